// Rotary position embedding as the Llama family's graphs write it (models/llama/graphs.py apply_rope),
// computed as one kernel instead of its 4 MIL ops per call:
//   mate = matmul(partner, x)                 (partner: [1, 1, D, D] const, x: [1, H, D, S])
//   out  = add(mul(x, cos), mul(mate, sin))   (cos, sin: [1, 1, D, S], broadcast over the heads)
// Each head's values are computed as the ops compute them: the same matmul kernel (kernels::gemm) on the
// same operands, each product and sum in fp32, every op's result rounded to fp16. So the kernel's result
// is the ops' bit for bit for any data; a decode step runs 4 of these per layer.
#pragma once

#include <cstdint>

namespace orion::emu {

struct Rotary {
    int64_t heads = 0, depth = 0, lanes = 0;  // H, D, S
};

// out = the rotated x, both [H, D, S]; partner [D, D]; cos and sin [D, S].
void run_rotary(const Rotary& r, const float* x, const float* partner, const float* cos, const float* sin, float* out);

}  // namespace orion::emu
