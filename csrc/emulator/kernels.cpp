// Kernels: portable C++ drivers (packing, blocking, threading) around small inner kernels that
// come in two flavours, AVX2+F16C+FMA and portable, picked once at run time. The matrix multiply is
// gemm.cpp's.
#include "emulator/kernels.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cmath>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <limits>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <type_traits>
#include <stdexcept>
#include <string>

#include "emulator/buffer_pool.h"
#include "emulator/conv_tiles.h"
#include "emulator/keyed_weights.h"
#include "emulator/fp16.h"
#include "emulator/huge_pages.h"
#include "emulator/simd.h"
#include "emulator/weight_prefetch.h"

#ifdef ORION_X86
#include <cpuid.h>
#endif

namespace orion::emu::kernels {
namespace {

constexpr int kConvMaxLanes = 12;      // lanes per conv register tile, at most (see Kernels::conv_lanes)
constexpr int64_t kConvKBlock = 128;   // input channels per fp32 weight slice (8 KiB, stays in L1)
constexpr int kConvConvertBlocks = 3;  // from this many lane tiles on, convert weights once per slice
// Lanes per conv job on long rows: the job's accumulators (16 KiB) stay in L1 and its input slice
// (kConvKBlock x 256 fp32, 128 KiB) in L2, instead of streaming all lanes once per panel.
constexpr int64_t kConvLaneChunk = 256;
// Panels per conv job on long rows: each slice of x (kConvKBlock x kConvLaneChunk) is read from memory
// once for all of them; their accumulators (64 KiB) and the slice stay in L2.
constexpr int64_t kConvGroup = 4;
constexpr int64_t kCompactLanes = 4;  // conv1x1 copies x's live lanes when there are at most this many
// Up to this many live lanes a conv1x1 waits on its weights' stream as much as on its FMAs (GPT-2's 3072 -> 16384,
// 100 MB: 8 lanes 2.3-2.4 ms, one lane 2.2), so the next weights are read while other ops run (weight_prefetch.h).
// An 8-lane GPT-2 124M decode step, in process, 4 alternations of 7 batches: +0.3% to +4.7% tok/s.
constexpr int64_t kStreamBoundLanes = 8;
constexpr size_t kCompactKeptFloats = size_t{1} << 17;  // a larger copy of them is pooled, not kept by its thread
constexpr int64_t kParallelWork = int64_t{1} << 16;  // multiply-adds worth a chunk of their own
// Most lanes of a tile of three fp16 panels (Kernels::conv_group_tile_f16): 3 x 8 accumulators of 32 registers.
constexpr int kConvTripleLanes = 8;
// Rows of an fp16 panel (32 bytes each) the group tiles prefetch ahead of the row they read.
constexpr int64_t kConvPrefetchRows = kConvPrefetchBytes / (kConvPanel * sizeof(uint16_t));

// The inner kernels of one SIMD flavour.
struct Kernels {
    const char* name;
    int conv_lanes;  // lanes per conv register tile (<= kConvMaxLanes): what its registers hold
    void (*round_fp16)(float* data, size_t n);
    void (*half_to_float)(const uint16_t* src, float* dst, size_t n);
    void (*float_to_half)(const float* src, uint16_t* dst, size_t n);
    void (*tanh)(const float* src, float* dst, size_t n);
    void (*sigmoid)(const float* src, float* dst, size_t n);
    // dst[i] = e^(src[i] - max) / sum_j e^(src[j] - max) for i < n; src may be dst.
    void (*softmax)(const float* src, float* dst, int64_t n);
    // dst[i] = e^(src[i] - max) * (1 / (sum_j e^(src[j] - max) * count)) for i < n, the sum in numpy's order;
    // returns max + log(sum) (the log-sum-exp); src may be dst.
    double (*scaled_softmax)(const float* src, float* dst, int64_t n, float count);
    void (*score_row_softmax)(float* row, const float* mask, int64_t n, const ScoreRowOps& ops);
    // acc[l*16 + j] (+)= sum_{c<k} w[c*16 + j] * x[c*S + l] for l < lanes (<= conv_lanes).
    void (*conv_tile_f16)(const uint16_t* w, const float* x, int64_t S, int64_t k, int lanes, float* acc, bool add);
    void (*conv_tile_f32)(const float* w, const float* x, int64_t S, int64_t k, int lanes, float* acc, bool add);
    // conv_tile_f16 (the same sums) that also writes the rows widened to fp32, w32[c*16 + j] = w[c*16 + j] (null
    // when the flavour has none: conv_panels then widens them apart).
    void (*conv_widen_tile_f16)(const uint16_t* w, float* w32, const float* x, int64_t S, int64_t k, int lanes,
                                float* acc, bool add);
    // conv_tile_f16 with int8 weights w[c*16 + j] standing for the fp32 product w[c*16 + j] * scale[j]
    // (w[c*16 + j] itself when scale is null).
    void (*conv_tile_i8)(const int8_t* w, const float* scale, const float* x, int64_t S, int64_t k, int lanes,
                         float* acc, bool add);
    // dst[r*16 + j] = w[r*16 + j] * scale[j] (w[r*16 + j] when scale is null) in fp32 for r < rows:
    // int8 panel rows widened.
    void (*dequant_i8)(const int8_t* w, const float* scale, float* dst, int64_t rows);
    // Two panels at once (null when the flavour has no registers for it): acc[l*32 + j] (+)=
    // sum_{c<k} w[c*32 + j] * x[c*S + l] for l < lanes (<= conv_lanes), one sum per output in c order.
    void (*conv_pair_tile_f32)(const float* w, const float* x, int64_t S, int64_t k, int lanes, float* acc, bool add);
    // conv_tile_f16 over rows c0 .. c0 + k of a low-bit panel, each weight decoded exactly to fp32.
    void (*conv_tile_q)(const QPanel& p, int64_t c0, const float* x, int64_t S, int64_t k, int lanes, float* acc,
                        bool add);
    // dst[r*16 + j] = the weight of row c0 + r, output j, in fp32, for r < rows.
    void (*widen_q)(const QPanel& p, int64_t c0, float* dst, int64_t rows);
    // `count` fp16 panels at once (null when the flavour has no registers for it): acc[g][l*16 + j] (+)=
    // sum_{c<k} w[g][c*16 + j] * x[c*S + l] for g < count and l < lanes, lanes in [kConvSequentialLanes,
    // conv_lanes]: each output summed as conv_tile_f16 sums it for those lanes. count is 2, or 3 for up to
    // kConvTripleLanes lanes.
    void (*conv_group_tile_f16)(const uint16_t* const* w, int count, const float* x, int64_t S, int64_t k, int lanes,
                                float* const* acc, bool add);
    // `count` (2 or 3) fp16 panels w[0..count) at one lane (decode; null when the flavour has none): acc[g*16 + j] =
    // sum_{c<k} w[g][c*16 + j] * x[c*S], each output summed as conv_tile_f16 sums it at one lane, the panels'
    // rows read as `count` streams at once.
    void (*conv_group_tile_f16_one)(const uint16_t* const* w, int count, const float* x, int64_t S, int64_t k,
                                    float* acc);
};

// ---------------------------------------------------------------------------------------------
// Portable flavour: plain loops (auto-vectorised where the compiler can), exact conversions.

void float_to_half_portable(const float* src, uint16_t* dst, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = emu::float_to_half(src[i]);
}

void tanh_portable(const float* src, float* dst, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = std::tanh(src[i]);
}

void sigmoid_portable(const float* src, float* dst, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = 1.0f / (1.0f + std::exp(-src[i]));
}

// std::exp, skipping the call where its fp32 result is exactly 0 (a masked score): below
// ln(smallest denormal / 2), about -103.97.
inline float exp_or_zero(float d) { return d < -110.0f ? 0.0f : std::exp(d); }

void softmax_portable(const float* src, float* dst, int64_t n) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) m = std::max(m, src[i]);
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) sum += (dst[i] = exp_or_zero(src[i] - m));
    for (int64_t i = 0; i < n; ++i) dst[i] /= sum;
}

// sum of a[0..n) in fp32 in numpy's order (np.sum's pairwise_sum): under 8 values one by one; up to 128 in 8
// partial sums combined as ((0+1)+(2+3))+((4+5)+(6+7)), then the rest one by one; more split in two halves, the
// first a multiple of 8 long. The cross-entropy's gradient then rounds as numpy's did.
float numpy_pairwise_sum(const float* a, int64_t n) {
    if (n < 8) {
        float res = -0.0f;
        for (int64_t i = 0; i < n; ++i) res += a[i];
        return res;
    }
    if (n <= 128) {
        float r[8];
        std::copy(a, a + 8, r);
        int64_t i = 8;
        for (; i < n - n % 8; i += 8)
            for (int j = 0; j < 8; ++j) r[j] += a[i + j];
        float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; ++i) res += a[i];
        return res;
    }
    const int64_t half = n / 2 - (n / 2) % 8;
    return numpy_pairwise_sum(a, half) + numpy_pairwise_sum(a + half, n - half);
}

