// The software ANE: compile = parse + validate + type-check + bake weights; evaluate runs the
// program on surfaces in fp16 numerics under the hardware's binding and surface rules.
#pragma once

#include <memory>
#include <string_view>

#include "runtime/program.h"

namespace orion::emu {

// Compiles and loads `mil_text` with the given weight files. Counts one compile toward the
// per-process budget. Throws CompileError / ConstraintError / CompileBudgetExhausted.
std::unique_ptr<runtime::LoadedProgram> compile(std::string_view mil_text, const runtime::WeightFiles& weights,
                                                runtime::Profile profile);

}  // namespace orion::emu
