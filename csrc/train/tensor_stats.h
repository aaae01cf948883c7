// Whole-tensor checks of training: the global gradient norm with a count of non-finite values, the
// clamp to the fp16 range at an fp32 -> fp16 crossing, and the loss-scale undo of a gradient program's
// results. None ever rewrites a NaN or an Inf.
#pragma once

#include <cstdint>
#include <vector>

namespace orion::train {

struct FloatSpan {
    const float* data;
    int64_t size;
};

struct SquaresAndNonfinite {
    double sum_of_squares;  // over the finite values only
    int64_t nonfinite;      // NaN and +-Inf values
};

// One pass over all tensors. Deterministic: the same result with any thread count.
SquaresAndNonfinite sum_of_squares(const std::vector<FloatSpan>& tensors);

struct ClampCounts {
    int64_t clamped;    // finite values beyond +-limit, now +-limit
    int64_t nonfinite;  // NaN and +-Inf values, left as they are
};

// Clamps finite values to [-limit, limit] in place; NaN and Inf are counted and left untouched.
ClampCounts clamp_finite(float* data, int64_t size, float limit);

// dst[i] = float(src[i]) / divisor in fp32 (src fp16 bits when `half`, else fp32), as numpy's
// np.divide(src, divisor, dtype=float32) rounds it; with `add`, dst[i] += that quotient (numpy's
// dst += quotient). Returns how many quotients are NaN or Inf. One parallel pass: a gradient program's
// fp16 result unscaled, widened, checked (and accumulated) at once.
int64_t unscale(const void* src, bool half, float* dst, int64_t size, float divisor, bool add);

}  // namespace orion::train
