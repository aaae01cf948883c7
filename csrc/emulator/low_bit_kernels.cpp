// The low-bit 1x1-conv weights: int8 (one scale per output channel) and 4/6-bit (palettized or
// block-wise affine): their packing and the tiles that decode them exactly inside the conv, one per SIMD
// flavour. kernels.cpp's conv driver runs these tiles as it runs the fp16 ones.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "emulator/conv_tiles.h"
#include "emulator/fp16.h"
#include "emulator/kernels.h"
#include "emulator/keyed_weights.h"

namespace orion::emu::kernels {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The low-bit packed weights alive in this process, by content hash (packed first, then shared).
std::mutex shared_q_mutex;
std::unordered_multimap<size_t, std::weak_ptr<const PackedConv1x1Q>> shared_q;

bool same_content(const PackedConv1x1Q& a, const PackedConv1x1Q& b) {
    return a.kind == b.kind && a.cout == b.cout && a.cin == b.cin && a.block_shift == b.block_shift &&
           a.channel_luts == b.channel_luts && a.affine4_pairs == b.affine4_pairs &&
           a.affine4_octets == b.affine4_octets && a.channel_major == b.channel_major && a.data == b.data &&
           a.lut == b.lut && a.params == b.params && a.lut_bytes == b.lut_bytes && a.channel_params == b.channel_params;
}

// lut4's channel-major layout (PackedConv1x1Q::channel_major): where row r of a chunk of 32 rows is. AVX2: byte
// (r / 16) * 8 + r % 8 of the chunk's 16, the high nibble when r / 8 is odd (so that the AVX2 decode gives rows
// in order); AVX-512 (`halves`): byte r % 16, the high nibble when r >= 16 (one widening gives rows 0-15).
int64_t chunk_byte(int64_t r, bool halves) { return halves ? r % 16 : (r / 16) * 8 + r % 8; }
int chunk_shift(int64_t r, bool halves) { return 4 * static_cast<int>(halves ? r / 16 : (r / 8) % 2); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Portable flavour.

void conv_tile_i8_portable(const int8_t* w, const float* scale, const float* x, int64_t S, int64_t k, int lanes,
                           float* acc, bool add) {
    for (int l = 0; l < lanes; ++l) {
        float sum[kConvPanel] = {};
        for (int64_t c = 0; c < k; ++c) {
            const float xv = x[c * S + l];
            for (int j = 0; j < kConvPanel; ++j)
                sum[j] += static_cast<float>(w[c * kConvPanel + j]) * (scale ? scale[j] : 1.0f) * xv;
        }
        for (int j = 0; j < kConvPanel; ++j) acc[l * kConvPanel + j] = (add ? acc[l * kConvPanel + j] : 0.0f) + sum[j];
    }
}

void dequant_i8_portable(const int8_t* w, const float* scale, float* dst, int64_t rows) {
    for (int64_t r = 0; r < rows; ++r)
        for (int j = 0; j < kConvPanel; ++j)
            dst[r * kConvPanel + j] = static_cast<float>(w[r * kConvPanel + j]) * (scale ? scale[j] : 1.0f);
}

void widen_q_portable(const QPanel& p, int64_t c0, float* dst, int64_t rows) {
    const float* table = half_table();
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t c = c0 + r;
        const uint8_t* row = p.rows + c * p.row_bytes;
        for (int j = 0; j < kConvPanel; ++j) {
            int index = (row[j / 2] >> (4 * (j % 2))) & 15;
            float w = 0.0f;
            switch (p.kind) {
                case PackedConv1x1Q::Kind::lut6:
                    index |= ((row[8 + j / 4] >> (2 * (j % 4))) & 3) << 4;
                    [[fallthrough]];
                case PackedConv1x1Q::Kind::lut4: w = p.lut[(p.channel_luts ? j : j / 8) * p.entries + index]; break;
                case PackedConv1x1Q::Kind::affine4: {
                    const uint16_t* block = p.params + (c >> p.block_shift) * 2 * kConvPanel;
                    // (u - z) is an fp16 value (checked at pack), its product with s exact in fp32: one rounding
                    w = emu::round_to_fp16((static_cast<float>(index) - table[block[kConvPanel + j]]) * table[block[j]]);
                    break;
                }
            }
            dst[r * kConvPanel + j] = w;
        }
    }
}

void conv_tile_q_portable(const QPanel& p, int64_t c0, const float* x, int64_t S, int64_t k, int lanes, float* acc,
                          bool add) {
    thread_local std::vector<float> rows;
    if (rows.size() < static_cast<size_t>(k * kConvPanel)) rows.resize(static_cast<size_t>(k * kConvPanel));
    widen_q_portable(p, c0, rows.data(), k);
    conv_tile_portable<float>(rows.data(), x, S, k, lanes, acc, add);  // the fp16 tile's sums, on the same values
}

// ---------------------------------------------------------------------------------------------
// AVX2 + F16C + FMA flavour.
#ifdef ORION_X86
namespace {

// 8 int8 values as fp32 (times 8 scales: exact when the products are fp16 values).
ORION_AVX2 inline __m256 load8_i8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
ORION_AVX2 inline __m256 load8_i8(const int8_t* p, __m256 scale) { return _mm256_mul_ps(load8_i8(p), scale); }

struct Int8Rows8 {
    static constexpr int64_t kRowBytes = kConvPanel;
    const int8_t* w;
    const int8_t* at(int64_t c) const { return w + c * kConvPanel; }
    __m256 scale_lo, scale_hi;
    ORION_AVX2 __m256 lo(int64_t c) const { return load8_i8(w + c * kConvPanel, scale_lo); }
    ORION_AVX2 __m256 hi(int64_t c) const { return load8_i8(w + c * kConvPanel + 8, scale_hi); }
};
struct UnscaledInt8Rows8 {
    static constexpr int64_t kRowBytes = kConvPanel;
    const int8_t* w;
    const int8_t* at(int64_t c) const { return w + c * kConvPanel; }
    ORION_AVX2 __m256 lo(int64_t c) const { return load8_i8(w + c * kConvPanel); }
    ORION_AVX2 __m256 hi(int64_t c) const { return load8_i8(w + c * kConvPanel + 8); }
};

// Low-bit rows (PackedConv1x1Q) as two fp32 halves, each weight formed exactly.
// The 8 nibbles of the 32-bit word at p, nibble k in lane k.
ORION_AVX2 inline __m256i nibbles8(const uint8_t* p) {
    uint32_t word;
    std::memcpy(&word, p, 4);
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)),
                                              _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                            _mm256_set1_epi32(15));
}
// t[idx] for idx in [0, 16), the table's entries 0-7 in t0 and 8-15 in t1.
ORION_AVX2 inline __m256 lookup16(__m256i idx, __m256 t0, __m256 t1) {
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(t0, idx), _mm256_permutevar8x32_ps(t1, idx),
                            _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));  // bit 3 picks t1
}
struct Lut4Rows8 {
    static constexpr int64_t kRowBytes = 8;
    const uint8_t* w;
    const uint8_t* at(int64_t c) const { return w + c * kRowBytes; }
    __m256 a0, a1, b0, b1;  // the low half's LUT (entries 0-7, 8-15), the high half's
    ORION_AVX2 __m256 lo(int64_t c) const { return lookup16(nibbles8(w + c * 8), a0, a1); }
    ORION_AVX2 __m256 hi(int64_t c) const { return lookup16(nibbles8(w + c * 8 + 4), b0, b1); }
};
// Any LUT by a gather: 4- or 6-bit indices, one LUT per half or per output channel.
struct LutGatherRows8 {
    const uint8_t* w;
    const float* lut;
    int64_t row_bytes;
    int64_t entries;
    bool six_bits, channel_luts;
    ORION_AVX2 __m256 make(int64_t c, int half) const {
        const uint8_t* row = w + c * row_bytes;
        __m256i index = nibbles8(row + 4 * half);
        if (six_bits) {
            uint16_t high;
            std::memcpy(&high, row + 8 + 2 * half, 2);
            const __m256i top = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(high),
                                                                   _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                                 _mm256_set1_epi32(3));
            index = _mm256_or_si256(index, _mm256_slli_epi32(top, 4));
        }
        const int e = static_cast<int>(entries);
        const __m256i base = channel_luts ? _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                                               _mm256_set1_epi32(e))
                                          : _mm256_setzero_si256();
        const float* table = lut + (channel_luts ? 8 * half * entries : half * entries);
        return _mm256_i32gather_ps(table, _mm256_add_epi32(index, base), 4);
    }
    ORION_AVX2 __m256 lo(int64_t c) const { return make(c, 0); }
    ORION_AVX2 __m256 hi(int64_t c) const { return make(c, 1); }
};
struct Affine4Rows8 {
    static constexpr int64_t kRowBytes = 8;
    const uint8_t* w;
    const uint8_t* at(int64_t c) const { return w + c * kRowBytes; }
    const uint16_t* params;
    int64_t first;  // the panel row w starts at (blocks count from the panel's first row)
    int shift;
    ORION_AVX2 __m256 make(int64_t c, int half) const {
        const uint16_t* block = params + ((first + c) >> shift) * 2 * kConvPanel + 8 * half;
        const __m256 shifted = _mm256_sub_ps(_mm256_cvtepi32_ps(nibbles8(w + c * 8 + 4 * half)), load8(block + kConvPanel));
        return round8(_mm256_mul_ps(shifted, load8(block)));  // fp16((u - z) * s): the product is exact in fp32
    }
    ORION_AVX2 __m256 lo(int64_t c) const { return make(c, 0); }
    ORION_AVX2 __m256 hi(int64_t c) const { return make(c, 1); }
};

