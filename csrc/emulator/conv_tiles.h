// What the two conv kernel files share (internal to the emulator, not an API; the SIMD macros are simd.h's): the
// 1x1-conv panel geometry, the register tiles generic over how a panel's rows are read (fp16, fp32 in
// kernels.cpp; int8 and 4/6-bit in low_bit_kernels.cpp), and the low-bit tiles the flavour tables of
// kernels.cpp point at.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string_view>
#include <type_traits>
#include <vector>

#include "emulator/fp16.h"
#include "emulator/kernels.h"
#include "emulator/simd.h"

namespace orion::emu::kernels {

constexpr int64_t kConvPanel = 16;     // output channels interleaved per packed conv panel
// From this many lanes on, a conv tile sums each output in one partial sum, c in order (fewer lanes
// interleave 2: conv_tile_avx2_rows, conv_tile_avx512_rows).
constexpr int kConvSequentialLanes = 4;
// How far ahead a decode tile (fewer than kConvSequentialLanes lanes, its panel streamed from memory once)
// prefetches its rows, when their reader gives their addresses (`at(c)` and `kRowBytes`): the hardware
// prefetcher alone leaves the FMAs waiting.
constexpr int64_t kConvPrefetchBytes = 4096;

// One panel (16 output channels) of a PackedConv1x1Q, as the low-bit tiles read it.
struct QPanel {
    PackedConv1x1Q::Kind kind = PackedConv1x1Q::Kind::lut4;
    const uint8_t* rows = nullptr;      // the panel's cin rows of row_bytes
    int64_t row_bytes = 8;
    const float* lut = nullptr;         // lut kinds: [2 halves or 16 channels][entries]
    int64_t entries = 16;
    bool channel_luts = false;
    const uint16_t* params = nullptr;   // affine4: per block of rows, 16 fp16 scales then 16 fp16 zero points
    const uint8_t* lut_bytes = nullptr; // lut4 in the AVX2 layout (PackedConv1x1Q::lut_bytes): rows in pairs
    int block_shift = 5;
    bool affine4_pairs = false;         // affine4 in the AVX2 layout (PackedConv1x1Q::affine4_pairs)
    bool affine4_octets = false;        // affine4 in the AVX2 layout (PackedConv1x1Q::affine4_octets)
    int64_t channel_bytes = 0;          // the channel-major layout (PackedConv1x1Q::channel_major): the bytes of
                                        // each channel's rows (0: another layout)
    const uint16_t* channel_params = nullptr;  // affine4 channel-major: per channel, its blocks' fp16 s, then z
    uint64_t call = 0;                  // which conv1x1 call reads it (0: unknown): the channel-major tiles copy x
                                        // once per call and thread, not once per panel
};

// fp16 bits -> fp32, all 65536 of them.
inline const float* half_table() {
    static const std::vector<float> table = [] {
        std::vector<float> t(65536);
        for (uint32_t h = 0; h < 65536; ++h) t[h] = emu::half_to_float(static_cast<uint16_t>(h));
        return t;
    }();
    return table.data();
}

// The portable conv tile (Kernels::conv_tile_f16 / conv_tile_f32).
template <typename W>
void conv_tile_portable(const W* w, const float* x, int64_t S, int64_t k, int lanes, float* acc, bool add) {
    const float* table = half_table();
    for (int l = 0; l < lanes; ++l) {
        float sum[kConvPanel] = {};
        for (int64_t c = 0; c < k; ++c) {
            const float xv = x[c * S + l];
            for (int j = 0; j < kConvPanel; ++j) {
                if constexpr (sizeof(W) == 2) {
                    sum[j] += table[w[c * kConvPanel + j]] * xv;
                } else {
                    sum[j] += w[c * kConvPanel + j] * xv;
                }
            }
        }
        for (int j = 0; j < kConvPanel; ++j) acc[l * kConvPanel + j] = (add ? acc[l * kConvPanel + j] : 0.0f) + sum[j];
    }
}

// A content hash of `bytes`: fixed 1 MiB chunks hashed on the threads, then combined in order (the
// same for any thread count).
inline size_t content_key(std::string_view bytes) {
    constexpr size_t kChunk = size_t{1} << 20;
    const int64_t chunks = static_cast<int64_t>((bytes.size() + kChunk - 1) / kChunk);
    std::vector<size_t> parts(static_cast<size_t>(chunks));
    parallel_for(chunks, 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i)
            parts[static_cast<size_t>(i)] = std::hash<std::string_view>{}(bytes.substr(static_cast<size_t>(i) * kChunk, kChunk));
    });
    size_t key = bytes.size();
    for (size_t part : parts) key = (key ^ part) * 0x100000001B3ull;
    return key;
}

