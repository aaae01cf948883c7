// Work over a list of tensors, cut into fixed-size blocks and spread over the emulator's thread pool.
// Blocks do not depend on the thread count, so per-block reductions combined in block order give the
// same result with any ORION_NUM_THREADS.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace orion::train {

inline constexpr int64_t kBlockElements = int64_t{1} << 16;

struct Block {
    size_t tensor;
    int64_t begin, end;
};

// Every tensor's [0, size) in order, cut into blocks of kBlockElements (the last one shorter).
std::vector<Block> make_blocks(const std::vector<int64_t>& sizes);

// Runs fn(tensor, begin, end) for every block, in parallel.
void for_each_block(const std::vector<int64_t>& sizes, const std::function<void(size_t, int64_t, int64_t)>& fn);

// Runs fn(block_index, block) for every block of `blocks`, in parallel.
void for_each_block(const std::vector<Block>& blocks, const std::function<void(size_t, const Block&)>& fn);

}  // namespace orion::train
