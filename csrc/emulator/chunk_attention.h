// A prompt chunk's attention over its KV cache plus itself (models/blocks.py chunk_attention: a speculative
// check's drafts, a prompt read in pieces), computed as one kernel instead of its 23 MIL ops:
//   past   = add(matmul(q, keys, transpose_x), past_mask)  [.., S, T]  (q: [.., D, S], keys: [.., D, T])
//   own    = add(matmul(q, k, transpose_x), own_mask)      [.., S, S]  (k: [.., D, S])
//   m      = add(top_own, relu(sub(top_past, top_own)))    (top_*: reduce_max over the last axis)
//   e_*    = exp(sub(*, m));  inv = pow(add(reduce_sum(e_past), reduce_sum(e_own)), exponent)
//   out    = transpose(add(matmul(mul(e_past, inv), values, transpose_y), matmul(mul(e_own, inv), v, transpose_y)))
//            (the contexts [.., S, D], values: [.., D, T], v: [.., D, S]; the transpose swaps the last two axes)
// Each head's values are computed as the ops compute them: the same gemm calls on the same operands (only
// the live queries' rows, which no other row's sums involve), each reduction from the first element to the last
// in fp32, each elementwise result in fp32, every op's result rounded to fp16. So the kernel is the ops bit for
// bit for any data; what it saves is ~20 kernel calls per head group and layer, their frame traffic, and the
// dead queries' rows (a check of 3 drafts in an 8-token bucket). The caches are the matmuls' y operands, read in
// place in fp16 (as the decode attention's): no fp32 copy of a layer's cache is made for a check.
#pragma once

#include <cstdint>

#include "emulator/decode_attention.h"

namespace orion::emu {

struct ChunkAttention {
    int64_t heads = 0;      // H: batches of the matmuls
    int64_t depth = 0;      // D: q, k, v and output rows
    int64_t seq = 0;        // S: the chunk's queries (= its keys)
    int64_t positions = 0;  // T: cached positions
    int64_t past_mask_rows = 1;  // 1: one [T] row for every query, S: a row per query (a sliding window's)
};

// Live extents, as the ops take them from live-lanes hints: the first `queries` queries are computed (the
// output is defined on those lanes only), the past scores, their softmax and sum cover the first `scored`
// positions and the past context's sum the first `summed` (<= scored); the own scores cover the chunk's first
// `own_scored` keys and the own context's sum the first `own_summed` (<= own_scored).
struct ChunkLive {
    int64_t queries = 0, scored = 0, summed = 0, own_scored = 0, own_summed = 0;
};

// out [H, D, S] as above (its dead queries' lanes 0); q, k, v [H, D, S], keys and values [H, D, T], past_mask
// [past_mask_rows, T], own_mask [S, S]; k, v, keys and values fp32 or fp16 read in place (the matmuls' y).
void run_chunk_attention(const ChunkAttention& a, const ChunkLive& live, const float* q, CacheView k, CacheView v,
                         CacheView keys, CacheView values, const float* past_mask, const float* own_mask,
                         float exponent, float* out);

}  // namespace orion::emu
