#include "train/blocks.h"

#include <algorithm>

#include "emulator/kernels.h"

namespace orion::train {

std::vector<Block> make_blocks(const std::vector<int64_t>& sizes) {
    std::vector<Block> blocks;
    for (size_t t = 0; t < sizes.size(); ++t)
        for (int64_t begin = 0; begin < sizes[t]; begin += kBlockElements)
            blocks.push_back({t, begin, std::min(sizes[t], begin + kBlockElements)});
    return blocks;
}

void for_each_block(const std::vector<Block>& blocks, const std::function<void(size_t, const Block&)>& fn) {
    emu::kernels::parallel_for(static_cast<int64_t>(blocks.size()), 1, [&](int64_t first, int64_t last) {
        for (int64_t i = first; i < last; ++i) fn(static_cast<size_t>(i), blocks[static_cast<size_t>(i)]);
    });
}

void for_each_block(const std::vector<int64_t>& sizes, const std::function<void(size_t, int64_t, int64_t)>& fn) {
    const std::vector<Block> blocks = make_blocks(sizes);
    for_each_block(blocks, [&](size_t, const Block& b) { fn(b.tensor, b.begin, b.end); });
}

}  // namespace orion::train
