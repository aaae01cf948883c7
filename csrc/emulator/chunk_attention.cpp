// The fused chunk attention kernel (see chunk_attention.h for why it is the ops bit for bit).
#include "emulator/chunk_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "emulator/fp16.h"
#include "emulator/kernels.h"

namespace orion::emu {

namespace {

// Cache bytes worth a thread's share of the heads (as the decode attention's).
constexpr int64_t kHeadBytes = int64_t{1} << 16;
// Up to this many rows of A the gemm streams B (gemv) instead of packing it: the score matmuls' query
// rows are cut to the live ones, but never across this bound, so each row is summed on the ops' path.
constexpr int64_t kGemvRows = 3;

void scale_row(float* row, float by, int64_t n) {
    for (int64_t t = 0; t < n; ++t) row[t] *= by;
    kernels::round_fp16(row, static_cast<size_t>(n));
}


}  // namespace

void run_chunk_attention(const ChunkAttention& a, const ChunkLive& live, const float* q, CacheView k, CacheView v,
                         CacheView keys, CacheView values, const float* past_mask, const float* own_mask,
                         float exponent, float* out) {
    const int64_t D = a.depth, S = a.seq, T = a.positions, Q = live.queries;
    // Query rows computed (of the scores and the contexts): the live ones, but never across the gemm's gemv bound.
    const int64_t rows = S <= kGemvRows ? S : std::clamp<int64_t>(Q, kGemvRows + 1, S);
    kernels::parallel_for(a.heads, std::max<int64_t>(1, kHeadBytes / std::max<int64_t>(4 * D * (T + S), 1)),
                          [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> scratch;  // grown, never shrunk
        const size_t need = static_cast<size_t>(rows * (T + S) + 2 * rows * D);
        if (scratch.size() < need) scratch.resize(need);
        float* past = scratch.data();          // [rows, T]: scores, masked, e, p (the ops' row layout)
        float* own = past + rows * T;          // [rows, S]
        float* past_ctx = own + rows * S;      // [rows, D]
        float* own_ctx = past_ctx + rows * D;  // [rows, D]
        for (int64_t h = begin; h < end; ++h) {
            const float* qh = q + h * D * S;
            cache_gemm(rows, live.scored, D, qh, 1, S, keys, h * D * T, T, 1, past, T);  // scores: q^T keys
            cache_gemm(rows, live.own_scored, D, qh, 1, S, k, h * D * S, S, 1, own, S);
            for (int64_t i = 0; i < Q; ++i) {
                float *pr = past + i * T, *orow = own + i * S;
                add_mask(pr, past_mask + (a.past_mask_rows == 1 ? 0 : i * T), live.scored);
                add_mask(orow, own_mask + i * S, live.own_scored);
                const float top_own = row_max(orow, live.own_scored);
                const float gap = round_to_fp16(row_max(pr, live.scored) - top_own);
                const float m = round_to_fp16(top_own + (gap > 0.0f ? gap : 0.0f));  // top_own + relu(gap)
                const float sums = exp_shifted(pr, m, live.scored) + exp_shifted(orow, m, live.own_scored);
                const float inv = round_to_fp16(std::pow(round_to_fp16(sums), exponent));
                scale_row(pr, inv, live.scored);
                scale_row(orow, inv, live.own_scored);
            }
            // The contexts: the probabilities' rows times values [D, T] (B transposed), as the ops' matmuls.
            cache_gemm(rows, D, live.summed, past, T, 1, values, h * D * T, 1, T, past_ctx, D);
            cache_gemm(rows, D, live.own_summed, own, S, 1, v, h * D * S, 1, S, own_ctx, D);
            float* oh = out + h * D * S;  // the sum [Q, D], transposed: [D, S]
            for (int64_t i = 0; i < Q; ++i) {
                float* sum = past_ctx + i * D;
                for (int64_t d = 0; d < D; ++d) sum[d] += own_ctx[i * D + d];
                kernels::round_fp16(sum, static_cast<size_t>(D));
                for (int64_t d = 0; d < D; ++d) oh[d * S + i] = sum[d];
            }
            for (int64_t d = 0; d < D; ++d)
                std::fill(oh + d * S + Q, oh + (d + 1) * S, 0.0f);  // dead queries: finite for whole-row ops
        }
    });
}

}  // namespace orion::emu