double scaled_softmax_portable(const float* src, float* dst, int64_t n, float count) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) m = std::max(m, src[i]);
    for (int64_t i = 0; i < n; ++i) dst[i] = exp_or_zero(src[i] - m);
    const float sum = numpy_pairwise_sum(dst, n);
    const float r = 1.0f / (sum * count);
    for (int64_t i = 0; i < n; ++i) dst[i] *= r;
    return static_cast<double>(m) + std::log(static_cast<double>(sum));
}

// The score row ops one by one, each with the flavour's own kernels.
template <void (*Round)(float*, size_t), void (*Softmax)(const float*, float*, int64_t)>
void score_row_softmax_by_ops(float* row, const float* mask, int64_t n, const ScoreRowOps& ops) {
    const size_t count = static_cast<size_t>(n);
    if (ops.has_scale) {
        for (int64_t j = 0; j < n; ++j) row[j] *= ops.scale;
        if (ops.round_scaled) Round(row, count);
    }
    for (int64_t j = 0; j < n; ++j) row[j] += mask[j];
    if (ops.round_masked) Round(row, count);
    Softmax(row, row, n);
    if (ops.round_probs) Round(row, count);
}

constexpr Kernels kPortable = {
    "portable",         6,                             round_fp16_portable,           half_to_float_portable,
    float_to_half_portable, tanh_portable, sigmoid_portable, softmax_portable, scaled_softmax_portable,
    score_row_softmax_by_ops<round_fp16_portable, softmax_portable>, conv_tile_portable<uint16_t>, conv_tile_portable<float>,
    nullptr,
    conv_tile_i8_portable, dequant_i8_portable, nullptr, conv_tile_q_portable, widen_q_portable, nullptr, nullptr,
};

// ---------------------------------------------------------------------------------------------
// AVX2 + F16C + FMA flavour.
#ifdef ORION_X86

ORION_AVX2 void float_to_half_avx2(const float* src, uint16_t* dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; ++i) dst[i] = emu::float_to_half(src[i]);
}

// How a conv tile reads row c (16 weights of one input channel) of a panel, as two fp32 halves.
template <typename W>
struct PlainRows8 {
    static constexpr int64_t kRowBytes = kConvPanel * sizeof(W);
    static constexpr bool kStreamed = sizeof(W) == 2;
    const W* w;
    const W* at(int64_t c) const { return w + c * kConvPanel; }
    ORION_AVX2 __m256 lo(int64_t c) const { return load8(w + c * kConvPanel); }
    ORION_AVX2 __m256 hi(int64_t c) const { return load8(w + c * kConvPanel + 8); }
};

template <typename W>
ORION_AVX2 void conv_tile_avx2(const W* w, const float* x, int64_t S, int64_t k, int lanes, float* acc, bool add) {
    conv_tile_avx2_rows(PlainRows8<W>{w}, x, S, k, lanes, acc, add);
}

// fp16 rows read as PlainRows8 reads them, each also stored widened to w32 (row c at w32 + 16 c).
struct WideningRows8 {
    static constexpr int64_t kRowBytes = kConvPanel * sizeof(uint16_t);
    static constexpr bool kStreamed = true;
    const uint16_t* w;
    float* w32;
    const uint16_t* at(int64_t c) const { return w + c * kConvPanel; }
    ORION_AVX2 __m256 lo(int64_t c) const { return widen(c * kConvPanel); }
    ORION_AVX2 __m256 hi(int64_t c) const { return widen(c * kConvPanel + 8); }
    ORION_AVX2 __m256 widen(int64_t i) const {
        const __m256 v = load8(w + i);
        _mm256_storeu_ps(w32 + i, v);
        return v;
    }
};

ORION_AVX2 void conv_widen_tile_avx2(const uint16_t* w, float* w32, const float* x, int64_t S, int64_t k, int lanes,
                                     float* acc, bool add) {
    conv_tile_avx2_rows(WideningRows8{w, w32}, x, S, k, lanes, acc, add);
}

// e^x for x in [-88, 88]: x = k ln2 + r with |r| <= ln2/2, e^r by its Taylor series to r^7
// (relative error < 2e-8 there), scaled by 2^k through the exponent bits.
ORION_AVX2 inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.0f)), _mm256_set1_ps(88.0f));
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693145752f), x);  // ln2 split in a short high part
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.42860677e-6f), r);          // and the rest
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    for (const float c : {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f})
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
}

// Values i..n-1 (fewer than 8) through `kernel` as one zero-padded group of 8: the tail takes the vector code
// too, so a value's result does not depend on where it sits.
inline void padded_tail(void (*kernel)(const float*, float*, size_t), const float* src, float* dst, size_t i, size_t n) {
    if (i == n) return;
    float tail[8] = {};
    std::copy(src + i, src + n, tail);
    kernel(tail, tail, 8);
    std::copy(tail, tail + (n - i), dst + i);
}

// tanh(a) = 1 - 2 / (e^(2a) + 1) for a = |x| >= 1/16; an odd series below, where that form cancels. Every
// element by the vector code (see sigmoid_avx2); a NaN stays NaN.
ORION_AVX2 void tanh_avx2(const float* src, float* dst, size_t n) {
    const __m256 sign_bit = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(src + i);
        const __m256 a = _mm256_andnot_ps(sign_bit, x);
        const __m256 big = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(exp8(_mm256_add_ps(a, a)), one)));
        const __m256 a2 = _mm256_mul_ps(a, a);
        const __m256 series = _mm256_mul_ps(
            a, _mm256_fmadd_ps(a2, _mm256_fmadd_ps(a2, _mm256_set1_ps(2.0f / 15.0f), _mm256_set1_ps(-1.0f / 3.0f)), one));
        const __m256 t = _mm256_blendv_ps(big, series, _mm256_cmp_ps(a, _mm256_set1_ps(0.0625f), _CMP_LT_OQ));
        const __m256 signed_t = _mm256_or_ps(t, _mm256_and_ps(x, sign_bit));
        _mm256_storeu_ps(dst + i, _mm256_blendv_ps(signed_t, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q)));  // NaN stays NaN
    }
    padded_tail(tanh_avx2, src, dst, i, n);
}

// 1 / (1 + e^-x) with exp8 (its clamp to [-88, 88] gives 1 above 88 and below -88 a value under 1e-38,
// both as in fp32); a NaN stays NaN. Every element by the vector code, so a fused run's rows and the op's
// flat pass agree bit for bit.
ORION_AVX2 void sigmoid_avx2(const float* src, float* dst, size_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(src + i);
        const __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
        _mm256_storeu_ps(dst + i, _mm256_blendv_ps(s, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
    }
    padded_tail(sigmoid_avx2, src, dst, i, n);
}

ORION_AVX2 float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

// The largest of src[0..n) (n > 0) into m; whether the row holds a NaN or an infinity (the softmaxes then
// take IEEE's results from their portable forms).
ORION_AVX2 bool row_max_special(const float* src, int64_t n, float& m) {
    int64_t i = 0;
    __m256 mv = _mm256_set1_ps(-std::numeric_limits<float>::infinity()), nan = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(src + i);
        mv = _mm256_max_ps(mv, v);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    m = hmax(mv);
    bool special = _mm256_movemask_ps(nan) != 0;
    for (; i < n; ++i) m = std::max(m, src[i]), special |= std::isnan(src[i]);
    return special || !std::isfinite(m);
}

// The max is exact; e^x by exp8 (relative error < 2e-8; below e^-87 it may give 0, which no fp16
// result can tell from the true value since the sum is >= 1); the sum in 8 fp32 partial sums.
ORION_AVX2 void softmax_avx2(const float* src, float* dst, int64_t n) {
    if (n <= 0) return;
    float m;
    if (row_max_special(src, n, m)) return softmax_portable(src, dst, n);  // NaN or inf: IEEE's results
    const __m256 m8 = _mm256_set1_ps(m);
    __m256 sv = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(src + i), m8));
        _mm256_storeu_ps(dst + i, e);
        sv = _mm256_add_ps(sv, e);
    }
    float sum = hsum(sv);
    for (; i < n; ++i) sum += (dst[i] = exp_or_zero(src[i] - m));
    const __m256 s8 = _mm256_set1_ps(sum);
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_div_ps(_mm256_loadu_ps(dst + i), s8));
    for (; i < n; ++i) dst[i] /= sum;
}

// e^x of 4 doubles for x in [-110, 0]: x = k ln2 + r with |r| <= ln2/2 (ln2 split in two), e^r by its Taylor
// series to r^9 (relative error < 1e-11), scaled by 2^k through the exponent bits; below e^-110 (0 once rounded
// to fp32), e^-110.
ORION_AVX2 inline __m256d exp4d(__m256d x) {
    x = _mm256_max_pd(x, _mm256_set1_pd(-110.0));
    const __m256d k = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(1.4426950408889634)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256d r = _mm256_fnmadd_pd(k, _mm256_set1_pd(0.6931471803691238), x);
    r = _mm256_fnmadd_pd(k, _mm256_set1_pd(1.9082149292705877e-10), r);
    __m256d p = _mm256_set1_pd(1.0 / 362880.0);
    for (const double c : {1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0})
        p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(c));
    const __m256i exponent = _mm256_slli_epi64(
        _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(k)), _mm256_set1_epi64x(1023)), 52);
    return _mm256_mul_pd(p, _mm256_castsi256_pd(exponent));
}

