// The chains of MIL ops that one fused kernel computes, found in a program's model (program_model.h):
// each finder returns its chains by each of their steps, and finds only chains whose intermediates
// nothing outside the chain reads. The emulator (emulator.cpp) adds one kernel per chain at its last
// step; the kernels themselves are in causal_attention.h, decode_attention.h, chunk_attention.h, stable_norm.h,
// rotary.h, packed_outputs.h and fused_elementwise.h.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "emulator/chunk_attention.h"
#include "emulator/decode_attention.h"
#include "emulator/fused_elementwise.h"
#include "emulator/packed_outputs.h"
#include "emulator/program_model.h"
#include "emulator/rotary.h"
#include "emulator/stable_norm.h"
#include "runtime/program.h"

namespace orion::emu {

using StepList = std::vector<const Step*>;

// A causal attention chain (causal_attention.h): its steps in order (scores, the optional scale,
// the mask, softmax, context) and its const operands.
struct AttentionChain {
    StepList steps;
    int scale = -1, mask = -1;  // value ids
};

// A decode step's attention of one lane (decode_attention.h): its 19 steps in program order, its
// operands' value ids and its shape.
struct DecodeChain {
    StepList steps;
    int q = -1, k = -1, v = -1, keys = -1, values = -1, mask = -1, exponent = -1;
    DecodeAttention shape;
};

// A prompt chunk's attention over its KV cache plus itself (chunk_attention.h): its 23 steps in program order,
// its operands' value ids and its shape.
struct ChunkChain {
    StepList steps;
    int q = -1, k = -1, v = -1, keys = -1, values = -1, past_mask = -1, own_mask = -1, exponent = -1;
    ChunkAttention shape;
};

// A stable norm over the channels of a decode step's [1, C, 1, S] (stable_norm.h): its steps in program
// order, its input and its consts.
struct NormChain {
    StepList steps;
    int x = -1, gamma = -1, beta = -1;  // gamma, beta: [1, C, 1, 1] operands of the optional mul and add
    StableNorm shape;
};

// A rotary embedding (rotary.h): its 4 steps in program order and its operands' value ids. `gradient`: the
// embedding's input gradient (run_rotary_gradient), x then being the output's gradient.
struct RotaryChain {
    StepList steps;
    int x = -1, partner = -1, cos = -1, sin = -1;
    Rotary shape;
    bool gradient = false;
};

// The I/O packing's placement of outputs in one surface (packed_outputs.h): its steps in order (the
// one-hot muls, the reshapes copying their blocks, the adds summing them), the values placed (value
// ids: a block, or the operand of the reshape copying it) and where.
struct PackedChain {
    StepList steps;
    std::vector<int> blocks;
    PackedOutputs placement;
};

// A pointwise conv whose result goes through elementwise steps (or none) to a second pointwise conv or to channel
// slices, every intermediate read by the chain alone: a transformer's MLP (GPT-2: fc, its bias and GELU, proj;
// Llama: gate|up, its two channel slices and SwiGLU, down) or projection (GPT-2: qkv and its bias, cut into q, k
// and v; Llama: qkv cut into heads). Computed lane block by lane block (lane_blocks.h).
struct LaneBlockChain {
    StepList steps;  // program order
    const Step* up = nullptr;
    StepList run;                   // the elementwise steps (a run, one step, or none)
    std::map<int, int64_t> slices;  // channel slices of up's result the run reads: value id -> first channel
    const Step* down = nullptr;     // the second conv, or null: then the outputs are
    std::vector<std::pair<const Step*, int64_t>> outputs;  // channel slices of the result: (step, first channel)
    // Whether `step` is a sink (the second conv or an output slice): its result is read outside the chain.
    bool sink(const Step* step) const {
        return step == down || std::any_of(outputs.begin(), outputs.end(), [&](const auto& o) { return o.first == step; });
    }
};

// An output the I/O padding writes as add(all-+0 const, value repeated along the output's leading
// axes): which output, the repeated block's element count and the value repeated.
struct ReplicatedOutput {
    size_t output;
    int64_t block;
    int source;
};

template <class Chain>
using ChainsByStep = std::map<const Step*, Chain>;
using ElementwiseRuns = ChainsByStep<StepList>;

class ChainFinder {
public:
    // `outputs`: the program's outputs; `cut_values`: the values cut from input surfaces (no step computes them).
    ChainFinder(const ProgramModel& model, const std::vector<runtime::TensorSpec>& outputs, const std::set<int>& cut_values);