// The low-bit tiles of each flavour (low_bit_kernels.cpp), as kernels.cpp's Kernels tables name them.
void conv_tile_i8_portable(const int8_t* w, const float* scale, const float* x, int64_t S, int64_t k, int lanes,
                           float* acc, bool add);
void dequant_i8_portable(const int8_t* w, const float* scale, float* dst, int64_t rows);
void widen_q_portable(const QPanel& p, int64_t c0, float* dst, int64_t rows);
void conv_tile_q_portable(const QPanel& p, int64_t c0, const float* x, int64_t S, int64_t k, int lanes, float* acc,
                          bool add);
// The panel p (16 output channels) of w, as the low-bit tiles read it.
QPanel q_panel(const PackedConv1x1Q& w, int64_t p);
// Adds the low-bit packed weights alive in this process (shared_conv1x1_q) to count and bytes.
void add_low_bit_usage(int64_t& count, int64_t& bytes);

#ifdef ORION_X86
ORION_AVX2 inline __m256 round8(__m256 v) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}


// 16 outputs x L lanes in 2*L*U accumulators; U interleaved partial sums over the input channels
// keep enough FMAs in flight when L is small (the bandwidth-bound decode case).
// The start and end of every such tile, whatever decodes its weight rows: the partial sums start at
// zero (partial sum 0 at acc's values if add); the rows from c to k go to partial sum 0; then the U
// partial sums are added in order and stored.
#define ORION_TILE_INLINE ORION_AVX2 __attribute__((always_inline)) inline

// Whether a row reader gives its rows' addresses (`at(c)`, `kRowBytes`), for prefetch_row.
template <typename Rows, typename = void>
struct AddressedRows : std::false_type {};
template <typename Rows>
struct AddressedRows<Rows, std::void_t<decltype(Rows::kRowBytes)>> : std::true_type {};

// Whether a row reader streams its rows from memory whatever the tile's lanes (`kStreamed`): fp16 panels, read
// once per lane tile or by the tile that widens them for the others (not the widened fp32 rows, in L1).
template <typename Rows, typename = void>
struct StreamedRows : std::false_type {};
template <typename Rows>
struct StreamedRows<Rows, std::void_t<decltype(Rows::kStreamed)>> : std::bool_constant<Rows::kStreamed> {};

// Row (c + u)'s cache line kConvPrefetchBytes ahead, in decode's tiles and in tiles of any width over streamed
// rows, from a loop that reads U rows a step from a c that is a multiple of U (u: the unrolled loop's index, so
// the test folds): the rows starting a cache line when U rows span whole lines (fp16, int8 at one lane), else
// the step's first row.
template <int L, typename Rows>
ORION_TILE_INLINE void prefetch_row(const Rows& rows, int64_t c, int u) {
    if constexpr ((L < kConvSequentialLanes || StreamedRows<Rows>::value) && AddressedRows<Rows>::value) {
        if ((u * Rows::kRowBytes) % 64 == 0)
            prefetch_streamed(rows.at(c + u + kConvPrefetchBytes / Rows::kRowBytes));
    }
}
template <int L, int U>
ORION_TILE_INLINE void conv_tile_start(__m256 (&lo)[U][L], __m256 (&hi)[U][L], const float* acc, bool add) {
    ORION_UNROLL
    for (int u = 0; u < U; ++u)
        ORION_UNROLL
        for (int l = 0; l < L; ++l) lo[u][l] = hi[u][l] = _mm256_setzero_ps();
    if (add)
        ORION_UNROLL
        for (int l = 0; l < L; ++l) {
            lo[0][l] = _mm256_loadu_ps(acc + l * kConvPanel);
            hi[0][l] = _mm256_loadu_ps(acc + l * kConvPanel + 8);
        }
}

// Two decoded weight rows (w[r] = row `row + r`'s 16 outputs as lo/hi halves) times their lanes of x, into
// partial sums (slot + r) % U.
template <int L, int U>
ORION_TILE_INLINE void fma_row_pair(const __m256 (&w)[2][2], const float* x, int64_t S, int64_t row, int slot,
                                    __m256 (&lo)[U][L], __m256 (&hi)[U][L]) {
    ORION_UNROLL
    for (int r = 0; r < 2; ++r) {
        const float* xc = x + (row + r) * S;
        ORION_UNROLL
        for (int l = 0; l < L; ++l) {
            const __m256 xv = _mm256_broadcast_ss(xc + l);
            lo[(slot + r) % U][l] = _mm256_fmadd_ps(w[r][0], xv, lo[(slot + r) % U][l]);
            hi[(slot + r) % U][l] = _mm256_fmadd_ps(w[r][1], xv, hi[(slot + r) % U][l]);
        }
    }
}