// softmax_avx2's max; the exponentials nearly correctly rounded to fp32 (exp4d; exp8's 1/3-ulp error changes the
// rounding of ~1 value in 5), summed in numpy's order; then one product by 1 / (sum * count) per value: numpy's
// roundings of the cross-entropy's gradient but for its exp's last bits.
ORION_AVX2 double scaled_softmax_avx2(const float* src, float* dst, int64_t n, float count) {
    if (n <= 0) return -std::numeric_limits<double>::infinity();
    float m;
    if (row_max_special(src, n, m)) return scaled_softmax_portable(src, dst, n, count);  // IEEE's results
    int64_t i = 0;
    const __m256 m8 = _mm256_set1_ps(m);
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(src + i), m8);
        const __m128 e_lo = _mm256_cvtpd_ps(exp4d(_mm256_cvtps_pd(_mm256_castps256_ps128(d))));
        const __m128 e_hi = _mm256_cvtpd_ps(exp4d(_mm256_cvtps_pd(_mm256_extractf128_ps(d, 1))));
        _mm256_storeu_ps(dst + i, _mm256_set_m128(e_hi, e_lo));
    }
    for (; i < n; ++i) dst[i] = exp_or_zero(src[i] - m);
    const float sum = numpy_pairwise_sum(dst, n);
    const __m256 r8 = _mm256_set1_ps(1.0f / (sum * count));
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_loadu_ps(dst + i), r8));
    for (; i < n; ++i) dst[i] *= 1.0f / (sum * count);
    return static_cast<double>(m) + std::log(static_cast<double>(sum));
}

// score_row_softmax_by_ops<round_fp16_avx2, softmax_avx2> in three passes over the row when n is a
// multiple of 8 (the scaled, masked scores and their max; the exponentials and their sum; the quotients):
// the same fp32 operations on the same values in the same order (softmax_avx2's max and partial sums).
ORION_AVX2 void score_row_softmax_avx2(float* row, const float* mask, int64_t n, const ScoreRowOps& ops) {
    if (n % 8 != 0) return score_row_softmax_by_ops<round_fp16_avx2, softmax_avx2>(row, mask, n, ops);
    const __m256 scale = _mm256_set1_ps(ops.scale);
    __m256 mv = _mm256_set1_ps(-std::numeric_limits<float>::infinity()), nan = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        __m256 v = _mm256_loadu_ps(row + i);
        if (ops.has_scale) {
            v = _mm256_mul_ps(v, scale);
            __asm__("" : "+x"(v));  // the product is its own op: never contracted with the add into an FMA
            if (ops.round_scaled) v = round8(v);
        }
        v = _mm256_add_ps(v, _mm256_loadu_ps(mask + i));
        if (ops.round_masked) v = round8(v);
        _mm256_storeu_ps(row + i, v);
        mv = _mm256_max_ps(mv, v);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    const float m = n > 0 ? hmax(mv) : 0.0f;
    if (_mm256_movemask_ps(nan) != 0 || !std::isfinite(m)) {  // NaN or inf: softmax_avx2's IEEE path
        softmax_portable(row, row, n);
        if (ops.round_probs) round_fp16_avx2(row, static_cast<size_t>(n));
        return;
    }
    const __m256 m8 = _mm256_set1_ps(m);
    __m256 sv = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + i), m8));
        _mm256_storeu_ps(row + i, e);
        sv = _mm256_add_ps(sv, e);
    }
    const __m256 s8 = _mm256_set1_ps(hsum(sv));
    for (int64_t i = 0; i < n; i += 8) {
        const __m256 p = _mm256_div_ps(_mm256_loadu_ps(row + i), s8);
        _mm256_storeu_ps(row + i, ops.round_probs ? round8(p) : p);
    }
}

// N fp16 panels at one lane (adjacent in acc): conv_tile_avx2's sums at one lane (row c into partial sum c % 2,
// the tail rows into sum 0, the sums added in order), in 4N accumulators. A decode step streams its weights from
// memory once, and panels read together keep several streams in flight where one panel's leaves the memory
// system idler (a standalone copy on this 2-core Zen, one thread: one panel 14-15 GB/s, two 18-19, three 20-21).
template <int N>
ORION_AVX2 void conv_group_tile_f16_one_fixed(const uint16_t* const* w, const float* x, int64_t S, int64_t k,
                                              float* acc) {
    constexpr int U = 2;
    PlainRows8<uint16_t> rows[N];
    __m256 lo[N][U][1], hi[N][U][1];
    ORION_UNROLL
    for (int p = 0; p < N; ++p) {
        rows[p] = PlainRows8<uint16_t>{w[p]};
        conv_tile_start<1, U>(lo[p], hi[p], acc + p * kConvPanel, false);
    }
    int64_t c = 0;
    for (; c + U <= k; c += U) {  // U rows: one cache line of each panel
        ORION_UNROLL
        for (int p = 0; p < N; ++p) prefetch_row<1>(rows[p], c, 0);
        ORION_UNROLL
        for (int u = 0; u < U; ++u) {
            const __m256 xv = _mm256_broadcast_ss(x + (c + u) * S);
            ORION_UNROLL
            for (int p = 0; p < N; ++p) {
                lo[p][u][0] = _mm256_fmadd_ps(rows[p].lo(c + u), xv, lo[p][u][0]);
                hi[p][u][0] = _mm256_fmadd_ps(rows[p].hi(c + u), xv, hi[p][u][0]);
            }
        }
    }
    ORION_UNROLL
    for (int p = 0; p < N; ++p) conv_tile_finish<1, U>(lo[p], hi[p], rows[p], x, S, c, k, acc + p * kConvPanel);
}

ORION_AVX2 void conv_group_tile_f16_one_avx2(const uint16_t* const* w, int count, const float* x, int64_t S, int64_t k,
                                             float* acc) {
    if (count == 3) return conv_group_tile_f16_one_fixed<3>(w, x, S, k, acc);
    conv_group_tile_f16_one_fixed<2>(w, x, S, k, acc);
}

constexpr Kernels kAvx2 = {
    "avx2+f16c+fma",    6,                         round_fp16_avx2,           half_to_float_avx2,
    float_to_half_avx2, tanh_avx2, sigmoid_avx2, softmax_avx2, scaled_softmax_avx2, score_row_softmax_avx2,
    conv_tile_avx2<uint16_t>, conv_tile_avx2<float>, conv_widen_tile_avx2,
    conv_tile_i8_avx2, dequant_i8_avx2, nullptr, conv_tile_q_avx2, widen_q_avx2, nullptr, conv_group_tile_f16_one_avx2,
};

// ---------------------------------------------------------------------------------------------
// AVX-512 flavour: the AVX2 kernels, with a conv tile holding a whole panel (16 outputs) of one
// lane in one register, so a tile spans up to 12 lanes. Each output sums its inputs exactly as the
// AVX2 tile with the same lane count does (same partial sums, same order).

template <typename W>
struct PlainRows16 {
    static constexpr int64_t kRowBytes = kConvPanel * sizeof(W);
    const W* w;
    const W* at(int64_t c) const { return w + c * kConvPanel; }
    ORION_AVX512 __m512 row(int64_t c) const { return load16(w + c * kConvPanel); }
};

template <typename W>
ORION_AVX512 void conv_tile_avx512(const W* w, const float* x, int64_t S, int64_t k, int lanes, float* acc, bool add) {
    conv_tile_avx512_rows(PlainRows16<W>{w}, x, S, k, lanes, acc, add);
}

// 32 outputs (two panels) x L lanes in 2L accumulators: two weight loads and L broadcasts feed 2L
// FMAs, half the loads per FMA of the one-panel tile.
template <int L>
ORION_AVX512 void conv_pair_tile_avx512_fixed(const float* w, const float* x, int64_t S, int64_t k, float* acc,
                                              bool add) {
    constexpr int64_t W = 2 * kConvPanel;
    __m512 lo[L], hi[L];
    ORION_UNROLL
    for (int l = 0; l < L; ++l) {
        lo[l] = add ? _mm512_loadu_ps(acc + l * W) : _mm512_setzero_ps();
        hi[l] = add ? _mm512_loadu_ps(acc + l * W + kConvPanel) : _mm512_setzero_ps();
    }
    for (int64_t c = 0; c < k; ++c) {
        const __m512 w_lo = _mm512_loadu_ps(w + c * W), w_hi = _mm512_loadu_ps(w + c * W + kConvPanel);
        const float* xc = x + c * S;
        ORION_UNROLL
        for (int l = 0; l < L; ++l) {
            const __m512 xv = _mm512_set1_ps(xc[l]);
            lo[l] = _mm512_fmadd_ps(w_lo, xv, lo[l]);
            hi[l] = _mm512_fmadd_ps(w_hi, xv, hi[l]);
        }
    }
    ORION_UNROLL
    for (int l = 0; l < L; ++l) {
        _mm512_storeu_ps(acc + l * W, lo[l]);
        _mm512_storeu_ps(acc + l * W + kConvPanel, hi[l]);
    }
}

