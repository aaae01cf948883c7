// Values inside the software ANE. Every tensor is held as fp32 storage whose values are exactly
// representable in its MIL dtype: fp16 tensors are rounded to fp16 after every op, integer and
// bool tensors hold whole numbers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "mil/program.h"

namespace orion::emu {

using Shape = std::vector<int64_t>;

struct Tensor {
    mil::DType dtype = mil::DType::fp16;
    Shape shape;
    std::vector<float> data;
    // Leading entries of the last axis that hold live data (see runtime::LiveLanes); the rest of
    // each row is stale. Equal to the last dimension unless a live-lanes hint reached this value.
    int64_t lanes = 1;
    // Live-prefix elements (see live_leading): < 0 when every element is live. A transpose that makes
    // the lane axis the leading one (a decode step's sequences becoming the attention's batch) leaves
    // the entries past the live lanes dead: the ops that understand it (prefix_aware_op) skip them,
    // any other op first sees them zeroed (settle_prefix).
    int64_t live_prefix = -1;
    // Set during an evaluate when this is an fp16 input read in place from its surface (only ops
    // that declared they can, such as matmul's y, see it); `data` is then not filled.
    const uint16_t* half = nullptr;

    int64_t size() const { return static_cast<int64_t>(data.size()); }
    int64_t last_dim() const { return shape.empty() ? 1 : shape.back(); }
    bool partial() const { return lanes < last_dim(); }
    // Whether a lane-separable kernel (elementwise, loads and stores) walks only each row's live prefix:
    // a partial tensor whose rows are longer than kShortRow lanes. Shorter rows (a decode step's lanes,
    // one per sequence) are computed whole: a kernel call per short row costs more than the dead lanes
    // it skips, and a dead lane's value is undefined either way (the fused elementwise runs gather the live
    // lanes of short rows instead, and the fused norm those of any rows: kernels::gather_lanes). Reductions and matmuls over the lane
    // axis still see only the live prefix (partial()).
    static constexpr int64_t kShortRow = 32;
    bool skips_dead_lanes() const { return partial() && last_dim() > kShortRow; }
    bool prefix_partial() const { return live_prefix >= 0; }
    // Every element live and in `data` (fp32): what a fused kernel over all lanes reads.
    bool whole_fp32() const { return !partial() && !prefix_partial() && !half; }
};

// Zeroes the dead elements past t's live prefix and makes it whole (for an op that reads every element).
inline void settle_prefix(Tensor& t) {
    if (!t.prefix_partial()) return;
    if (static_cast<size_t>(t.live_prefix) < t.data.size())
        std::fill(t.data.begin() + t.live_prefix, t.data.end(), 0.0f);
    t.live_prefix = -1;
}

// The live entries of axis 0 of `shape` (an op's compile-time view of t's data, same element order):
// every one unless t's live prefix is partial. A prefix that is not whole entries of that axis is
// settled (zeroed past it) and the tensor counts as whole.
inline int64_t live_leading(Tensor& t, const Shape& shape) {
    if (!t.prefix_partial() || shape.empty()) return shape.empty() ? 1 : shape[0];
    int64_t inner = 1;
    for (size_t d = 1; d < shape.size(); ++d) inner *= shape[d];
    if (inner > 0 && t.live_prefix % inner == 0 && t.live_prefix / inner <= shape[0]) return t.live_prefix / inner;
    settle_prefix(t);
    return shape[0];
}

// Marks `lead` of out's `shape[0]` leading entries live (all of them: whole).
inline void set_live_leading(Tensor& out, const Shape& shape, int64_t lead) {
    if (shape.empty() || lead >= shape[0]) {
        out.live_prefix = -1;
        return;
    }
    int64_t inner = 1;
    for (size_t d = 1; d < shape.size(); ++d) inner *= shape[d];
    out.live_prefix = lead * inner;
}

// Calls fn(offset, count) for the live prefix of every row of t's last axis (one call when all
// lanes are live, or the rows are short: skips_dead_lanes).
// Only the live prefix's rows (Tensor::live_prefix) are visited.
template <typename Fn>
void for_each_live_row(const Tensor& t, Fn&& fn) {
    const int64_t end = t.prefix_partial() ? std::min(t.live_prefix, t.size()) : t.size();
    if (!t.skips_dead_lanes()) return fn(int64_t{0}, end);
    const int64_t width = t.last_dim();
    for (int64_t offset = 0; offset < end; offset += width) fn(offset, t.lanes);
}

inline int64_t element_count(const Shape& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

// Row-major strides of a shape, in elements.
inline std::vector<int64_t> strides_of(const Shape& shape) {
    std::vector<int64_t> s(shape.size(), 1);
    for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * shape[i + 1];
    return s;
}

using mil::shape_str;  // "[1, 768, 1, 32]"

}  // namespace orion::emu
