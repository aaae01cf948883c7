// The fused decode attention kernel (see decode_attention.h for why it is the ops bit for bit).
#include "emulator/decode_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "emulator/fp16.h"
#include "emulator/kernels.h"

namespace orion::emu {

namespace {

// Cache bytes worth a thread's share of the heads (as matmul's split of an fp16 cache read in place).
constexpr int64_t kHeadBytes = int64_t{1} << 16;

// c[n] = sum over k < K of a[k] * b[k * b_rs + n * b_cs], for n < N, rounded to fp16: the matmul op's
// call for one batch of one row.
void vector_times(int64_t N, int64_t K, const float* a, CacheView b, int64_t offset, int64_t b_rs, int64_t b_cs,
                  float* c) {
    if (b.half)
        kernels::gemm_f16b(1, N, K, a, K, 1, b.half + offset, b_rs, b_cs, c, N, true);
    else
        kernels::gemm(1, N, K, a, K, 1, b.data + offset, b_rs, b_cs, c, N, true);
}

}  // namespace

void run_decode_attention(const DecodeAttention& a, int64_t scored, int64_t summed, const float* q, const float* k,
                          const float* v, CacheView keys, CacheView values, const float* mask, float exponent,
                          float* out) {
    const int64_t D = a.depth, T = a.positions, L = scored;
    kernels::parallel_for(a.heads, std::max<int64_t>(1, kHeadBytes / std::max<int64_t>(4 * D * T, 1)),
                          [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> scratch;  // grown, never shrunk
        if (scratch.size() < static_cast<size_t>(T + 2 * D)) scratch.resize(static_cast<size_t>(T + 2 * D));
        float* row = scratch.data();  // scores, then masked, shifted, e
        float* lanes = row + T;       // q * k, then e_self * v
        float* context = lanes + D;   // e . values^T
        for (int64_t h = begin; h < end; ++h) {
            const float *qh = q + h * D, *kh = k + h * D, *vh = v + h * D;
            const float* mh = mask + h / a.heads_per_mask_row * T;
            vector_times(L, D, qh, keys, h * D * T, T, 1, row);  // scores
            for (int64_t t = 0; t < L; ++t) row[t] += mh[t];    // masked
            kernels::round_fp16(row, static_cast<size_t>(L));
            for (int64_t d = 0; d < D; ++d) lanes[d] = qh[d] * kh[d];  // q * k
            kernels::round_fp16(lanes, static_cast<size_t>(D));
            float self = 0.0f, top = -std::numeric_limits<float>::infinity();
            for (int64_t d = 0; d < D; ++d) self += lanes[d];
            self = round_to_fp16(self);
            for (int64_t t = 0; t < L; ++t) top = std::max(top, row[t]);
            const float gap = round_to_fp16(top - self);
            const float m = round_to_fp16(self + (gap > 0.0f ? gap : 0.0f));  // self + relu(gap)
            for (int64_t t = 0; t < L; ++t) row[t] -= m;  // shift
            kernels::round_fp16(row, static_cast<size_t>(L));
            kernels::exp_fp16(row, row, static_cast<size_t>(L));  // e
            const float e_self = round_to_fp16(std::exp(round_to_fp16(self - m)));
            float sum = 0.0f;
            for (int64_t t = 0; t < L; ++t) sum += row[t];
            const float denom = round_to_fp16(round_to_fp16(sum) + e_self);
            vector_times(D, summed, row, values, h * D * T, 1, T, context);  // e . values^T
            for (int64_t d = 0; d < D; ++d) lanes[d] = e_self * vh[d];
            kernels::round_fp16(lanes, static_cast<size_t>(D));
            for (int64_t d = 0; d < D; ++d) context[d] += lanes[d];  // num
            kernels::round_fp16(context, static_cast<size_t>(D));
            const float inv = round_to_fp16(std::pow(denom, exponent));
            float* oh = out + h * D;
            for (int64_t d = 0; d < D; ++d) oh[d] = context[d] * inv;
            kernels::round_fp16(oh, static_cast<size_t>(D));
        }
    });
}

}  // namespace orion::emu