// Readers that decode two rows at a time (pair(c, w) for even c, rows c and c + 1; lo/hi for one row),
// for conv_tile_pairs_avx2.
//
// lut4 and lut6 in the AVX2 layout (PackedConv1x1Q::lut_bytes): rows 2q and 2q + 1 from one row pair,
// their 32 indices' low 4 bits in bytes by one shift and mask (lut6's high 2 bits the same way), and the
// fp16 weights by vpshufb lookups of the LUT entries' low and high bytes in tables of 16 entries (lane 0
// the first half's LUT, lane 1 the second's; lut6 picks one of its 4 tables by the high bits, two blends).
//
// The 16 bytes of entries `index` of 4 tables picked by `top` (0-3 per byte; `odd`, `upper`: its bits 0
// and 1 moved to each byte's bit 7, which blendv reads).
ORION_AVX2 inline __m256i lookup64(const __m256i* table, __m256i index, __m256i odd, __m256i upper) {
    const __m256i t01 = _mm256_blendv_epi8(_mm256_shuffle_epi8(table[0], index), _mm256_shuffle_epi8(table[1], index), odd);
    const __m256i t23 = _mm256_blendv_epi8(_mm256_shuffle_epi8(table[2], index), _mm256_shuffle_epi8(table[3], index), odd);
    return _mm256_blendv_epi8(t01, t23, upper);
}
template <int Tables>
struct LutPairRows8 {
    const uint8_t* w;    // the panel's row pairs
    int64_t row_bytes;   // 8 (lut4) or 12 (lut6): a pair is 2 * row_bytes
    int64_t first;       // the panel row that row 0 of this reader is (even for pair())
    __m256i low[Tables], high[Tables];  // lut_bytes: the entries' low bytes, then their high bytes
    // Rows r (outputs 0-7 in lane 0, 8-15 in lane 1) and r + 1 of the panel, r even, as fp16.
    ORION_AVX2 void pair_fp16(int64_t r, __m256i& r0, __m256i& r1) const {
        const uint8_t* p = w + r * row_bytes;
        const __m256i bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
        const __m256i index =
            _mm256_and_si256(_mm256_srlv_epi64(bytes, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
        __m256i lo, hi;
        if constexpr (Tables == 1) {
            lo = _mm256_shuffle_epi8(low[0], index);
            hi = _mm256_shuffle_epi8(high[0], index);
        } else {
            long long top_bits;
            std::memcpy(&top_bits, p + 16, 8);
            const __m256i top = _mm256_and_si256(
                _mm256_srlv_epi64(_mm256_set1_epi64x(top_bits), _mm256_setr_epi64x(0, 2, 4, 6)), _mm256_set1_epi8(3));
            // a 16-bit shift moves each byte's bit 0 (by 7) or bit 1 (by 6) to its bit 7; what crosses into the
            // next byte lands below its bit 7
            const __m256i odd = _mm256_slli_epi16(top, 7), upper = _mm256_slli_epi16(top, 6);
            lo = lookup64(low, index, odd, upper);
            hi = lookup64(high, index, odd, upper);
        }
        r0 = _mm256_unpacklo_epi8(lo, hi);
        r1 = _mm256_unpackhi_epi8(lo, hi);
    }
    ORION_AVX2 void pair(int64_t c, __m256 (&out)[2][2]) const {
        __m256i r0, r1;
        pair_fp16(first + c, r0, r1);
        out[0][0] = _mm256_cvtph_ps(_mm256_castsi256_si128(r0));
        out[0][1] = _mm256_cvtph_ps(_mm256_extracti128_si256(r0, 1));
        out[1][0] = _mm256_cvtph_ps(_mm256_castsi256_si128(r1));
        out[1][1] = _mm256_cvtph_ps(_mm256_extracti128_si256(r1, 1));
    }
    ORION_AVX2 __m128i row_fp16(int64_t c, int half) const {
        const int64_t r = first + c;
        __m256i r0, r1;
        pair_fp16(r & ~int64_t{1}, r0, r1);
        const __m256i row = (r & 1) ? r1 : r0;
        return half ? _mm256_extracti128_si256(row, 1) : _mm256_castsi256_si128(row);
    }
    ORION_AVX2 __m256 lo(int64_t c) const { return _mm256_cvtph_ps(row_fp16(c, 0)); }
    ORION_AVX2 __m256 hi(int64_t c) const { return _mm256_cvtph_ps(row_fp16(c, 1)); }
};
// Block-wise 4-bit in the AVX2 layouts (PackedConv1x1Q::affine4_pairs: rows in pairs, byte j of a pair holding
// output j's values of both rows; affine4_octets: rows in octets, a 32-bit word per output), each weight formed
// exactly: each block's s and n = -(z * s) (exact in fp32: two fp16 values) decoded once into registers, and a
// weight is fp16(fma(u, s, n)), the exact (u - z) * s rounded once (Affine4Rows8's values). Needs blocks of 2 rows
// or more, pairs inside a block (even first).
// The u of 8 outputs of one row pair as int32 (row 2q in bits 0-3, row 2q + 1 in bits 4-7).
ORION_AVX2 inline __m256i pair_bytes8(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
// Octets: the 8 words of half `half` (outputs 8 * half + j) of the octet holding row r (rows 8g + i in bits 4i-4i+3).
ORION_AVX2 inline __m256i octet_words(const uint8_t* w, int64_t r, int half) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (r / 8) * 64 + 32 * half));
}
struct Affine4PairRows8 {
    const uint8_t* w;  // the panel's row pairs (or octets)
    const uint16_t* params;
    int64_t first;     // the panel row that row 0 of this reader is
    int shift;
    bool octets;       // PackedConv1x1Q::affine4_octets
    int64_t block = -1;  // whose parameters s and n hold
    __m256 s[2] = {}, n[2] = {};
    ORION_AVX2 void use_block(int64_t r) {
        const int64_t b = r >> shift;
        if (b == block) return;
        block = b;
        const uint16_t* at = params + b * 2 * kConvPanel;
        for (int half = 0; half < 2; ++half) {
            s[half] = load8(at + 8 * half);
            n[half] = _mm256_mul_ps(load8(at + kConvPanel + 8 * half), _mm256_sub_ps(_mm256_setzero_ps(), s[half]));
        }
    }
    ORION_AVX2 __m256 weight(__m256i u, int half) const {
        return round8(_mm256_fmadd_ps(_mm256_cvtepi32_ps(u), s[half], n[half]));
    }
    // Rows r and r + 1 (r even) of 8 outputs: their u in bits 0-3 and 4-7 of each int32 (and others above).
    ORION_AVX2 __m256i both(int64_t r, int half) const {
        if (!octets) return pair_bytes8(w + r * 8 + 8 * half);
        return _mm256_srl_epi32(octet_words(w, r, half), _mm_cvtsi32_si128(4 * static_cast<int>(r % 8)));
    }
    ORION_AVX2 void pair(int64_t c, __m256 (&out)[2][2]) {
        const int64_t r = first + c;
        use_block(r);
        const __m256i fifteen = _mm256_set1_epi32(15);
        for (int half = 0; half < 2; ++half) {
            const __m256i u = both(r, half);
            out[0][half] = weight(_mm256_and_si256(u, fifteen), half);
            out[1][half] = weight(_mm256_and_si256(_mm256_srli_epi32(u, 4), fifteen), half);
        }
    }
    ORION_AVX2 __m256 row(int64_t c, int half) {
        const int64_t r = first + c;
        use_block(r);
        const __m256i u = both(r & ~int64_t{1}, half);
        return weight(_mm256_and_si256(_mm256_srli_epi32(u, 4 * static_cast<int>(r & 1)), _mm256_set1_epi32(15)), half);
    }
    ORION_AVX2 __m256 lo(int64_t c) { return row(c, 0); }
    ORION_AVX2 __m256 hi(int64_t c) { return row(c, 1); }
};

