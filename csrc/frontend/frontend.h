// The MIL front end both backends share: parse (with the input limits of hardware_limits.h), the
// op table's argument rules, the I/O rules, the hardware rules of the profile, the weight checks
// and the type step (types.h). It allocates nothing the size of a tensor and constructs nothing of
// a backend's; the emulator and the ane backend both start from its CheckedProgram.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "frontend/input_parts.h"
#include "frontend/types.h"
#include "mil/program.h"
#include "runtime/program.h"

namespace orion::frontend {

// A program that passed every shared check.
struct CheckedProgram {
    mil::Program program;
    std::vector<runtime::TensorSpec> inputs, outputs;  // binding order
    std::vector<TypedOp> typed;                        // per statement of main, in order
    InputCuts cuts;                                    // the tensors main cuts from its input surfaces
    const mil::Function& main() const { return *program.find_function("main"); }
};

// Throws ParseError / CompileError / ConstraintError naming what, where and the fix.
CheckedProgram check(std::string_view text, const runtime::WeightFiles& weights, const runtime::CompileOptions& options);

// The weight dictionary's keys: ANE-34 paths without control characters (see weight_file_relpath).
void check_weight_keys(const runtime::WeightFiles& weights);

// "line 7: op 'y' (conv)": how every front-end and emulator message names a statement.
std::string where(const mil::Operation& op);

}  // namespace orion::frontend
