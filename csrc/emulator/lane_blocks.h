// A chain of a pointwise conv, elementwise steps and a second pointwise conv or channel slices (chains.h
// LaneBlockChain: a transformer's MLP or projection over [1, C, 1, S]) computed lane block by lane block: each
// block of lanes goes through the first conv, the steps and the second conv (or is copied into the slices) before
// the next, so the chain's wide values (GPT-2's [3072, S] hidden layer and the second conv's packed copy of it, its
// [2304, S] q|k|v before the cut) exist one block at a time instead of for every lane at once: a 1,024-lane
// prefill's peak of pooled activations is set by the residual stream's values, not by the chains'.
//
// Every lane is computed as the chain's ops compute it, bit for bit: the lanes of a 1x1 conv are independent and
// conv1x1 sums each the same for any lane count (blocks of 128+ lanes take its converting path, as the whole op's
// chunks of about 256 do; fewer live lanes are one block, the whole op's call); the run computes each element as
// its ops do wherever it sits; a slice copies.
#pragma once

#include <cstdint>
#include <vector>

#include "emulator/fused_elementwise.h"
#include "emulator/ops.h"

namespace orion::emu {

// Lanes per block, at most: the live lanes in ceil(live / kLaneBlock) blocks of (nearly) equal width.
constexpr int64_t kLaneBlock = 256;

struct LaneBlockedChain {
    LaneBlockKernel up, down;  // the convs' lane-block forms; `down` null: the result goes to `outputs`
    // The elementwise steps over [act_rows, S] (none: the result is the hidden value), their result stored to `act`
    // (`hidden` itself when it overwrites the hidden block in place); operands that read the hidden value (up's
    // result, or a channel slice of it) read slot `hidden` with their first channel in Operand::offset.
    ElementwiseRun run;
    int x = -1, hidden = -1, act = -1, out = -1;  // frame slots: up's input and result, the run's result, down's result
    int64_t hidden_rows = 0, act_rows = 0, lanes = 0;  // up's and the run's channels; S
    struct Output {
        int slot;
        int64_t channel, channels;  // the result's channels [channel, channel + channels)
    };
    std::vector<Output> outputs;
};

// Computes the chain over x's live lanes into `out` or the outputs (their dead lanes untouched, as the ops leave
// them), taking the block-sized hidden (and act) buffers from the buffer pool for the call. False (nothing written)
// when x is fp16 read in place, has a live prefix or no live lane: the chain's own kernels run then.
bool run_lane_blocked_chain(const LaneBlockedChain& chain, Frame& frame);

}  // namespace orion::emu
