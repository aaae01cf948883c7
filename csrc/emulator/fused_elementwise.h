// A run of elementwise ops (add, sub, mul, real_div, pow, and the unary sigmoid and tanh: SiLU, SwiGLU,
// GELU's tanh form) of one output shape, computed row by row in one pass over memory: each row of every
// op's result is computed while the rows it reads are still in cache, and results nothing outside the run
// reads are never stored in the frame.
//
// Each element is computed exactly as the op's own kernel computes it (the same fp32 operation, then
// the same rounding to the op's dtype), so the run's results are the ops' bit for bit. Operands are
// whole tensors of the output's shape, rows broadcast along the lanes ([.., S] vectors shared by
// every row), one value per row ([.., 1]) or a scalar.
#pragma once

#include <cstdint>
#include <vector>

#include "emulator/ops.h"

namespace orion::emu {

struct ElementwiseRun {
    enum class Fn { add, sub, mul, div, pow, sigmoid, tanh };  // sigmoid, tanh: unary, their y is their x
    enum class Kind { full, lanes, per_row, scalar };
    struct Operand {
        Kind kind = Kind::full;
        int slot = -1;   // the frame value it reads, or
        int step = -1;   // (>= 0) an earlier step of the run whose row it reads
        int64_t offset = 0;  // where in the slot's data it starts (a channel slice of a lane block, lane_blocks.h)
    };
    struct Step {
        Fn fn = Fn::add;
        Operand x, y;
        int out = -1;          // frame slot, or -1 when no one outside the run reads the result
        bool round = true;     // fp16 result
    };
    std::vector<Step> steps;
    int64_t rows = 0, width = 0;  // the output shape as rows of `width` lanes
    // Every operand whole or a scalar: the run goes over the flat tensor in long chunks instead of
    // rows (a decode step's [1, C, 1, 1] values have rows of one element).
    bool flat = false;
};

// The Fn of a MIL op name, or false when the op is not a fusable elementwise op.
bool elementwise_fn(const std::string& op, ElementwiseRun::Fn* fn);
// Whether `fn` takes one operand.
inline bool is_unary(ElementwiseRun::Fn fn) { return fn == ElementwiseRun::Fn::sigmoid || fn == ElementwiseRun::Fn::tanh; }

// Each step's live lanes by the binary ops' rule: the narrowest live prefix among its operands that span the
// lanes (an earlier step's result carries that step's), the row width when all are whole.
std::vector<int64_t> live_lanes_of_steps(const ElementwiseRun& run, const Frame& frame);

// Computes the run: every element, or (given `live`, per step) each row's first live[s] elements of a step
// whose live lanes are fewer than the row width; its dead lanes stay stale, as the op's own kernel leaves them.
// Rows of at most Tensor::kShortRow lanes skip dead lanes only when every step has the same live lanes.
void run_elementwise(const ElementwiseRun& run, Frame& frame, const std::vector<int64_t>* live = nullptr);

}  // namespace orion::emu
