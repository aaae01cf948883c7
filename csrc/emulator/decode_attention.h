// A decode step's attention of one query per head over its KV cache plus its own key and value
// (models/blocks.py cached_attention, one lane), computed as one kernel instead of its 19 MIL ops:
//   scores = matmul(q, keys)              [.., 1, T]   (q: [.., 1, D], keys: [.., D, T])
//   masked = add(scores, mask)                          (mask: [.., 1, T], its rows broadcast over heads)
//   self   = reduce_sum(mul(q, k), -1)    [.., 1, 1]
//   top    = reduce_max(masked, -1)
//   m      = add(self, relu(sub(top, self)))            (max(top, self) without a max op)
//   e      = exp(sub(masked, m));  e_self = exp(sub(self, m))
//   denom  = add(reduce_sum(e, -1), e_self)
//   num    = add(matmul(e, values^T), mul(e_self, v))   (values: [.., D, T], v: [.., 1, D])
//   out    = mul(num, pow(denom, exponent))             (exponent: the scalar const, -1)
// Each head's values are computed as the ops compute them: the same matmul kernels (kernels::gemm,
// gemm_f16b for an fp16 cache read in place) on the same operands, each reduction from the first element
// to the last in fp32, each elementwise result in fp32 and every op's result rounded to fp16. So the
// kernel's result is the ops' bit for bit, with no condition on the data; what it saves is the ops'
// dispatch, broadcasting and frame traffic (~20 kernel calls per head group and layer).
#pragma once

#include <cstdint>

namespace orion::emu {

struct DecodeAttention {
    int64_t heads = 0;      // H: batches of the matmuls (every leading axis)
    int64_t depth = 0;      // D: q, k, v and output lanes
    int64_t positions = 0;  // T: cached positions
    int64_t heads_per_mask_row = 1;  // consecutive heads one [T] row of the mask covers (1: a row per head)
};

// Where the cache's keys and values are: fp32 in the frame, or fp16 read in place from the surface
// (exactly one of the two pointers is set).
struct CacheView {
    const float* data = nullptr;
    const uint16_t* half = nullptr;
};

// c = A B rounded to fp16 (kernels::gemm's contract), B the cache from element `offset` with strides b_rs, b_cs:
// gemm_f16b reading an fp16 cache in place, else gemm. The attentions' matmul op calls over a cache.
void cache_gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t a_rs, int64_t a_cs, CacheView b,
                int64_t offset, int64_t b_rs, int64_t b_cs, float* c, int64_t c_rs);

// The attentions' score-row ops, each result rounded to fp16 as its op's:
// row[t] = round(row[t] + mask[t]) for t < n (add).
void add_mask(float* row, const float* mask, int64_t n);
// The largest of row[0..n) (reduce_max; -inf for n = 0).
float row_max(const float* row, int64_t n);
// row[t] = round(exp(round(row[t] - m))) for t < n (sub, exp); returns round(their sum, in order) (reduce_sum).
float exp_shifted(float* row, float m, int64_t n);

// out[h, d] for every head h and lane d, as above; q, k, v and out are [H, D], the mask [H / heads_per_mask_row, T].
// Live lanes (a live-lanes hint on the cache and the mask), as the ops take them: the scores, the softmax and its
// sum cover the first `scored` positions, and the context's sum the first `summed` (<= scored).
void run_decode_attention(const DecodeAttention& a, int64_t scored, int64_t summed, const float* q, const float* k,
                          const float* v, CacheView keys, CacheView values, const float* mask, float exponent,
                          float* out);

}  // namespace orion::emu
