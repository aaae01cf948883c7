// LayerNorm's and RMSNorm's overflow-safe normalization (python/orion/ops/reduction.py stable_norm) over the
// channels of [1, C, 1, S], computed as one kernel instead of its 17 (RMSNorm) or 20 (LayerNorm) MIL ops:
//   top  = reduce_max(x, 1);  bottom = reduce_max(mul(x, neg_y), 1)
//   peak = add(top, relu(sub(bottom, top)));  inv = pow(add(peak, floor), inv_y)
//   y    = mul(x, inv)                                   (LayerNorm: y = sub(y, mul(reduce_sum(y, 1), mean_y)))
//   rstd = pow(add(mul(reduce_sum(mul(y, y), 1), meansq_y), mul(r, r)), rsqrt_y),  r = mul(inv, root_eps_y)
//   out  = mul(y, rstd)                                  (then, when the chain has them, mul(out, gamma), add(.., beta))
// Every value is computed as its op computes it: each elementwise result in fp32, each reduction over the
// channels from the first to the last in fp32, every op's result rounded to fp16. So the kernel's result is the
// ops' bit for bit for any data; what it saves is a decode step's ~20 kernel calls per norm, and a prompt's ~20
// passes over [C, S] with the intermediates they write (GPT-2 124M's 1,024-lane layer: 9 MiB of them at its peak).
#pragma once

#include <cstdint>

namespace orion::emu {

struct StableNorm {
    int64_t channels = 0, lanes = 0;  // C, S
    bool center = false;              // LayerNorm (subtract the mean) or RMSNorm
    // The scalar consts of the chain, as the frame holds them (fp16 values).
    float neg_y = -1.0f, floor = 0.0f, inv_y = -1.0f, mean_y = 0.0f, meansq_y = 0.0f, root_eps_y = 0.0f, rsqrt_y = -0.5f;
    int64_t gamma_stride = 1, beta_stride = 1;  // 1: a value per channel; 0: one value for every channel
};

// Lanes one kernel pass normalizes together (a decode step's are fewer); a prompt's longer rows go in blocks of
// them, each gathered from the rows, normalized in the caches and scattered back, the blocks on every thread.
constexpr int64_t kStableNormBlockLanes = 64;

// out = the normalized x, both [C, S] channel-major (S = n.lanes), for the first `live` lanes (the rest of out
// untouched); then times gamma[c] and plus beta[c] where given (each null when the chain has no such op).
void run_stable_norm(const StableNorm& n, int64_t live, const float* x, const float* gamma, const float* beta,
                     float* out);

}  // namespace orion::emu
