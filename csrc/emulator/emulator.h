// The software ANE: compile = the shared front end (frontend/, type step included) + kernels built
// from its results; evaluate runs the program on surfaces in fp16 numerics under the hardware's
// binding and surface rules.
#pragma once

#include <memory>
#include <string_view>

#include "frontend/frontend.h"
#include "runtime/backend.h"
#include "runtime/program.h"

namespace orion::emu {

// Checks and type-checks (the front end), then counts one compile toward the per-process budget
// (only a program that reaches the emulated device compiler counts), then builds the kernels and loads.
// Throws CompileError / ConstraintError / CompileBudgetExhausted.
std::unique_ptr<runtime::LoadedProgram> compile(std::string_view mil_text, const runtime::WeightFiles& weights,
                                                const runtime::CompileOptions& options);

// compile() without counting a compile (the harness's stand-in framework loads with it).
std::unique_ptr<runtime::LoadedProgram> build(std::string_view mil_text, const runtime::WeightFiles& weights,
                                              const runtime::CompileOptions& options);

}  // namespace orion::emu
