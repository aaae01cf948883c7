#include "train/adamw.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "emulator/kernels.h"
#include "emulator/simd.h"
#include "hardware_limits.h"
#include "train/blocks.h"
#include "train/train_error.h"

namespace orion::train {

namespace {

// half[i] = fp16(p[i] with finite values clamped to +-FP16_MAX) for i < n; returns the count clamped.
// Branch-free (bit tests, min/max) so the clamp vectorizes; the fp16 rounding is the kernels' F16C one.
int64_t write_half(const float* p, uint16_t* half, int64_t n) {
    constexpr int64_t kChunk = 1024;
    const float limit = static_cast<float>(limits::FP16_MAX);
    float clamped[kChunk];
    int64_t count = 0;
    for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
        const int64_t m = std::min(kChunk, n - c0);
        int32_t chunk_count = 0;
        for (int64_t i = 0; i < m; ++i) {
            const float x = p[c0 + i];
            uint32_t bits;
            std::memcpy(&bits, &x, sizeof bits);
            const bool finite = (bits & 0x7f800000u) != 0x7f800000u;
            const float y = std::min(std::max(x, -limit), limit);
            clamped[i] = finite ? y : x;  // NaN and Inf as they are
            chunk_count += (finite && y != x) ? 1 : 0;
        }
        count += chunk_count;
        emu::kernels::float_to_half(clamped, half + c0, static_cast<size_t>(m));
    }
    return count;
}

struct Coefficients {
    float gs, one_minus_b1, b2, one_minus_b2, decay, step_size, bias2_sqrt, eps;
};

// The scalar loop's operations in order (no FMA), four lanes (SSE2, the baseline) or eight (AVX2) at a
// time: every lane's bits are the scalar loop's. Returns the first index left to the scalar loop.
int64_t update_sse2(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                    int64_t i, int64_t end, const Coefficients& k) {
#if defined(__SSE2__)
    // written out because std::sqrt's errno keeps GCC from vectorizing the scalar loop
    const __m128 v_gs = _mm_set1_ps(k.gs), v_1mb1 = _mm_set1_ps(k.one_minus_b1), v_b2 = _mm_set1_ps(k.b2),
                 v_1mb2 = _mm_set1_ps(k.one_minus_b2), v_decay = _mm_set1_ps(k.decay),
                 v_step = _mm_set1_ps(k.step_size), v_bias2 = _mm_set1_ps(k.bias2_sqrt), v_eps = _mm_set1_ps(k.eps);
    for (; i + 4 <= end; i += 4) {
        const __m128 gi = _mm_mul_ps(_mm_loadu_ps(g + i), v_gs);
        const __m128 m0 = _mm_loadu_ps(m + i), v0 = _mm_loadu_ps(v + i);
        const __m128 mi = _mm_add_ps(m0, _mm_mul_ps(v_1mb1, _mm_sub_ps(gi, m0)));
        const __m128 vi = _mm_add_ps(_mm_mul_ps(v0, v_b2), _mm_mul_ps(_mm_mul_ps(v_1mb2, gi), gi));
        _mm_storeu_ps(m + i, mi);
        _mm_storeu_ps(v + i, vi);
        const __m128 denom = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(vi), v_bias2), v_eps);
        const __m128 pi = _mm_sub_ps(_mm_mul_ps(_mm_loadu_ps(p + i), v_decay),
                                     _mm_mul_ps(v_step, _mm_div_ps(mi, denom)));
        _mm_storeu_ps(p + i, pi);
    }
#endif
    return i;
}

#ifdef ORION_X86
// "avx2" without "fma": GCC would fuse these multiplies and adds into FMAs (other bits) if it could.
__attribute__((target("avx2"))) int64_t update_avx2(float* __restrict p, const float* __restrict g,
                                                    float* __restrict m, float* __restrict v, int64_t i,
                                                    int64_t end, const Coefficients& k) {
    const __m256 v_gs = _mm256_set1_ps(k.gs), v_1mb1 = _mm256_set1_ps(k.one_minus_b1), v_b2 = _mm256_set1_ps(k.b2),
                 v_1mb2 = _mm256_set1_ps(k.one_minus_b2), v_decay = _mm256_set1_ps(k.decay),
                 v_step = _mm256_set1_ps(k.step_size), v_bias2 = _mm256_set1_ps(k.bias2_sqrt),
                 v_eps = _mm256_set1_ps(k.eps);
    for (; i + 8 <= end; i += 8) {
        const __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(g + i), v_gs);
        const __m256 m0 = _mm256_loadu_ps(m + i), v0 = _mm256_loadu_ps(v + i);
        const __m256 mi = _mm256_add_ps(m0, _mm256_mul_ps(v_1mb1, _mm256_sub_ps(gi, m0)));
        const __m256 vi = _mm256_add_ps(_mm256_mul_ps(v0, v_b2), _mm256_mul_ps(_mm256_mul_ps(v_1mb2, gi), gi));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), v_bias2), v_eps);
        const __m256 pi = _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(p + i), v_decay),
                                        _mm256_mul_ps(v_step, _mm256_div_ps(mi, denom)));
        _mm256_storeu_ps(p + i, pi);
    }
    return update_sse2(p, g, m, v, i, end, k);
}
#endif

}  // namespace

