// The CPU head's mean cross-entropy over a window's logits, forward and backward in one parallel pass.
#pragma once

#include <cstdint>

namespace orion::train {

// logits [rows, vocab] (fp32, row-major) against targets[rows] (a negative target: an ignored position),
// overwritten with dloss/dlogits of the mean over the kept rows: softmax / kept, minus 1 / kept at each
// target, 0 on ignored rows. Returns that mean loss (each row's log-sum-exp minus its target's logit, in
// double, summed in row order: the same value with any thread count). Throws TrainError for a target
// >= vocab or no kept row; nothing is written then.
double cross_entropy(float* logits, int64_t rows, int64_t vocab, const int64_t* targets);

}  // namespace orion::train