// What the int4 decode tile reads of x besides x itself, the same for every panel of a conv1x1 call, so made once
// per call and thread (QPanel::call; 0: every time). `sums`: the sums of x over each block of B rows of the first
// k, per lane, at sums[b * lanes + l]. `scaled`: x[c * S + l] * 2^x_shift(c) at scaled[c * lanes + l], for the
// subnormal weights (affine4_block_tile_fixed), or nullptr where they would not give the converted weights' bits:
// an x with 2^-60 > |x| > 0 or |x| >= 2^26 (finite), or MXCSR's DAZ or FTZ set.
struct BlockX {
    const float* sums;
    const float* scaled;
};
constexpr int kEvenShift = 100, kOddShift = 96;
// Row c's nibble as the tile masks it in place: bit 4i of an octet's word (i = c % 8; rows 5-7 after a shift right
// by 12: bit 4i - 12), bit 0 or 4 of a pair's byte.
constexpr int nibble_bit(int64_t c, bool octets) {
    const int i = static_cast<int>(c % 8);
    return octets ? 4 * (i < 5 ? i : i - 3) : 4 * static_cast<int>(c % 2);
}
// The power of two BlockX::scaled multiplies row c's x by: that masked nibble read as fp32 bits is the subnormal
// u * 2^(nibble_bit - 149), so the product is u * x * 2^(kEvenShift - 149) for every row.
constexpr int x_shift(int64_t c, bool octets) { return kEvenShift - nibble_bit(c, octets); }
static_assert(x_shift(1, false) == kOddShift, "pairs: odd rows at 2^kOddShift");
// The lanes of v that BlockX::scaled does not allow: 0 < |v| < 2^-60 or 2^26 <= |v| < infinity.
ORION_AVX2 inline __m256 unscalable(__m256 v) {
    const __m256 a = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
    const __m256 tiny = _mm256_and_ps(_mm256_cmp_ps(a, _mm256_set1_ps(0x1p-60f), _CMP_LT_OQ),
                                      _mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_GT_OQ));
    const __m256 big = _mm256_and_ps(_mm256_cmp_ps(a, _mm256_set1_ps(0x1p26f), _CMP_GE_OQ),
                                     _mm256_cmp_ps(a, _mm256_set1_ps(INFINITY), _CMP_LT_OQ));
    return _mm256_or_ps(tiny, big);
}
// Whether BlockX::scaled allows every x[i * S + l] (i < rows, l < lanes).
ORION_AVX2 bool scalable(const float* x, int64_t S, int64_t rows, int lanes) {
    __m256 bad = _mm256_setzero_ps();
    if (S == lanes) {  // contiguous
        const int64_t n = rows * lanes;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) bad = _mm256_or_ps(bad, unscalable(_mm256_loadu_ps(x + i)));
        for (; i < n; ++i) bad = _mm256_or_ps(bad, unscalable(_mm256_set1_ps(x[i])));
    } else {
        for (int64_t i = 0; i < rows; ++i)
            for (int l = 0; l < lanes; ++l) bad = _mm256_or_ps(bad, unscalable(_mm256_set1_ps(x[i * S + l])));
    }
    return _mm256_movemask_ps(bad) == 0;
}
ORION_AVX2 BlockX block_x(uint64_t call, const float* x, int64_t S, int64_t B, int64_t k, int lanes, bool octets) {
    thread_local std::vector<float> sums, scaled;
    thread_local bool exact = false;
    thread_local struct { uint64_t call; const float* x; int64_t S, B, k; int lanes; bool octets; } made{};
    if (call && call == made.call && x == made.x && S == made.S && B == made.B && k == made.k && lanes == made.lanes &&
        octets == made.octets)
        return {sums.data(), exact ? scaled.data() : nullptr};
    alignas(32) static constexpr int kLive[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    const int64_t blocks = k / B;
    sums.resize(static_cast<size_t>(blocks * lanes));
    for (int64_t b = 0; b < blocks; ++b) {
        const float* xb = x + b * B * S;
        if (S == 1 && B % 16 == 0) {  // one lane, its x contiguous (a compact decode call): 8 rows a load
            __m256 xs[2] = {_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8)};
            for (int64_t c = 16; c < B; c += 16) {
                xs[0] = _mm256_add_ps(xs[0], _mm256_loadu_ps(xb + c));
                xs[1] = _mm256_add_ps(xs[1], _mm256_loadu_ps(xb + c + 8));
            }
            sums[static_cast<size_t>(b)] = hsum(_mm256_add_ps(xs[0], xs[1]));
            continue;
        }
        for (int l0 = 0; l0 < lanes; l0 += 8) {  // lane l of row c at x[c * S + l]: a register of 8 lanes per row
            const int n = std::min(lanes - l0, 8);
            const __m256i live = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kLive + 8 - n));
            __m256 xs[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
            for (int64_t c = 0; c < B; c += 2) {
                xs[0] = _mm256_add_ps(xs[0], _mm256_maskload_ps(xb + c * S + l0, live));
                xs[1] = _mm256_add_ps(xs[1], _mm256_maskload_ps(xb + (c + 1) * S + l0, live));
            }
            alignas(32) float total[8];
            _mm256_store_ps(total, _mm256_add_ps(xs[0], xs[1]));
            std::copy(total, total + n, sums.begin() + b * lanes + l0);
        }
    }
    exact = (_mm_getcsr() & 0x8040) == 0 && scalable(x, S, k, lanes);  // (FTZ 0x8000, DAZ 0x40)
    if (exact) {
        scaled.resize(static_cast<size_t>(k * lanes));
        alignas(32) float factor[8];  // x_shift depends on c % 8 alone (pairs: c % 2)
        for (int i = 0; i < 8; ++i) factor[i] = std::ldexp(1.0f, x_shift(i, octets));
        if (S == 1 && lanes == 1) {  // a compact decode call: 8 rows a multiply
            const __m256 factors = _mm256_load_ps(factor);
            int64_t c = 0;
            for (; c + 8 <= k; c += 8) _mm256_storeu_ps(scaled.data() + c, _mm256_mul_ps(_mm256_loadu_ps(x + c), factors));
            for (; c < k; ++c) scaled[static_cast<size_t>(c)] = x[c] * factor[c % 8];
        } else {
            for (int64_t c = 0; c < k; ++c)
                for (int l = 0; l < lanes; ++l) scaled[static_cast<size_t>(c * lanes + l)] = x[c * S + l] * factor[c % 8];
        }
    }
    made = {call, x, S, B, k, lanes, octets};
    return {sums.data(), exact ? scaled.data() : nullptr};
}
// The int4 decode tile (the AVX2 layout, blocks of B >= 2 rows, whole blocks from a block's first row): per block
// and lane, the sums of u * x (u the stored 4-bit values, exact in fp32) and of x, then acc += s * sum(u * x) +
// n * sum(x) with n = -(z * s): the block's scale and zero point applied once per block and lane, not per
// weight. It sums (u - z) * s * x unrounded where the fp16 tile sums fp16((u - z) * s) * x, so each output
// differs from the fp16 conv of the dequantized weight by at most the fp16 rounding of its weights
// (|error| <= 2^-11 * sum |w * x|) plus fp32 rounding; the converting (prefill) path stays bit for bit.
// U interleaved partial sums per block (rows r -> r % U) keep the FMAs in flight when L is small.
// L lanes of x from lane 0, x_sums their block sums (BlockX's rows of `stride` lanes), P rows a step (whole
// pairs, a multiple of U dividing B; octets: 8); under kConvSequentialLanes lanes each step prefetches
// kConvPrefetchBytes ahead.
// Subnormal: x is BlockX::scaled (S its lanes) and each u is used where it is stored, not converted: masked in
// place (pairs: u & 15 for row 2q, u & 0xF0 for row 2q + 1; octets: word & (15 << 4i) for row i < 5 of an octet,
// for rows 5-7 the word shifted right by 12 once and masked the same way) and read as fp32 bits it is the
// subnormal u * 2^(nibble_bit - 149), so each product with the scaled x is u * x * 2^(kEvenShift - 149) =
// u * x * 2^-49 exactly, and every sum is the converted path's times 2^-49 exactly (for the x BlockX allows every
// product and sum is a multiple of 2^-83, so scaled it is exact where it is subnormal, and |x * 2^100| < 2^126):
// s * 2^49 then gives the same bits. Octets: one 32-byte load per 8 rows of 8 outputs and a vpand per 8 weights
// (and a vpsrld per 8 rows), instead of a vpmovzxbd per 16 weights and a vpand or vpsrld and a vcvtdq2ps per 8.
// Row c goes to partial sum c % U in both layouts (so the converting and subnormal forms give the same bits); at
// one lane the octet tile has U = 2 where the pair tile has 4, another order of the same fp32 sums.
template <int L, int U, bool Subnormal, bool Octets, int P = (Octets ? 8 : U < 2 ? 2 : U)>
ORION_AVX2 void affine4_block_tile_fixed(const uint8_t* pairs, const uint16_t* params, int64_t B, const float* x,
                                         int64_t S, int64_t k, const float* x_sums, int stride, float* acc, bool add) {
    static_assert(P % U == 0 && (!Octets || P == 8), "whole steps of partial sums (octets: an octet a step)");
    const __m256i fifteen = _mm256_set1_epi32(15), high = _mm256_set1_epi32(0xF0);
    const __m256 unscale = _mm256_set1_ps(Subnormal ? 0x1p49f : 1.0f);
    __m256 a_lo[L], a_hi[L];
    ORION_UNROLL
    for (int l = 0; l < L; ++l) {
        a_lo[l] = add ? _mm256_loadu_ps(acc + l * kConvPanel) : _mm256_setzero_ps();
        a_hi[l] = add ? _mm256_loadu_ps(acc + l * kConvPanel + 8) : _mm256_setzero_ps();
    }
    for (int64_t c0 = 0; c0 < k; c0 += B, params += 2 * kConvPanel, x_sums += stride) {
        __m256 lo[U][L], hi[U][L];
        ORION_UNROLL
        for (int u = 0; u < U; ++u)
            ORION_UNROLL
            for (int l = 0; l < L; ++l) lo[u][l] = hi[u][l] = _mm256_setzero_ps();
        for (int64_t c = c0; c < c0 + B; c += P) {
            if constexpr (L < kConvSequentialLanes)  // (a decode tile: its panel streamed from memory once)
                prefetch_streamed(pairs + c * 8 + kConvPrefetchBytes);
            if constexpr (Octets) {
                const __m256i words[2] = {octet_words(pairs, c, 0), octet_words(pairs, c, 1)};
                const __m256i upper[2] = {_mm256_srli_epi32(words[0], 12), _mm256_srli_epi32(words[1], 12)};
                ORION_UNROLL
                for (int h = 0; h < 8; h += 2) {
                    __m256 w[2][2];
                    ORION_UNROLL
                    for (int r = 0; r < 2; ++r)
                        ORION_UNROLL
                        for (int half = 0; half < 2; ++half) {
                            const int i = h + r;
                            if constexpr (Subnormal) {
                                const __m256i mask = _mm256_set1_epi32(15 << nibble_bit(i, true));
                                const __m256i from = i < 5 ? words[half] : upper[half];
                                w[r][half] = _mm256_castsi256_ps(_mm256_and_si256(from, mask));
                            } else {
                                w[r][half] = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(words[half], 4 * i),
                                                                                 fifteen));
                            }
                        }
                    fma_row_pair<L, U>(w, x, S, c + h, h, lo, hi);
                }
                continue;
            }
            ORION_UNROLL
            for (int h = 0; h < P; h += 2) {
                const __m256i b_lo = pair_bytes8(pairs + (c + h) * 8), b_hi = pair_bytes8(pairs + (c + h) * 8 + 8);
                __m256 w[2][2];
                if constexpr (Subnormal) {
                    w[0][0] = _mm256_castsi256_ps(_mm256_and_si256(b_lo, fifteen));
                    w[0][1] = _mm256_castsi256_ps(_mm256_and_si256(b_hi, fifteen));
                    w[1][0] = _mm256_castsi256_ps(_mm256_and_si256(b_lo, high));
                    w[1][1] = _mm256_castsi256_ps(_mm256_and_si256(b_hi, high));
                } else {
                    w[0][0] = _mm256_cvtepi32_ps(_mm256_and_si256(b_lo, fifteen));
                    w[0][1] = _mm256_cvtepi32_ps(_mm256_and_si256(b_hi, fifteen));
                    w[1][0] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b_lo, 4));
                    w[1][1] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b_hi, 4));
                }
                fma_row_pair<L, U>(w, x, S, c + h, h, lo, hi);
            }
        }
        sum_partials<L, U>(lo, hi);
        const __m256 s_lo = load8(params), s_hi = load8(params + 8);
        const __m256 n_lo = _mm256_mul_ps(load8(params + kConvPanel), _mm256_sub_ps(_mm256_setzero_ps(), s_lo));
        const __m256 n_hi = _mm256_mul_ps(load8(params + kConvPanel + 8), _mm256_sub_ps(_mm256_setzero_ps(), s_hi));
        const __m256 su_lo = _mm256_mul_ps(s_lo, unscale), su_hi = _mm256_mul_ps(s_hi, unscale);  // (exact)
        ORION_UNROLL
        for (int l = 0; l < L; ++l) {
            const __m256 xl = _mm256_broadcast_ss(x_sums + l);
            a_lo[l] = _mm256_fmadd_ps(n_lo, xl, _mm256_fmadd_ps(su_lo, lo[0][l], a_lo[l]));
            a_hi[l] = _mm256_fmadd_ps(n_hi, xl, _mm256_fmadd_ps(su_hi, hi[0][l], a_hi[l]));
        }
    }
    ORION_UNROLL
    for (int l = 0; l < L; ++l) {
        _mm256_storeu_ps(acc + l * kConvPanel, a_lo[l]);
        _mm256_storeu_ps(acc + l * kConvPanel + 8, a_hi[l]);
    }
}

// affine4_block_tile_fixed for any number of lanes (from 5 on, tiles of up to 3, which the registers hold).
template <bool Subnormal, bool Octets>
ORION_AVX2 void affine4_block_tile(const uint8_t* pairs, const uint16_t* params, int64_t B, const float* x, int64_t S,
                                   int64_t k, const float* x_sums, int stride, int lanes, float* acc, bool add) {
    switch (lanes) {
        case 1:
            if constexpr (Octets) {  // 2 partial sums, not 4 (Zen 1, an 18.8 MB weight: 17.2 -> 19.2 GFLOP/s a thread)
                return affine4_block_tile_fixed<1, 2, Subnormal, true>(pairs, params, B, x, S, k, x_sums, stride, acc,
                                                                       add);
            } else {  // (pairs: blocks of 2 or 4 rows)
                if (B >= 4)
                    return affine4_block_tile_fixed<1, 4, Subnormal, false>(pairs, params, B, x, S, k, x_sums, stride,
                                                                            acc, add);
                return affine4_block_tile_fixed<1, 2, Subnormal, false>(pairs, params, B, x, S, k, x_sums, stride, acc,
                                                                        add);
            }
        case 2:
            return affine4_block_tile_fixed<2, 2, Subnormal, Octets>(pairs, params, B, x, S, k, x_sums, stride, acc,
                                                                     add);
        case 3:
            return affine4_block_tile_fixed<3, 1, Subnormal, Octets>(pairs, params, B, x, S, k, x_sums, stride, acc,
                                                                     add);
        case 4:
            return affine4_block_tile_fixed<4, 1, Subnormal, Octets>(pairs, params, B, x, S, k, x_sums, stride, acc,
                                                                     add);
        default:
            affine4_block_tile_fixed<3, 1, Subnormal, Octets>(pairs, params, B, x, S, k, x_sums, stride, acc, add);
            return affine4_block_tile<Subnormal, Octets>(pairs, params, B, x + 3, S, k, x_sums + 3, stride, lanes - 3,
                                                         acc + 3 * kConvPanel, add);
    }
}

// conv_tile_avx2_fixed's sums (each row into the same partial sum, in the same order: the same bits)
// with rows decoded in pairs: steps of P rows (whole pairs, a multiple of U).
template <int L, int U, typename Rows>
ORION_AVX2 void conv_tile_pairs_avx2_fixed(Rows rows, const float* x, int64_t S, int64_t k, float* acc, bool add) {
    constexpr int P = U < 2 ? 2 : U;
    __m256 lo[U][L], hi[U][L];
    conv_tile_start<L, U>(lo, hi, acc, add);
    const int64_t main = k - k % U;  // rows c < main go to partial sum c % U, the rest to 0
    int64_t c = 0;
    for (; c + P <= main; c += P) {
        ORION_UNROLL
        for (int h = 0; h < P; h += 2) {
            __m256 w[2][2];
            rows.pair(c + h, w);
            fma_row_pair<L, U>(w, x, S, c + h, h, lo, hi);
        }
    }
    conv_tile_finish<L, U>(lo, hi, rows, x, S, c, k, acc);
}

