// The software ANE: compile = parse + validate + type-check + bake weights; evaluate runs the
// program on surfaces in fp16 numerics under the hardware's binding and surface rules.
#pragma once

#include <memory>
#include <string_view>

#include "runtime/backend.h"
#include "runtime/program.h"

namespace orion::emu {

// Compiles and loads `mil_text` with the given weight files. Counts one compile toward the
// per-process budget. Throws CompileError / ConstraintError / CompileBudgetExhausted.
std::unique_ptr<runtime::LoadedProgram> compile(std::string_view mil_text, const runtime::WeightFiles& weights,
                                                runtime::Profile profile);

// compile() without counting a compile (the harness's stand-in framework loads with it).
std::unique_ptr<runtime::LoadedProgram> build(std::string_view mil_text, const runtime::WeightFiles& weights,
                                              runtime::Profile profile);

// The emulator's front end without a compile: parses, checks every hardware rule of `profile`,
// type-checks and reads the weights exactly as compile() does (same errors), and returns the
// inputs and outputs in binding order. The ane backend runs it before the framework's compiler.
std::pair<std::vector<runtime::TensorSpec>, std::vector<runtime::TensorSpec>> check(
    std::string_view mil_text, const runtime::WeightFiles& weights, runtime::Profile profile);

// The "emulator" entry of the backend registry.
runtime::Backend backend();

}  // namespace orion::emu
