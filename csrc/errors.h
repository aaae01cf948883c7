// Exceptions of the core. The Python bindings map them one-to-one onto orion.CompileError,
// orion.EvaluateError, orion.ConstraintError and orion.CompileBudgetExhausted.
#pragma once

#include <stdexcept>
#include <string>

#include "constraints.h"

namespace orion {

// The program cannot be compiled: malformed MIL, a type error, a missing weight file.
struct CompileError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Malformed MIL text: carries the 1-based line and column of the offending character.
struct ParseError : CompileError {
    int line, column;
    ParseError(const std::string& what, int line_, int column_)
        : CompileError("line " + std::to_string(line_) + ", column " + std::to_string(column_) + ": " + what),
          line(line_), column(column_) {}
};

// A program cannot be evaluated with the given surfaces.
struct EvaluateError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A known ANE rule is broken. `id` is the stable catalog id (see constraints.h); the message
// names the rule, then says where and how to fix it.
struct ConstraintError : std::runtime_error {
    std::string id;
    ConstraintError(const constraints::Constraint& c, const std::string& detail)
        : std::runtime_error(std::string(c.id) + " (" + c.title + "): " + detail), id(c.id) {}
};

// The per-process compile budget is used up (docs/hardware.md §1: ~119 compiles per process).
struct CompileBudgetExhausted : std::runtime_error {
    using std::runtime_error::runtime_error;
};

}  // namespace orion