// conv_tile_avx2_rows (the same U for each lane count) over a pair reader.
template <typename Rows>
ORION_AVX2 void conv_tile_pairs_avx2(Rows rows, const float* x, int64_t S, int64_t k, int lanes, float* acc,
                                     bool add) {
    switch (lanes) {
        case 1: return conv_tile_pairs_avx2_fixed<1, 2>(rows, x, S, k, acc, add);
        case 2: return conv_tile_pairs_avx2_fixed<2, 2>(rows, x, S, k, acc, add);
        case 3: return conv_tile_pairs_avx2_fixed<3, 2>(rows, x, S, k, acc, add);
        case 4: return conv_tile_pairs_avx2_fixed<4, 1>(rows, x, S, k, acc, add);
        case 5: return conv_tile_pairs_avx2_fixed<5, 1>(rows, x, S, k, acc, add);
        default: return conv_tile_pairs_avx2_fixed<6, 1>(rows, x, S, k, acc, add);
    }
}

template <typename Rows>
ORION_AVX2 void widen_pairs_avx2(Rows rows, float* dst, int64_t n) {
    int64_t r = 0;
    for (; r + 2 <= n; r += 2) {
        __m256 w[2][2];
        rows.pair(r, w);
        _mm256_storeu_ps(dst + r * kConvPanel, w[0][0]);
        _mm256_storeu_ps(dst + r * kConvPanel + 8, w[0][1]);
        _mm256_storeu_ps(dst + (r + 1) * kConvPanel, w[1][0]);
        _mm256_storeu_ps(dst + (r + 1) * kConvPanel + 8, w[1][1]);
    }
    if (r < n) {
        _mm256_storeu_ps(dst + r * kConvPanel, rows.lo(r));
        _mm256_storeu_ps(dst + r * kConvPanel + 8, rows.hi(r));
    }
}

template <typename Rows>
ORION_AVX2 void widen_rows_avx2(Rows rows, float* dst, int64_t n) {
    for (int64_t r = 0; r < n; ++r) {
        _mm256_storeu_ps(dst + r * kConvPanel, rows.lo(r));
        _mm256_storeu_ps(dst + r * kConvPanel + 8, rows.hi(r));
    }
}

// Calls f with the AVX2 rows reader of p from row c0 (f.pairs with a pair reader where one applies).
template <typename F>
ORION_AVX2 void with_q_rows8(const QPanel& p, int64_t c0, F f) {
    const uint8_t* w = p.rows + c0 * p.row_bytes;
    switch (p.kind) {
        case PackedConv1x1Q::Kind::lut4:
            if (p.lut_bytes) {
                LutPairRows8<1> rows{p.rows, p.row_bytes, c0, {}, {}};
                rows.low[0] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.lut_bytes));
                rows.high[0] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.lut_bytes + 32));
                return c0 % 2 ? f(rows) : f.pairs(rows);
            }
            return f(Lut4Rows8{w, _mm256_loadu_ps(p.lut), _mm256_loadu_ps(p.lut + 8), _mm256_loadu_ps(p.lut + 16),
                               _mm256_loadu_ps(p.lut + 24)});  // (per-channel LUTs: channel_bytes, not here)
        case PackedConv1x1Q::Kind::lut6:
            if (p.kind == PackedConv1x1Q::Kind::lut6 && p.lut_bytes) {
                LutPairRows8<4> rows{p.rows, p.row_bytes, c0, {}, {}};
                for (int t = 0; t < 4; ++t) {
                    rows.low[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.lut_bytes + 32 * t));
                    rows.high[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.lut_bytes + 128 + 32 * t));
                }
                return c0 % 2 ? f(rows) : f.pairs(rows);
            }
            return f(LutGatherRows8{w, p.lut, p.row_bytes, p.entries, p.kind == PackedConv1x1Q::Kind::lut6,
                                    p.channel_luts});
        case PackedConv1x1Q::Kind::affine4:
            if (p.affine4_pairs || p.affine4_octets) {
                const Affine4PairRows8 rows{p.rows, p.params, c0, p.block_shift, p.affine4_octets};
                return c0 % 2 ? f(rows) : f.pairs(rows);
            }
            return f(Affine4Rows8{w, p.params, c0, p.block_shift});
    }
}

// lut4 with a LUT per output channel in the channel-major layout (PackedConv1x1Q::channel_major), decoded along
// the input axis: a channel's LUT (its 16 fp16 entries' low and high bytes) is a vpshufb table, and the 16 bytes
// of a chunk of 32 rows give their weights in row order by one shift, one mask, two vpshufb and two unpacks
// (fp16), then four vcvtph2ps. Each output is a dot product of its channel's exact weights with x, in 4 x 8
// partial sums over the rows: the values the fp16 tile multiplies, summed in another order (within fp32
// rounding of it). Rows c0 to c0 + k, c0 a multiple of 32 (conv_panel's tiles: all rows from 0), any number of
// lanes (a pass over the panel per lane, its x copied contiguous unless it is already).

// Per channel of the panel, its LUT's entries' fp16 low bytes, then high bytes (vpshufb tables; the entries are
// fp16 values, so vcvtps2ph is exact).
ORION_AVX2 void channel_tables(const QPanel& p, uint8_t (&table)[kConvPanel][2][16]) {
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                           0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    for (int j = 0; j < kConvPanel; ++j) {
        const __m256i halves = _mm256_setr_m128i(_mm256_cvtps_ph(_mm256_loadu_ps(p.lut + 16 * j), _MM_FROUND_TO_NEAREST_INT),
                                                 _mm256_cvtps_ph(_mm256_loadu_ps(p.lut + 16 * j + 8), _MM_FROUND_TO_NEAREST_INT));
        const __m256i bytes = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(halves, split), _MM_SHUFFLE(3, 1, 2, 0));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(table[j]), bytes);
    }
}
// The fp16 weights of a chunk's 32 rows (its 16 bytes at w): rows 0-7 and 8-15 in first's lanes, 16-31 in second's.
ORION_AVX2 inline void decode_chunk(const uint8_t* w, __m256i low, __m256i high, __m256i& first, __m256i& second) {
    const __m256i bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    const __m256i index = _mm256_and_si256(_mm256_srlv_epi64(bytes, _mm256_setr_epi64x(0, 0, 4, 4)),
                                           _mm256_set1_epi8(15));  // lane 1: the high nibbles
    const __m256i lo = _mm256_shuffle_epi8(low, index), hi = _mm256_shuffle_epi8(high, index);
    first = _mm256_unpacklo_epi8(lo, hi);
    second = _mm256_unpackhi_epi8(lo, hi);
}

ORION_AVX2 void lut4_channel_tile(const QPanel& p, int64_t c0, const float* x, int64_t S, int64_t k, int lanes,
                                  float* acc, bool add) {
    if (c0 % 32) throw std::logic_error("lut4_channel_tile: rows from inside a chunk of 32");
    const int64_t chunks = (k + 31) / 32;
    thread_local std::vector<float> column;
    if (column.size() < static_cast<size_t>(chunks * 32)) column.resize(static_cast<size_t>(chunks * 32));
    alignas(32) uint8_t table[kConvPanel][2][16];
    channel_tables(p, table);
    for (int l = 0; l < lanes; ++l) {
        const float* xl = x + l;  // row c's value at xl[c], padded rows 0
        if (S != 1 || k % 32) {
            float* to = column.data();
            for (int64_t c = 0; c < k; ++c) to[c] = x[c * S + l];
            std::fill(to + k, to + chunks * 32, 0.0f);
            xl = to;
        }
        for (int j = 0; j < kConvPanel; ++j) {
            const uint8_t* w = p.rows + j * p.channel_bytes + c0 / 2;
            const __m256i low = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(table[j][0])));
            const __m256i high = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(table[j][1])));
            __m256 sum[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
            for (int64_t t = 0; t < chunks; ++t) {
                // (the panel's channels, then the next panel's, lie one after another: one stream)
                if (t % 4 == 0) prefetch_streamed(w + 16 * t + kConvPrefetchBytes);
                __m256i first, second;
                decode_chunk(w + 16 * t, low, high, first, second);
                const float* xt = xl + 32 * t;  // rows 0-7, 8-15 (first), 16-23, 24-31 (second)
                sum[0] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(first)), _mm256_loadu_ps(xt), sum[0]);
                sum[1] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(first, 1)), _mm256_loadu_ps(xt + 8), sum[1]);
                sum[2] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(second)), _mm256_loadu_ps(xt + 16), sum[2]);
                sum[3] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(second, 1)), _mm256_loadu_ps(xt + 24), sum[3]);
            }
            const float total = hsum(_mm256_add_ps(_mm256_add_ps(sum[0], sum[1]), _mm256_add_ps(sum[2], sum[3])));
            acc[l * kConvPanel + j] = (add ? acc[l * kConvPanel + j] : 0.0f) + total;
        }
    }
}

// The 8 x 8 block of fp32 at src (row stride src_stride) transposed into dst (row stride dst_stride).
ORION_AVX2 inline void transpose8x8(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_load_ps(src + i * src_stride);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; ++i) {
        _mm256_storeu_ps(dst + i * dst_stride, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(dst + (i + 4) * dst_stride, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}

// widen_q of the channel-major layout: rows c0 to c0 + n of the panel, a chunk of 32 rows at a time: each
// channel's chunk decoded as in the tile into a [16 channels][32 rows] block, then transposed by 8 x 8 blocks.
// Rows c0 to c0 + n of chunk t, its weights decoded as block[channel][row of the chunk], into dst as panel rows
// (transposed by 8 x 8 blocks).
ORION_AVX2 void store_chunk_rows(const float (&block)[kConvPanel][32], int64_t t, int64_t c0, float* dst, int64_t n) {
    alignas(32) float rows[32][kConvPanel];
    const int64_t first_row = std::max(c0, 32 * t), end = std::min(c0 + n, 32 * t + 32);
    const bool whole = first_row == 32 * t && end == 32 * t + 32;
    float* to = whole ? dst + (32 * t - c0) * kConvPanel : &rows[0][0];
    for (int jb = 0; jb < kConvPanel; jb += 8)
        for (int rb = 0; rb < 32; rb += 8) transpose8x8(&block[jb][rb], 32, to + rb * kConvPanel + jb, kConvPanel);
    if (!whole)
        std::copy(&rows[0][0] + (first_row - 32 * t) * kConvPanel, &rows[0][0] + (end - 32 * t) * kConvPanel,
                  dst + (first_row - c0) * kConvPanel);
}

ORION_AVX2 void widen_lut4_channels(const QPanel& p, int64_t c0, float* dst, int64_t n) {
    alignas(32) uint8_t table[kConvPanel][2][16];
    channel_tables(p, table);
    alignas(32) float block[kConvPanel][32];
    for (int64_t t = c0 / 32; t * 32 < c0 + n; ++t) {
        for (int j = 0; j < kConvPanel; ++j) {
            const __m256i low = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(table[j][0])));
            const __m256i high = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(table[j][1])));
            __m256i first, second;
            decode_chunk(p.rows + j * p.channel_bytes + 16 * t, low, high, first, second);
            _mm256_store_ps(block[j], _mm256_cvtph_ps(_mm256_castsi256_si128(first)));
            _mm256_store_ps(block[j] + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(first, 1)));
            _mm256_store_ps(block[j] + 16, _mm256_cvtph_ps(_mm256_castsi256_si128(second)));
            _mm256_store_ps(block[j] + 24, _mm256_cvtph_ps(_mm256_extracti128_si256(second, 1)));
        }
        store_chunk_rows(block, t, c0, dst, n);
    }
}

