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

}  // namespace

void add_mask(float* row, const float* mask, int64_t n) {
    for (int64_t t = 0; t < n; ++t) row[t] += mask[t];
    kernels::round_fp16(row, static_cast<size_t>(n));
}

float row_max(const float* row, int64_t n) {
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < n; ++t) top = std::max(top, row[t]);
    return top;
}

float exp_shifted(float* row, float m, int64_t n) {
    for (int64_t t = 0; t < n; ++t) row[t] -= m;
    kernels::round_fp16(row, static_cast<size_t>(n));
    kernels::exp_fp16(row, row, static_cast<size_t>(n));
    float sum = 0.0f;
    for (int64_t t = 0; t < n; ++t) sum += row[t];
    return round_to_fp16(sum);
}

void cache_gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t a_rs, int64_t a_cs, CacheView b,
                int64_t offset, int64_t b_rs, int64_t b_cs, float* c, int64_t c_rs) {
    if (b.half)
        kernels::gemm_f16b(M, N, K, a, a_rs, a_cs, b.half + offset, b_rs, b_cs, c, c_rs, true);
    else
        kernels::gemm(M, N, K, a, a_rs, a_cs, b.data + offset, b_rs, b_cs, c, c_rs, true);
}

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
            cache_gemm(1, L, D, qh, D, 1, keys, h * D * T, T, 1, row, L);  // scores
            add_mask(row, mh, L);  // masked
            for (int64_t d = 0; d < D; ++d) lanes[d] = qh[d] * kh[d];  // q * k
            kernels::round_fp16(lanes, static_cast<size_t>(D));
            float self = 0.0f;
            for (int64_t d = 0; d < D; ++d) self += lanes[d];
            self = round_to_fp16(self);
            const float gap = round_to_fp16(row_max(row, L) - self);
            const float m = round_to_fp16(self + (gap > 0.0f ? gap : 0.0f));  // self + relu(gap)
            const float sum = exp_shifted(row, m, L);  // e, and its sum
            const float e_self = round_to_fp16(std::exp(round_to_fp16(self - m)));
            const float denom = round_to_fp16(sum + e_self);
            cache_gemm(1, D, summed, row, summed, 1, values, h * D * T, 1, T, context, D);  // e . values^T
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
