// Data movement: reshape, transpose, cast, slicing and concat.
#include <algorithm>
#include <cmath>

#include "emulator/ops.h"

namespace orion::emu {

namespace {

BuiltOp build_reshape(OpContext& ctx) {
    const Shape& in = ctx.type("x").shape;
    const Shape& shape = ctx.out_type().shape;
    // Keeping the last axis, the output is a view of the input: same data, same lanes. Kernels read
    // shapes from their build-time types, and the lane layout (last dimension) is unchanged.
    if (!in.empty() && !shape.empty() && in.back() == shape.back())
        return {nullptr, ctx.slot("x", /*fp16_in_place=*/true)};
    if (ctx.plan_only()) return {};
    const int x = ctx.slot("x"), o = ctx.out_slot();
    const int64_t in_lanes = in.empty() ? 1 : in.back();
    return {[=](Frame& fr) {
                const Tensor& t = fr.values[x];
                Tensor& out = fr.values[o];
                out.lanes = out.last_dim();
                if (t.lanes >= in_lanes) {
                    out.data = t.data;
                    return;
                }
                // The lane axis changes: dead lanes (stale, maybe NaN) become ordinary elements, so they are zeros
                // (a check's LM head, 2 of 8 lanes live: a branch per element cost 3x these two passes).
                out.data.resize(t.data.size());
                const int64_t live = t.lanes, rows = t.size() / in_lanes;
                float* dst = out.data.data();
                for (int64_t r = 0; r < rows; ++r)
                    for (int64_t j = live; j < in_lanes; ++j) dst[r * in_lanes + j] = 0.0f;
                kernels::copy_lanes(t.data.data(), in_lanes, dst, in_lanes, rows, live);
            }};
}

BuiltOp build_transpose(OpContext& ctx) {
    if (ctx.plan_only()) return {};
    const Shape& in = ctx.type("x").shape;
    const Shape out = ctx.out_type().shape;
    const std::vector<int64_t>& perm = ctx.attrs<frontend::Permutation>().perm;
    const int64_t rank = static_cast<int64_t>(in.size());
    const auto in_strides = strides_of(in);
    std::vector<int64_t> src_strides(static_cast<size_t>(rank));  // input stride of each output dim
    for (int64_t i = 0; i < rank; ++i) src_strides[i] = in_strides[perm[i]];
    const int x = ctx.slot("x"), o = ctx.out_slot();
    const bool keeps_lanes = rank > 0 && perm.back() == rank - 1;
    const int64_t in_lanes = rank > 0 ? in.back() : 1;
    // Live prefixes (Tensor::live_prefix): the lane axis made the leading one leaves the entries past the
    // live lanes dead (a decode step's dead sequences as the attention's batch); the leading axis kept
    // leading keeps its live entries, and made the lane axis it gives the live lanes. Only live entries are copied.
    const bool lanes_to_lead = rank >= 2 && perm[0] == rank - 1;
    const bool lead_kept = rank >= 2 && perm[0] == 0, lead_to_lanes = rank >= 2 && perm.back() == 0;
    const int64_t out_inner = rank > 0 ? element_count(out) / std::max<int64_t>(out[0], 1) : 1;
    const int64_t lane_dim = std::find(perm.begin(), perm.end(), rank - 1) - perm.begin();  // the input lanes' axis
    return {[=](Frame& fr) {
                Tensor& tin = fr.values[x];
                Tensor& tout = fr.values[o];
                if (!lead_kept && !lead_to_lanes) settle_prefix(tin);
                const int64_t lead = rank > 0 ? live_leading(tin, in) : 1;  // the input's live leading entries
                const float* a = tin.data.data();
                tout.lanes = keeps_lanes ? tin.lanes : lead_to_lanes && lead < in[0] ? lead : tout.last_dim();
                // Moving the lane axis, dead lanes (stale, maybe NaN) become ordinary elements: they are zeros.
                const int64_t live = keeps_lanes ? in_lanes : tin.lanes;
                int64_t out_lead = rank > 0 ? out[0] : 1;
                if (lead_kept) out_lead = lead;
                else if (lanes_to_lead && live < in_lanes) out_lead = live;
                set_live_leading(tout, out, out_lead);
                float* c = tout.data.data();
                if (rank == 0) {
                    c[0] = a[0];
                    return;
                }
                // Row by row of the output's last axis; the input lane of an element is its index on lane_dim.
                const int64_t n = out_lead * out_inner, row = out[rank - 1], step = src_strides[rank - 1];
                const int64_t copied = lead_to_lanes ? std::min(lead, row) : row;  // past it: dead lanes, left stale
                std::vector<int64_t> idx(static_cast<size_t>(rank), 0);
                int64_t src = 0;
                for (int64_t first = 0; first < n; first += row) {
                    float* dst = c + first;
                    if (live == in_lanes) {
                        for (int64_t j = 0; j < copied; ++j) dst[j] = a[src + j * step];
                    } else if (lane_dim == rank - 1) {
                        for (int64_t j = 0; j < copied; ++j) dst[j] = j >= live ? 0.0f : a[src + j * step];
                    } else {
                        const bool dead = idx[static_cast<size_t>(lane_dim)] >= live;
                        for (int64_t j = 0; j < copied; ++j) dst[j] = dead ? 0.0f : a[src + j * step];
                    }
                    for (int64_t d = rank - 2; d >= 0; --d) {
                        src += src_strides[d];
                        if (++idx[d] < out[d]) break;
                        src -= src_strides[d] * out[d];
                        idx[d] = 0;
                    }
                }
            }};
}

BuiltOp build_cast(OpContext& ctx) {
    if (ctx.plan_only()) return {};
    const int x = ctx.slot("x"), o = ctx.out_slot();
    const mil::DType to = ctx.out_type().dtype;
    return {[=](Frame& fr) {
                Tensor& out = fr.values[o];
                out.data = fr.values[x].data;
                out.lanes = fr.values[x].lanes;
                if (!mil::is_float(to) && to != mil::DType::boolean) {
                    // Float to integer truncates toward zero and saturates at the type's range.
                    double lo = -2147483648.0, hi = 2147483647.0;
                    if (to == mil::DType::int8) lo = -128, hi = 127;
                    if (to == mil::DType::uint8) lo = 0, hi = 255;
                    if (to == mil::DType::int16) lo = -32768, hi = 32767;
                    if (to == mil::DType::uint16) lo = 0, hi = 65535;
                    for (float& v : out.data)
                        v = std::isnan(v) ? 0.0f : static_cast<float>(std::fmin(hi, std::fmax(lo, std::trunc(v))));
                }
                finish(out);
            }};
}

// Copies the box [begin, begin + size) with `stride` of x into out (all per dimension), a row of the
// last axis at a time (contiguous rows as one copy), the rows split across the threads. Trailing axes
// the box spans whole are merged into the one before them first, so that a box of whole rows (a
// channel range of [1, C, 1, 1], the first row of a padded input) is one row, one copy. With `live_rows`
// (a box of whole rows of the lane axis), rows are not merged and each copies x's live lanes only.
Kernel strided_copy(int x, int o, Shape in_shape, std::vector<int64_t> begin, std::vector<int64_t> stride, Shape box,
                    bool live_rows = false) {
    while (!live_rows && box.size() >= 2 && box.back() == in_shape.back() && begin.back() == 0 && stride.back() == 1 &&
           stride[stride.size() - 2] == 1) {
        const int64_t whole = in_shape.back();
        for (auto* v : {&in_shape, &box, &begin, &stride}) v->pop_back();
        in_shape.back() *= whole, box.back() *= whole, begin.back() *= whole;
    }
    return [=](Frame& fr) {
        const float* a = fr.values[x].data.data();
        float* c = fr.values[o].data.data();
        const size_t rank = box.size();
        const int64_t n = element_count(box);
        if (n == 0) return;
        if (rank == 0) return void(c[0] = a[0]);
        const auto in_strides = strides_of(in_shape);
        const int64_t width = box.back(), rows = n / width;
        const int64_t copied = live_rows ? std::min(width, fr.values[x].lanes) : width;
        const int64_t step = stride.back() * in_strides.back();  // between a row's elements in x
        kernels::parallel_for(rows, std::max<int64_t>(1, (int64_t{1} << 15) / copied), [&](int64_t first, int64_t end) {
            for (int64_t row = first; row < end; ++row) {
                int64_t src = (begin.back()) * in_strides.back();
                for (int64_t d = static_cast<int64_t>(rank) - 2, rest = row; d >= 0; --d) {
                    src += (begin[d] + rest % box[d] * stride[d]) * in_strides[d];
                    rest /= box[d];
                }
                float* dst = c + row * width;
                if (step == 1) {
                    std::copy(a + src, a + src + copied, dst);
                } else {
                    for (int64_t i = 0; i < copied; ++i) dst[i] = a[src + i * step];
                }
            }
        });
    };
}

BuiltOp build_slice_by_size(OpContext& ctx) {
    if (ctx.plan_only()) return {};
    const Shape& in = ctx.type("x").shape;
    const frontend::Slice& slice = ctx.attrs<frontend::Slice>();
    const std::vector<int64_t>& begin = slice.begin;
    const Shape& box = slice.extent;
    const size_t rank = in.size();
    const int x = ctx.slot("x"), o = ctx.out_slot();
    const Kernel copy = strided_copy(x, o, in, begin, slice.stride, box);
    const int64_t lane_begin = rank ? begin.back() : 0, lane_size = rank ? box.back() : 1;
    const bool slices_lanes = rank && box.back() != in.back();
    // Whole rows of a long lane axis (q, k and v cut from a prompt's qkv): only their live lanes are copied.
    const Kernel live_copy = rank >= 2 && !slices_lanes ? strided_copy(x, o, in, begin, slice.stride, box, true)
                                                         : Kernel{};
    return {[=](Frame& fr) {
                (live_copy && fr.values[x].skips_dead_lanes() ? live_copy : copy)(fr);
                // Slicing inside the live prefix keeps part of it live; everything else is fully live.
                const int64_t live = fr.values[x].lanes - (slices_lanes ? lane_begin : 0);
                fr.values[o].lanes = live > 0 && live < lane_size ? live : lane_size;
            }};
}

BuiltOp build_slice_by_index(OpContext& ctx) {
    if (ctx.plan_only()) return {};
    const frontend::Slice& slice = ctx.attrs<frontend::Slice>();
    return {strided_copy(ctx.slot("x"), ctx.out_slot(), ctx.type("x").shape, slice.begin, slice.stride, slice.extent)};
}

BuiltOp build_concat(OpContext& ctx) {
    if (ctx.plan_only()) return {};
    const frontend::Concat& concat = ctx.attrs<frontend::Concat>();
    const int64_t axis = concat.axis;
    const bool interleave = concat.interleave;
    const std::vector<int64_t> widths = concat.widths;
    const Shape out = ctx.out_type().shape;
    const size_t rank = out.size();
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= out[d];
    for (size_t d = static_cast<size_t>(axis) + 1; d < rank; ++d) inner *= out[d];
    const auto slots = ctx.tuple_slots("values");
    const int o = ctx.out_slot();
    return {[=](Frame& fr) {
                float* c = fr.values[o].data.data();
                const int64_t total = out[axis];
                for (int64_t r = 0; r < outer; ++r) {
                    int64_t offset = 0;
                    for (size_t v = 0; v < slots.size(); ++v) {
                        const float* a = fr.values[slots[v]].data.data() + r * widths[v] * inner;
                        for (int64_t j = 0; j < widths[v]; ++j) {
                            // interleave: element j of value v goes to position j * count + v
                            const int64_t pos = interleave ? j * static_cast<int64_t>(slots.size()) + static_cast<int64_t>(v) : offset + j;
                            std::copy(a + j * inner, a + (j + 1) * inner, c + (r * total + pos) * inner);
                        }
                        offset += widths[v];
                    }
                }
            }};
}

}  // namespace

std::vector<OpEntry> tensor_ops() {
    return {
        {"reshape", build_reshape},         {"transpose", build_transpose},
        {"cast", build_cast},               {"slice_by_size", build_slice_by_size},
        {"slice_by_index", build_slice_by_index}, {"concat", build_concat},
    };
}

}  // namespace orion::emu