void check_hyper(const AdamWHyper& h) {
    auto fail = [](const std::string& what) { throw TrainError("AdamW: " + what); };
    if (!std::isfinite(h.lr) || h.lr < 0) fail("lr=" + std::to_string(h.lr) + " must be finite and >= 0");
    if (!(h.beta1 >= 0 && h.beta1 < 1)) fail("beta1=" + std::to_string(h.beta1) + " must be in [0, 1)");
    if (!(h.beta2 >= 0 && h.beta2 < 1)) fail("beta2=" + std::to_string(h.beta2) + " must be in [0, 1)");
    if (!(h.eps > 0) || !std::isfinite(h.eps)) fail("eps=" + std::to_string(h.eps) + " must be finite and > 0");
    if (!std::isfinite(h.weight_decay) || h.weight_decay < 0)
        fail("weight_decay=" + std::to_string(h.weight_decay) + " must be finite and >= 0");
    if (h.step < 1) fail("step=" + std::to_string(h.step) + " must be >= 1 (the 1-based index of this update)");
    if (!std::isfinite(h.grad_scale)) fail("grad_scale=" + std::to_string(h.grad_scale) + " must be finite");
}

int64_t adamw_step(const std::vector<AdamWTensor>& tensors, const AdamWHyper& h) {
    check_hyper(h);
    // Scalars as torch computes them (in double, then used against fp32 tensors).
    const double bias1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
    const double bias2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));
    const float step_size = static_cast<float>(h.lr / bias1);
    const float bias2_sqrt = static_cast<float>(std::sqrt(bias2));
    const float one_minus_b1 = static_cast<float>(1.0 - h.beta1);
    const float b2 = static_cast<float>(h.beta2), one_minus_b2 = static_cast<float>(1.0 - h.beta2);
    const float eps = static_cast<float>(h.eps), gs = static_cast<float>(h.grad_scale);
    const float decay_factor = static_cast<float>(1.0 - h.lr * h.weight_decay);

    std::atomic<int64_t> clamped{0};
    std::vector<int64_t> sizes;
    sizes.reserve(tensors.size());
    for (const auto& t : tensors) sizes.push_back(t.size);
#ifdef ORION_X86
    const bool avx2 = emu::kernels::simd_flavour() != emu::kernels::SimdFlavour::portable;
#endif
    for_each_block(sizes, [&](size_t which, int64_t begin, int64_t end) {
        const AdamWTensor& t = tensors[which];
        float* __restrict p = t.param;
        const float* __restrict g = t.grad;
        float* __restrict m = t.exp_avg;
        float* __restrict v = t.exp_avg_sq;
        const Coefficients k{gs, one_minus_b1, b2, one_minus_b2, t.decay ? decay_factor : 1.0f, step_size,
                             bias2_sqrt, eps};
        const float decay = k.decay;
#ifdef ORION_X86
        int64_t i = avx2 ? update_avx2(p, g, m, v, begin, end, k) : update_sse2(p, g, m, v, begin, end, k);
#else
        int64_t i = update_sse2(p, g, m, v, begin, end, k);
#endif
        for (; i < end; ++i) {
            // The operation order of torch's single-tensor AdamW (lerp for m, addcmul for v, addcdiv).
            const float gi = g[i] * gs;
            const float mi = m[i] + one_minus_b1 * (gi - m[i]);
            const float vi = v[i] * b2 + one_minus_b2 * gi * gi;
            m[i] = mi;
            v[i] = vi;
            p[i] = p[i] * decay - step_size * (mi / (std::sqrt(vi) / bias2_sqrt + eps));
        }
        if (t.half) clamped += write_half(p + begin, t.half + begin, end - begin);
    });
    return clamped.load();
}

}  // namespace orion::train
