// Lane-blocked MLPs (see lane_blocks.h).
#include "emulator/lane_blocks.h"

#include <algorithm>
#include <utility>

#include "emulator/buffer_pool.h"

namespace orion::emu {

bool run_lane_blocked_mlp(const LaneBlockedMlp& mlp, Frame& frame) {
    const Tensor& in = frame.values[static_cast<size_t>(mlp.x)];
    if (in.half || in.prefix_partial()) return false;
    const int64_t live = std::min(in.lanes, mlp.lanes);  // the convs compute x's live lanes
    const int64_t blocks = std::max<int64_t>(1, (live + kMlpLaneBlock - 1) / kMlpLaneBlock);
    const int64_t widest = (live + blocks - 1) / blocks;
    Tensor& hidden = frame.values[static_cast<size_t>(mlp.hidden)];
    Tensor& act = frame.values[static_cast<size_t>(mlp.act)];
    Tensor& out = frame.values[static_cast<size_t>(mlp.out)];
    hidden.data = buffer_pool::take(static_cast<size_t>(mlp.hidden_rows * widest));
    act.data = buffer_pool::take(static_cast<size_t>(mlp.act_rows * widest));
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t s0 = b * live / blocks, n = (b + 1) * live / blocks - s0;
        mlp.up(in.data.data() + s0, mlp.lanes, hidden.data.data(), n, n);
        ElementwiseRun run = mlp.run;  // over the block: rows of n lanes, the hidden's slices n lanes per channel
        run.width = n;
        for (ElementwiseRun::Step& step : run.steps)
            for (ElementwiseRun::Operand* o : {&step.x, &step.y})
                if (o->step < 0 && o->slot == mlp.hidden) o->offset *= n;
        run_elementwise(run, frame);
        mlp.down(act.data.data(), n, out.data.data() + s0, mlp.lanes, n);
    }
    buffer_pool::give(std::exchange(hidden.data, {}));
    buffer_pool::give(std::exchange(act.data, {}));
    out.lanes = live, out.live_prefix = -1;
    return true;
}

}  // namespace orion::emu
