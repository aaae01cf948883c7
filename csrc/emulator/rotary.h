// Rotary position embedding as the Llama family's graphs write it (models/llama/graphs.py apply_rope),
// computed as one kernel instead of its 4 MIL ops per call:
//   mate = matmul(partner, x)                 (partner: [1, 1, D, D] const, x: [1, H, D, S])
//   out  = add(mul(x, cos), mul(mate, sin))   (cos, sin: [1, 1, D, S], broadcast over the heads)
// Each head's values are computed as the ops compute them: the same matmul kernel (kernels::gemm) on the
// same operands, or, for a signed-permutation partner and finite values, the permutation itself (what that
// gemm computes, exactly: see Rotary::mate); each product and sum in fp32, every op's result rounded to fp16.
// So the kernel's result is the ops' bit for bit for any data; a decode step runs 4 of these per layer. A training
// step's layer gradient runs the chain of the input gradient (run_rotary_gradient) twice.
#pragma once

#include <cstdint>
#include <vector>

namespace orion::emu {

struct Rotary {
    int64_t heads = 0, depth = 0, lanes = 0;  // H, D, S
    // When the partner is a signed permutation (each row one +-1, zeros elsewhere: models/llama/graphs.py
    // rope_partner), row c of the matmul is sign[c] * x[mate[c]]: the gemm sums that one exact product and
    // zeros from +0, so it gives exactly sign * x (+0 for a zero) while x is finite. Empty: any other partner.
    std::vector<int64_t> mate;
    std::vector<float> sign;
};

// The signed permutation `partner` ([D, D]), or its transpose when `transposed`, stands for, in r.mate and r.sign
// (left empty when it is none).
void read_permutation(const float* partner, Rotary& r, bool transposed = false);

// out = the rotated x, both [H, D, S]; partner [D, D]; cos and sin [D, S]. With live lanes, as the ops: the
// matmul covers x's first `x_lanes` lanes, the rest the first `live` lanes of each row (the caller passes S for
// rows the ops compute whole); the rest of out is left as it was.
void run_rotary(const Rotary& r, int64_t x_lanes, int64_t live, const float* x, const float* partner, const float* cos,
                const float* sin, float* out);

// The input gradient of the embedding, as the autodiff transform writes it (autodiff/transform.py):
//   out = add(mul(dy, cos), matmul(partner, mul(dy, sin), transpose_x = true))
// computed the same way: the products rounded to fp16, the transposed partner's matmul by the same gemm call as
// the op's (or, for a signed permutation and finite values, the transpose's permutation, read into r by
// read_permutation(..., transposed = true): what that gemm computes exactly), the sum rounded. Every lane of dy,
// cos and sin ([H, D, S], [D, S], [D, S]) is computed.
void run_rotary_gradient(const Rotary& r, const float* dy, const float* partner, const float* cos, const float* sin,
                         float* out);

}  // namespace orion::emu