// What the low-bit entry points do with a rows reader (functors, not lambdas: a lambda does not take
// its caller's target attribute).
struct TileAvx2 {
    const float* x;
    int64_t S, k;
    int lanes;
    float* acc;
    bool add;
    template <typename Rows>
    ORION_AVX2 void operator()(Rows rows) const { conv_tile_avx2_rows(rows, x, S, k, lanes, acc, add); }
    template <typename Rows>
    ORION_AVX2 void pairs(Rows rows) const { conv_tile_pairs_avx2(rows, x, S, k, lanes, acc, add); }
};
struct WidenAvx2 {
    float* dst;
    int64_t n;
    template <typename Rows>
    ORION_AVX2 void operator()(Rows rows) const { widen_rows_avx2(rows, dst, n); }
    template <typename Rows>
    ORION_AVX2 void pairs(Rows rows) const { widen_pairs_avx2(rows, dst, n); }
};

}  // namespace

ORION_AVX2 void conv_tile_i8_avx2(const int8_t* w, const float* scale, const float* x, int64_t S, int64_t k,
                                  int lanes, float* acc, bool add) {
    if (!scale) return conv_tile_avx2_rows(UnscaledInt8Rows8{w}, x, S, k, lanes, acc, add);
    conv_tile_avx2_rows(Int8Rows8{w, _mm256_loadu_ps(scale), _mm256_loadu_ps(scale + 8)}, x, S, k, lanes, acc, add);
}

ORION_AVX2 void conv_tile_q_avx2(const QPanel& p, int64_t c0, const float* x, int64_t S, int64_t k, int lanes,
                                 float* acc, bool add) {
    if (p.channel_bytes) return lut4_channel_tile(p, c0, x, S, k, lanes, acc, add);
    const int64_t block = int64_t{1} << p.block_shift;
    if (p.kind == PackedConv1x1Q::Kind::affine4 && (p.affine4_pairs || p.affine4_octets) && c0 % block == 0 &&
        k % block == 0) {
        const uint8_t* rows = p.rows + c0 * p.row_bytes;
        const uint16_t* params = p.params + (c0 >> p.block_shift) * 2 * kConvPanel;
        const BlockX bx = block_x(p.call, x, S, block, k, lanes, p.affine4_octets);
        if (p.affine4_octets) {
            if (bx.scaled)
                return affine4_block_tile<true, true>(rows, params, block, bx.scaled, lanes, k, bx.sums, lanes, lanes,
                                                      acc, add);
            return affine4_block_tile<false, true>(rows, params, block, x, S, k, bx.sums, lanes, lanes, acc, add);
        }
        if (bx.scaled)
            return affine4_block_tile<true, false>(rows, params, block, bx.scaled, lanes, k, bx.sums, lanes, lanes, acc,
                                                   add);
        return affine4_block_tile<false, false>(rows, params, block, x, S, k, bx.sums, lanes, lanes, acc, add);
    }
    with_q_rows8(p, c0, TileAvx2{x, S, k, lanes, acc, add});
}

ORION_AVX2 void widen_q_avx2(const QPanel& p, int64_t c0, float* dst, int64_t n) {
    if (p.channel_bytes) return widen_lut4_channels(p, c0, dst, n);
    with_q_rows8(p, c0, WidenAvx2{dst, n});
}

ORION_AVX2 void dequant_i8_avx2(const int8_t* w, const float* scale, float* dst, int64_t rows) {
    const __m256 one = _mm256_set1_ps(1.0f);  // exact: q * 1 = q
    const __m256 lo = scale ? _mm256_loadu_ps(scale) : one, hi = scale ? _mm256_loadu_ps(scale + 8) : one;
    for (int64_t r = 0; r < rows; ++r) {
        _mm256_storeu_ps(dst + r * kConvPanel, load8_i8(w + r * kConvPanel, lo));
        _mm256_storeu_ps(dst + r * kConvPanel + 8, load8_i8(w + r * kConvPanel + 8, hi));
    }
}

// ---------------------------------------------------------------------------------------------
// AVX-512 flavour.
namespace {

// 16 int8 weights as fp32 (times their 16 scales: exact when the products are fp16 values).
ORION_AVX512 inline __m512 load16_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
struct Int8Rows16 {
    static constexpr int64_t kRowBytes = kConvPanel;
    const int8_t* w;
    const int8_t* at(int64_t c) const { return w + c * kConvPanel; }
    __m512 scale;
    ORION_AVX512 __m512 row(int64_t c) const { return _mm512_mul_ps(load16_i8(w + c * kConvPanel), scale); }
};
struct UnscaledInt8Rows16 {
    static constexpr int64_t kRowBytes = kConvPanel;
    const int8_t* w;
    const int8_t* at(int64_t c) const { return w + c * kConvPanel; }
    ORION_AVX512 __m512 row(int64_t c) const { return load16_i8(w + c * kConvPanel); }
};

// Low-bit rows (PackedConv1x1Q), 16 weights in one register, each formed exactly.
// The 16 nibbles of the 64-bit word at p, nibble k in lane k.
ORION_AVX512 inline __m512i nibbles16(const uint8_t* p) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(static_cast<int>(lo))),
                                            _mm256_set1_epi32(static_cast<int>(hi)), 1);
    const __m512i shifts = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    return _mm512_and_si512(_mm512_srlv_epi32(both, shifts), _mm512_set1_epi32(15));
}
// The 16 nibbles of the 64-bit row at p with the panel's halves interleaved (InterleavedRows): nibble j < 8 in
// bits 0-3 of lane 2j, nibble 8 + j in those of lane 2j + 1 (one broadcast, one shift per lane pair); the
// bits above are the next nibbles.
ORION_AVX512 inline __m512i interleaved_nibbles16(const uint8_t* p) {
    long long word;
    std::memcpy(&word, p, 8);
    return _mm512_srlv_epi64(_mm512_set1_epi64(word), _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28));
}
// lut4 with a LUT per panel half: an interleaved row by one shift, one ternary logic op (the nibble, and bit 4
// picking the half's LUT) and one two-table permute of the fp32 entries.
struct Lut4Rows16 {
    static constexpr int64_t kRowBytes = 8;
    static constexpr bool kInterleaved = true;
    const uint8_t* w;
    const uint8_t* at(int64_t c) const { return w + c * kRowBytes; }
    __m512 low, high;  // the low half's LUT, the high half's
    ORION_AVX512 __m512 row(int64_t c) const {
        const __m512i half = _mm512_setr_epi32(0, 16, 0, 16, 0, 16, 0, 16, 0, 16, 0, 16, 0, 16, 0, 16);
        const __m512i index = _mm512_ternarylogic_epi32(interleaved_nibbles16(w + c * 8), _mm512_set1_epi32(15), half,
                                                        0xEA);  // (a & b) | c
        return _mm512_permutex2var_ps(low, index, high);
    }
};
struct LutGatherRows16 {
    const uint8_t* w;
    const float* lut;
    int64_t row_bytes;
    int64_t entries;
    bool six_bits, channel_luts;
    ORION_AVX512 __m512 row(int64_t c) const {
        const uint8_t* r = w + c * row_bytes;
        __m512i index = nibbles16(r);
        if (six_bits) {
            uint32_t high;
            std::memcpy(&high, r + 8, 4);
            const __m512i top = _mm512_and_si512(
                _mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(high)),
                                  _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)),
                _mm512_set1_epi32(3));
            index = _mm512_or_si512(index, _mm512_slli_epi32(top, 4));
        }
        const __m512i lane = channel_luts ? _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
                                          : _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        const __m512i base = _mm512_mullo_epi32(lane, _mm512_set1_epi32(static_cast<int>(entries)));
        return _mm512_i32gather_ps(_mm512_add_epi32(index, base), lut, 4);
    }
};
struct Affine4Rows16 {
    static constexpr int64_t kRowBytes = 8;
    const uint8_t* w;
    const uint8_t* at(int64_t c) const { return w + c * kRowBytes; }
    const uint16_t* params;
    int64_t first;
    int shift;
    ORION_AVX512 __m512 row(int64_t c) const {
        const uint16_t* block = params + ((first + c) >> shift) * 2 * kConvPanel;
        const __m512 shifted = _mm512_sub_ps(_mm512_cvtepi32_ps(nibbles16(w + c * 8)), load16(block + kConvPanel));
        return _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_mul_ps(shifted, load16(block)), _MM_FROUND_TO_NEAREST_INT));
    }
};

// The int4 decode tile (blocks of B >= U rows, whole blocks from a block's first row): conv_tile_avx512_fixed's
// sums (row c into partial sum c % U, in the same order: the same bits) with each block's s and n = -(z * s)
// (exact in fp32: two fp16 values) decoded once into interleaved registers, and a weight fp16(fma(u, s, n)),
// the exact (u - z) * s rounded once (Affine4Rows16's values), from an interleaved row of nibbles.
template <int L, int U>
ORION_AVX512 void affine4_tile_avx512_fixed(const uint8_t* w, const uint16_t* params, int64_t B, const float* x,
                                            int64_t S, int64_t k, float* acc, bool add) {
    __m512 sum[U][L];
    tile_sums_start<L, U, true>(sum, acc, add);
    const __m512i fifteen = _mm512_set1_epi32(15);
    for (int64_t c0 = 0; c0 < k; c0 += B, params += 2 * kConvPanel) {
        const __m512 s = interleave16(load16(params));
        const __m512 n = _mm512_mul_ps(interleave16(load16(params + kConvPanel)), _mm512_sub_ps(_mm512_setzero_ps(), s));
        for (int64_t c = c0; c < c0 + B; c += U) {
            if constexpr (L < kConvSequentialLanes)
                prefetch_streamed(w + c * 8 + kConvPrefetchBytes);
            ORION_UNROLL
            for (int u = 0; u < U; ++u) {
                const __m512 v = _mm512_cvtepi32_ps(_mm512_and_si512(interleaved_nibbles16(w + (c + u) * 8), fifteen));
                const __m512 wv = _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_fmadd_ps(v, s, n), _MM_FROUND_TO_NEAREST_INT));
                const float* xc = x + (c + u) * S;
                ORION_UNROLL
                for (int l = 0; l < L; ++l) sum[u][l] = _mm512_fmadd_ps(wv, _mm512_set1_ps(xc[l]), sum[u][l]);
            }
        }
    }
    tile_sums_store<L, U, true>(sum, acc);
}

// affine4_tile_avx512_fixed with conv_tile_avx512_rows' U for each lane count (B >= 4).
ORION_AVX512 void affine4_tile_avx512(const uint8_t* w, const uint16_t* params, int64_t B, const float* x, int64_t S,
                                      int64_t k, int lanes, float* acc, bool add) {
    switch (lanes) {
        case 1: return affine4_tile_avx512_fixed<1, 2>(w, params, B, x, S, k, acc, add);
        case 2: return affine4_tile_avx512_fixed<2, 2>(w, params, B, x, S, k, acc, add);
        case 3: return affine4_tile_avx512_fixed<3, 2>(w, params, B, x, S, k, acc, add);
        case 4: return affine4_tile_avx512_fixed<4, 1>(w, params, B, x, S, k, acc, add);
        case 5: return affine4_tile_avx512_fixed<5, 1>(w, params, B, x, S, k, acc, add);
        case 6: return affine4_tile_avx512_fixed<6, 1>(w, params, B, x, S, k, acc, add);
        case 7: return affine4_tile_avx512_fixed<7, 1>(w, params, B, x, S, k, acc, add);
        case 8: return affine4_tile_avx512_fixed<8, 1>(w, params, B, x, S, k, acc, add);
        case 9: return affine4_tile_avx512_fixed<9, 1>(w, params, B, x, S, k, acc, add);
        case 10: return affine4_tile_avx512_fixed<10, 1>(w, params, B, x, S, k, acc, add);
        case 11: return affine4_tile_avx512_fixed<11, 1>(w, params, B, x, S, k, acc, add);
        default: return affine4_tile_avx512_fixed<12, 1>(w, params, B, x, S, k, acc, add);
    }
}

