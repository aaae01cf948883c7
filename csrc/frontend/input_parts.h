// The tensors a program cuts out of its input surfaces by slices and reshapes alone
// (runtime::InputPart): what the I/O packing (ANE-37) and the I/O padding (ANE-12/-21) do to lay
// tensors in surfaces. Both backends accept live-lanes hints on them; the emulator reads each one
// straight from its place in the surface instead of loading the surface and copying it apart.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "frontend/types.h"
#include "runtime/program.h"

namespace orion::frontend {

struct InputCuts {
    // Every value that is one contiguous range of an input surface, made from the input by
    // reshapes and slice_by_size boxes that are contiguous in memory (the inputs themselves excluded):
    // a live-lanes hint may name any of them.
    std::map<std::string, runtime::InputPart> ranges;
    // Those of them that an op other than such a cut reads, or that the program returns, in program order.
    std::vector<runtime::InputPart> parts;
};

// `inputs` in binding order; `typed` the type step's results, one per statement of fn.body.
InputCuts find_input_cuts(const mil::Function& fn, const std::vector<runtime::TensorSpec>& inputs,
                          const std::vector<TypedOp>& typed);

}  // namespace orion::frontend
