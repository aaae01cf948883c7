// The software ANE: compile = the shared front end (frontend/) + the type step + kernels; evaluate
// runs the program on surfaces in fp16 numerics under the hardware's binding and surface rules.
#pragma once

#include <memory>
#include <string_view>

#include "frontend/frontend.h"
#include "runtime/backend.h"
#include "runtime/program.h"

namespace orion::emu {

// Checks, type-checks, then counts one compile toward the per-process budget (only a program that
// reaches the emulated device compiler counts), then builds the kernels and loads.
// Throws CompileError / ConstraintError / CompileBudgetExhausted.
std::unique_ptr<runtime::LoadedProgram> compile(std::string_view mil_text, const runtime::WeightFiles& weights,
                                                const runtime::CompileOptions& options);

// compile() without counting a compile (the harness's stand-in framework loads with it).
std::unique_ptr<runtime::LoadedProgram> build(std::string_view mil_text, const runtime::WeightFiles& weights,
                                              const runtime::CompileOptions& options);

// The type step alone over a checked program: every op's output type inferred from its inputs and
// compared with its declaration (CompileError naming the op). Allocates nothing tensor-sized and
// builds no program; the ane backend runs it so both backends refuse the same programs.
void check_types(const frontend::CheckedProgram& checked, const runtime::WeightFiles& weights);

}  // namespace orion::emu