ORION_AVX512 void conv_pair_tile_avx512(const float* w, const float* x, int64_t S, int64_t k, int lanes, float* acc,
                                        bool add) {
    switch (lanes) {
        case 1: return conv_pair_tile_avx512_fixed<1>(w, x, S, k, acc, add);
        case 2: return conv_pair_tile_avx512_fixed<2>(w, x, S, k, acc, add);
        case 3: return conv_pair_tile_avx512_fixed<3>(w, x, S, k, acc, add);
        case 4: return conv_pair_tile_avx512_fixed<4>(w, x, S, k, acc, add);
        case 5: return conv_pair_tile_avx512_fixed<5>(w, x, S, k, acc, add);
        case 6: return conv_pair_tile_avx512_fixed<6>(w, x, S, k, acc, add);
        case 7: return conv_pair_tile_avx512_fixed<7>(w, x, S, k, acc, add);
        case 8: return conv_pair_tile_avx512_fixed<8>(w, x, S, k, acc, add);
        case 9: return conv_pair_tile_avx512_fixed<9>(w, x, S, k, acc, add);
        case 10: return conv_pair_tile_avx512_fixed<10>(w, x, S, k, acc, add);
        case 11: return conv_pair_tile_avx512_fixed<11>(w, x, S, k, acc, add);
        default: return conv_pair_tile_avx512_fixed<12>(w, x, S, k, acc, add);
    }
}

// Row c of N fp16 panels times its L lanes of x, into their sums.
template <int N, int L>
ORION_AVX512 __attribute__((always_inline)) inline void fma_group_row(const uint16_t* const* w, const float* xc,
                                                                      int64_t c, __m512 (&sum)[N][L]) {
    __m512 rows[N];
    ORION_UNROLL
    for (int g = 0; g < N; ++g) rows[g] = load16(w[g] + c * kConvPanel);
    ORION_UNROLL
    for (int l = 0; l < L; ++l) {
        const __m512 xv = _mm512_set1_ps(xc[l]);
        ORION_UNROLL
        for (int g = 0; g < N; ++g) sum[g][l] = _mm512_fmadd_ps(rows[g], xv, sum[g][l]);
    }
}

// N fp16 panels x L lanes in N*L accumulators (at most 24 of the 32 registers), one partial sum per output
// (conv_tile_avx512's sums from kConvSequentialLanes lanes on): per row N weight loads and L broadcasts feed N*L
// FMAs. Three panels a tile run 10-11% faster than two at 4-8 lanes on this Zen 4, from memory or from L2
// (a standalone copy, one thread). Each panel's rows are prefetched kConvPrefetchRows ahead: a decode step
// streams them from memory, and the hardware prefetcher alone leaves the FMAs waiting.
template <int N, int L>
ORION_AVX512 void conv_group_tile_f16_avx512_fixed(const uint16_t* const* w, const float* x, int64_t S, int64_t k,
                                                   float* const* acc, bool add) {
    __m512 sum[N][L];
    ORION_UNROLL
    for (int g = 0; g < N; ++g)
        ORION_UNROLL
        for (int l = 0; l < L; ++l) sum[g][l] = add ? _mm512_loadu_ps(acc[g] + l * kConvPanel) : _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 2 <= k; c += 2) {  // two rows: one cache line of each panel
        ORION_UNROLL
        for (int g = 0; g < N; ++g)
            prefetch_streamed(w[g] + (c + kConvPrefetchRows) * kConvPanel);
        fma_group_row<N, L>(w, x + c * S, c, sum);
        fma_group_row<N, L>(w, x + (c + 1) * S, c + 1, sum);
    }
    if (c < k) fma_group_row<N, L>(w, x + c * S, c, sum);
    ORION_UNROLL
    for (int g = 0; g < N; ++g)
        ORION_UNROLL
        for (int l = 0; l < L; ++l) _mm512_storeu_ps(acc[g] + l * kConvPanel, sum[g][l]);
}

template <int N>
ORION_AVX512 void conv_group_tile_f16_avx512_lanes(const uint16_t* const* w, const float* x, int64_t S, int64_t k,
                                                   int lanes, float* const* acc, bool add) {
    switch (lanes) {
        case 4: return conv_group_tile_f16_avx512_fixed<N, 4>(w, x, S, k, acc, add);
        case 5: return conv_group_tile_f16_avx512_fixed<N, 5>(w, x, S, k, acc, add);
        case 6: return conv_group_tile_f16_avx512_fixed<N, 6>(w, x, S, k, acc, add);
        case 7: return conv_group_tile_f16_avx512_fixed<N, 7>(w, x, S, k, acc, add);
        default: return conv_group_tile_f16_avx512_fixed<N, 8>(w, x, S, k, acc, add);
    }
}

ORION_AVX512 void conv_group_tile_f16_avx512(const uint16_t* const* w, int count, const float* x, int64_t S, int64_t k,
                                             int lanes, float* const* acc, bool add) {
    if (count == 3) return conv_group_tile_f16_avx512_lanes<3>(w, x, S, k, lanes, acc, add);
    switch (lanes) {
        case 9: return conv_group_tile_f16_avx512_fixed<2, 9>(w, x, S, k, acc, add);
        case 10: return conv_group_tile_f16_avx512_fixed<2, 10>(w, x, S, k, acc, add);
        case 11: return conv_group_tile_f16_avx512_fixed<2, 11>(w, x, S, k, acc, add);
        case 12: return conv_group_tile_f16_avx512_fixed<2, 12>(w, x, S, k, acc, add);
        default: return conv_group_tile_f16_avx512_lanes<2>(w, x, S, k, lanes, acc, add);
    }
}

constexpr Kernels kAvx512 = {
    "avx512f+f16c+fma", kConvMaxLanes,             round_fp16_avx2,
    half_to_float_avx2, float_to_half_avx2,        tanh_avx2, sigmoid_avx2, softmax_avx2, scaled_softmax_avx2,
    score_row_softmax_avx2,
    conv_tile_avx512<uint16_t>, conv_tile_avx512<float>, nullptr, conv_tile_i8_avx512, dequant_i8_avx2,
    conv_pair_tile_avx512, conv_tile_q_avx512, widen_q_avx512, conv_group_tile_f16_avx512, nullptr,
};

bool cpu_has_avx2_f16c_fma() {
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & bit_F16C)) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");  // these also check OS support
}

bool cpu_has_avx512f() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");  // also checks that the OS saves the zmm state
}
#endif  // ORION_X86

// ---------------------------------------------------------------------------------------------

SimdFlavour select_flavour() {
    // ORION_SIMD=portable forces the portable path, ORION_SIMD=avx2 the AVX2 one (no AVX-512).
    const std::string env = std::getenv("ORION_SIMD") ? std::getenv("ORION_SIMD") : "";
    if (env == "portable") return SimdFlavour::portable;
#ifdef ORION_X86
    if (cpu_has_avx2_f16c_fma())
        return env != "avx2" && cpu_has_avx512f() ? SimdFlavour::avx512 : SimdFlavour::avx2;
#endif
    return SimdFlavour::portable;
}

