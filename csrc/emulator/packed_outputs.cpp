// The I/O packing's output placement in one pass (see packed_outputs.h).
#include "emulator/packed_outputs.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "emulator/kernels.h"
#include "emulator/simd.h"

namespace orion::emu {

namespace {

// Elements per pass over the blocks: at most kChunk, and few enough that every block's slice (read twice:
// for the signs, then to place it) stays in L2 (kChunkBudget elements over all blocks): a Stories110M layer
// gradient places 288 rows of dW, whose 4096-element slices (4.7 MB) the second read fetched from L3 again.
constexpr int64_t kChunk = 4096, kMinChunk = 256, kChunkBudget = int64_t{1} << 17;
// Elements read and written worth a job of their own (the 16384-element blocks of a layer gradient were
// 4 chunks of 4096 under a grain of 16: one thread did them all).
constexpr int64_t kJobWork = int64_t{1} << 16;
constexpr uint32_t kSign = 0x80000000u, kAbs = 0x7fffffffu, kNonFinite = 0x7f800000u;

inline uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

inline float from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

// The two passes over one chunk of `len` elements: the zero sums' signs and the largest magnitude's bits
// over every block, then each row written (its block's value, or the sign where that is a zero).
uint32_t signs_portable(const std::vector<const float*>& blocks, int64_t e0, int64_t len, uint32_t* sign) {
    uint32_t worst = 0;
    for (const float* b : blocks)
        for (int64_t e = 0; e < len; ++e) {
            const uint32_t v = bits(b[e0 + e]);
            sign[e] &= v;
            worst = std::max(worst, v & kAbs);
        }
    return worst;
}

void place_portable(const float* b, const uint32_t* sign, int64_t len, float* row) {
    for (int64_t e = 0; e < len; ++e) {
        const uint32_t v = b ? bits(b[e]) : 0u;
        row[e] = from_bits((v & kAbs) ? v : sign[e]);
    }
}

#ifdef ORION_X86
// The same bits, eight elements per step (the portable loops compiled to SSE2 at best).
ORION_AVX2 uint32_t signs_avx2(const std::vector<const float*>& blocks, int64_t e0, int64_t len, uint32_t* sign) {
    const int64_t len8 = len / 8 * 8;
    const __m256i abs = _mm256_set1_epi32(static_cast<int>(kAbs));
    __m256i worst8 = _mm256_setzero_si256();
    uint32_t worst = 0;
    for (const float* block : blocks) {
        const float* b = block + e0;
        for (int64_t e = 0; e < len8; e += 8) {
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + e));
            __m256i* sp = reinterpret_cast<__m256i*>(sign + e);
            _mm256_storeu_si256(sp, _mm256_and_si256(_mm256_loadu_si256(sp), v));
            worst8 = _mm256_max_epu32(worst8, _mm256_and_si256(v, abs));
        }
        for (int64_t e = len8; e < len; ++e) {
            const uint32_t v = bits(b[e]);
            sign[e] &= v;
            worst = std::max(worst, v & kAbs);
        }
    }
    alignas(32) uint32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), worst8);
    for (uint32_t w : lanes) worst = std::max(worst, w);
    return worst;
}

ORION_AVX2 void place_avx2(const float* b, const uint32_t* sign, int64_t len, float* row) {
    if (!b) {
        std::memcpy(row, sign, static_cast<size_t>(len) * sizeof(float));
        return;
    }
    const int64_t len8 = len / 8 * 8;
    const __m256i abs = _mm256_set1_epi32(static_cast<int>(kAbs)), zero = _mm256_setzero_si256();
    for (int64_t e = 0; e < len8; e += 8) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + e));
        const __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sign + e));
        const __m256i is_zero = _mm256_cmpeq_epi32(_mm256_and_si256(v, abs), zero);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + e), _mm256_blendv_epi8(v, s, is_zero));
    }
    place_portable(b + len8, sign + len8, len - len8, row + len8);
}
#endif

}  // namespace

bool run_packed_outputs(const PackedOutputs& p, const std::vector<const float*>& blocks, float* out,
                        const DeadLanes& dead) {
    const int64_t slices = std::max<int64_t>(1, static_cast<int64_t>(blocks.size()));
    int64_t chunk = kChunk;
    while (chunk > kMinChunk && chunk * slices > kChunkBudget) chunk /= 2;
    const int64_t n = p.block;
    // The pieces (first element, length) to place: chunks of the whole block, or of each row's live lanes.
    const bool some_dead = dead.width > 0 && dead.lanes < dead.width;
    const int64_t row = some_dead ? dead.width : n, live = some_dead ? dead.lanes : n;
    std::vector<std::pair<int64_t, int64_t>> pieces;
    for (int64_t r0 = 0; r0 < n; r0 += row)
        for (int64_t e = 0; e < live; e += chunk) pieces.emplace_back(r0 + e, std::min(chunk, live - e));
    if (some_dead && dead.zeroed)
        for (int64_t h = 0; h < p.rows; ++h)
            for (int64_t r0 = 0; r0 < n; r0 += row) std::fill(out + h * n + r0 + live, out + h * n + r0 + row, 0.0f);
    const int64_t grain = std::max<int64_t>(1, kJobWork / (chunk * (slices + p.rows)));
    std::vector<int> block_of(static_cast<size_t>(p.rows), -1);
    for (size_t i = 0; i < p.hot.size(); ++i) block_of[static_cast<size_t>(p.hot[i])] = static_cast<int>(i);
#ifdef ORION_X86
    const bool avx2 = kernels::simd_flavour() != kernels::SimdFlavour::portable;
    const auto signs = avx2 ? signs_avx2 : signs_portable;
    const auto place = avx2 ? place_avx2 : place_portable;
#else
    const auto signs = signs_portable;
    const auto place = place_portable;
#endif
    std::atomic<bool> finite{true};
    kernels::parallel_for(static_cast<int64_t>(pieces.size()), grain, [&](int64_t begin, int64_t end) {
        uint32_t sign[kChunk];  // per element: the sign a zero sum takes (set only if every block's is)
        for (int64_t c = begin; c < end && finite.load(std::memory_order_relaxed); ++c) {
            const auto [e0, len] = pieces[static_cast<size_t>(c)];
            std::fill(sign, sign + len, kSign);
            // the largest magnitude's bits: a non-finite block leaves the output to the ops
            if (signs(blocks, e0, len, sign) >= kNonFinite) {
                finite.store(false, std::memory_order_relaxed);
                return;
            }
            for (int64_t h = 0; h < p.rows; ++h) {
                const int i = block_of[static_cast<size_t>(h)];
                place(i < 0 ? nullptr : blocks[static_cast<size_t>(i)] + e0, sign, len, out + h * n + e0);
            }
        }
    });
    return finite.load();
}

}  // namespace orion::emu