// The U partial sums added in order into partial sum 0.
template <int L, int U>
ORION_TILE_INLINE void sum_partials(__m256 (&lo)[U][L], __m256 (&hi)[U][L]) {
    ORION_UNROLL
    for (int u = 1; u < U; ++u)
        ORION_UNROLL
        for (int l = 0; l < L; ++l) {
            lo[0][l] = _mm256_add_ps(lo[0][l], lo[u][l]);
            hi[0][l] = _mm256_add_ps(hi[0][l], hi[u][l]);
        }
}

template <int L, int U, typename Rows>
ORION_TILE_INLINE void conv_tile_finish(__m256 (&lo)[U][L], __m256 (&hi)[U][L], Rows& rows, const float* x, int64_t S,
                                        int64_t c, int64_t k, float* acc) {
    for (; c < k; ++c) {
        const __m256 w_lo = rows.lo(c), w_hi = rows.hi(c);
        ORION_UNROLL
        for (int l = 0; l < L; ++l) {
            const __m256 xv = _mm256_broadcast_ss(x + c * S + l);
            lo[0][l] = _mm256_fmadd_ps(w_lo, xv, lo[0][l]);
            hi[0][l] = _mm256_fmadd_ps(w_hi, xv, hi[0][l]);
        }
    }
    sum_partials<L, U>(lo, hi);
    ORION_UNROLL
    for (int l = 0; l < L; ++l) {
        _mm256_storeu_ps(acc + l * kConvPanel, lo[0][l]);
        _mm256_storeu_ps(acc + l * kConvPanel + 8, hi[0][l]);
    }
}

template <int L, int U, typename Rows>
ORION_AVX2 void conv_tile_avx2_fixed(Rows rows, const float* x, int64_t S, int64_t k, float* acc, bool add) {
    __m256 lo[U][L], hi[U][L];
    conv_tile_start<L, U>(lo, hi, acc, add);
    int64_t c = 0;
    for (; c + U <= k; c += U) {
        ORION_UNROLL
        for (int u = 0; u < U; ++u) {
            prefetch_row<L>(rows, c, u);
            const float* xc = x + (c + u) * S;
            const __m256 w_lo = rows.lo(c + u), w_hi = rows.hi(c + u);
            ORION_UNROLL
            for (int l = 0; l < L; ++l) {
                const __m256 xv = _mm256_broadcast_ss(xc + l);
                lo[u][l] = _mm256_fmadd_ps(w_lo, xv, lo[u][l]);
                hi[u][l] = _mm256_fmadd_ps(w_hi, xv, hi[u][l]);
            }
        }
    }
    conv_tile_finish<L, U>(lo, hi, rows, x, S, c, k, acc);
}

template <typename Rows>
ORION_AVX2 void conv_tile_avx2_rows(Rows rows, const float* x, int64_t S, int64_t k, int lanes, float* acc, bool add) {
    switch (lanes) {
        case 1: return conv_tile_avx2_fixed<1, 2>(rows, x, S, k, acc, add);
        case 2: return conv_tile_avx2_fixed<2, 2>(rows, x, S, k, acc, add);
        case 3: return conv_tile_avx2_fixed<3, 2>(rows, x, S, k, acc, add);
        case 4: return conv_tile_avx2_fixed<4, 1>(rows, x, S, k, acc, add);
        case 5: return conv_tile_avx2_fixed<5, 1>(rows, x, S, k, acc, add);
        default: return conv_tile_avx2_fixed<6, 1>(rows, x, S, k, acc, add);
    }
}

ORION_AVX2 void conv_tile_i8_avx2(const int8_t* w, const float* scale, const float* x, int64_t S, int64_t k,
                                  int lanes, float* acc, bool add);
ORION_AVX2 void dequant_i8_avx2(const int8_t* w, const float* scale, float* dst, int64_t rows);
ORION_AVX2 void conv_tile_q_avx2(const QPanel& p, int64_t c0, const float* x, int64_t S, int64_t k, int lanes,
                                 float* acc, bool add);
ORION_AVX2 void widen_q_avx2(const QPanel& p, int64_t c0, float* dst, int64_t n);

ORION_AVX512 inline __m512 load16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
ORION_AVX512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

// Whether an AVX-512 row reader gives its 16 outputs with the panel's halves interleaved (`kInterleaved`): output
// j < 8 in lane 2j, output 8 + j in lane 2j + 1 (what one 64-bit shift per lane pair decodes from a row of
// nibbles). The tiles keep such sums interleaved and put them in order at the end (the same sums, lanes moved).
template <typename Rows, typename = void>
struct InterleavedRows : std::false_type {};
template <typename Rows>
struct InterleavedRows<Rows, std::void_t<decltype(Rows::kInterleaved)>> : std::true_type {};

// 16 outputs in order from interleaved lanes, and back.
ORION_AVX512 inline __m512 deinterleave16(__m512 v) {
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15), v);
}
ORION_AVX512 inline __m512 interleave16(__m512 v) {
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15), v);
}

