// The fused causal attention kernel (see causal_attention.h for why it is exact).
#include "emulator/causal_attention.h"

#include <algorithm>
#include <cmath>

#include "emulator/kernels.h"

namespace orion::emu {

namespace {

// Queries per task (more than gemm's matrix-vector rows): 128, or 64 for a 64-token bucket. A block
// computes its keys up to its last row, so a bigger one wastes more of the triangle but packs each
// key matrix fewer times (128 measured 10% faster than 64 at 1024 tokens).
constexpr int64_t kQueryBlock = 128, kSmallQueryBlock = 64;
constexpr int64_t kLaneGroup = 16;   // row prefixes are whole groups of the widest softmax vector
constexpr double kScoreLimit = 16384.0;  // |scaled score| bound: a masked one stays below -65504 + 16384

int64_t query_block(int64_t seq) { return seq % kQueryBlock == 0 ? kQueryBlock : kSmallQueryBlock; }

// The largest Euclidean norm among the first `columns` of the S columns of a [D, S] matrix.
double max_column_norm(const float* m, int64_t depth, int64_t seq, int64_t columns) {
    std::vector<double> sq(static_cast<size_t>(columns), 0.0);
    for (int64_t d = 0; d < depth; ++d)
        for (int64_t s = 0; s < columns; ++s) sq[static_cast<size_t>(s)] += static_cast<double>(m[d * seq + s]) * m[d * seq + s];
    double worst = 0.0;
    for (double v : sq) worst = std::max(worst, v);  // NaN never wins std::max: checked below
    for (double v : sq)
        if (!std::isfinite(v)) return INFINITY;
    return std::sqrt(worst);
}

// Whether every score of a live query (the first `live` columns of q) over the keys it reaches (the
// first `keys` columns of k) is bounded well inside fp16, in every batch.
bool scores_are_bounded(const CausalAttention& a, const float* q, const float* k, float scale, int64_t live,
                        int64_t keys) {
    const double s = a.has_scale ? std::fabs(static_cast<double>(scale)) : 1.0;
    if (!std::isfinite(s)) return false;
    for (int64_t b = 0; b < a.batches; ++b) {
        const double bound = 1.01 * max_column_norm(q + a.q_offset[b], a.depth, a.seq, live) *
                             max_column_norm(k + a.k_offset[b], a.depth, a.seq, keys);
        if (!(bound < kScoreLimit * 2) || !(bound * s < kScoreLimit)) return false;
    }
    return true;
}

// The probabilities of batch b's query rows [i0, i0 + rows) over the keys [0, keys) into p (rows `ld` apart):
// s[i][j] = sum_d q[d][i] k[d][j] by the gemm, then each row's softmax over its L_i keys and exact zeros from
// there to the row's end (the masked tail).
void block_probabilities(const CausalAttention& a, const float* q, const float* k, const float* mask,
                         const kernels::ScoreRowOps& row_ops, int64_t b, int64_t i0, int64_t rows, int64_t keys,
                         float* p, int64_t ld) {
    const int64_t S = a.seq;
    kernels::gemm(rows, keys, a.depth, q + a.q_offset[b] + i0, 1, S, k + a.k_offset[b], S, 1, p, ld, a.round_scores);
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        const int64_t reach = std::min(keys, (i + kLaneGroup) / kLaneGroup * kLaneGroup);  // L_i
        float* row = p + r * ld;
        kernels::score_row_softmax(row, mask + i * S, reach, row_ops);
        std::fill(row + reach, row + ld, 0.0f);
    }
}

}  // namespace

bool causal_attention_applies(int64_t seq, int64_t value_depth) {
    return seq >= kSmallQueryBlock && seq % kSmallQueryBlock == 0 && value_depth >= 16;
}

int64_t causal_attention_dead_end(const CausalAttention& a, int64_t live) {
    return std::min(a.seq, (live + kLaneGroup - 1) / kLaneGroup * kLaneGroup);
}

bool run_causal_attention(const CausalAttention& a, const float* q, const float* k, const float* v, float scale,
                          const float* mask, float* out, int64_t live) {
    live = std::clamp<int64_t>(live, 0, a.seq);
    const int64_t S = a.seq, block = query_block(S), blocks = (live + block - 1) / block;
    // The rows up to the last live one's group of 16 and the keys they reach (a 16-token prompt in a 1024-token
    // bucket: 16 rows and keys of its block's 128; the keys past a live row's L_i hold exact-0 probabilities whose
    // terms leave the sums as they are, and each row's sums are the gemm's in the same order whatever the rows).
    const int64_t reached = causal_attention_dead_end(a, live);
    if (!scores_are_bounded(a, q, k, scale, live, reached)) return false;
    const kernels::ScoreRowOps row_ops{a.has_scale, scale, a.round_scaled, a.round_masked, a.round_probs};
    kernels::parallel_for(a.batches * blocks, 1, [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> scratch;
        for (int64_t task = begin; task < end; ++task) {
            const int64_t b = task / blocks, i0 = task % blocks * block;
            const int64_t rows = std::min(block, reached - i0), keys = i0 + rows;  // the last row needs keys [0, keys)
            scratch.resize(static_cast<size_t>(rows * keys));
            float* p = scratch.data();
            block_probabilities(a, q, k, mask, row_ops, b, i0, rows, keys, p, keys);
            // o[d][i] = sum_j v[d][j] p[i][j] over the keys the block reaches.
            kernels::gemm(a.value_depth, rows, keys, v + a.v_offset[b], S, 1, p, 1, keys,
                          out + b * a.value_depth * S + i0, S, a.round_out);
        }
    });
    return true;
}

bool run_causal_probabilities(const CausalAttention& a, const float* q, const float* k, float scale, const float* mask,
                              float* probs) {
    const int64_t S = a.seq, block = query_block(S), blocks = S / block;
    if (!scores_are_bounded(a, q, k, scale, S, S)) return false;
    const kernels::ScoreRowOps row_ops{a.has_scale, scale, a.round_scaled, a.round_masked, a.round_probs};
    kernels::parallel_for(a.batches * blocks, 1, [&](int64_t begin, int64_t end) {
        for (int64_t task = begin; task < end; ++task) {
            const int64_t b = task / blocks, i0 = task % blocks * block;
            // as run_causal_attention: keys [0, i0 + block) for the block's rows, exact zeros to the row's end
            block_probabilities(a, q, k, mask, row_ops, b, i0, block, i0 + block, probs + b * S * S + i0 * S, S);
        }
    });
    return true;
}

}  // namespace orion::emu
