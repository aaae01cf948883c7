#include "train/cross_entropy.h"

#include <algorithm>
#include <string>
#include <vector>

#include "emulator/kernels.h"
#include "train/train_error.h"

namespace orion::train {

double cross_entropy(float* logits, int64_t rows, int64_t vocab, const int64_t* targets) {
    int64_t kept = 0;
    for (int64_t r = 0; r < rows; ++r) {
        if (targets[r] >= vocab)
            throw TrainError("cross_entropy: target " + std::to_string(targets[r]) + " at position " +
                             std::to_string(r) + " is outside the vocabulary of " + std::to_string(vocab) +
                             "; pass token ids below it (or a negative target to ignore the position)");
        kept += targets[r] >= 0;
    }
    if (kept == 0)
        throw TrainError("cross_entropy: every target is ignored (negative); give the window at least one "
                         "trained target");
    // softmax / kept as numpy's d *= 1 / (sum * kept) rounds it, minus 1 / kept (fp32) at the target
    const float count = static_cast<float>(kept), scale = 1.0f / count;
    std::vector<double> losses(static_cast<size_t>(rows), 0.0);
    // A row (Stories110M: 32,000 values, 125 KiB) stays in L2 through its three passes.
    emu::kernels::parallel_for(rows, 1, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            float* row = logits + r * vocab;
            const int64_t t = targets[r];
            if (t < 0) {
                std::fill(row, row + vocab, 0.0f);
                continue;
            }
            const double target_logit = row[t];
            losses[static_cast<size_t>(r)] = emu::kernels::scaled_softmax(row, row, vocab, count) - target_logit;
            row[t] -= scale;
        }
    });
    double total = 0.0;
    for (const double loss : losses) total += loss;
    return total / static_cast<double>(kept);
}

}  // namespace orion::train