const Kernels& active() {
    static const Kernels& kernels = [] () -> const Kernels& {
        switch (simd_flavour()) {
#ifdef ORION_X86
            case SimdFlavour::avx512: return kAvx512;
            case SimdFlavour::avx2: return kAvx2;
#endif
            default: return kPortable;
        }
    }();
    return kernels;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Scratch buffers reused by each thread across calls.
float* scratch(std::vector<float>& buffer, size_t n) {
    if (buffer.size() < n) buffer.resize(n);
    return buffer.data();
}

// Whether conv_panels converts the weights to fp32 once per slice for `lanes` lanes (enough tiles
// reuse them), which is also when two panels can share one job (Kernels::conv_pair_tile_f32).
bool converts_weights(const Kernels& k, int64_t cin, int64_t lanes) {
    return cin > 0 && lanes > (kConvConvertBlocks - 1) * k.conv_lanes;  // ceil(lanes / conv_lanes) >= blocks, undivided
}

// Whether fp16 panels over `lanes` lanes of x ([cin][lanes] fp32) are read by the flavour's group tiles, each tile
// widening its rows as it reads them, rather than converted once per slice (converts_weights): faster while x stays
// within kGroupTileXBytes (it is then read from L2/L3 row by row, not packed). AVX-512 on this 2-core Zen, best of
// 3 isolated runs, GFLOP/s of the two ways: 768->3072 conv at 32 lanes 335 vs 210, 64: 350 vs 283, 128: 351 vs 302,
// 1024: 306 vs 278; 3072->768 at 32: 398 vs 230, 256: 358 vs 307, but 512 (6 MiB of x): 307 vs 325.
constexpr int64_t kGroupTileXBytes = int64_t{4} << 20;
bool reads_fp16_in_tiles(const Kernels& k, int64_t cin, int64_t lanes) {
    return k.conv_group_tile_f16 && cin * lanes * static_cast<int64_t>(sizeof(float)) <= kGroupTileXBytes;
}

// Whether conv_panels' unconverted path runs fp16 panels several to a tile for jobs of `lanes` lanes:
// with Kernels::conv_group_tile_f16_one at one lane, with Kernels::conv_group_tile_f16 when every tile has at
// least kConvSequentialLanes lanes (fp16_tile_panels says how many).
bool pairs_fp16_panels(const Kernels& k, int64_t lanes) {
    return lanes == 1 ? k.conv_group_tile_f16_one != nullptr : k.conv_group_tile_f16 && lanes >= kConvSequentialLanes;
}

// A panel's weights in the flavour's tile, and widened to fp32: fp16 ones, or int8 ones times their
// panel's 16 scales (`scale`, unused for fp16; null: the int8 values themselves).
void conv_tile(const Kernels& k, const uint16_t* w, const float*, const float* x, int64_t S, int64_t kc, int lanes,
               float* acc, bool add) {
    k.conv_tile_f16(w, x, S, kc, lanes, acc, add);
}
void conv_tile(const Kernels& k, const int8_t* w, const float* scale, const float* x, int64_t S, int64_t kc, int lanes,
               float* acc, bool add) {
    k.conv_tile_i8(w, scale, x, S, kc, lanes, acc, add);
}
void widen_rows(const Kernels& k, const uint16_t* w, const float*, float* dst, int64_t rows) {
    k.half_to_float(w, dst, static_cast<size_t>(rows * kConvPanel));
}
void widen_rows(const Kernels& k, const int8_t* w, const float* scale, float* dst, int64_t rows) {
    k.dequant_i8(w, scale, dst, rows);
}
// A low-bit panel from row c0 on (what conv_panels passes where the other weights pass a pointer).
struct QRows {
    const QPanel* panel;
    int64_t c0;
};
void conv_tile(const Kernels& k, QRows w, const float*, const float* x, int64_t S, int64_t kc, int lanes, float* acc,
               bool add) {
    k.conv_tile_q(*w.panel, w.c0, x, S, kc, lanes, acc, add);
}
void widen_rows(const Kernels& k, QRows w, const float*, float* dst, int64_t rows) { k.widen_q(*w.panel, w.c0, dst, rows); }
// Whether the tile takes all of a job's lanes in one call (it runs them in passes of its own, over x it copies once
// per conv1x1 call and thread): the channel-major layout's.
bool lanes_in_passes(QRows w) { return w.panel->channel_bytes != 0; }
template <typename W>
bool lanes_in_passes(const W*) { return false; }
// The first lane tile over an fp16 panel's rows (acc, x, S, lanes as Kernels::conv_tile_f16's), widening them to
// w32 for the other tiles as it reads them: the tiles it ran (1), or 0 when the flavour has no such tile and
// for the other weights.
int widening_tile(const Kernels& k, const uint16_t* w, float* w32, const float* x, int64_t S, int64_t kc, int lanes,
                  float* acc, bool add) {
    if (!k.conv_widen_tile_f16) return 0;
    k.conv_widen_tile_f16(w, w32, x, S, kc, lanes, acc, add);
    return 1;
}
template <typename W>
int widening_tile(const Kernels&, W, float*, const float*, int64_t, int64_t, int, float*, bool) {
    return 0;
}

// The panel's weights from row `rows` on.
template <typename W>
const W* advance(const W* w, int64_t rows) {
    return w + rows * kConvPanel;
}
QRows advance(QRows w, int64_t rows) { return {w.panel, w.c0 + rows}; }

// Each output's sum times its channel's power-of-two scale (exact), before any rounding.
void scale_outputs(float* acc, const float* post, int64_t lanes, int64_t width) {
    if (!post) return;
    for (int64_t s = 0; s < lanes; ++s)
        for (int64_t j = 0; j < width; ++j) acc[s * width + j] *= post[j];
}

// How a packed weight's scales enter a panel's sums: inside (each weight q * scale, formed in the
// tile), or after (sum(q * x) * scale: bit for bit the same when every scale is a power of two, as
// scaling by 2^k commutes with each fp32 rounding of the sum; the tile then converts only).
struct PanelScales {
    const float* inside = nullptr;
    const float* after = nullptr;
};

// A job's `lanes` lanes as the conv register tiles take them: balanced tiles of at most conv_lanes lanes,
// tile t from lane tile_start(t) on.
struct LaneTiling {
    int64_t lanes;
    int tiles;
    // One tile (decode's few lanes) without a division: a 64-bit one costs tens of cycles, per panel.
    LaneTiling(const Kernels& k, int64_t n)
        : lanes(n), tiles(n <= k.conv_lanes ? 1 : static_cast<int>(ceil_div(n, k.conv_lanes))) {}
    int64_t tile_start(int t) const { return tiles == 1 ? t * lanes : t * lanes / tiles; }
    int tile_width(int t) const { return static_cast<int>(tile_start(t + 1) - tile_start(t)); }
};

// Panels per tile of conv_panels' grouped fp16 path (pairs_fp16_panels) for jobs of `lanes` lanes: three at one
// lane, or when no tile is wider than kConvTripleLanes; else two.
int64_t fp16_tile_panels(const Kernels& k, int64_t lanes) {
    const LaneTiling tiling(k, lanes);
    return lanes == 1 || ceil_div(lanes, tiling.tiles) <= kConvTripleLanes ? 3 : 2;
}

// Whether conv_panels' fp16 panels, unconverted, run slice by slice with the first lane tile widening each slice for
// the others (Kernels::conv_widen_tile_f16): for 2+ tiles, all of kConvSequentialLanes lanes or more (each output
// then sums c in order in one partial sum, sliced or not), unless the flavour pairs its panels instead.
bool widens_in_tile(const Kernels& k, const LaneTiling& tiling) {
    return k.conv_widen_tile_f16 && tiling.tiles > 1 && tiling.lanes / tiling.tiles >= kConvSequentialLanes &&
           !pairs_fp16_panels(k, tiling.lanes);
}

// Where the tiles read x: its rows of S lanes (x[c*S + s]), or lane tiles packed by pack_lane_tiles, whose
// rows are contiguous (the tile of n lanes from lane s: x[s*cin + c*n + l]), so that a tile reads one
// stream instead of a cache line per input channel (rows of a power-of-two bucket, 4 KiB apart, also
// share one L1 set).
struct XView {
    const float* x;
    int64_t S, cin;
    bool packed;
    XView from(int64_t s) const { return {x + s * (packed ? cin : 1), S, cin, packed}; }
    int64_t stride(int64_t n) const { return packed ? n : S; }
    const float* rows(int64_t c0, int64_t n) const { return x + c0 * stride(n); }
};

// x's lanes [0, lanes) in the packed layout of XView, for jobs of `chunks` balanced lane chunks tiled
// as conv_panels tiles them: dst[s*cin + c*n + l] = x[c*S + s + l] for each tile (from lane s, n wide).
void pack_lane_tiles(const Kernels& k, const float* x, int64_t S, int64_t cin, int64_t lanes, int64_t chunks,
                     float* dst) {
    parallel_for(cin, std::max<int64_t>(1, kParallelWork / std::max<int64_t>(lanes, 1)), [&](int64_t begin, int64_t end) {
        for (int64_t ch = 0; ch < chunks; ++ch) {
            const int64_t a0 = ch * lanes / chunks;
            const LaneTiling tiling(k, (ch + 1) * lanes / chunks - a0);
            for (int t = 0; t < tiling.tiles; ++t) {
                const int64_t s = a0 + tiling.tile_start(t), n = tiling.tile_width(t);
                for (int64_t c = begin; c < end; ++c) std::memcpy(dst + s * cin + c * n, x + c * S + s, static_cast<size_t>(n) * sizeof(float));
            }
        }
    });
}

// `count` conv panels (16 output channels each; panel_at(g) gives panel g's weights and scales, g < count)
// over the first `lanes` lanes of x, written to out rows (rows of them in all, panel g's from row 16 g).
// The converting path runs the panels slice by slice, so each slice of x is read from memory once for
// all of them and from the cache by the others; each output sums its inputs as a single panel's would. It
// also takes fp16 panels in 2+ lane tiles of kConvSequentialLanes lanes or more (widens_in_tile), whose
// first tile widens each slice for the others.
template <typename PanelAt>
void conv_panels(const Kernels& k, const PanelAt& panel_at, int64_t count, int64_t cin, XView x, int64_t out_stride,
                 int64_t lanes, float* out, int64_t rows, bool round) {
    thread_local std::vector<float> acc_buffer, weight_buffer;
    const int64_t panel_acc = lanes * kConvPanel;
    float* acc = scratch(acc_buffer, static_cast<size_t>(count * panel_acc));
    const LaneTiling tiling(k, lanes);
    constexpr bool fp16 = std::is_same_v<std::decay_t<decltype(panel_at(0).first)>, const uint16_t*>;
    if (!x.packed && !(fp16 && widens_in_tile(k, tiling))) {  // x is packed for (only) the converting path
        int64_t g = 0;
        if constexpr (fp16) {
            if (pairs_fp16_panels(k, lanes) && lanes == 1)
                for (int n = 0; g + 2 <= count; g += n) {  // three panels a tile, then two
                    n = count - g >= 3 ? 3 : 2;
                    const uint16_t* w[3] = {panel_at(g).first, panel_at(g + 1).first,
                                            n == 3 ? panel_at(g + 2).first : nullptr};
                    k.conv_group_tile_f16_one(w, n, x.rows(0, 1), x.stride(1), cin, acc + g * panel_acc);
                }
            else if (pairs_fp16_panels(k, lanes))
                for (int64_t n = 0, most = fp16_tile_panels(k, lanes); g + 2 <= count; g += n) {  // three (or two)
                    n = std::min(most, count - g);
                    const uint16_t* w[3] = {panel_at(g).first, panel_at(g + 1).first,
                                            n == 3 ? panel_at(g + 2).first : nullptr};
                    for (int t = 0; t < tiling.tiles; ++t) {
                        const int64_t s0 = tiling.tile_start(t);
                        const int width = tiling.tile_width(t);
                        float* tile_acc[3] = {acc + g * panel_acc + s0 * kConvPanel,
                                              acc + (g + 1) * panel_acc + s0 * kConvPanel,
                                              n == 3 ? acc + (g + 2) * panel_acc + s0 * kConvPanel : nullptr};
                        k.conv_group_tile_f16(w, static_cast<int>(n), x.from(s0).rows(0, width), x.stride(width), cin,
                                              width, tile_acc, false);
                    }
                }
        }
        for (; g < count; ++g) {
            const auto [w, scales] = panel_at(g);
            if (lanes_in_passes(w)) {
                conv_tile(k, w, scales.inside, x.rows(0, lanes), x.stride(lanes), cin, static_cast<int>(lanes),
                          acc + g * panel_acc, false);
                continue;
            }
            for (int t = 0; t < tiling.tiles; ++t) {
                const int64_t s0 = tiling.tile_start(t);
                const int n = tiling.tile_width(t);
                conv_tile(k, w, scales.inside, x.from(s0).rows(0, n), x.stride(n), cin, n,
                          acc + g * panel_acc + s0 * kConvPanel, false);
            }
        }
    } else {
        float* w32 = scratch(weight_buffer, kConvKBlock * kConvPanel);
        for (int64_t c0 = 0; c0 < cin; c0 += kConvKBlock) {
            const int64_t kc = std::min(kConvKBlock, cin - c0);
            for (int64_t g = 0; g < count; ++g) {
                const auto [w, scales] = panel_at(g);
                float* g_acc = acc + g * panel_acc;
                const int n0 = tiling.tile_width(0);
                int t = widening_tile(k, advance(w, c0), w32, x.rows(c0, n0), x.stride(n0), kc, n0, g_acc, c0 > 0);
                if (t == 0) widen_rows(k, advance(w, c0), scales.inside, w32, kc);
                for (; t < tiling.tiles; ++t) {
                    const int64_t s0 = tiling.tile_start(t);
                    const int n = tiling.tile_width(t);
                    k.conv_tile_f32(w32, x.from(s0).rows(c0, n), x.stride(n), kc, n, g_acc + s0 * kConvPanel, c0 > 0);
                }
            }
        }
    }
    for (int64_t g = 0; g < count; ++g) {
        float* panel = acc + g * panel_acc;
        scale_outputs(panel, panel_at(g).second.after, lanes, kConvPanel);
        if (round) k.round_fp16(panel, static_cast<size_t>(panel_acc));
        for (int64_t j = 0; j < std::min(kConvPanel, rows - g * kConvPanel); ++j)
            for (int64_t s = 0; s < lanes; ++s) out[(g * kConvPanel + j) * out_stride + s] = panel[s * kConvPanel + j];
    }
}

// Two adjacent panels (32 output channels; the second starts cin * 16 values after w) over the
// first `lanes` lanes, written to out rows: conv_panels' converting path with the pair tile. Each
// output sums exactly as conv_panels' would.
template <typename W>
void conv_pair(const Kernels& k, const W* w, PanelScales scales, int64_t cin, XView x, int64_t out_stride,
               int64_t lanes, float* out, int64_t rows, bool round) {
    constexpr int64_t P = 2 * kConvPanel;
    const float* scale = scales.inside;
    thread_local std::vector<float> acc_buffer, weight_buffer;
    float* acc = scratch(acc_buffer, static_cast<size_t>(lanes * P));
    float* w32 = scratch(weight_buffer, kConvKBlock * P);
    const LaneTiling tiling(k, lanes);
    const W* second = w + cin * kConvPanel;
    const float* second_scale = scale ? scale + kConvPanel : nullptr;
    for (int64_t c0 = 0; c0 < cin; c0 += kConvKBlock) {
        const int64_t kc = std::min(kConvKBlock, cin - c0);
        for (int64_t c = 0; c < kc; ++c) {
            widen_rows(k, w + (c0 + c) * kConvPanel, scale, w32 + c * P, 1);
            widen_rows(k, second + (c0 + c) * kConvPanel, second_scale, w32 + c * P + kConvPanel, 1);
        }
        for (int t = 0; t < tiling.tiles; ++t) {
            const int64_t s0 = tiling.tile_start(t);
            const int n = tiling.tile_width(t);
            k.conv_pair_tile_f32(w32, x.from(s0).rows(c0, n), x.stride(n), kc, n, acc + s0 * P, c0 > 0);
        }
    }
    scale_outputs(acc, scales.after, lanes, P);  // the pair's 32 scales are contiguous
    if (round) k.round_fp16(acc, static_cast<size_t>(lanes * P));
    for (int64_t j = 0; j < rows; ++j)
        for (int64_t s = 0; s < lanes; ++s) out[j * out_stride + s] = acc[s * P + j];
}

}  // namespace

