// The I/O packing's placement of several outputs in one surface (python/orion/passes/io_packing.py):
// sum_i mul(block_i, e_i), with block_i an output's values as [1, 1, r, W] and e_i the one-hot const
// [1, rows, 1, 1] of its row, added in order. Computed literally that costs rows multiply-adds per
// element of every block; this kernel writes each row once, with the ops' result bit for bit when
// every block is finite: x*1 = x and x*0 = +-0 exactly in fp16, so a row holds its block's value,
// except that a zero there (and every element of a row no block is placed in) is -0 only when all
// the blocks' values at that element have the sign bit (IEEE: -0 + -0 = -0, -0 + +0 = +0).
#pragma once

#include <cstdint>
#include <vector>

namespace orion::emu {

struct PackedOutputs {
    int64_t block = 0;              // elements of each block (r * W)
    int64_t rows = 0;               // rows of the packed result
    std::vector<int64_t> hot;       // block i's row
};

// Lanes of the blocks' rows that are dead (a prompt shorter than its bucket): with `lanes` < `width`, the
// elements of each row of `width` past its first `lanes` are not read. `zeroed`: they count as +0 in every
// block (the blocks reach the placement through a reshape that moves the lane axis, which zeroes them), so
// they are +0 in every row of the output; else they are left as they are, as the ops leave dead lanes.
struct DeadLanes {
    int64_t width = 0;
    int64_t lanes = 0;
    bool zeroed = false;
};

// out[h * block + e] for every row h from blocks[i] (fp16 values in fp32) placed in rows p.hot[i], but for
// `dead` lanes. Returns false when some block holds Inf or NaN (x*0 is then NaN): the caller runs the ops
// themselves, which overwrite every element of `out` that they compute.
bool run_packed_outputs(const PackedOutputs& p, const std::vector<const float*>& blocks, float* out,
                        const DeadLanes& dead = {});

}  // namespace orion::emu