// The AVX-512 tiles' U partial sums of L lanes (row c into sum[c % U]), kept interleaved when `Interleaved`:
// all zero, sum[0] starting from acc's L rows of 16 when adding...
template <int L, int U, bool Interleaved>
ORION_AVX512 __attribute__((always_inline)) inline void tile_sums_start(__m512 (&sum)[U][L], const float* acc, bool add) {
    ORION_UNROLL
    for (int u = 0; u < U; ++u)
        ORION_UNROLL
        for (int l = 0; l < L; ++l) sum[u][l] = _mm512_setzero_ps();
    if (add)
        ORION_UNROLL
        for (int l = 0; l < L; ++l) {
            sum[0][l] = _mm512_loadu_ps(acc + l * kConvPanel);
            if constexpr (Interleaved) sum[0][l] = interleave16(sum[0][l]);
        }
}

// ... and at the end added in order (sum[0] + sum[1] + ...) and stored to acc in output order.
template <int L, int U, bool Interleaved>
ORION_AVX512 __attribute__((always_inline)) inline void tile_sums_store(__m512 (&sum)[U][L], float* acc) {
    ORION_UNROLL
    for (int u = 1; u < U; ++u)
        ORION_UNROLL
        for (int l = 0; l < L; ++l) sum[0][l] = _mm512_add_ps(sum[0][l], sum[u][l]);
    ORION_UNROLL
    for (int l = 0; l < L; ++l) {
        if constexpr (Interleaved) sum[0][l] = deinterleave16(sum[0][l]);
        _mm512_storeu_ps(acc + l * kConvPanel, sum[0][l]);
    }
}

template <int L, int U, typename Rows>
ORION_AVX512 void conv_tile_avx512_fixed(Rows rows, const float* x, int64_t S, int64_t k, float* acc, bool add) {
    constexpr bool interleaved = InterleavedRows<Rows>::value;
    __m512 sum[U][L];
    tile_sums_start<L, U, interleaved>(sum, acc, add);
    int64_t c = 0;
    for (; c + U <= k; c += U) {
        ORION_UNROLL
        for (int u = 0; u < U; ++u) {
            prefetch_row<L>(rows, c, u);
            const __m512 wv = rows.row(c + u);
            const float* xc = x + (c + u) * S;
            ORION_UNROLL
            for (int l = 0; l < L; ++l) sum[u][l] = _mm512_fmadd_ps(wv, _mm512_set1_ps(xc[l]), sum[u][l]);
        }
    }
    for (; c < k; ++c) {
        const __m512 wv = rows.row(c);
        ORION_UNROLL
        for (int l = 0; l < L; ++l) sum[0][l] = _mm512_fmadd_ps(wv, _mm512_set1_ps(x[c * S + l]), sum[0][l]);
    }
    tile_sums_store<L, U, interleaved>(sum, acc);
}

template <typename Rows>
ORION_AVX512 void conv_tile_avx512_rows(Rows rows, const float* x, int64_t S, int64_t k, int lanes, float* acc, bool add) {
    switch (lanes) {
        case 1: return conv_tile_avx512_fixed<1, 2>(rows, x, S, k, acc, add);
        case 2: return conv_tile_avx512_fixed<2, 2>(rows, x, S, k, acc, add);
        case 3: return conv_tile_avx512_fixed<3, 2>(rows, x, S, k, acc, add);
        case 4: return conv_tile_avx512_fixed<4, 1>(rows, x, S, k, acc, add);
        case 5: return conv_tile_avx512_fixed<5, 1>(rows, x, S, k, acc, add);
        case 6: return conv_tile_avx512_fixed<6, 1>(rows, x, S, k, acc, add);
        case 7: return conv_tile_avx512_fixed<7, 1>(rows, x, S, k, acc, add);
        case 8: return conv_tile_avx512_fixed<8, 1>(rows, x, S, k, acc, add);
        case 9: return conv_tile_avx512_fixed<9, 1>(rows, x, S, k, acc, add);
        case 10: return conv_tile_avx512_fixed<10, 1>(rows, x, S, k, acc, add);
        case 11: return conv_tile_avx512_fixed<11, 1>(rows, x, S, k, acc, add);
        default: return conv_tile_avx512_fixed<12, 1>(rows, x, S, k, acc, add);
    }
}

ORION_AVX512 void conv_tile_i8_avx512(const int8_t* w, const float* scale, const float* x, int64_t S, int64_t k,
                                      int lanes, float* acc, bool add);
ORION_AVX512 void conv_tile_q_avx512(const QPanel& p, int64_t c0, const float* x, int64_t S, int64_t k, int lanes,
                                     float* acc, bool add);
ORION_AVX512 void widen_q_avx512(const QPanel& p, int64_t c0, float* dst, int64_t n);
#endif  // ORION_X86

}  // namespace orion::emu::kernels