SimdFlavour simd_flavour() {
    static const SimdFlavour flavour = select_flavour();
    return flavour;
}

void round_fp16(float* data, size_t n) {
    const Kernels& k = active();
    constexpr int64_t kGrain = int64_t{1} << 16;
    if (n <= static_cast<size_t>(kGrain)) return k.round_fp16(data, n);  // a fused kernel's row: no dispatch
    parallel_for(static_cast<int64_t>(n), kGrain, [&](int64_t begin, int64_t end) {
        k.round_fp16(data + begin, static_cast<size_t>(end - begin));
    });
}

void half_to_float(const uint16_t* src, float* dst, size_t n) { active().half_to_float(src, dst, n); }

void exp_fp16(const float* src, float* dst, size_t n) {
    static const std::vector<float> table = [] {
        std::vector<float> t(size_t{1} << 16);
        for (uint32_t h = 0; h < t.size(); ++h)
            t[h] = round_to_fp16(std::exp(emu::half_to_float(static_cast<uint16_t>(h))));
        return t;
    }();
    const Kernels& k = active();
    uint16_t bits[256];
    for (size_t i = 0; i < n; i += std::size(bits)) {
        const size_t m = std::min(std::size(bits), n - i);
        k.float_to_half(src + i, bits, m);  // exact: src holds fp16 values
        for (size_t j = 0; j < m; ++j) dst[i + j] = table[bits[j]];
    }
}

void tanh(const float* src, float* dst, size_t n) { active().tanh(src, dst, n); }
void sigmoid(const float* src, float* dst, size_t n) { active().sigmoid(src, dst, n); }

void softmax(const float* src, float* dst, int64_t n) { active().softmax(src, dst, n); }

double scaled_softmax(const float* src, float* dst, int64_t n, float count) {
    return active().scaled_softmax(src, dst, n, count);
}

void score_row_softmax(float* row, const float* mask, int64_t n, const ScoreRowOps& ops) {
    active().score_row_softmax(row, mask, n, ops);
}

void float_to_half(const float* src, uint16_t* dst, size_t n) { active().float_to_half(src, dst, n); }

PackedConv1x1 pack_conv1x1(const uint16_t* weight, int64_t cout, int64_t cin) {
    if (cout < 0 || cin < 0) throw std::invalid_argument("pack_conv1x1: negative weight shape");
    PackedConv1x1 packed;
    packed.cout = cout;
    packed.cin = cin;
    // On huge pages: decode streams a packed weight once per token, and on 4 KiB pages each 4 KiB of it costs a
    // TLB miss (GPT-2 124M's 52 convs at one lane, two threads: 13.0-14.4 ms on 4 KiB pages, 12.2-13.3 on huge).
    // The panels are written once, on the threads: a fresh map's pages are zeroed by the kernel as each thread first
    // touches them (the last panel's missing channels stay zero), with no single-threaded memset before.
    const size_t n = static_cast<size_t>(ceil_div(cout, kConvPanel) * cin * kConvPanel);
    if (n == 0) return packed;
    std::shared_ptr<uint16_t> panels = huge_page_map<uint16_t>(n);
    parallel_for(ceil_div(cout, kConvPanel), 1, [&](int64_t begin, int64_t end) {  // panels are independent
        for (int64_t o = begin * kConvPanel; o < std::min(cout, end * kConvPanel); ++o) {
            uint16_t* panel = panels.get() + (o / kConvPanel) * cin * kConvPanel + o % kConvPanel;
            for (int64_t c = 0; c < cin; ++c) panel[c * kConvPanel] = weight[o * cin + c];
        }
    });
    packed.data = PanelData<uint16_t>(panels.get(), n, panels, /*mapped=*/false);
    return packed;
}

const char* conv1x1_panel_layout() { return "fp16p16v1"; }  // fp16, panels of kConvPanel channels, [cin][16]