// The channel-major layout (PackedConv1x1Q::channel_major, AVX-512's chunks: lut4 with a LUT per output channel,
// int4 with blocks of 32+), decoded along the input axis. lut4: a channel's LUT is one register of fp32 weights,
// and a chunk's 16 bytes give its 32 rows' weights by one widening, one shift and two permutes, rows 0-15 (low
// nibbles), then 16-31. Each output is a dot product of its channel's exact weights with x in 4 partial sums of 16
// (chunks alternating between two pairs), added, then the 16 channels' lanes summed together (lane_sums16): the
// values the fp16 tile multiplies, summed in another order (within fp32 rounding of it). Rows c0 to c0 + k, c0 a
// multiple of 32 (and of an int4 block; conv_panel's tiles: all rows from 0); each decoded chunk feeds the L lanes.
// (int4's decode tile, affine4_channel_tile_avx512_fixed, applies its blocks' parameters to sums instead.)
// Chunk t's 32 weights of one channel (its 16 bytes at w + 16 t) times the L lanes' columns, into sum.
template <int L>
ORION_AVX512 __attribute__((always_inline)) inline void lut4_channel_chunk(const uint8_t* w, __m512 table,
                                                                          const float* columns, int64_t chunks,
                                                                          int64_t t, __m512 (&sum)[L][2]) {
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16 * t)));
    const __m512 low = _mm512_permutexvar_ps(bytes, table);  // (the index's bits 0-3)
    const __m512 high = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
    ORION_UNROLL
    for (int l = 0; l < L; ++l) {
        const float* xt = columns + (l * chunks + t) * 32;
        sum[l][0] = _mm512_fmadd_ps(low, _mm512_loadu_ps(xt), sum[l][0]);
        sum[l][1] = _mm512_fmadd_ps(high, _mm512_loadu_ps(xt + 16), sum[l][1]);
    }
}
// Channel j's table: its LUT (lut4), or block b's 16 weights fp16((u - z) * s), u = 0..15 (affine4: the exact
// (u - z) * s rounded once, Affine4Rows16's values; the converting path's).
template <bool Affine>
ORION_AVX512 __attribute__((always_inline)) inline __m512 channel_table(const QPanel& p, int j, int64_t b) {
    if constexpr (Affine) {
        const int64_t blocks = p.channel_bytes * 2 >> p.block_shift;
        const uint16_t* sz = p.channel_params + j * blocks * 2 + b;
        const __m512 u = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512 levels = _mm512_mul_ps(_mm512_sub_ps(u, _mm512_set1_ps(emu::half_to_float(sz[blocks]))),
                                            _mm512_set1_ps(emu::half_to_float(sz[0])));  // exact: fp16 operands
        return _mm512_cvtph_ps(_mm512_cvtps_ph(levels, _MM_FROUND_TO_NEAREST_INT));
    } else {
        return _mm512_loadu_ps(p.lut + 16 * j);
    }
}
// The 16 sums of the lanes of v[0..15], in order (a fixed tree: the halves, quarters, pairs, then lanes added).
ORION_AVX512 inline __m512 lane_sums16(const __m512 (&v)[16]) {
    __m512 w[8], x[4], y[2];
    for (int i = 0; i < 8; ++i)  // lanes 0-7: v[2i]'s halves added, 8-15: v[2i + 1]'s
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; ++i)  // quarter k: v[4i + k]'s quarters added
        x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0xDD));
    for (int m = 0; m < 2; ++m)  // quarter k: pairs of v[8m + k], then of v[8m + 4 + k]
        y[m] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * m], x[2 * m + 1], 0x44), _mm512_shuffle_ps(x[2 * m], x[2 * m + 1], 0xEE));
    // lane 4k + r: v[k + 4r]'s sum
    const __m512 z = _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], 0x88), _mm512_shuffle_ps(y[0], y[1], 0xDD));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), z);
}

template <int L>
ORION_AVX512 void channel_tile_avx512_fixed(const QPanel& p, int64_t c0, const float* columns, int64_t chunks,
                                            float* acc, bool add) {
    __m512 channel_sums[L][kConvPanel];
    for (int j = 0; j < kConvPanel; ++j) {
        const uint8_t* w = p.rows + j * p.channel_bytes + c0 / 2;
        const __m512 table = channel_table<false>(p, j, 0);
        __m512 sum[2][L][2];
        ORION_UNROLL
        for (int h = 0; h < 2; ++h)
            ORION_UNROLL
            for (int l = 0; l < L; ++l) sum[h][l][0] = sum[h][l][1] = _mm512_setzero_ps();
        int64_t t = 0;
        for (; t + 2 <= chunks; t += 2) {
            // (the panel's channels, then the next panel's, lie one after another: one stream)
            prefetch_streamed(w + 16 * t + kConvPrefetchBytes);
            lut4_channel_chunk<L>(w, table, columns, chunks, t, sum[0]);
            lut4_channel_chunk<L>(w, table, columns, chunks, t + 1, sum[1]);
        }
        if (t < chunks) lut4_channel_chunk<L>(w, table, columns, chunks, t, sum[0]);
        ORION_UNROLL
        for (int l = 0; l < L; ++l)
            channel_sums[l][j] = _mm512_add_ps(_mm512_add_ps(sum[0][l][0], sum[0][l][1]),
                                               _mm512_add_ps(sum[1][l][0], sum[1][l][1]));
    }
    ORION_UNROLL
    for (int l = 0; l < L; ++l) {
        const __m512 total = lane_sums16(channel_sums[l]);
        _mm512_storeu_ps(acc + l * kConvPanel, add ? _mm512_add_ps(_mm512_loadu_ps(acc + l * kConvPanel), total) : total);
    }
}

// The 16 fp16 values at p as fp32, those of lanes outside `m` 0 (they may be any bytes: channel_params ends with a
// tail of kChannelParamsTail values, so that 16 can be read from any of its own).
ORION_AVX512 inline __m512 fp16_lanes(const uint16_t* p, __mmask16 m) {
    return _mm512_maskz_mov_ps(m, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
}

// The int4 decode tile of the channel-major layout (blocks of 32+ rows): per channel, block and lane the sum of u * x
// (u the stored 4-bit values, exact in fp32), then acc += s * sum(u * x) per block, and once per channel the blocks'
// n = -(z * s) (exact: fp16 operands) times their sums of x (`x_sums`, per lane and block), 16 blocks a register. As
// AVX2's int4 tile, it sums the unrounded weights (u - z) * s: within their fp16 rounding of the fp16 conv of the
// dequantized weight (the converting path stays bit for bit), each lane the same way at any lane count. Per chunk
// one widening, a mask, a shift and two conversions, no table: the tables of fp16 levels it replaced held the tile
// to about two thirds of lut4's rate. Blocks alternate between two sums per lane; each decoded chunk feeds the L
// lanes. OneChunk: blocks of 32 rows (block_shift 5; llama.cpp's and Orion's quantizers' block).
template <int L, bool OneChunk>
ORION_AVX512 void affine4_channel_tile_avx512_fixed(const QPanel& p, int64_t c0, const float* columns,
                                                    const float* x_sums, int64_t chunks, float* acc, bool add) {
    const int block_chunks = OneChunk ? 0 : p.block_shift - 5;  // log2 of the chunks per block
    const int64_t blocks = p.channel_bytes * 2 >> p.block_shift, b0 = c0 >> p.block_shift;
    const int64_t used = (chunks + (int64_t{1} << block_chunks) - 1) >> block_chunks;  // the call's blocks
    const __m512i low_nibble = _mm512_set1_epi32(15);
    __m512 channel_sums[L][kConvPanel];
    for (int j = 0; j < kConvPanel; ++j) {
        const uint8_t* w = p.rows + j * p.channel_bytes + c0 / 2;
        const uint16_t* scales = p.channel_params + j * blocks * 2 + b0;
        const uint16_t* zeros = scales + blocks;
        if (j + 1 < kConvPanel) {  // the next channel's parameters (the rows are one prefetched stream)
            prefetch_streamed(scales + blocks * 2);
            prefetch_streamed(zeros + blocks * 2);
        }
        __m512 sum[L][2];
        ORION_UNROLL
        for (int l = 0; l < L; ++l) sum[l][0] = sum[l][1] = _mm512_setzero_ps();
        for (int64_t g = 0; g < used; g += 16) {  // 16 blocks at a time: their s and z in two registers
            const int n = static_cast<int>(std::min<int64_t>(16, used - g));
            const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
            const __m512 s = fp16_lanes(scales + g, m), z = fp16_lanes(zeros + g, m);
            const __m512 zs = _mm512_mul_ps(z, s);  // exact
            alignas(64) float block_scale[16];
            _mm512_store_ps(block_scale, s);
            for (int i = 0; i < n; i += 2) {  // (two blocks a step: each into its own sums)
                __m512 part[2][L];
                ORION_UNROLL
                for (int h = 0; h < 2; ++h) {
                    ORION_UNROLL
                    for (int l = 0; l < L; ++l) part[h][l] = _mm512_setzero_ps();
                    if (h == 1 && i + 1 == n) break;
                    const int64_t t0 = (g + i + h) << block_chunks;
                    const int64_t t1 = OneChunk ? t0 + 1 : std::min(chunks, t0 + (int64_t{1} << block_chunks));
                    for (int64_t t = t0; t < t1; ++t) {
                        if (t % 2 == 0) prefetch_streamed(w + 16 * t + kConvPrefetchBytes);
                        const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16 * t)));
                        const __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(bytes, low_nibble));
                        const __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4));
                        ORION_UNROLL
                        for (int l = 0; l < L; ++l) {
                            const float* xt = columns + (l * chunks + t) * 32;
                            part[h][l] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xt), part[h][l]);
                            part[h][l] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xt + 16), part[h][l]);
                        }
                    }
                }
                const __m512 s0 = _mm512_set1_ps(block_scale[i]), s1 = _mm512_set1_ps(block_scale[i + 1]);
                ORION_UNROLL
                for (int l = 0; l < L; ++l) {
                    sum[l][0] = _mm512_fmadd_ps(s0, part[0][l], sum[l][0]);
                    sum[l][1] = _mm512_fmadd_ps(s1, part[1][l], sum[l][1]);  // (0 past the last block)
                }
            }
            ORION_UNROLL
            for (int l = 0; l < L; ++l)  // the blocks' n * sum(x), n = -(z * s)
                sum[l][0] = _mm512_fnmadd_ps(zs, _mm512_maskz_loadu_ps(m, x_sums + l * used + g), sum[l][0]);
        }
        ORION_UNROLL
        for (int l = 0; l < L; ++l) channel_sums[l][j] = _mm512_add_ps(sum[l][0], sum[l][1]);
    }
    ORION_UNROLL
    for (int l = 0; l < L; ++l) {
        const __m512 total = lane_sums16(channel_sums[l]);
        _mm512_storeu_ps(acc + l * kConvPanel, add ? _mm512_add_ps(_mm512_loadu_ps(acc + l * kConvPanel), total) : total);
    }
}

// tile(std::integral_constant<int, L>{}) for L = n (1-4): a channel-major tile's lane count as its template argument.
template <typename Tile>
ORION_AVX512 void for_lane_count(int n, Tile tile) {
    if (n == 1) tile(std::integral_constant<int, 1>{});
    else if (n == 2) tile(std::integral_constant<int, 2>{});
    else if (n == 3) tile(std::integral_constant<int, 3>{});
    else tile(std::integral_constant<int, 4>{});
}

