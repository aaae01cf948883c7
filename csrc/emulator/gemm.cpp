// The emulator's matrix multiply (kernels::gemm, kernels::gemm_f16b): a few rows of A stream B as
// gemv; more are a packed, blocked GEMM (BLIS-style) around a register tile of each SIMD flavour
// (portable, AVX2+F16C+FMA, AVX-512), picked once at run time as the other kernels' (simd.h).
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "emulator/fp16.h"
#include "emulator/kernels.h"
#include "emulator/simd.h"

namespace orion::emu::kernels {
namespace {

constexpr int64_t kGemmMR = 6, kGemmNR = 16;  // gemm register tile: 6 rows x 16 columns
constexpr int64_t kGemmKC = 256, kGemmMC = 96;
// Outer blocks of C whose A and B slices are packed once per K slice (1.5 and 2 MiB, in L3).
constexpr int64_t kGemmOuterM = 1536, kGemmOuterN = 2048;
constexpr int64_t kGemvMaxM = 3;  // up to this many rows of A, gemm streams B instead of packing it
constexpr int64_t kParallelWork = int64_t{1} << 16;  // multiply-adds worth a chunk of their own

// The inner kernels of one SIMD flavour.
struct GemmKernels {
    void (*round_fp16)(float* data, size_t n);
    void (*half_to_float)(const uint16_t* src, float* dst, size_t n);
    // c[i*c_rs + j] (+)= sum_{p<k} a[p*MR + i] * b[p*NR + j] for i < rows, j < cols.
    void (*gemm_tile)(int64_t k, const float* a, const float* b, float* c, int64_t c_rs, int64_t rows, int64_t cols,
                      bool add);
    // A full 2MR x 2NR block of C from two A panels (rows 0..MR-1, MR..2MR-1) and two B panels
    // (columns 0..NR-1, NR..2NR-1), each element summed as gemm_tile sums it; null when the flavour
    // has no registers for it.
    void (*gemm_block)(int64_t k, const float* a0, const float* a1, const float* b0, const float* b1, float* c,
                       int64_t c_rs, bool add);
    // c[j] = sum_{p<k} a[p*a_cs] * b[p*b_rs + j] for j < n (rows of B contiguous); B in fp32 or fp16.
    void (*gemv_rows)(int64_t k, int64_t n, const float* a, int64_t a_cs, const float* b, int64_t b_rs, float* c);
    void (*gemv_rows_f16)(int64_t k, int64_t n, const float* a, int64_t a_cs, const uint16_t* b, int64_t b_rs,
                          float* c);
    // c[j] = sum_{p<k} a[p] * b[j*b_cs + p] for j < n (columns of B contiguous); B in fp32 or fp16.
    void (*gemv_cols)(int64_t k, int64_t n, const float* a, const float* b, int64_t b_cs, float* c);
    void (*gemv_cols_f16)(int64_t k, int64_t n, const float* a, const uint16_t* b, int64_t b_cs, float* c);
    // dst[p*NR + j] = b[j*b_cs + p] (widened exactly from fp16) for p < k, j < NR: one full column panel
    // of a B whose columns are contiguous (B transposed), packed.
    void (*pack_b_cols)(const float* b, int64_t b_cs, int64_t k, float* dst);
    void (*pack_b_cols_f16)(const uint16_t* b, int64_t b_cs, int64_t k, float* dst);
    // dst[p*NR + j] = b[p*b_rs + j] (widened exactly from fp16) for p < k, j < NR: one full column panel of
    // a B whose rows are contiguous, packed.
    void (*pack_b_rows)(const float* b, int64_t b_rs, int64_t k, float* dst);
    void (*pack_b_rows_f16)(const uint16_t* b, int64_t b_rs, int64_t k, float* dst);
    // dst[p*MR + i] = a[i*a_rs + p] for p < k, i < MR: one full row panel of an A whose rows are contiguous.
    void (*pack_a_rows)(const float* a, int64_t a_rs, int64_t k, float* dst);
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Scratch buffers reused by each thread across calls.
float* scratch(std::vector<float>& buffer, size_t n) {
    if (buffer.size() < n) buffer.resize(n);
    return buffer.data();
}

// ---------------------------------------------------------------------------------------------
// Portable flavour: plain loops (auto-vectorised where the compiler can), exact conversions.

void gemm_tile_portable(int64_t k, const float* a, const float* b, float* c, int64_t c_rs, int64_t rows, int64_t cols,
                        bool add) {
    float sum[kGemmMR][kGemmNR] = {};
    for (int64_t p = 0; p < k; ++p)
        for (int i = 0; i < kGemmMR; ++i)
            for (int j = 0; j < kGemmNR; ++j) sum[i][j] += a[p * kGemmMR + i] * b[p * kGemmNR + j];
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) c[i * c_rs + j] = (add ? c[i * c_rs + j] : 0.0f) + sum[i][j];
}

inline float as_float(float v) { return v; }
inline float as_float(uint16_t h) { return emu::half_to_float(h); }

template <typename B>
void gemv_rows_portable(int64_t k, int64_t n, const float* a, int64_t a_cs, const B* b, int64_t b_rs, float* c) {
    std::fill(c, c + n, 0.0f);
    for (int64_t p = 0; p < k; ++p) {
        const float ap = a[p * a_cs];
        const B* bp = b + p * b_rs;
        for (int64_t j = 0; j < n; ++j) c[j] += ap * as_float(bp[j]);
    }
}

template <typename B>
void gemv_cols_portable(int64_t k, int64_t n, const float* a, const B* b, int64_t b_cs, float* c) {
    for (int64_t j = 0; j < n; ++j) {
        float sum = 0.0f;
        for (int64_t p = 0; p < k; ++p) sum += a[p] * as_float(b[j * b_cs + p]);
        c[j] = sum;
    }
}

template <typename B>
void pack_b_cols_portable(const B* b, int64_t b_cs, int64_t k, float* dst) {
    for (int64_t j = 0; j < kGemmNR; ++j)
        for (int64_t p = 0; p < k; ++p) dst[p * kGemmNR + j] = as_float(b[j * b_cs + p]);
}

template <typename B>
void pack_b_rows_portable(const B* b, int64_t b_rs, int64_t k, float* dst) {
    for (int64_t p = 0; p < k; ++p)
        for (int64_t j = 0; j < kGemmNR; ++j) dst[p * kGemmNR + j] = as_float(b[p * b_rs + j]);
}

void pack_a_rows_portable(const float* a, int64_t a_rs, int64_t k, float* dst) {
    for (int64_t p = 0; p < k; ++p)
        for (int64_t i = 0; i < kGemmMR; ++i) dst[p * kGemmMR + i] = a[i * a_rs + p];
}

constexpr GemmKernels kPortable = {
    round_fp16_portable, half_to_float_portable, gemm_tile_portable, nullptr,
    gemv_rows_portable<float>, gemv_rows_portable<uint16_t>, gemv_cols_portable<float>, gemv_cols_portable<uint16_t>,
    pack_b_cols_portable<float>, pack_b_cols_portable<uint16_t>, pack_b_rows_portable<float>,
    pack_b_rows_portable<uint16_t>, pack_a_rows_portable,
};

// ---------------------------------------------------------------------------------------------
// AVX2 + F16C + FMA flavour.
#ifdef ORION_X86


ORION_AVX2 void gemm_tile_avx2(int64_t k, const float* a, const float* b, float* c, int64_t c_rs, int64_t rows,
                               int64_t cols, bool add) {
    __m256 acc[kGemmMR][2];
    ORION_UNROLL
    for (int i = 0; i < kGemmMR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int64_t p = 0; p < k; ++p) {
        const __m256 b0 = _mm256_loadu_ps(b + p * kGemmNR), b1 = _mm256_loadu_ps(b + p * kGemmNR + 8);
        ORION_UNROLL
        for (int i = 0; i < kGemmMR; ++i) {
            const __m256 av = _mm256_broadcast_ss(a + p * kGemmMR + i);
            acc[i][0] = _mm256_fmadd_ps(av, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(av, b1, acc[i][1]);
        }
    }
    if (rows == kGemmMR && cols == kGemmNR) {
        ORION_UNROLL
        for (int i = 0; i < kGemmMR; ++i) {
            float* ci = c + i * c_rs;
            if (add) {
                acc[i][0] = _mm256_add_ps(acc[i][0], _mm256_loadu_ps(ci));
                acc[i][1] = _mm256_add_ps(acc[i][1], _mm256_loadu_ps(ci + 8));
            }
            _mm256_storeu_ps(ci, acc[i][0]);
            _mm256_storeu_ps(ci + 8, acc[i][1]);
        }
        return;
    }
    float tile[kGemmMR][kGemmNR];
    ORION_UNROLL
    for (int i = 0; i < kGemmMR; ++i) {
        _mm256_storeu_ps(tile[i], acc[i][0]);
        _mm256_storeu_ps(tile[i] + 8, acc[i][1]);
    }
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) c[i * c_rs + j] = (add ? c[i * c_rs + j] : 0.0f) + tile[i][j];
}

// The first n (< 8) values at p as fp32, the other lanes 0.
template <typename B>
ORION_AVX2 inline __m256 load8_first(const B* p, int64_t n) {
    B part[8] = {};
    std::memcpy(part, p, static_cast<size_t>(n) * sizeof(B));
    return load8(part);
}

// Streams B row by row, four rows per pass over c (which stays in L1); the last n % 8 columns are
// one vector summed in a register.
template <typename B>
ORION_AVX2 void gemv_rows_avx2(int64_t k, int64_t n, const float* a, int64_t a_cs, const B* b, int64_t b_rs,
                               float* c) {
    std::fill(c, c + n, 0.0f);
    const int64_t n8 = n / 8 * 8, tail = n - n8;
    __m256 c_tail = _mm256_setzero_ps();
    int64_t p = 0;
    for (; p + 4 <= k; p += 4) {
        const B *b0 = b + p * b_rs, *b1 = b0 + b_rs, *b2 = b1 + b_rs, *b3 = b2 + b_rs;
        const __m256 v0 = _mm256_set1_ps(a[p * a_cs]), v1 = _mm256_set1_ps(a[(p + 1) * a_cs]),
                     v2 = _mm256_set1_ps(a[(p + 2) * a_cs]), v3 = _mm256_set1_ps(a[(p + 3) * a_cs]);
        for (int64_t j = 0; j < n8; j += 8) {
            __m256 sum = _mm256_fmadd_ps(v0, load8(b0 + j), _mm256_loadu_ps(c + j));
            sum = _mm256_fmadd_ps(v1, load8(b1 + j), sum);
            sum = _mm256_fmadd_ps(v2, load8(b2 + j), sum);
            _mm256_storeu_ps(c + j, _mm256_fmadd_ps(v3, load8(b3 + j), sum));
        }
        if (tail) {
            c_tail = _mm256_fmadd_ps(v0, load8_first(b0 + n8, tail), c_tail);
            c_tail = _mm256_fmadd_ps(v1, load8_first(b1 + n8, tail), c_tail);
            c_tail = _mm256_fmadd_ps(v2, load8_first(b2 + n8, tail), c_tail);
            c_tail = _mm256_fmadd_ps(v3, load8_first(b3 + n8, tail), c_tail);
        }
    }
    for (; p < k; ++p) {
        const B* bp = b + p * b_rs;
        const __m256 v = _mm256_set1_ps(a[p * a_cs]);
        for (int64_t j = 0; j < n8; j += 8) _mm256_storeu_ps(c + j, _mm256_fmadd_ps(v, load8(bp + j), _mm256_loadu_ps(c + j)));
        if (tail) c_tail = _mm256_fmadd_ps(v, load8_first(bp + n8, tail), c_tail);
    }
    if (tail) {
        float part[8];
        _mm256_storeu_ps(part, c_tail);
        std::copy(part, part + tail, c + n8);
    }
}

// The four horizontal sums of v[0..3], as one vector.
ORION_AVX2 inline __m128 hsum4(const __m256* v) {
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

// Dot products of a with four columns of B at a time; the last k % 8 entries are one vector.
template <typename B>
ORION_AVX2 void gemv_cols_avx2(int64_t k, int64_t n, const float* a, const B* b, int64_t b_cs, float* c) {
    const int64_t k8 = k / 8 * 8, tail = k - k8;
    const __m256 a_tail = tail ? load8_first(a + k8, tail) : _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const B* bj = b + j * b_cs;
        __m256 acc[4];
        ORION_UNROLL
        for (int q = 0; q < 4; ++q) acc[q] = _mm256_setzero_ps();
        for (int64_t p = 0; p < k8; p += 8) {
            const __m256 av = _mm256_loadu_ps(a + p);
            ORION_UNROLL
            for (int q = 0; q < 4; ++q) acc[q] = _mm256_fmadd_ps(av, load8(bj + q * b_cs + p), acc[q]);
        }
        if (tail)
            ORION_UNROLL
            for (int q = 0; q < 4; ++q) acc[q] = _mm256_fmadd_ps(a_tail, load8_first(bj + q * b_cs + k8, tail), acc[q]);
        _mm_storeu_ps(c + j, hsum4(acc));
    }
    for (; j < n; ++j) {
        const B* bj = b + j * b_cs;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t p = 0; p < k8; p += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + p), load8(bj + p), acc);
        if (tail) acc = _mm256_fmadd_ps(a_tail, load8_first(bj + k8, tail), acc);
        c[j] = hsum(acc);
    }
}