namespace {

// Whether `packed` holds exactly `weight` [cout][cin] (and, for int8, `scale`).
// Panels are compared on the threads.
template <typename Packed, typename W>
bool packs(const Packed& packed, const W* weight, const float* scale, int64_t cout, int64_t cin) {
    if (packed.cout != cout || packed.cin != cin) return false;
    std::atomic<bool> equal{true};
    parallel_for(ceil_div(cout, kConvPanel), 1, [&](int64_t begin, int64_t end) {
        for (int64_t o = begin * kConvPanel; o < std::min(cout, end * kConvPanel) && equal.load(std::memory_order_relaxed); ++o) {
            const W* panel = packed.data.data() + (o / kConvPanel) * cin * kConvPanel + o % kConvPanel;
            bool same = true;
            for (int64_t c = 0; c < cin && same; ++c) same = panel[c * kConvPanel] == weight[o * cin + c];
            if constexpr (std::is_same_v<Packed, PackedConv1x1I8>) same = same && packed.scale[static_cast<size_t>(o)] == scale[o];
            if (!same) equal.store(false, std::memory_order_relaxed);
        }
    });
    return equal.load();
}

// The packed weights alive in this process, by content hash, so that equal weights are packed once; those
// compiled with a key, by key (keyed_weights.h).
template <typename Packed>
struct SharedPacked {
    std::unordered_multimap<size_t, std::weak_ptr<const Packed>> held;
};
std::mutex shared_mutex;
SharedPacked<PackedConv1x1> shared_f16;
SharedPacked<PackedConv1x1I8> shared_i8;
KeyedWeights<PackedConv1x1> keyed_f16;
KeyedWeights<PackedConv1x1I8> keyed_i8;

// The live packed weights under `key` (taken under the lock; compared outside it).
template <typename Packed>
std::vector<std::shared_ptr<const Packed>> held_under(const SharedPacked<Packed>& shared, size_t key) {
    std::vector<std::shared_ptr<const Packed>> alive;
    auto [first, last] = shared.held.equal_range(key);
    for (auto it = first; it != last; ++it)
        if (auto held = it->second.lock()) alive.push_back(std::move(held));
    return alive;
}

// Hashing, comparing and packing run outside the lock (and on the threads), so programs compiled
// from several threads pack at once; a weight packed twice in a race is kept once (the first).
template <typename Packed, typename W, typename Pack>
std::shared_ptr<const Packed> share(SharedPacked<Packed>& shared, const W* weight, const float* scale, int64_t cout,
                                    int64_t cin, const Pack& pack) {
    if (cout < 0 || cin < 0) throw std::invalid_argument("shared_conv1x1: negative weight shape");
    const std::string_view bytes(reinterpret_cast<const char*>(weight), static_cast<size_t>(cout * cin) * sizeof(W));
    size_t key = content_key(bytes) ^ (static_cast<size_t>(cout) * 0x9E3779B97F4A7C15ull);
    if (scale)
        key ^= content_key(std::string_view(reinterpret_cast<const char*>(scale), static_cast<size_t>(cout) * sizeof(float))) << 1;
    std::vector<std::shared_ptr<const Packed>> seen;
    {
        std::lock_guard<std::mutex> lock(shared_mutex);
        seen = held_under(shared, key);
    }
    for (const auto& candidate : seen)
        if (packs(*candidate, weight, scale, cout, cin)) return candidate;  // equal content, not only an equal hash
    auto packed = std::make_shared<const Packed>(pack());
    std::lock_guard<std::mutex> lock(shared_mutex);
    for (const auto& candidate : held_under(shared, key))  // packed by another thread meanwhile?
        if (std::find(seen.begin(), seen.end(), candidate) == seen.end() && packs(*candidate, weight, scale, cout, cin))
            return candidate;
    auto& held = shared.held;
    for (auto it = held.begin(); it != held.end();) it = it->second.expired() ? held.erase(it) : std::next(it);
    held.emplace(key, packed);
    return packed;
}

// Whether `packed` holds `weight` [cout][cin] at a few sampled places (rows and columns first, middle
// and last): what a keyed weight is checked by, a constant cost that catches a key naming other bytes.
bool samples_match(const PackedConv1x1& packed, const uint16_t* weight, int64_t cout, int64_t cin) {
    if (packed.cout != cout || packed.cin != cin) return false;
    for (int64_t o : {int64_t{0}, cout / 2, cout - 1})
        for (int64_t c : {int64_t{0}, cin / 3, cin / 2, cin - 1})
            if (o >= 0 && o < cout && c >= 0 && c < cin &&
                packed.data[static_cast<size_t>((o / kConvPanel) * cin * kConvPanel + c * kConvPanel + o % kConvPanel)] !=
                    weight[o * cin + c])
                return false;
    return true;
}

template <typename Packed>
void add_usage(const SharedPacked<Packed>& shared, int64_t& count, int64_t& bytes) {
    for (const auto& [key, weak] : shared.held)
        if (auto alive = weak.lock()) {
            ++count;
            bytes += static_cast<int64_t>(alive->data.size() * sizeof(alive->data[0]));
            if constexpr (std::is_same_v<Packed, PackedConv1x1I8>)
                bytes += static_cast<int64_t>(alive->scale.size() * sizeof(float));
        }
}

// The elements (bytes for the low-bit weights) of one panel.
int64_t panel_size(const PackedConv1x1Q& w) { return w.rows_stored() * w.row_bytes; }
template <typename Packed>
int64_t panel_size(const Packed& w) { return w.cin * kConvPanel; }

PanelScales panel_scales(const PackedConv1x1&, int64_t) { return {}; }
PanelScales panel_scales(const PackedConv1x1I8& w, int64_t o0) {
    const float* scale = w.scale.data() + o0;
    return w.scale_after ? PanelScales{nullptr, scale} : PanelScales{scale, nullptr};
}

// conv1x1 of either packed weight type: the same jobs, tiles and summation order for both.
template <typename Packed>
void conv1x1_packed(const Packed& w, const float* x, int64_t S, int64_t lanes, float* out, int64_t out_stride,
                    bool round_fp16) {
    const int64_t panels = ceil_div(w.cout, kConvPanel);
    if (w.cout < 0 || w.cin < 0 || static_cast<int64_t>(w.data.size()) != panels * panel_size(w))
        throw std::invalid_argument("conv1x1: weight is not a packed [cout, cin] conv weight");
    if (lanes < 0 || lanes > S) throw std::invalid_argument("conv1x1: lanes must be in [0, S]");
    if (lanes == 0 || panels == 0) return;
    const Kernels& k = active();
    constexpr bool fp16 = std::is_same_v<Packed, PackedConv1x1>;
    const bool in_tiles = fp16 && reads_fp16_in_tiles(k, w.cin, lanes);
    if (lanes < S && (lanes <= kCompactLanes || in_tiles || !converts_weights(k, w.cin, lanes))) {
        // Live lanes of wider rows that do not convert the weights (decode: 1 of 32; a short prompt in a long
        // bucket: 16 of 1024, whose rows 4 KiB apart would all meet in one L1 set; on AVX-512 most prompts): the
        // panels read x as a contiguous [cin][lanes] copy (not a cache line per input channel) and each job writes
        // its outputs' lanes to out's rows (in parallel: no compact result scattered after by one thread). The same
        // values in the same order: the same sums. (Lanes that convert the weights read x packed in lane tiles,
        // below.) A large copy (a prompt's) is pooled, not kept by the thread.
        const size_t n = static_cast<size_t>(w.cin * lanes);
        thread_local std::vector<float> compact_x;
        std::vector<float> pooled = n > kCompactKeptFloats ? buffer_pool::take(n) : std::vector<float>{};
        float* xc = pooled.empty() ? scratch(compact_x, n) : pooled.data();
        gather_lanes(x, w.cin, S, lanes, xc);
        conv1x1_packed(w, xc, lanes, lanes, out, out_stride, round_fp16);
        if (!pooled.empty()) buffer_pool::give(std::move(pooled));
        return;
    }
    // Long rows are cut into balanced chunks of about kConvLaneChunk lanes (each >= 18, so every
    // register tile keeps 4+ lanes and each output sums its inputs in the same order as unchunked).
    const int64_t chunks = lanes >= 2 * kConvLaneChunk ? lanes / kConvLaneChunk : 1;
    auto chunk_start = [&](int64_t c) { return c * lanes / chunks; };
    // A job is one panel; as many adjacent ones as a group tile of the flavour takes (two or three); on long rows
    // otherwise kConvGroup of them, which share each slice of x; low-bit panels go kConvGroup to a job at decode's
    // few lanes too, which amortizes a job's fixed cost (its QPanels, the tile dispatch).
    constexpr bool low_bit = std::is_same_v<Packed, PackedConv1x1Q>;
    static std::atomic<uint64_t> calls{0};
    [[maybe_unused]] const uint64_t call = low_bit ? ++calls : 0;  // (QPanel::call; unused by fp16 panels)
    const bool converts = !in_tiles && converts_weights(k, w.cin, lanes / chunks);
    const bool pairs = !low_bit && k.conv_pair_tile_f32 && converts;
    // Unconverted fp16 panels (decode's lanes, and prompts' on AVX-512) go as many to a job as conv_panels runs to a tile.
    const bool fp16_groups = fp16 && !converts && pairs_fp16_panels(k, lanes);
    const int64_t per_job = fp16_groups ? fp16_tile_panels(k, lanes) : pairs ? 2 : converts || low_bit ? kConvGroup : 1;
    const int64_t job_work = per_job * w.cin * kConvPanel * (lanes / chunks + 4);  // + the weight stream's cost
    // Long rows (the converting tiles, many panels per lane) read x packed in lane tiles, packed once here.
    std::vector<float> packed_x = converts ? buffer_pool::take(static_cast<size_t>(lanes * w.cin)) : std::vector<float>{};
    if (converts) pack_lane_tiles(k, x, S, w.cin, lanes, chunks, packed_x.data());
    const XView xv{converts ? packed_x.data() : x, S, w.cin, converts};
    // Decode's few lanes stream the weights (guided chunks: the threads end together); more lanes compute.
    (converts ? parallel_for : parallel_for_guided)(
                 ceil_div(panels, per_job) * chunks, std::max<int64_t>(1, kParallelWork / std::max<int64_t>(job_work, 1)),
                 [&](int64_t begin, int64_t end) {
                     for (int64_t job = begin; job < end; ++job) {
                         // One lane chunk (decode, short prompts): no divisions per job.
                         const int64_t p = (chunks == 1 ? job : job / chunks) * per_job, c = chunks == 1 ? 0 : job % chunks;
                         const int64_t o0 = p * kConvPanel;
                         const int64_t s0 = chunks == 1 ? 0 : chunk_start(c), n = chunks == 1 ? lanes : chunk_start(c + 1) - s0;
                         const int64_t count = std::min(per_job, panels - p);
                         float* job_out = out + o0 * out_stride + s0;
                         if constexpr (low_bit) {
                             QPanel group[kConvGroup];
                             for (int64_t g = 0; g < count; ++g) {
                                 group[g] = q_panel(w, p + g);
                                 group[g].call = call;
                             }
                             conv_panels(k, [&](int64_t g) { return std::pair{QRows{&group[g], 0}, PanelScales{}}; },
                                         count, w.cin, xv.from(s0), out_stride, n, job_out, w.cout - o0, round_fp16);
                         } else {
                             const auto* panel = w.data.data() + o0 * w.cin;
                             if (pairs && count == 2)
                                 conv_pair(k, panel, panel_scales(w, o0), w.cin, xv.from(s0), out_stride, n, job_out,
                                           std::min(2 * kConvPanel, w.cout - o0), round_fp16);
                             else
                                 conv_panels(k, [&](int64_t g) {
                                     return std::pair{panel + g * w.cin * kConvPanel, panel_scales(w, o0 + g * kConvPanel)};
                                 }, count, w.cin, xv.from(s0), out_stride, n, job_out, w.cout - o0, round_fp16);
                         }
                     }
                 });
    if (converts) buffer_pool::give(std::move(packed_x));
    if (lanes <= kStreamBoundLanes)  // bound by the weight stream: read the next weights while other ops run
        weight_streamed(w.weak_from_this(), w.data.data(), w.data.size() * sizeof(w.data[0]));
}

}  // namespace

