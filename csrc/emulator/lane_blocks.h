// A transformer MLP (chains.h MlpChain: pointwise conv -> elementwise run -> pointwise conv over [1, C, 1, S])
// computed lane block by lane block: each block of lanes goes through the first conv, the run and the second conv
// before the next, so its wide hidden values (GPT-2's [3072, S] for a [768, S] stream, with the second conv's packed
// copy of them) exist one block at a time instead of for every lane at once: a 1,024-lane prefill's peak of pooled
// activations is set by the stream's values, not by the MLP's.
//
// Every lane is computed as the chain's ops compute it, bit for bit: the lanes of a 1x1 conv are independent and
// conv1x1 sums each the same for any lane count of 256 or more (each block's, and the whole op's chunks of about
// 256), as it does when all live lanes are one block; the run computes each element as its ops do wherever it sits.
#pragma once

#include <cstdint>

#include "emulator/fused_elementwise.h"
#include "emulator/ops.h"

namespace orion::emu {

// Lanes per block, about: a prompt's live lanes in blocks of at least this many (fewer: one block of them all).
constexpr int64_t kMlpLaneBlock = 256;

struct LaneBlockedMlp {
    LaneBlockKernel up, down;  // the convs' lane-block forms
    // The run over [act_rows, S], its result stored to `act`; operands that read the hidden value (up's result, or a
    // channel slice of it) read slot `hidden` with their first channel in Operand::offset.
    ElementwiseRun run;
    int x = -1, hidden = -1, act = -1, out = -1;  // frame slots: up's input and result, the run's result, down's result
    int64_t hidden_rows = 0, act_rows = 0, lanes = 0;  // up's and the run's channels; S
};

// Computes the chain over x's live lanes into `out` (its dead lanes untouched, as the convs leave them), taking the
// block-sized hidden and act buffers from the buffer pool for the call. False (nothing written) when x is fp16 read
// in place or has a live prefix: the chain's own kernels run then.
bool run_lane_blocked_mlp(const LaneBlockedMlp& mlp, Frame& frame);

}  // namespace orion::emu
