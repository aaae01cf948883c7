// Causal attention computed as one kernel: the MIL chain
//   s = matmul(q, k, transpose_x)   [B, S, S]    (q, k: [B, D, S])
//   t = mul(s, scale)                            (optional scalar const)
//   u = add(t, mask)                             (const [S, S]: 0 on and below the diagonal, <= -65504 above)
//   p = softmax(u, axis = -1)
//   o = matmul(v, p, transpose_y)   [B, Dv, S]   (v: [B, Dv, S])
// with the work above the diagonal skipped. Each row i of the scores is computed over the keys
// [0, L_i), L_i = i + 1 rounded up to 16, and the rest are taken as exact zeros of p.
//
// That is exact, not an approximation, when every |q_i . k_j| * |scale| stays well inside fp16
// (checked per call from the column norms: Cauchy-Schwarz): a masked score is then at most
// -65504 / 2, so its exponential underflows to exactly 0 in fp32 and it moves neither the row's
// max nor its sum, and the softmax and matmul kernels reach bit for bit what the five ops compute
// (row prefixes of whole vector widths keep the sums' order; only an exact zero's sign may differ).
// When the check fails (large or non-finite activations) the caller runs the five ops.
#pragma once

#include <cstdint>
#include <vector>

namespace orion::emu {

struct CausalAttention {
    int64_t batches = 0;        // B (heads, or query groups)
    int64_t depth = 0;          // D: q and k rows
    int64_t value_depth = 0;    // Dv: v rows
    int64_t seq = 0;            // S: queries = keys
    std::vector<int64_t> q_offset, k_offset, v_offset;  // per batch, in elements
    bool round_scores = true, round_scaled = true, round_masked = true, round_probs = true, round_out = true;
    bool has_scale = false;
};

// Whether the fused form applies to these shapes (S a multiple of 64, Dv of at least 16: the
// shapes whose gemm calls take the same kernel path as the unfused ops').
bool causal_attention_applies(int64_t seq, int64_t value_depth);

// Computes o as above, or returns false (writing nothing) when the exactness check fails.
// scale is read only when has_scale; mask is the [S, S] additive mask, row-major.
// `live`: the leading lanes (queries = keys) that hold data (a live-lanes hint; S when all do). Only the
// query blocks holding live queries are computed, up to the last live query's group of 16 rows and over the
// keys those rows reach (the keys past a live row's L_i hold only exact-0 probabilities, and leaving those zero
// terms out of the sums leaves them bit for bit), and o is defined on its live lanes only. The dead lanes those
// rows read, within [live, dead_end(a, live)), must be finite (the caller zeroes them): a dead query's row is
// computed and ignored, and a dead key is a masked key of some live row, read with its probability an exact 0.
bool run_causal_attention(const CausalAttention& a, const float* q, const float* k, const float* v, float scale,
                          const float* mask, float* out, int64_t live);

// The probabilities p of the chain above (its first four ops: o is not computed), every lane, into `probs`
// ([batches, S, S]): each row i over the keys [0, L_i) and exact zeros after, what the ops compute bit for bit
// under the same check (a layer gradient's recomputed attention: the gemm of its scores over the lower blocks
// only). Returns false (writing nothing) when the check fails. value_depth and v_offset are not read.
bool run_causal_probabilities(const CausalAttention& a, const float* q, const float* k, float scale, const float* mask,
                              float* probs);

// The end of the dead lanes run_causal_attention reads with `live` lanes live: the end of the last live
// query's group of 16 (the rows it computes and the keys they reach).
int64_t causal_attention_dead_end(const CausalAttention& a, int64_t live);

}  // namespace orion::emu