PackedConv1x1 map_conv1x1(const std::string& path, const uint16_t* weight, int64_t cout, int64_t cin) {
    if (cout <= 0 || cin <= 0) throw std::invalid_argument("map_conv1x1: the weight has no elements");
    const size_t bytes = static_cast<size_t>(ceil_div(cout, kConvPanel) * cin * kConvPanel) * sizeof(uint16_t);
    auto refuse = [&](const std::string& why) {
        return std::invalid_argument("packed weight file '" + path + "' " + why + " (a stale or damaged program-cache "
                                     "file: delete it, or clear the cache with `python -m orion cache clear`)");
    };
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw refuse(std::string("cannot be opened: ") + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
        ::close(fd);
        throw refuse("holds " + std::to_string(st.st_size) + " bytes, but the panels of a [" + std::to_string(cout) +
                     ", " + std::to_string(cin) + "] weight take " + std::to_string(bytes));
    }
    // MAP_POPULATE: the pages are in the page cache (a warm start): mapping them all at once costs less
    // than a fault per page at the first evaluate.
#ifdef MAP_POPULATE
    constexpr int kFlags = MAP_PRIVATE | MAP_POPULATE;
#else
    constexpr int kFlags = MAP_PRIVATE;  // macOS: faulted in at the first evaluate
#endif
    void* map = ::mmap(nullptr, bytes, PROT_READ, kFlags, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) throw refuse(std::string("cannot be mapped: ") + std::strerror(errno));
    std::shared_ptr<const void> owner(map, [bytes](const void* p) { ::munmap(const_cast<void*>(p), bytes); });
    PackedConv1x1 packed;
    packed.cout = cout;
    packed.cin = cin;
    packed.data = PanelData<uint16_t>(static_cast<const uint16_t*>(map), bytes / sizeof(uint16_t), std::move(owner));
    if (!samples_match(packed, weight, cout, cin)) throw refuse("does not hold this weight's values");
    return packed;
}

std::shared_ptr<const PackedConv1x1> shared_conv1x1(const uint16_t* weight, int64_t cout, int64_t cin,
                                                    std::string_view key, const std::string& packed_file) {
    if (key.empty()) return share(shared_f16, weight, nullptr, cout, cin, [&] { return pack_conv1x1(weight, cout, cin); });
    if (cout < 0 || cin < 0) throw std::invalid_argument("shared_conv1x1: negative weight shape");
    // The same bytes read as another shape (a reshaped file) are another packed weight.
    const std::string shaped = std::string(key) + "/" + std::to_string(cout) + "x" + std::to_string(cin);
    const std::string_view bytes(reinterpret_cast<const char*>(weight), static_cast<size_t>(cout * cin) * 2);
    return keyed_f16.get(shaped, sampled_bytes(bytes), [&] {
        return std::make_shared<const PackedConv1x1>(!packed_file.empty() && cout > 0 && cin > 0
                                                         ? map_conv1x1(packed_file, weight, cout, cin)
                                                         : pack_conv1x1(weight, cout, cin));
    });
}

std::vector<std::pair<std::string, std::shared_ptr<const PackedConv1x1>>> keyed_conv1x1_packed() {
    std::vector<std::pair<std::string, std::shared_ptr<const PackedConv1x1>>> out;
    keyed_f16.for_each([&](const std::string& key, const std::shared_ptr<const PackedConv1x1>& alive) {
        if (!alive->data.mapped()) out.emplace_back(key, alive);
    });
    return out;
}

std::shared_ptr<const PackedConv1x1I8> shared_conv1x1_i8(const int8_t* q, const float* scale, int64_t cout,
                                                         int64_t cin) {
    return share(shared_i8, q, scale, cout, cin, [&] { return pack_conv1x1_i8(q, scale, cout, cin); });
}

std::shared_ptr<const PackedConv1x1I8> keyed_conv1x1_i8(
    const std::string& key, const std::string& samples,
    const std::function<std::shared_ptr<const PackedConv1x1I8>()>& make) {
    return keyed_i8.get(key, samples, make);
}

std::pair<int64_t, int64_t> shared_conv1x1_usage() {
    int64_t count = 0, bytes = 0;
    keyed_f16.for_each([&](const std::string&, const std::shared_ptr<const PackedConv1x1>& alive) {
        ++count;  // (keyed fp16 weights are held by key alone; keyed int8 and low-bit ones by content too)
        bytes += static_cast<int64_t>(alive->data.size() * sizeof(alive->data[0]));
    });
    std::lock_guard<std::mutex> lock(shared_mutex);
    add_usage(shared_f16, count, bytes);
    add_usage(shared_i8, count, bytes);
    add_low_bit_usage(count, bytes);
    return {count, bytes};
}

void conv1x1(const PackedConv1x1& w, const float* x, int64_t S, int64_t lanes, float* out, bool round_fp16,
             int64_t out_stride) {
    conv1x1_packed(w, x, S, lanes, out, out_stride > 0 ? out_stride : S, round_fp16);
}

void conv1x1(const PackedConv1x1Q& w, const float* x, int64_t S, int64_t lanes, float* out, bool round_fp16,
             int64_t out_stride) {
    const int64_t panels = ceil_div(w.cout, kConvPanel);
    const bool lut = w.kind != PackedConv1x1Q::Kind::affine4;
    const bool lut_ok = w.lut_bytes.empty()
                            ? static_cast<int64_t>(w.lut.size()) == panels * (w.channel_luts ? kConvPanel : 2) * w.entries
                            : !w.channel_luts && static_cast<int64_t>(w.lut_bytes.size()) == panels * w.entries * 4;
    if ((lut && !lut_ok) ||
        (!lut && (w.block_shift < 0 || w.block_shift > 30 || (w.cin & ((int64_t{1} << w.block_shift) - 1)) ||
                  static_cast<int64_t>(w.channel_major ? w.channel_params.size() - kChannelParamsTail : w.params.size()) !=
                      panels * (w.cin >> w.block_shift) * 2 * kConvPanel)))
        throw std::invalid_argument("conv1x1: low-bit weight without its LUTs or block parameters");
    conv1x1_packed(w, x, S, lanes, out, out_stride > 0 ? out_stride : S, round_fp16);
}

void conv1x1(const PackedConv1x1I8& w, const float* x, int64_t S, int64_t lanes, float* out, bool round_fp16,
             int64_t out_stride) {
    if (static_cast<int64_t>(w.scale.size()) != ceil_div(w.cout, kConvPanel) * kConvPanel)
        throw std::invalid_argument("conv1x1: int8 weight without one scale per (padded) output channel");
    conv1x1_packed(w, x, S, lanes, out, out_stride > 0 ? out_stride : S, round_fp16);
}

const char* simd_path() { return active().name; }

}  // namespace orion::emu::kernels
