// AdamW on fp32 master weights, in place, over the emulator's thread pool (ORION_NUM_THREADS), optionally
// writing each updated weight's fp16 copy (the programs' input) in the same pass.
// Same update as torch.optim.AdamW: decoupled weight decay p -= lr*wd*p (only on tensors the caller
// marks), then m = b1*m + (1-b1)*g, v = b2*v + (1-b2)*g^2, p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps).
#pragma once

#include <cstdint>
#include <vector>

namespace orion::train {

struct AdamWHyper {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    double weight_decay = 0.0;
    int64_t step = 1;         // the update's 1-based index t, for the bias corrections
    double grad_scale = 1.0;  // every gradient is read as grad * grad_scale (loss-scale undo, clipping, 1/accum)
};

// One tensor's arrays (all `size` floats, distinct memory) and whether weight decay applies to it.
struct AdamWTensor {
    float* param;
    const float* grad;
    float* exp_avg;
    float* exp_avg_sq;
    int64_t size;
    bool decay;
    // When set: the updated parameter, its finite values clamped to +-FP16_MAX (NaN and Inf as they are),
    // rounded to fp16 (ties to even) into these `size` values, while the block is in cache.
    uint16_t* half = nullptr;
};

// Throws TrainError naming the field when a hyperparameter is out of range.
void check_hyper(const AdamWHyper& h);

// Updates every tensor in place (one parallel pass over all of them); returns how many values of the
// fp16 copies were clamped.
int64_t adamw_step(const std::vector<AdamWTensor>& tensors, const AdamWHyper& h);

}  // namespace orion::train
