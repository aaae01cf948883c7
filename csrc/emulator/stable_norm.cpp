// The fused stable norm kernel (see stable_norm.h for why it is the ops bit for bit).
#include "emulator/stable_norm.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "emulator/kernels.h"

namespace orion::emu {

namespace {

void round(float* v, int64_t n) { kernels::round_fp16(v, static_cast<size_t>(n)); }

// acc[s] = acc[s] (+ or max) v[c, s] over the channels in order, then rounded: reduce_sum / reduce_max over axis 1.
// The running values are kept in a local array (S <= kStableNormBlockLanes), which v cannot alias: in acc, each
// step was a store and a reload (a decode step's 768 channels: a chain of ~9 cycles a channel instead of 4).
template <int64_t kS, typename F>
void reduce_channels(const float* v, int64_t C, int64_t S_, float init, float* acc, F f) {
    const int64_t S = kS > 0 ? kS : S_;
    if (S == 1) {
        float running = init;
        for (int64_t c = 0; c < C; ++c) running = f(running, v[c]);
        acc[0] = running;
    } else {
        float running[kStableNormBlockLanes];
        std::fill(running, running + S, init);
        for (int64_t c = 0; c < C; ++c)
            for (int64_t s = 0; s < S; ++s) running[s] = f(running[s], v[c * S + s]);
        std::copy(running, running + S, acc);
    }
    round(acc, S);
}

// dst[c, s] = f(src[c, s], lane[s]): one flat loop when there is one lane (a decode step), which vectorises.
template <int64_t kS, typename F>
void per_lane(const float* src, const float* lane, int64_t C, int64_t S_, float* dst, F f) {
    const int64_t S = kS > 0 ? kS : S_;
    if (S == 1) {
        const float v = lane[0];
        for (int64_t i = 0; i < C; ++i) dst[i] = f(src[i], v);
        return;
    }
    for (int64_t c = 0; c < C; ++c)
        for (int64_t s = 0; s < S; ++s) dst[c * S + s] = f(src[c * S + s], lane[s]);
}

// The norm of `kS` lanes known at compile time (0: n.lanes), so that a check's or a batch's 2-8 lanes are loops of
// that width the compiler unrolls; every value is computed as for any other width.
template <int64_t kS>
void stable_norm_lanes(const StableNorm& n, const float* x, const float* gamma, const float* beta, float* out) {
    const int64_t C = n.channels, S = kS > 0 ? kS : n.lanes, size = C * S;
    thread_local std::vector<float> scratch;  // grown, never shrunk
    if (scratch.size() < static_cast<size_t>(size)) scratch.resize(static_cast<size_t>(size));
    float* tmp = scratch.data();
    float top[kStableNormBlockLanes], bottom[kStableNormBlockLanes], inv[kStableNormBlockLanes], rstd[kStableNormBlockLanes];
    auto max = [](float a, float b) { return std::max(a, b); };
    auto sum = [](float a, float b) { return a + b; };
    const float lowest = -std::numeric_limits<float>::infinity();
    reduce_channels<kS>(x, C, S, lowest, top, max);
    for (int64_t i = 0; i < size; ++i) tmp[i] = x[i] * n.neg_y;  // neg
    round(tmp, size);
    reduce_channels<kS>(tmp, C, S, lowest, bottom, max);
    for (int64_t s = 0; s < S; ++s) {
        float gap = bottom[s] - top[s];
        round(&gap, 1);
        float peak = top[s] + (gap > 0.0f ? gap : 0.0f);  // top + relu(gap)
        round(&peak, 1);
        float scale = peak + n.floor;
        round(&scale, 1);
        inv[s] = std::pow(scale, n.inv_y);
    }
    round(inv, S);
    auto times = [](float a, float b) { return a * b; };
    float* y = out;  // the unit (then centered) values, normalized in place at the end
    per_lane<kS>(x, inv, C, S, y, times);
    round(y, size);
    if (n.center) {
        float mean[kStableNormBlockLanes];
        reduce_channels<kS>(y, C, S, 0.0f, mean, sum);
        for (int64_t s = 0; s < S; ++s) mean[s] *= n.mean_y;
        round(mean, S);
        per_lane<kS>(y, mean, C, S, y, [](float a, float b) { return a - b; });
        round(y, size);
    }
    for (int64_t i = 0; i < size; ++i) tmp[i] = y[i] * y[i];  // sq
    round(tmp, size);
    reduce_channels<kS>(tmp, C, S, 0.0f, rstd, sum);  // the squares' sum, then the rstd
    for (int64_t s = 0; s < S; ++s) {
        float terms[3] = {rstd[s] * n.meansq_y, inv[s] * n.root_eps_y, 0.0f};  // meansq, root_eps
        round(terms, 2);
        terms[2] = terms[1] * terms[1];  // eps
        round(terms + 2, 1);
        float var = terms[0] + terms[2];
        round(&var, 1);
        rstd[s] = std::pow(var, n.rsqrt_y);
    }
    round(rstd, S);
    per_lane<kS>(y, rstd, C, S, y, times);
    round(y, size);
    for (const auto& [per_channel, stride, add] : {std::tuple{gamma, n.gamma_stride, false}, std::tuple{beta, n.beta_stride, true}}) {
        if (!per_channel) continue;
        if (S == 1 && stride == 1) {  // a decode step: one flat loop
            for (int64_t c = 0; c < C; ++c) y[c] = add ? y[c] + per_channel[c] : y[c] * per_channel[c];
        } else {
            for (int64_t c = 0; c < C; ++c) {
                const float p = per_channel[c * stride];
                for (int64_t s = 0; s < S; ++s) y[c * S + s] = add ? y[c * S + s] + p : y[c * S + s] * p;
            }
        }
        round(y, size);
    }
}

// The norm of one contiguous [C, n.lanes] block (n.lanes <= kStableNormBlockLanes); out may be x (x is last read
// where y = x * inv is written, element by element).
void stable_norm_block(const StableNorm& n, const float* x, const float* gamma, const float* beta, float* out) {
    switch (n.lanes) {
        case 1: return stable_norm_lanes<1>(n, x, gamma, beta, out);
        case 2: return stable_norm_lanes<2>(n, x, gamma, beta, out);
        case 3: return stable_norm_lanes<3>(n, x, gamma, beta, out);
        case 4: return stable_norm_lanes<4>(n, x, gamma, beta, out);
        case 5: return stable_norm_lanes<5>(n, x, gamma, beta, out);
        case 6: return stable_norm_lanes<6>(n, x, gamma, beta, out);
        case 7: return stable_norm_lanes<7>(n, x, gamma, beta, out);
        case 8: return stable_norm_lanes<8>(n, x, gamma, beta, out);
        default: return stable_norm_lanes<0>(n, x, gamma, beta, out);
    }
}

}  // namespace

void run_stable_norm(const StableNorm& n, int64_t live, const float* x, const float* gamma, const float* beta,
                     float* out) {
    if (live == n.lanes && live <= kStableNormBlockLanes) return stable_norm_block(n, x, gamma, beta, out);
    const int64_t C = n.channels, blocks = (live + kStableNormBlockLanes - 1) / kStableNormBlockLanes;
    kernels::parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
        thread_local std::vector<float> packed;  // grown, never shrunk
        for (int64_t b = b0; b < b1; ++b) {
            StableNorm block = n;
            const int64_t first = b * kStableNormBlockLanes;
            block.lanes = std::min(kStableNormBlockLanes, live - first);
            const auto size = static_cast<size_t>(C * block.lanes);
            if (packed.size() < size) packed.resize(size);
            kernels::gather_lanes(x + first, C, n.lanes, block.lanes, packed.data());
            stable_norm_block(block, packed.data(), gamma, beta, packed.data());  // in place
            kernels::scatter_lanes(packed.data(), C, block.lanes, out + first, n.lanes);
        }
    });
}

}  // namespace orion::emu