ORION_AVX512 void channel_tile_avx512(const QPanel& p, int64_t c0, const float* x, int64_t S, int64_t k, int lanes,
                                           float* acc, bool add) {
    if (c0 % 32 || (p.kind == PackedConv1x1Q::Kind::affine4 && c0 % (int64_t{1} << p.block_shift)))
        throw std::logic_error("channel_tile_avx512: rows from inside a chunk of 32 (or an int4 block)");
    const int64_t chunks = (k + 31) / 32;
    const bool affine = p.kind == PackedConv1x1Q::Kind::affine4;
    const int64_t used = affine ? ((chunks << 5) + (int64_t{1} << p.block_shift) - 1) >> p.block_shift : 0;
    // Each lane's x contiguous, padded rows 0: x itself for one lane of contiguous whole chunks, else a copy; int4:
    // each lane's sums of x over the call's blocks. Made once per conv1x1 call and thread (the panels of a call read
    // the same x).
    thread_local std::vector<float> copy, sums;
    thread_local struct { uint64_t call; const float* x; int64_t S, k; int lanes; } copied{};
    const bool in_place = S == 1 && k % 32 == 0;
    const float* columns = in_place ? x : copy.data();
    if (!p.call || p.call != copied.call || x != copied.x || S != copied.S || k != copied.k || lanes != copied.lanes) {
        if (!in_place) {
            if (copy.size() < static_cast<size_t>(lanes * chunks * 32)) copy.resize(static_cast<size_t>(lanes * chunks * 32));
            for (int l = 0; l < lanes; ++l) {
                float* to = copy.data() + l * chunks * 32;
                for (int64_t c = 0; c < k; ++c) to[c] = x[c * S + l];
                std::fill(to + k, to + chunks * 32, 0.0f);
            }
            columns = copy.data();
        }
        if (affine) {
            if (sums.size() < static_cast<size_t>(lanes * used)) sums.resize(static_cast<size_t>(lanes * used));
            const int64_t per_block = int64_t{1} << (p.block_shift - 5);  // chunks
            for (int l = 0; l < lanes; ++l)
                for (int64_t b = 0; b < used; ++b) {
                    __m512 total = _mm512_setzero_ps();
                    for (int64_t t = b * per_block; t < std::min(chunks, (b + 1) * per_block); ++t) {
                        const float* xt = columns + (l * chunks + t) * 32;
                        total = _mm512_add_ps(total, _mm512_add_ps(_mm512_loadu_ps(xt), _mm512_loadu_ps(xt + 16)));
                    }
                    sums[l * used + b] = _mm512_reduce_add_ps(total);
                }
        }
        copied = {p.call, x, S, k, lanes};
    }
    for (int l0 = 0; l0 < lanes; l0 += 4) {
        const float* cols = columns + l0 * chunks * 32;
        float* a = acc + l0 * kConvPanel;
        const int n = static_cast<int>(std::min(lanes - l0, 4));
        if (affine) {
            const float* x_sums = sums.data() + l0 * used;
            for_lane_count(n, [&](auto L) {
                constexpr int kLanes = decltype(L)::value;
                if (p.block_shift == 5) affine4_channel_tile_avx512_fixed<kLanes, true>(p, c0, cols, x_sums, chunks, a, add);
                else affine4_channel_tile_avx512_fixed<kLanes, false>(p, c0, cols, x_sums, chunks, a, add);
            });
        } else {
            for_lane_count(n, [&](auto L) { channel_tile_avx512_fixed<decltype(L)::value>(p, c0, cols, chunks, a, add); });
        }
    }
}

template <typename F>
ORION_AVX512 void with_q_rows16(const QPanel& p, int64_t c0, F f) {
    const uint8_t* w = p.rows + c0 * p.row_bytes;
    switch (p.kind) {
        case PackedConv1x1Q::Kind::lut4:
            if (!p.channel_luts) return f(Lut4Rows16{w, _mm512_loadu_ps(p.lut), _mm512_loadu_ps(p.lut + 16)});
            [[fallthrough]];
        case PackedConv1x1Q::Kind::lut6:
            return f(LutGatherRows16{w, p.lut, p.row_bytes, p.entries, p.kind == PackedConv1x1Q::Kind::lut6,
                                     p.channel_luts});
        case PackedConv1x1Q::Kind::affine4: return f(Affine4Rows16{w, p.params, c0, p.block_shift});
    }
}

struct TileAvx512 {
    const float* x;
    int64_t S, k;
    int lanes;
    float* acc;
    bool add;
    template <typename Rows>
    ORION_AVX512 void operator()(Rows rows) const { conv_tile_avx512_rows(rows, x, S, k, lanes, acc, add); }
};
struct WidenAvx512 {
    float* dst;
    int64_t n;
    template <typename Rows>
    ORION_AVX512 void operator()(Rows rows) const {
        for (int64_t r = 0; r < n; ++r) {
            __m512 row = rows.row(r);
            if constexpr (InterleavedRows<Rows>::value) row = deinterleave16(row);
            _mm512_storeu_ps(dst + r * kConvPanel, row);
        }
    }
};

}  // namespace

ORION_AVX512 void conv_tile_i8_avx512(const int8_t* w, const float* scale, const float* x, int64_t S, int64_t k,
                                      int lanes, float* acc, bool add) {
    if (!scale) return conv_tile_avx512_rows(UnscaledInt8Rows16{w}, x, S, k, lanes, acc, add);
    conv_tile_avx512_rows(Int8Rows16{w, _mm512_loadu_ps(scale)}, x, S, k, lanes, acc, add);
}

ORION_AVX512 void conv_tile_q_avx512(const QPanel& p, int64_t c0, const float* x, int64_t S, int64_t k, int lanes,
                                     float* acc, bool add) {
    if (p.channel_bytes) return channel_tile_avx512(p, c0, x, S, k, lanes, acc, add);
    const int64_t block = int64_t{1} << p.block_shift;
    if (p.kind == PackedConv1x1Q::Kind::affine4 && block >= 4 && c0 % block == 0 && k % block == 0)
        return affine4_tile_avx512(p.rows + c0 * p.row_bytes, p.params + (c0 >> p.block_shift) * 2 * kConvPanel, block,
                                   x, S, k, lanes, acc, add);
    with_q_rows16(p, c0, TileAvx512{x, S, k, lanes, acc, add});
}

ORION_AVX512 void widen_q_avx512(const QPanel& p, int64_t c0, float* dst, int64_t n) {
    if (p.channel_bytes) {  // the channel-major layout: a chunk of 32 rows at a time, as channel_tile_avx512
        alignas(64) float block[kConvPanel][32];
        for (int64_t t = c0 / 32; t * 32 < c0 + n; ++t) {
            for (int j = 0; j < kConvPanel; ++j) {
                const __m512 table = p.kind == PackedConv1x1Q::Kind::affine4
                                         ? channel_table<true>(p, j, (32 * t) >> p.block_shift)
                                         : channel_table<false>(p, j, 0);
                const __m512i bytes = _mm512_cvtepu8_epi32(
                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(p.rows + j * p.channel_bytes + 16 * t)));
                _mm512_store_ps(block[j], _mm512_permutexvar_ps(bytes, table));
                _mm512_store_ps(block[j] + 16, _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table));
            }
            store_chunk_rows(block, t, c0, dst, n);
        }
        return;
    }
    with_q_rows16(p, c0, WidenAvx512{dst, n});
}

#endif  // ORION_X86

// ---------------------------------------------------------------------------------------------

QPanel q_panel(const PackedConv1x1Q& w, int64_t p) {
    QPanel panel;
    panel.kind = w.kind;
    panel.rows = w.data.data() + p * w.rows_stored() * w.row_bytes;
    panel.row_bytes = w.row_bytes;
    panel.entries = w.entries;
    panel.channel_luts = w.channel_luts;
    if (!w.lut.empty()) panel.lut = w.lut.data() + p * (w.channel_luts ? kConvPanel : 2) * w.entries;
    if (!w.lut_bytes.empty()) panel.lut_bytes = w.lut_bytes.data() + p * w.entries * 4;
    if (!w.params.empty()) panel.params = w.params.data() + p * (w.cin >> w.block_shift) * 2 * kConvPanel;
    panel.block_shift = w.block_shift;
    panel.affine4_pairs = w.affine4_pairs;
    panel.affine4_octets = w.affine4_octets;
    if (w.channel_major) panel.channel_bytes = w.rows_stored() / 2;
    if (!w.channel_params.empty())
        panel.channel_params = w.channel_params.data() + p * kConvPanel * (w.cin >> w.block_shift) * 2;
    return panel;
}

void add_low_bit_usage(int64_t& count, int64_t& bytes) {
    std::lock_guard<std::mutex> lock_q(shared_q_mutex);
    for (const auto& [key, weak] : shared_q)
        if (auto alive = weak.lock()) {
            ++count;
            bytes += static_cast<int64_t>(alive->data.size() + alive->lut.size() * 4 + alive->params.size() * 2 +
                                          alive->lut_bytes.size() + alive->channel_params.size() * 2);
        }
}

bool int8_weights_fp16_exact(const int8_t* q, const float* scale, int64_t cout, int64_t cin) {
    // With s = m * 2^e and q = q' * 2^t (m, q' odd), q * s = (q' * m) * 2^(e + t) is an fp16 value (and then exact
    // in fp32 too) iff q' * m < 2^11 (11 significant bits), e + t >= -24 (the subnormals' step) and |q * s| <=
    // 65504: a row's largest odd part q' (needed only when 127 * m >= 2^11), smallest t (that of the OR of its
    // |q|) and largest |q| decide it for all its weights.
    for (int64_t o = 0; o < cout && cin > 0; ++o) {
        const float s = scale[o];
        if (!std::isfinite(s)) return false;
        const int8_t* row = q + o * cin;
        unsigned bits = 0, largest = 0;
        for (int64_t c = 0; c < cin; ++c) {  // (vectorized)
            const unsigned v = static_cast<unsigned>(std::abs(static_cast<int>(row[c])));
            bits |= v;
            largest = std::max(largest, v);
        }
        if (largest == 0 || s == 0.0f) continue;  // every product is 0
        int x = 0;
        int64_t m = static_cast<int64_t>(std::ldexp(std::frexp(static_cast<double>(std::fabs(s)), &x), 24));
        int e = x - 24;
        for (; m % 2 == 0; m /= 2) ++e;
        if (e + __builtin_ctz(bits) < -24 || largest * static_cast<double>(std::fabs(s)) > 65504.0) return false;
        if (127 * m < 2048) continue;
        for (int64_t c = 0; c < cin; ++c) {
            const unsigned v = static_cast<unsigned>(std::abs(static_cast<int>(row[c])));
            if (v && (v >> __builtin_ctz(v)) * m >= 2048) return false;
        }
    }
    return true;
}

PackedConv1x1I8 pack_conv1x1_i8(const int8_t* q, const float* scale, int64_t cout, int64_t cin) {
    if (cout < 0 || cin < 0) throw std::invalid_argument("pack_conv1x1_i8: negative weight shape");
    if (!int8_weights_fp16_exact(q, scale, cout, cin))
        throw std::invalid_argument("pack_conv1x1_i8: some q * scale is not an fp16 value (dequantize to fp16 instead)");
    PackedConv1x1I8 packed;
    packed.cout = cout;
    packed.cin = cin;
    const int64_t panels = ceil_div(cout, kConvPanel);
    packed.data.assign(static_cast<size_t>(panels * cin * kConvPanel), 0);
    packed.scale.assign(static_cast<size_t>(panels * kConvPanel), 0.0f);
    for (int64_t o = 0; o < cout; ++o) {
        int8_t* panel = packed.data.data() + (o / kConvPanel) * cin * kConvPanel + o % kConvPanel;
        for (int64_t c = 0; c < cin; ++c) panel[c * kConvPanel] = q[o * cin + c];
        packed.scale[static_cast<size_t>(o)] = scale[o];
    }
    packed.scale_after = std::all_of(scale, scale + cout, [](float s) {
        int exponent = 0;
        return std::isfinite(s) && std::fabs(std::frexp(s, &exponent)) == 0.5f;  // +-2^k
    });
    return packed;
}

