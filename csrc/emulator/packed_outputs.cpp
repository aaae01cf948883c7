// The I/O packing's output placement in one pass (see packed_outputs.h).
#include "emulator/packed_outputs.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "emulator/kernels.h"

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

}  // namespace

bool run_packed_outputs(const PackedOutputs& p, const std::vector<const float*>& blocks, float* out) {
    const int64_t slices = std::max<int64_t>(1, static_cast<int64_t>(blocks.size()));
    int64_t chunk = kChunk;
    while (chunk > kMinChunk && chunk * slices > kChunkBudget) chunk /= 2;
    const int64_t n = p.block, chunks = (n + chunk - 1) / chunk;
    const int64_t grain = std::max<int64_t>(1, kJobWork / (chunk * (slices + p.rows)));
    std::vector<int> block_of(static_cast<size_t>(p.rows), -1);
    for (size_t i = 0; i < p.hot.size(); ++i) block_of[static_cast<size_t>(p.hot[i])] = static_cast<int>(i);
    std::atomic<bool> finite{true};
    kernels::parallel_for(chunks, grain, [&](int64_t begin, int64_t end) {
        uint32_t sign[kChunk];  // per element: the sign a zero sum takes (set only if every block's is)
        for (int64_t c = begin; c < end && finite.load(std::memory_order_relaxed); ++c) {
            const int64_t e0 = c * chunk, len = std::min(n, e0 + chunk) - e0;
            std::fill(sign, sign + len, kSign);
            uint32_t worst = 0;  // the largest magnitude's bits: a non-finite block leaves the output to the ops
            for (const float* b : blocks)
                for (int64_t e = 0; e < len; ++e) {
                    const uint32_t v = bits(b[e0 + e]);
                    sign[e] &= v;
                    worst = std::max(worst, v & kAbs);
                }
            if (worst >= kNonFinite) {
                finite.store(false, std::memory_order_relaxed);
                return;
            }
            for (int64_t h = 0; h < p.rows; ++h) {
                float* row = out + h * n + e0;
                const int i = block_of[static_cast<size_t>(h)];
                const float* b = i < 0 ? nullptr : blocks[static_cast<size_t>(i)] + e0;
                for (int64_t e = 0; e < len; ++e) {
                    const uint32_t v = b ? bits(b[e]) : 0u;
                    row[e] = from_bits((v & kAbs) ? v : sign[e]);
                }
            }
        }
    });
    return finite.load();
}

}  // namespace orion::emu
