// The SIMD flavours the emulator's kernel files share (internal): the target attributes of their
// AVX2 and AVX-512 functions, the unroll pragma their register tiles need, and the flavour this
// process runs (picked once, from the CPU and ORION_SIMD).
#pragma once

#include <cstddef>
#include <cstdint>

#include "emulator/fp16.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ORION_X86 1
#define ORION_AVX2 __attribute__((target("avx2,fma,f16c")))
#define ORION_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
#endif

// Fully unrolls a constant-trip loop so that arrays of vector accumulators live in registers (GCC
// otherwise keeps them on the stack).
#if defined(__clang__)
#define ORION_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define ORION_UNROLL _Pragma("GCC unroll 16")
#else
#define ORION_UNROLL
#endif

namespace orion::emu::kernels {

enum class SimdFlavour { portable, avx2, avx512 };

// The widest flavour this CPU runs, narrowed by ORION_SIMD=avx2 or ORION_SIMD=portable; the same for
// the whole process (kernels::simd_path names it).
SimdFlavour simd_flavour();

#ifdef ORION_X86
// A weight stream's line read ahead of the tile that reads it once, non-temporally: the stream (a decode step's
// whole weights, hundreds of MB) then evicts less of the caches' activations, KV cache lines and interpreter
// state. In-process A/B on this Zen 4 (ab_env, 16 rounds of 63 steps): SmolLM2-135M lut4 0.90-0.97x the step time,
// int4 0.98x, fp16 0.99x, GPT-2 124M 1.00x.
inline void prefetch_streamed(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_NTA); }
#endif

// The fp16 conversions and vector helpers every kernel file uses.
inline void round_fp16_portable(float* data, size_t n) {
    for (size_t i = 0; i < n; ++i) data[i] = emu::round_to_fp16(data[i]);
}

inline void half_to_float_portable(const uint16_t* src, float* dst, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = emu::half_to_float(src[i]);
}

#ifdef ORION_X86
ORION_AVX2 inline void round_fp16_avx2(float* data, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(data + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(data + i), _MM_FROUND_TO_NEAREST_INT)));
    for (; i < n; ++i) data[i] = emu::round_to_fp16(data[i]);
}

ORION_AVX2 inline void half_to_float_avx2(const uint16_t* src, float* dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
    for (; i < n; ++i) dst[i] = emu::half_to_float(src[i]);
}

ORION_AVX2 inline __m256 load8(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
ORION_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

ORION_AVX2 inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif  // ORION_X86

}  // namespace orion::emu::kernels
