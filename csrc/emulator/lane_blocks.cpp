// Lane-blocked conv chains (see lane_blocks.h).
#include "emulator/lane_blocks.h"

#include <algorithm>
#include <utility>

#include "emulator/buffer_pool.h"

namespace orion::emu {

namespace {

constexpr int64_t kCopyGrain = int64_t{1} << 15;  // elements worth a thread's share of a block's slice copies

}  // namespace

bool run_lane_blocked_chain(const LaneBlockedChain& chain, Frame& frame) {
    const Tensor& in = frame.values[static_cast<size_t>(chain.x)];
    const int64_t live = std::min(in.lanes, chain.lanes);  // the convs compute x's live lanes
    if (in.half || in.prefix_partial() || live <= 0) return false;
    const int64_t blocks = std::max<int64_t>(1, (live + kLaneBlock - 1) / kLaneBlock);
    const int64_t widest = (live + blocks - 1) / blocks;
    const bool has_run = !chain.run.steps.empty(), own_act = has_run && chain.act != chain.hidden;
    std::vector<float>& hidden = frame.values[static_cast<size_t>(chain.hidden)].data;
    hidden = buffer_pool::take(static_cast<size_t>(chain.hidden_rows * widest));
    if (own_act) frame.values[static_cast<size_t>(chain.act)].data = buffer_pool::take(static_cast<size_t>(chain.act_rows * widest));
    const float* result = own_act ? frame.values[static_cast<size_t>(chain.act)].data.data() : hidden.data();
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t s0 = b * live / blocks, n = (b + 1) * live / blocks - s0;
        chain.up(in.data.data() + s0, chain.lanes, hidden.data(), n, n);
        if (has_run) {
            ElementwiseRun run = chain.run;  // over the block: rows of n lanes, the hidden's slices n lanes a channel
            run.width = n;
            for (ElementwiseRun::Step& step : run.steps)
                for (ElementwiseRun::Operand* o : {&step.x, &step.y})
                    if (o->step < 0 && o->slot == chain.hidden) o->offset *= n;
            run_elementwise(run, frame);
        }
        if (chain.down) chain.down(result, n, frame.values[static_cast<size_t>(chain.out)].data.data() + s0, chain.lanes, n);
        for (const LaneBlockedChain::Output& o : chain.outputs) {  // the slices' rows, split across the threads
            const float* from = result + o.channel * n;
            float* to = frame.values[static_cast<size_t>(o.slot)].data.data() + s0;
            kernels::parallel_for(o.channels, std::max<int64_t>(1, kCopyGrain / n), [&](int64_t begin, int64_t end) {
                kernels::copy_lanes(from + begin * n, n, to + begin * chain.lanes, chain.lanes, end - begin, n);
            });
        }
    }
    buffer_pool::give(std::exchange(hidden, {}));
    if (own_act) buffer_pool::give(std::exchange(frame.values[static_cast<size_t>(chain.act)].data, {}));
    auto computed = [&](int slot) {  // live on x's live lanes, as the ops leave it
        Tensor& t = frame.values[static_cast<size_t>(slot)];
        t.lanes = live, t.live_prefix = -1;
    };
    if (chain.down) computed(chain.out);
    for (const LaneBlockedChain::Output& o : chain.outputs) computed(o.slot);
    return true;
}

}  // namespace orion::emu