PackedConv1x1Q pack_conv1x1_lut(const uint8_t* indices, int bits, const float* lut, int64_t group, int64_t cout,
                                int64_t cin) {
    if (cout < 0 || cin < 0) throw std::invalid_argument("pack_conv1x1_lut: negative weight shape");
    if (bits != 4 && bits != 6) throw std::invalid_argument("pack_conv1x1_lut: indices must have 4 or 6 bits");
    if (group <= 0) throw std::invalid_argument("pack_conv1x1_lut: the LUT group must be positive");
    PackedConv1x1Q packed;
    packed.kind = bits == 4 ? PackedConv1x1Q::Kind::lut4 : PackedConv1x1Q::Kind::lut6;
    packed.cout = cout, packed.cin = cin;
    packed.row_bytes = bits == 4 ? 8 : 12;
    packed.entries = int64_t{1} << bits;
    packed.channel_luts = group % 8 != 0;
    // The AVX2 flavour's layout for LUTs per panel half (the other flavours' readers take the plain one).
    const bool avx2 = std::string_view(simd_path()) == "avx2+f16c+fma";
    const bool paired = !packed.channel_luts && avx2;
    packed.channel_major = packed.channel_luts && bits == 4 && (avx2 || std::string_view(simd_path()) == "avx512f+f16c+fma");
    const int64_t tables = packed.entries / 16;  // paired: vpshufb tables of 16 entries per LUT
    const int64_t panels = ceil_div(cout, kConvPanel), luts = packed.channel_luts ? kConvPanel : 2;
    const int64_t rows_stored = packed.channel_major ? packed.rows_stored() : paired ? cin + cin % 2 : cin;
    packed.data.assign(static_cast<size_t>(panels * rows_stored * packed.row_bytes), 0);
    if (paired)
        packed.lut_bytes.assign(static_cast<size_t>(panels * packed.entries * 4), 0);
    else
        packed.lut.assign(static_cast<size_t>(panels * luts * packed.entries), 0.0f);
    for (int64_t o = 0; o < cout; ++o) {
        const int64_t p = o / kConvPanel, j = o % kConvPanel;
        const float* table = lut + (o / group) * packed.entries;  // this channel's LUT: its group's
        if (paired && j % 8 == 0) {  // [low bytes, high bytes][table][panel half][16 entries]
            uint8_t* bytes = packed.lut_bytes.data() + p * packed.entries * 4 + 16 * (j / 8);
            for (int64_t e = 0; e < packed.entries; ++e) {
                const uint16_t h = emu::float_to_half(table[e]);
                bytes[(e / 16) * 32 + e % 16] = static_cast<uint8_t>(h & 0xFF);
                bytes[(tables + e / 16) * 32 + e % 16] = static_cast<uint8_t>(h >> 8);
            }
        } else if (!paired && (packed.channel_luts || j % 8 == 0)) {
            std::copy(table, table + packed.entries,
                      packed.lut.begin() + (p * luts + (packed.channel_luts ? j : j / 8)) * packed.entries);
        }
        uint8_t* rows = packed.data.data() + p * rows_stored * packed.row_bytes;
        for (int64_t c = 0; c < cin; ++c) {
            const unsigned index = indices[o * cin + c];
            if (index >= static_cast<unsigned>(packed.entries))
                throw std::invalid_argument("pack_conv1x1_lut: an index is out of the LUT's range");
            if (packed.channel_major) {  // (kernels.h)
                rows[j * (rows_stored / 2) + (c / 32) * 16 + chunk_byte(c % 32, !avx2)] |=
                    static_cast<uint8_t>(index << chunk_shift(c % 32, !avx2));
                continue;
            }
            if (paired) {  // (kernels.h) and lut6's high bits at byte j % 8 after the pair's 16, bits 2 * (2 * half + row)
                uint8_t* pair = rows + (c / 2) * 2 * packed.row_bytes;
                pair[(c % 2) * 8 + j % 8] |= static_cast<uint8_t>((index & 15) << (4 * (j / 8)));
                if (bits == 6) pair[16 + j % 8] |= static_cast<uint8_t>((index >> 4) << (2 * (2 * (j / 8) + c % 2)));
                continue;
            }
            uint8_t* row = rows + c * packed.row_bytes;
            row[j / 2] |= static_cast<uint8_t>((index & 15) << (4 * (j % 2)));
            if (bits == 6) row[8 + j / 4] |= static_cast<uint8_t>((index >> 4) << (2 * (j % 4)));
        }
    }
    return packed;
}

bool affine4_packable(float scale, float zero) {
    if (!emu::is_fp16_value(scale) || !emu::is_fp16_value(zero)) return false;
    // Whether u - zero is an fp16 value for every u, found once per zero point (a weight's millions of blocks
    // share a few): by zero's fp16 bits, 0 not yet known, 1 yes, 2 no.
    static std::array<std::atomic<uint8_t>, 65536> known{};
    std::atomic<uint8_t>& entry = known[emu::float_to_half(zero)];
    uint8_t verdict = entry.load(std::memory_order_relaxed);
    if (verdict == 0) {
        verdict = 1;
        for (int u = 0; u < 16; ++u)
            if (!emu::is_fp16_value(static_cast<float>(u) - zero)) verdict = 2;  // exact in fp32: fp16 operands below 2^11
        entry.store(verdict, std::memory_order_relaxed);
    }
    return verdict == 1;
}

PackedConv1x1Q pack_conv1x1_affine4(const uint8_t* u, const float* scale, const float* zero, int64_t block,
                                    int64_t cout, int64_t cin) {
    if (cout < 0 || cin < 0) throw std::invalid_argument("pack_conv1x1_affine4: negative weight shape");
    if (block <= 0 || (block & (block - 1)) || cin % block)
        throw std::invalid_argument("pack_conv1x1_affine4: the block must be a power of two dividing cin");
    PackedConv1x1Q packed;
    packed.kind = PackedConv1x1Q::Kind::affine4;
    packed.cout = cout, packed.cin = cin;
    packed.row_bytes = 8;
    packed.entries = 16;
    int shift = 0;
    while ((int64_t{1} << shift) < block) ++shift;
    packed.block_shift = shift;
    // The AVX2 flavour's layouts: blocks of 8+ rows in octets, of 2 or 4 in pairs (the other flavours' readers take
    // the plain one).
    const bool avx2 = std::string_view(simd_path()) == "avx2+f16c+fma";
    packed.affine4_octets = shift >= 3 && avx2;
    packed.affine4_pairs = shift > 0 && shift < 3 && avx2;
    // The AVX-512 flavour's channel-major layout for blocks of whole chunks of 32 rows.
    packed.channel_major = block >= 32 && std::string_view(simd_path()) == "avx512f+f16c+fma";
    const int64_t panels = ceil_div(cout, kConvPanel), blocks = cin / block;
    packed.data.assign(static_cast<size_t>(panels * cin * 8), 0);
    if (packed.channel_major)
        packed.channel_params.assign(static_cast<size_t>(panels * kConvPanel * blocks * 2 + kChannelParamsTail), 0);
    else
        packed.params.assign(static_cast<size_t>(panels * blocks * 2 * kConvPanel), 0);
    for (int64_t o = 0; o < cout; ++o) {
        const int64_t p = o / kConvPanel, j = o % kConvPanel;
        for (int64_t b = 0; b < blocks; ++b) {
            const float s = scale[o * blocks + b], z = zero[o * blocks + b];
            if (!affine4_packable(s, z))
                throw std::invalid_argument("pack_conv1x1_affine4: a scale or zero point is not an fp16 value, or some "
                                            "u - zero is not (dequantize to fp16 instead)");
            if (packed.channel_major) {
                uint16_t* at = packed.channel_params.data() + (p * kConvPanel + j) * blocks * 2 + b;
                at[0] = emu::float_to_half(s);
                at[blocks] = emu::float_to_half(z);
                continue;
            }
            uint16_t* at = packed.params.data() + (p * blocks + b) * 2 * kConvPanel;
            at[j] = emu::float_to_half(s);
            at[kConvPanel + j] = emu::float_to_half(z);
        }
        uint8_t* rows = packed.data.data() + p * cin * 8;
        const uint8_t* row = u + o * cin;
        if (std::any_of(row, row + cin, [](uint8_t v) { return v > 15; }))
            throw std::invalid_argument("pack_conv1x1_affine4: a value is above 15");
        if (packed.affine4_octets || packed.affine4_pairs) {  // rows c and c + 1 in one byte (blocks of 2+: cin even)
            uint8_t* at = rows + (packed.affine4_octets ? (j / 8) * 32 + (j % 8) * 4 : j);
            for (int64_t c = 0; c < cin; c += 2) {
                const int64_t byte = packed.affine4_octets ? (c / 8) * 64 + (c % 8) / 2 : (c / 2) * 16;
                at[byte] = static_cast<uint8_t>(row[c] | row[c + 1] << 4);
            }
            continue;
        }
        for (int64_t c = 0; c < cin; ++c) {
            const unsigned v = row[c];
            if (packed.channel_major)
                rows[j * (cin / 2) + (c / 32) * 16 + chunk_byte(c % 32, true)] |= static_cast<uint8_t>(v << chunk_shift(c % 32, true));
            else
                rows[c * 8 + j / 2] |= static_cast<uint8_t>(v << (4 * (j % 2)));
        }
    }
    return packed;
}

std::shared_ptr<const PackedConv1x1Q> shared_conv1x1_q(PackedConv1x1Q packed) {
    size_t key = content_key(std::string_view(reinterpret_cast<const char*>(packed.data.data()), packed.data.size()));
    key ^= content_key(std::string_view(reinterpret_cast<const char*>(packed.lut.data()), packed.lut.size() * 4)) << 1;
    key ^= content_key(std::string_view(reinterpret_cast<const char*>(packed.params.data()), packed.params.size() * 2)) << 2;
    key ^= content_key(std::string_view(reinterpret_cast<const char*>(packed.lut_bytes.data()), packed.lut_bytes.size())) << 3;
    key ^= content_key(std::string_view(reinterpret_cast<const char*>(packed.channel_params.data()),
                                        packed.channel_params.size() * 2)) << 4;
    key ^= static_cast<size_t>(packed.cout) * 0x9E3779B97F4A7C15ull + static_cast<size_t>(packed.kind);
    std::lock_guard<std::mutex> lock(shared_q_mutex);
    auto [first, last] = shared_q.equal_range(key);
    for (auto it = first; it != last; ++it)
        if (auto held = it->second.lock())
            if (same_content(*held, packed)) return held;
    for (auto it = shared_q.begin(); it != shared_q.end();) it = it->second.expired() ? shared_q.erase(it) : std::next(it);
    auto made = std::make_shared<const PackedConv1x1Q>(std::move(packed));
    shared_q.emplace(key, made);
    return made;
}

std::shared_ptr<const PackedConv1x1Q> keyed_conv1x1_q(
    const std::string& key, const std::string& samples,
    const std::function<std::shared_ptr<const PackedConv1x1Q>()>& make) {
    static KeyedWeights<PackedConv1x1Q> keyed;
    return keyed.get(key, samples, make);
}

}  // namespace orion::emu::kernels
