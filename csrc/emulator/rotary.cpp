// The fused rotary embedding kernel (see rotary.h for why it is the ops bit for bit).
#include "emulator/rotary.h"

#include <vector>

#include "emulator/kernels.h"

namespace orion::emu {

void run_rotary(const Rotary& r, const float* x, const float* partner, const float* cos, const float* sin, float* out) {
    const int64_t D = r.depth, S = r.lanes, block = D * S;
    thread_local std::vector<float> scratch;  // grown, never shrunk
    if (scratch.size() < static_cast<size_t>(2 * block)) scratch.resize(static_cast<size_t>(2 * block));
    float *mate = scratch.data(), *turned = mate + block;
    for (int64_t h = 0; h < r.heads; ++h) {
        const float* xh = x + h * block;
        float* oh = out + h * block;
        kernels::gemm(D, S, D, partner, D, 1, xh, S, 1, mate, S, true);  // the matmul op's call for this batch
        for (int64_t i = 0; i < block; ++i) oh[i] = xh[i] * cos[i];
        for (int64_t i = 0; i < block; ++i) turned[i] = mate[i] * sin[i];
        kernels::round_fp16(oh, static_cast<size_t>(block));
        kernels::round_fp16(turned, static_cast<size_t>(block));
        for (int64_t i = 0; i < block; ++i) oh[i] += turned[i];
        kernels::round_fp16(oh, static_cast<size_t>(block));
    }
}

}  // namespace orion::emu
