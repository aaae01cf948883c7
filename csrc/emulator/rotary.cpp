// The fused rotary embedding kernel (see rotary.h for why it is the ops bit for bit).
#include "emulator/rotary.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "emulator/kernels.h"

namespace orion::emu {

namespace {

// Elements of work below which a parallel_for chunk is not worth waking a thread for.
constexpr int64_t kParallelElements = int64_t{1} << 15;

// Whether the first `lanes` lanes of every row of x ([rows, S]) are finite.
bool finite_lanes(const float* x, int64_t rows, int64_t S, int64_t lanes) {
    bool finite = true;
    for (int64_t d = 0; d < rows; ++d)
        for (int64_t i = 0; i < lanes; ++i) finite &= std::isfinite(x[d * S + i]);
    return finite;
}

// dst = the partner (its transpose when `transposed`, r then holding the transpose's permutation) times src, both
// [D, S]: the matmul op's gemm call over src's first `gemm_lanes` lanes, or, for a signed permutation and finite
// src, that permutation over the first `lanes` lanes (exactly what the gemm computes: see Rotary::mate).
void partner_product(const Rotary& r, bool transposed, const float* partner, const float* src, int64_t gemm_lanes,
                     int64_t lanes, float* dst) {
    const int64_t D = r.depth, S = r.lanes;
    if (r.mate.empty() || !finite_lanes(src, D, S, gemm_lanes)) {
        kernels::gemm(D, gemm_lanes, D, partner, transposed ? 1 : D, transposed ? D : 1, src, S, 1, dst, S, true);
        return;
    }
    for (int64_t d = 0; d < D; ++d) {
        const float* from = src + r.mate[static_cast<size_t>(d)] * S;
        const float sign = r.sign[static_cast<size_t>(d)];
        for (int64_t i = 0; i < lanes; ++i) dst[d * S + i] = sign * from[i] + 0.0f;  // +0 for 0
    }
}

}  // namespace

void read_permutation(const float* partner, Rotary& r, bool transposed) {
    const int64_t D = r.depth;
    r.mate.assign(static_cast<size_t>(D), -1);
    r.sign.assign(static_cast<size_t>(D), 0.0f);
    bool permutation = true;
    for (int64_t c = 0; c < D && permutation; ++c)
        for (int64_t k = 0; k < D && permutation; ++k) {
            const float p = transposed ? partner[k * D + c] : partner[c * D + k];
            if (p == 0.0f) continue;
            permutation = (p == 1.0f || p == -1.0f) && r.mate[static_cast<size_t>(c)] < 0;
            r.mate[static_cast<size_t>(c)] = k, r.sign[static_cast<size_t>(c)] = p;
        }
    if (!permutation || std::find(r.mate.begin(), r.mate.end(), -1) != r.mate.end()) r.mate.clear(), r.sign.clear();
}

void run_rotary(const Rotary& r, int64_t x_lanes, int64_t live, const float* x, const float* partner, const float* cos,
                const float* sin, float* out) {
    const int64_t D = r.depth, S = r.lanes, block = D * S;
    // The elements computed: every one, or each row's live lanes (rows of S, the live ones first).
    const int64_t rows = live < S ? D : 1, width = live < S ? live : block;
    // Heads are independent: a training step's 12 heads of 64 x 256 go over the threads, a decode step's few
    // lanes stay on the caller's.
    const int64_t grain = std::max<int64_t>(1, kParallelElements / std::max<int64_t>(rows * width, 1));
    kernels::parallel_for(r.heads, grain, [&](int64_t h0, int64_t h1) {
        thread_local std::vector<float> scratch;  // grown, never shrunk
        if (scratch.size() < static_cast<size_t>(2 * block)) scratch.resize(static_cast<size_t>(2 * block));
        float *mate = scratch.data(), *turned = mate + block;
        auto round_rows = [&](float* v) {
            for (int64_t d = 0; d < rows; ++d) kernels::round_fp16(v + d * S, static_cast<size_t>(width));
        };
        for (int64_t h = h0; h < h1; ++h) {
            const float* xh = x + h * block;
            float* oh = out + h * block;
            partner_product(r, false, partner, xh, x_lanes, std::max(x_lanes, live), mate);
            for (int64_t d = 0; d < rows; ++d)
                for (int64_t i = d * S; i < d * S + width; ++i) oh[i] = xh[i] * cos[i], turned[i] = mate[i] * sin[i];
            round_rows(oh);
            round_rows(turned);
            for (int64_t d = 0; d < rows; ++d)
                for (int64_t i = d * S; i < d * S + width; ++i) oh[i] += turned[i];
            round_rows(oh);
        }
    });
}

void run_rotary_gradient(const Rotary& r, const float* dy, const float* partner, const float* cos, const float* sin,
                         float* out) {
    const int64_t S = r.lanes, block = r.depth * S;
    const int64_t grain = std::max<int64_t>(1, kParallelElements / std::max<int64_t>(block, 1));
    kernels::parallel_for(r.heads, grain, [&](int64_t h0, int64_t h1) {
        thread_local std::vector<float> scratch;  // grown, never shrunk
        if (scratch.size() < static_cast<size_t>(2 * block)) scratch.resize(static_cast<size_t>(2 * block));
        float *turned = scratch.data(), *mate = turned + block;
        for (int64_t h = h0; h < h1; ++h) {
            const float* dh = dy + h * block;
            float* oh = out + h * block;
            for (int64_t i = 0; i < block; ++i) oh[i] = dh[i] * cos[i], turned[i] = dh[i] * sin[i];
            kernels::round_fp16(oh, static_cast<size_t>(block));
            kernels::round_fp16(turned, static_cast<size_t>(block));
            partner_product(r, true, partner, turned, S, S, mate);
            for (int64_t i = 0; i < block; ++i) oh[i] += mate[i];
            kernels::round_fp16(oh, static_cast<size_t>(block));
        }
    });
}

}  // namespace orion::emu
