// MIL text in both directions: the emitter (mil_emit.mm) writes the dialect of docs/hardware.md §4
// byte-for-byte in its conventions; the parser accepts that dialect with its real-world variations.
#pragma once

#include <string>
#include <string_view>

#include "mil/program.h"

namespace orion::mil {

// Canonical text of `program`. emit(parse(emit(p))) == emit(p) and parse(emit(p)) == p.
// Throws CompileError for a program that cannot be written (e.g. a non-finite float literal).
std::string emit(const Program& program);

// `text` with the default buildInfo block (default_build_info) after `program(...)`, on the same line
// (so line numbers in error messages stay those of `text`), when it has no attribute block there;
// otherwise `text` unchanged. orion.compile sends every program through this,
// on both backends: every program that ran on hardware carries one (docs/hardware.md §4).
std::string with_build_info(std::string_view text);

// Parses MIL text. Throws ParseError (line, column, what was expected) on malformed input.
// Statements carry their source location.
Program parse(std::string_view text);

}  // namespace orion::mil