    // How many steps read each value (a program output counts as two readers, outside every group).
    const std::vector<int>& readers() const { return readers_; }

    ChainsByStep<AttentionChain> causal_attention() const;
    // Causal attention probabilities whose softmax has readers besides one context matmul (a layer gradient's
    // recomputed probabilities): matmul(q, k, transpose_x) -> [mul(scale)] -> add(causal mask) -> softmax, none of
    // their steps in `grouped` (the attention chains).
    ChainsByStep<AttentionChain> causal_probabilities(const std::set<const Step*>& grouped) const;
    ChainsByStep<DecodeChain> decode_attention() const;
    ChainsByStep<ChunkChain> chunk_attention() const;
    ChainsByStep<NormChain> stable_norms() const;
    ChainsByStep<RotaryChain> rotaries() const;
    // Chains sum_i mul(block_i [1, 1, r, W], one-hot [1, rows, 1, 1]) of two or more fp16 blocks in
    // distinct rows, added in order, whose partial sums and products nothing else reads, none of their
    // steps in `grouped` (the other fused groups).
    ChainsByStep<PackedChain> packed_outputs(const std::set<const Step*>& grouped) const;
    // Runs of two or more consecutive elementwise steps (binary, sigmoid or tanh) of one float output shape,
    // none of them in `grouped`.
    ElementwiseRuns elementwise_runs(const std::set<const Step*>& grouped) const;
    // The chains LaneBlockChain describes, from each pointwise conv of one image ([1, C, 1, S], one row per
    // channel) not in `grouped`: the elementwise steps are one of `runs` or a single step, read the conv's result
    // whole or in channel slices of every lane (besides values per row and scalars), and their result (or the
    // conv's) is read by one pointwise conv or by channel slices of every lane alone.
    ChainsByStep<LaneBlockChain> lane_block_chains(const ElementwiseRuns& runs,
                                                   const std::set<const Step*>& grouped) const;
    // Outputs ([1, k, 1, C*S], the value in every row) whose step is in no group or run: their kernel
    // computes one block and the store copies it, in the surface's dtype, into the other rows.
    ChainsByStep<ReplicatedOutput> replicated_outputs(const std::set<const Step*>& grouped,
                                                      const ElementwiseRuns& runs) const;

    // How operand `id` of a binary op with output shape `out` is read row by row, if it can be.
    std::optional<ElementwiseRun::Kind> operand_kind(int id, const Shape& out) const;

private:
    using CausalMasks = std::map<std::pair<int, int64_t>, bool>;  // (mask, S) -> causal: is_causal_mask, once each
    std::optional<AttentionChain> probability_chain(const Step& probs, CausalMasks& causal) const;
    const ValueInfo& value(int id) const { return model_.values_[static_cast<size_t>(id)]; }
    int reads(int id) const { return readers_[static_cast<size_t>(id)]; }
    // The fp16 step computing value `id` into its own slot (not a view) when `op` is its kind, else null.
    const Step* fp16_producer(int id, const char* op) const;
    // The step computing `id`, when `op` is its kind and its one reader is the chain (not a view of another value).
    const Step* private_producer(int id, const char* op) const;
    // The chains `match` finds, each ending at one step of the program: `match(last, made)` returns a chain
    // or nothing, where made(id, op) is fp16_producer's step, recorded as the chain's, and made(step) records
    // `step`. The chain's steps are the recorded ones in program order.
    template <class Chain, class Match>
    ChainsByStep<Chain> fp16_chains(Match match) const;
    // Whether every result of `steps` but `out`'s is read by `steps` only (a program output never is).
    bool private_results(const StepList& steps, const Step* out) const;
    // The steps reading value `id`, in program order (a step reading it twice once).
    StepList readers_of(int id) const;
    // The step that reads value `id` when it is its only reader (and the program does not return it), else null.
    const Step* sole_reader(int id) const;
    // The row a const [1, rows, 1, 1] of fp16 +0s and one 1 selects, or -1.
    int64_t one_hot_row(int id) const;

    const ProgramModel& model_;
    const std::vector<runtime::TensorSpec>& outputs_;
    const std::set<int>& cut_values_;
    std::map<int, const Step*> producer_;
    std::vector<int> readers_;
};

// A float const's values as its frame tensor holds them: a BLOBFILE's, a folded op's (held, not
// copied), or the literal's rounded to fp16 for an fp16 const.
std::shared_ptr<const std::vector<float>> const_floats(const ValueInfo& v);

}  // namespace orion::emu