// Rows r[0..7] of an 8 x 8 block, transposed in place.
ORION_AVX2 inline void transpose8(__m256* r) {
    __m256 t[8], u[8];
    ORION_UNROLL
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    ORION_UNROLL
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    ORION_UNROLL
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

// The column panel by 8 x 8 blocks transposed in registers: each store fills half a packed row (the
// scalar copy wrote one element of a different cache line per step); the last k % 8 rows one by one.
template <typename B>
ORION_AVX2 void pack_b_cols_avx2(const B* b, int64_t b_cs, int64_t k, float* dst) {
    const int64_t k8 = k / 8 * 8;
    for (int64_t j0 = 0; j0 < kGemmNR; j0 += 8) {
        for (int64_t p = 0; p < k8; p += 8) {
            __m256 r[8];
            ORION_UNROLL
            for (int q = 0; q < 8; ++q) r[q] = load8(b + (j0 + q) * b_cs + p);  // column j0 + q, rows p..p+7
            transpose8(r);
            ORION_UNROLL
            for (int q = 0; q < 8; ++q) _mm256_storeu_ps(dst + (p + q) * kGemmNR + j0, r[q]);
        }
        for (int64_t j = j0; j < j0 + 8; ++j)
            for (int64_t p = k8; p < k; ++p) dst[p * kGemmNR + j] = as_float(b[j * b_cs + p]);
    }
}

// Two vector copies per packed row (a call to memcpy or to the conversion loop per 16 values cost more).
template <typename B>
ORION_AVX2 void pack_b_rows_avx2(const B* b, int64_t b_rs, int64_t k, float* dst) {
    for (int64_t p = 0; p < k; ++p) {
        const B* src = b + p * b_rs;
        _mm256_storeu_ps(dst + p * kGemmNR, load8(src));
        _mm256_storeu_ps(dst + p * kGemmNR + 8, load8(src + 8));
    }
}

// The row panel by 6 x 8 blocks (two zero rows) transposed in registers: each packed row's 6 values one
// store of 4 and one of 2 (the scalar copy read a different row's cache line per value); the last k % 8
// columns one by one.
ORION_AVX2 void pack_a_rows_avx2(const float* a, int64_t a_rs, int64_t k, float* dst) {
    static_assert(kGemmMR == 6, "pack_a_rows_avx2 transposes 6 rows");
    const int64_t k8 = k / 8 * 8;
    for (int64_t p = 0; p < k8; p += 8) {
        __m256 r[8];
        ORION_UNROLL
        for (int i = 0; i < kGemmMR; ++i) r[i] = _mm256_loadu_ps(a + i * a_rs + p);
        r[6] = r[7] = _mm256_setzero_ps();
        transpose8(r);  // r[q]: column p + q, rows 0..7
        ORION_UNROLL
        for (int q = 0; q < 8; ++q) {
            float* d = dst + (p + q) * kGemmMR;
            _mm_storeu_ps(d, _mm256_castps256_ps128(r[q]));
            _mm_storel_pi(reinterpret_cast<__m64*>(d + 4), _mm256_extractf128_ps(r[q], 1));
        }
    }
    for (int64_t p = k8; p < k; ++p)
        for (int64_t i = 0; i < kGemmMR; ++i) dst[p * kGemmMR + i] = a[i * a_rs + p];
}

constexpr GemmKernels kAvx2 = {
    round_fp16_avx2, half_to_float_avx2, gemm_tile_avx2, nullptr,
    gemv_rows_avx2<float>, gemv_rows_avx2<uint16_t>, gemv_cols_avx2<float>, gemv_cols_avx2<uint16_t>,
    pack_b_cols_avx2<float>, pack_b_cols_avx2<uint16_t>, pack_b_rows_avx2<float>, pack_b_rows_avx2<uint16_t>,
    pack_a_rows_avx2,
};

// ---------------------------------------------------------------------------------------------
// AVX-512 flavour: the AVX2 kernels, and a 2 x 2 block of their register tiles in 24 registers.

// C[12 x 32] from two packed A panels and two packed B panels: 24 accumulators, per step two
// loads of B and twelve broadcasts of A feed 24 FMAs. Each element's sum is gemm_tile's (from 0
// over p in order, then added to C when `add`).
ORION_AVX512 void gemm_block_avx512(int64_t k, const float* a0, const float* a1, const float* b0, const float* b1,
                                    float* c, int64_t c_rs, bool add) {
    __m512 lo[2 * kGemmMR], hi[2 * kGemmMR];
    ORION_UNROLL
    for (int i = 0; i < 2 * kGemmMR; ++i) lo[i] = hi[i] = _mm512_setzero_ps();
    for (int64_t p = 0; p < k; ++p) {
        const __m512 bl = _mm512_loadu_ps(b0 + p * kGemmNR), bh = _mm512_loadu_ps(b1 + p * kGemmNR);
        ORION_UNROLL
        for (int i = 0; i < kGemmMR; ++i) {
            const __m512 av = _mm512_set1_ps(a0[p * kGemmMR + i]);
            lo[i] = _mm512_fmadd_ps(av, bl, lo[i]);
            hi[i] = _mm512_fmadd_ps(av, bh, hi[i]);
        }
        ORION_UNROLL
        for (int i = 0; i < kGemmMR; ++i) {
            const __m512 av = _mm512_set1_ps(a1[p * kGemmMR + i]);
            lo[kGemmMR + i] = _mm512_fmadd_ps(av, bl, lo[kGemmMR + i]);
            hi[kGemmMR + i] = _mm512_fmadd_ps(av, bh, hi[kGemmMR + i]);
        }
    }
    ORION_UNROLL
    for (int i = 0; i < 2 * kGemmMR; ++i) {
        float* ci = c + i * c_rs;
        if (add) {
            lo[i] = _mm512_add_ps(lo[i], _mm512_loadu_ps(ci));
            hi[i] = _mm512_add_ps(hi[i], _mm512_loadu_ps(ci + kGemmNR));
        }
        _mm512_storeu_ps(ci, lo[i]);
        _mm512_storeu_ps(ci + kGemmNR, hi[i]);
    }
}

constexpr GemmKernels kAvx512 = {
    round_fp16_avx2, half_to_float_avx2, gemm_tile_avx2, gemm_block_avx512,
    gemv_rows_avx2<float>, gemv_rows_avx2<uint16_t>, gemv_cols_avx2<float>, gemv_cols_avx2<uint16_t>,
    pack_b_cols_avx2<float>, pack_b_cols_avx2<uint16_t>, pack_b_rows_avx2<float>, pack_b_rows_avx2<uint16_t>,
    pack_a_rows_avx2,
};
#endif  // ORION_X86

// ---------------------------------------------------------------------------------------------

const GemmKernels& active() {
    static const GemmKernels& kernels = [] () -> const GemmKernels& {
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

// Packs A(m0.., p0..) [mc x kc] into row panels [kc][MR], zero-padding the last panel's rows.
void pack_a(const GemmKernels& k, const float* a, int64_t a_rs, int64_t a_cs, int64_t m0, int64_t mc, int64_t p0,
            int64_t kc, float* dst) {
    for (int64_t i0 = 0; i0 < mc; i0 += kGemmMR, dst += kc * kGemmMR) {
        const int64_t rows = std::min(kGemmMR, mc - i0);
        if (a_rs == 1 && rows == kGemmMR) {  // columns of A contiguous: one short copy per p
            for (int64_t p = 0; p < kc; ++p)
                std::memcpy(dst + p * kGemmMR, a + (m0 + i0) + (p0 + p) * a_cs, kGemmMR * sizeof(float));
            continue;
        }
        if (a_cs == 1 && rows == kGemmMR) {  // rows of A contiguous: the flavour's transposing copy
            k.pack_a_rows(a + (m0 + i0) * a_rs + p0, a_rs, kc, dst);
            continue;
        }
        for (int64_t p = 0; p < kc; ++p) {
            const float* src = a + (m0 + i0) * a_rs + (p0 + p) * a_cs;
            for (int64_t i = 0; i < kGemmMR; ++i) dst[p * kGemmMR + i] = i < rows ? src[i * a_rs] : 0.0f;
        }
    }
}

// Packs one column panel of B(p0.., j0..) [kc x cols <= NR] into [kc][NR], zero-padding its columns;
// an fp16 B is widened exactly on the way.
template <typename B>
void pack_b_panel(const GemmKernels& k, const B* b, int64_t b_rs, int64_t b_cs, int64_t p0, int64_t kc, int64_t j0,
                  int64_t cols, float* dst) {
    if (b_cs == 1 && cols == kGemmNR) {  // rows of B contiguous, a full panel: the flavour's row copy
        if constexpr (std::is_same_v<B, float>) k.pack_b_rows(b + p0 * b_rs + j0, b_rs, kc, dst);
        else k.pack_b_rows_f16(b + p0 * b_rs + j0, b_rs, kc, dst);
        return;
    }
    if (b_cs == 1) {
        for (int64_t p = 0; p < kc; ++p) {
            const B* src = b + (p0 + p) * b_rs + j0;
            float* row = dst + p * kGemmNR;
            if constexpr (std::is_same_v<B, float>) std::memcpy(row, src, static_cast<size_t>(cols) * sizeof(float));
            else k.half_to_float(src, row, static_cast<size_t>(cols));
            std::fill(row + cols, row + kGemmNR, 0.0f);
        }
        return;
    }
    if (b_rs == 1 && cols == kGemmNR) {  // columns of B contiguous: the flavour's transposing copy
        if constexpr (std::is_same_v<B, float>) k.pack_b_cols(b + p0 + j0 * b_cs, b_cs, kc, dst);
        else k.pack_b_cols_f16(b + p0 + j0 * b_cs, b_cs, kc, dst);
        return;
    }
    if (cols < kGemmNR)
        for (int64_t p = 0; p < kc; ++p) std::fill(dst + p * kGemmNR + cols, dst + (p + 1) * kGemmNR, 0.0f);
    for (int64_t j = 0; j < cols; ++j) {  // column by column: contiguous reads when B is transposed
        const B* src = b + p0 * b_rs + (j0 + j) * b_cs;
        for (int64_t p = 0; p < kc; ++p) dst[p * kGemmNR + j] = as_float(src[p * b_rs]);
    }
}

// The packed GEMM's A and B packs, in the calling thread's buffers kept across calls (at most 1.5 + 2 MiB a
// thread; a call's packs are used by the pool's workers until it returns, and a thread runs one call at a
// time: nested parallel_for runs inline). New vectors per call cost a zero fill of up to 3.5 MiB, and
// fresh pages to fault in, for values the packing overwrites (it writes every element, padding included).
struct PackBuffers {
    std::vector<float> a, b;
};

PackBuffers& pack_buffers() {
    thread_local PackBuffers buffers;
    return buffers;
}

// The packed GEMM (BLIS-style). C is cut into outer blocks of up to kGemmOuterM x kGemmOuterN; for each
// block and each slice of kGemmKC along K, the threads first pack A's row panels and B's column panels
// (each element once), then compute jobs of kGemmMC rows x a column chunk from the shared packs. Each
// element of C is summed as gemm_tile sums it: from 0 over a K slice in order, then added to C, slice
// after slice; it is rounded to fp16 (when asked) after the last slice.
template <typename B>
void gemm_packed(const GemmKernels& k, int64_t M, int64_t N, int64_t K, const float* a, int64_t a_rs, int64_t a_cs,
                 const B* b, int64_t b_rs, int64_t b_cs, float* c, int64_t c_rs, bool round_fp16) {
    PackBuffers& packs = pack_buffers();
    float* const a_packed = scratch(packs.a, static_cast<size_t>(ceil_div(std::min(M, kGemmOuterM), kGemmMR) * kGemmMR * kGemmKC));
    float* const b_packed = scratch(packs.b, static_cast<size_t>(ceil_div(std::min(N, kGemmOuterN), kGemmNR) * kGemmNR * kGemmKC));
    const int64_t by = k.gemm_block ? 2 : 1;
    for (int64_t mo = 0; mo < M; mo += kGemmOuterM)
        for (int64_t no = 0; no < N; no += kGemmOuterN) {
            const int64_t mb = std::min(kGemmOuterM, M - mo), nb = std::min(kGemmOuterN, N - no);
            const int64_t a_panels = ceil_div(mb, kGemmMR), b_panels = ceil_div(nb, kGemmNR);
            // Jobs: kGemmMC rows x a chunk of whole 2NR column groups, a few jobs per thread.
            const int64_t tiles_m = ceil_div(mb, kGemmMC);
            const int64_t groups = ceil_div(nb, 2 * kGemmNR);
            const int64_t chunks_n = std::clamp<int64_t>(ceil_div(int64_t{4} * num_threads(), tiles_m), 1, groups);
            const int64_t chunk = ceil_div(groups, chunks_n) * 2 * kGemmNR;
            const int64_t tiles_n = ceil_div(nb, chunk);
            for (int64_t p0 = 0; p0 < K; p0 += kGemmKC) {
                const int64_t kc = std::min(kGemmKC, K - p0);
                const bool add = p0 > 0, last = p0 + kc >= K;
                parallel_for(a_panels + b_panels, std::max<int64_t>(1, kParallelWork / (16 * kc * kGemmNR)),
                             [&](int64_t begin, int64_t end) {
                    for (int64_t q = begin; q < end; ++q) {
                        if (q < a_panels) {
                            const int64_t i0 = q * kGemmMR;
                            pack_a(k, a, a_rs, a_cs, mo + i0, std::min(kGemmMR, mb - i0), p0, kc, a_packed + i0 * kc);
                        } else {
                            const int64_t j0 = (q - a_panels) * kGemmNR;
                            pack_b_panel(k, b, b_rs, b_cs, p0, kc, no + j0, std::min(kGemmNR, nb - j0),
                                         b_packed + j0 * kc);
                        }
                    }
                });
                const int64_t job_work = std::min(mb, kGemmMC) * std::min(nb, chunk) * kc;
                parallel_for(tiles_m * tiles_n, std::max<int64_t>(1, kParallelWork / job_work), [&](int64_t begin,
                                                                                                     int64_t end) {
                    for (int64_t t = begin; t < end; ++t) {
                        const int64_t m0 = t / tiles_n * kGemmMC, n0 = t % tiles_n * chunk;
                        const int64_t mc = std::min(kGemmMC, mb - m0), nc = std::min(chunk, nb - n0);
                        const float* ap = a_packed + m0 * kc;
                        const float* bp = b_packed + n0 * kc;
                        float* ct = c + (mo + m0) * c_rs + no + n0;
                        // Blocks of 2x2 register tiles where the flavour has them, single tiles at the edges.
                        for (int64_t j0 = 0; j0 < nc; j0 += by * kGemmNR)
                            for (int64_t i0 = 0; i0 < mc; i0 += by * kGemmMR) {
                                if (by == 2 && i0 + 2 * kGemmMR <= mc && j0 + 2 * kGemmNR <= nc) {
                                    k.gemm_block(kc, ap + i0 * kc, ap + (i0 + kGemmMR) * kc, bp + j0 * kc,
                                                 bp + (j0 + kGemmNR) * kc, ct + i0 * c_rs + j0, c_rs, add);
                                    continue;
                                }
                                for (int64_t j = j0; j < std::min(nc, j0 + by * kGemmNR); j += kGemmNR)
                                    for (int64_t i = i0; i < std::min(mc, i0 + by * kGemmMR); i += kGemmMR)
                                        k.gemm_tile(kc, ap + i * kc, bp + j * kc, ct + i * c_rs + j, c_rs,
                                                    std::min(kGemmMR, mc - i), std::min(kGemmNR, nc - j), add);
                            }
                        if (last && round_fp16)
                            for (int64_t i = 0; i < mc; ++i) k.round_fp16(ct + i * c_rs, static_cast<size_t>(nc));
                    }
                });
            }
        }
}

// A few rows of A: stream B once per row in its natural order, split over columns.
template <typename B>
void gemv_path(const GemmKernels& k, int64_t M, int64_t N, int64_t K, const float* a, int64_t a_rs, int64_t a_cs,
               const B* b, int64_t b_rs, int64_t b_cs, float* c, int64_t c_rs, bool round_fp16) {
    constexpr int64_t kColumnBlock = 64;
    const int64_t blocks = ceil_div(N, kColumnBlock);
    parallel_for(blocks, std::max<int64_t>(1, kParallelWork / (kColumnBlock * K)), [&](int64_t begin, int64_t end) {
        const int64_t n0 = begin * kColumnBlock, n = std::min(N, end * kColumnBlock) - n0;
        thread_local std::vector<float> row_buffer;
        for (int64_t m = 0; m < M; ++m) {
            float* c_row = c + m * c_rs + n0;
            if (b_cs == 1) {
                if constexpr (std::is_same_v<B, float>) k.gemv_rows(K, n, a + m * a_rs, a_cs, b + n0, b_rs, c_row);
                else k.gemv_rows_f16(K, n, a + m * a_rs, a_cs, b + n0, b_rs, c_row);
            } else {
                float* a_row = scratch(row_buffer, static_cast<size_t>(K));
                for (int64_t p = 0; p < K; ++p) a_row[p] = a[m * a_rs + p * a_cs];
                if constexpr (std::is_same_v<B, float>) k.gemv_cols(K, n, a_row, b + n0 * b_cs, b_cs, c_row);
                else k.gemv_cols_f16(K, n, a_row, b + n0 * b_cs, b_cs, c_row);
            }
            if (round_fp16) k.round_fp16(c_row, static_cast<size_t>(n));
        }
    });
}

bool zero_sized(int64_t M, int64_t N, int64_t K, float* c, int64_t c_rs) {
    if (M < 0 || N < 0 || K < 0) throw std::invalid_argument("gemm: negative size");
    if (M == 0 || N == 0) return true;
    if (K == 0) {
        for (int64_t m = 0; m < M; ++m) std::fill(c + m * c_rs, c + m * c_rs + N, 0.0f);
        return true;
    }
    return false;
}

}  // namespace

void gemm_f16b(int64_t M, int64_t N, int64_t K, const float* a, int64_t a_rs, int64_t a_cs, const uint16_t* b,
               int64_t b_rs, int64_t b_cs, float* c, int64_t c_rs, bool round_fp16) {
    if (zero_sized(M, N, K, c, c_rs)) return;
    if (M <= kGemvMaxM && (b_cs == 1 || b_rs == 1))
        return gemv_path(active(), M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, c_rs, round_fp16);
    gemm_packed(active(), M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, c_rs, round_fp16);  // B widened as it is packed
}

void gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t b_rs,
          int64_t b_cs, float* c, int64_t c_rs, bool round_fp16) {
    if (zero_sized(M, N, K, c, c_rs)) return;
    const GemmKernels& k = active();
    if (M <= kGemvMaxM && (b_cs == 1 || b_rs == 1))
        return gemv_path(k, M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, c_rs, round_fp16);
    // One contiguous column of C (a decode step's RoPE partner times its [head_dim, 1] heads): its transpose,
    // the row b^T A^T, streams A as gemv instead of packing it for a one-column tile.
    if (N == 1 && c_rs == 1 && (a_cs == 1 || a_rs == 1))
        return gemv_path(k, 1, M, K, b, 0, b_rs, a, a_cs, a_rs, c, 0, round_fp16);
    gemm_packed(k, M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, c_rs, round_fp16);
}

}  // namespace orion::emu::kernels
