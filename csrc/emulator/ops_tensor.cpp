// Data movement: reshape, transpose, cast, slicing and concat.
#include <algorithm>
#include <cmath>

#include "emulator/ops.h"
#include "hardware_limits.h"

namespace orion::emu {

namespace {

BuiltOp build_reshape(OpContext& ctx) {
    const mil::Type tx = ctx.type("x");
    Shape shape = ctx.ints("shape");
    int64_t known = 1, infer = -1;
    for (size_t i = 0; i < shape.size(); ++i) {
        if (shape[i] == -1) {
            if (infer >= 0) ctx.fail("shape has more than one -1");
            infer = static_cast<int64_t>(i);
        } else if (shape[i] <= 0) {
            ctx.fail("shape " + shape_str(shape) + " has a non-positive dimension");
        } else {
            if (known > limits::MAX_ELEMENTS / shape[i])
                ctx.fail("shape " + shape_str(shape) + " has more than MAX_ELEMENTS (" +
                         std::to_string(limits::MAX_ELEMENTS) + ") elements");
            known *= shape[i];
        }
    }
    const int64_t n = tx.element_count();
    if (infer >= 0) {
        if (n % known) ctx.fail("cannot infer -1 in " + shape_str(shape) + " for " + std::to_string(n) + " elements");
        shape[infer] = n / known;
    } else if (known != n) {
        ctx.fail("cannot reshape " + shape_str(tx.shape) + " (" + std::to_string(n) + " elements) to " + shape_str(shape));
    }
    // Keeping the last axis, the output is a view of the input: same data, same lanes. Kernels read
    // shapes from their build-time types, and the lane layout (last dimension) is unchanged.
    if (!tx.shape.empty() && !shape.empty() && tx.shape.back() == shape.back())
        return {tensor_type(tx.dtype, shape), nullptr, ctx.slot("x", /*fp16_in_place=*/true)};
    if (ctx.types_only()) return {tensor_type(tx.dtype, shape)};
    const int x = ctx.slot("x"), o = ctx.out_slot();
    return {tensor_type(tx.dtype, shape), [=](Frame& fr) {
                fr.values[o].data = fr.values[x].data;
                fr.values[o].lanes = fr.values[o].last_dim();
            }};
}

BuiltOp build_transpose(OpContext& ctx) {
    const mil::Type tx = ctx.type("x");
    std::vector<int64_t> perm = ctx.ints("perm");
    const int64_t rank = static_cast<int64_t>(tx.shape.size());
    if (static_cast<int64_t>(perm.size()) != rank) ctx.fail("perm has " + std::to_string(perm.size()) + " entries for a rank-" + std::to_string(rank) + " tensor");
    std::vector<bool> seen(static_cast<size_t>(rank), false);
    for (auto& p : perm) {
        p = normalize_axis(ctx, p, rank);
        if (seen[static_cast<size_t>(p)]) ctx.fail("perm " + shape_str(ctx.ints("perm")) + " is not a permutation");
        seen[static_cast<size_t>(p)] = true;
    }
    Shape out(static_cast<size_t>(rank));
    for (int64_t i = 0; i < rank; ++i) out[i] = tx.shape[perm[i]];
    if (ctx.types_only()) return {tensor_type(tx.dtype, out)};
    const auto in_strides = strides_of(tx.shape);
    std::vector<int64_t> src_strides(static_cast<size_t>(rank));  // input stride of each output dim
    for (int64_t i = 0; i < rank; ++i) src_strides[i] = in_strides[perm[i]];
    const int x = ctx.slot("x"), o = ctx.out_slot();
    const bool keeps_lanes = rank > 0 && perm.back() == rank - 1;
    return {tensor_type(tx.dtype, out), [=](Frame& fr) {
                const float* a = fr.values[x].data.data();
                fr.values[o].lanes = keeps_lanes ? fr.values[x].lanes : fr.values[o].last_dim();
                float* c = fr.values[o].data.data();
                const int64_t n = element_count(out);
                std::vector<int64_t> idx(static_cast<size_t>(rank), 0);
                int64_t src = 0;
                for (int64_t i = 0; i < n; ++i) {
                    c[i] = a[src];
                    for (int64_t d = rank - 1; d >= 0; --d) {
                        src += src_strides[d];
                        if (++idx[d] < out[d]) break;
                        src -= src_strides[d] * out[d];
                        idx[d] = 0;
                    }
                }
            }};
}

BuiltOp build_cast(OpContext& ctx) {
    const mil::Type tx = ctx.type("x");
    const std::string name = ctx.text("dtype");
    const auto dtype = mil::dtype_from_name(name);
    if (!dtype || *dtype == mil::DType::string || *dtype == mil::DType::uint64)
        ctx.fail("cannot cast to '" + name + "' (use fp16, fp32, int32, int16, int8, uint16, uint8 or bool)");
    mil::Type type = tx;
    type.dtype = *dtype;
    if (ctx.types_only()) return {type};
    const int x = ctx.slot("x"), o = ctx.out_slot();
    const mil::DType to = *dtype;
    return {type, [=](Frame& fr) {
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

// Copies the box [begin, begin + size) with `stride` of x into out (all per dimension).
Kernel strided_copy(int x, int o, Shape in_shape, std::vector<int64_t> begin, std::vector<int64_t> stride, Shape box) {
    return [=](Frame& fr) {
        const float* a = fr.values[x].data.data();
        float* c = fr.values[o].data.data();
        const auto in_strides = strides_of(in_shape);
        const size_t rank = box.size();
        const int64_t n = element_count(box);
        std::vector<int64_t> idx(rank, 0);
        for (int64_t i = 0; i < n; ++i) {
            int64_t src = 0;
            for (size_t d = 0; d < rank; ++d) src += (begin[d] + idx[d] * stride[d]) * in_strides[d];
            c[i] = a[src];
            for (int64_t d = static_cast<int64_t>(rank) - 1; d >= 0; --d) {
                if (++idx[d] < box[d]) break;
                idx[d] = 0;
            }
        }
    };
}

BuiltOp build_slice_by_size(OpContext& ctx) {
    const mil::Type tx = ctx.type("x");
    auto begin = ctx.ints("begin");
    auto size = ctx.ints("size");
    const size_t rank = tx.shape.size();
    if (begin.size() != rank || size.size() != rank)
        ctx.fail("begin and size need " + std::to_string(rank) + " entries each for x of shape " + shape_str(tx.shape));
    Shape box(rank);
    for (size_t d = 0; d < rank; ++d) {
        if (begin[d] < 0) begin[d] += tx.shape[d];
        box[d] = size[d] == -1 ? tx.shape[d] - begin[d] : size[d];
        if (begin[d] < 0 || box[d] < 0 || begin[d] + box[d] > tx.shape[d])
            ctx.fail("slice begin " + shape_str(ctx.ints("begin")) + " size " + shape_str(ctx.ints("size")) +
                     " is outside x of shape " + shape_str(tx.shape));
    }
    if (ctx.types_only()) return {tensor_type(tx.dtype, box)};
    const int x = ctx.slot("x"), o = ctx.out_slot();
    const Kernel copy = strided_copy(x, o, tx.shape, begin, std::vector<int64_t>(rank, 1), box);
    const int64_t lane_begin = rank ? begin.back() : 0, lane_size = rank ? box.back() : 1;
    const bool slices_lanes = rank && box.back() != tx.shape.back();
    return {tensor_type(tx.dtype, box), [=](Frame& fr) {
                copy(fr);
                // Slicing inside the live prefix keeps part of it live; everything else is fully live.
                const int64_t live = fr.values[x].lanes - (slices_lanes ? lane_begin : 0);
                fr.values[o].lanes = live > 0 && live < lane_size ? live : lane_size;
            }};
}

std::vector<bool> bool_mask(OpContext& ctx, const char* arg, size_t rank) {
    if (!ctx.has(arg)) return std::vector<bool>(rank, false);
    const auto& v = ctx.constant(arg);
    if (v.type.dtype != mil::DType::boolean || v.constant->numbers.size() != rank)
        ctx.fail(std::string(arg) + " must be a bool tensor with one entry per dimension");
    std::vector<bool> m;
    for (double d : v.constant->numbers) m.push_back(d != 0.0);
    return m;
}

BuiltOp build_slice_by_index(OpContext& ctx) {
    const mil::Type tx = ctx.type("x");
    const size_t rank = tx.shape.size();
    auto begin = ctx.ints("begin"), end = ctx.ints("end");
    auto stride = ctx.has("stride") ? ctx.ints("stride") : std::vector<int64_t>(rank, 1);
    if (begin.size() != rank || end.size() != rank || stride.size() != rank)
        ctx.fail("begin, end and stride need " + std::to_string(rank) + " entries each");
    const auto begin_mask = bool_mask(ctx, "begin_mask", rank), end_mask = bool_mask(ctx, "end_mask", rank);
    const auto squeeze = bool_mask(ctx, "squeeze_mask", rank);
    Shape box(rank), out;
    for (size_t d = 0; d < rank; ++d) {
        const int64_t n = tx.shape[d], s = stride[d];
        if (s == 0) ctx.fail("stride must not be 0");
        auto clampi = [&](int64_t v, bool masked, bool is_begin) {
            if (masked) return is_begin ? (s > 0 ? int64_t{0} : n - 1) : (s > 0 ? n : int64_t{-1});
            if (v < 0) v += n;
            return s > 0 ? std::min(std::max(v, int64_t{0}), n) : std::min(std::max(v, int64_t{-1}), n - 1);
        };
        const int64_t b = clampi(begin[d], begin_mask[d], true), e = clampi(end[d], end_mask[d], false);
        begin[d] = b;
        box[d] = s > 0 ? std::max<int64_t>(0, (e - b + s - 1) / s) : std::max<int64_t>(0, (b - e - s - 1) / -s);
        if (squeeze[d]) {
            if (box[d] != 1) ctx.fail("squeeze_mask on dimension " + std::to_string(d) + " whose slice is not 1 wide");
        } else {
            out.push_back(box[d]);
        }
    }
    if (ctx.types_only()) return {tensor_type(tx.dtype, out)};
    return {tensor_type(tx.dtype, out), strided_copy(ctx.slot("x"), ctx.out_slot(), tx.shape, begin, stride, box)};
}

BuiltOp build_concat(OpContext& ctx) {
    const auto types = ctx.tuple_types("values");
    if (types.empty()) ctx.fail("values must hold at least one tensor");
    const size_t rank = types[0].shape.size();
    const int64_t axis = normalize_axis(ctx, ctx.int_scalar("axis"), static_cast<int64_t>(rank));
    const bool interleave = ctx.has("interleave") && ctx.boolean("interleave");
    Shape out = types[0].shape;
    out[axis] = 0;
    std::vector<int64_t> widths;
    for (const auto& t : types) {
        if (t.dtype != types[0].dtype || t.shape.size() != rank) ctx.fail("values differ in dtype or rank");
        for (size_t d = 0; d < rank; ++d)
            if (static_cast<int64_t>(d) != axis && t.shape[d] != types[0].shape[d])
                ctx.fail("values differ in dimension " + std::to_string(d) + " (" + shape_str(t.shape) + " vs " +
                         shape_str(types[0].shape) + ")");
        if (interleave && t.shape[axis] != types[0].shape[axis]) ctx.fail("interleave needs equal sizes along axis");
        widths.push_back(t.shape[axis]);
        out[axis] += t.shape[axis];
    }
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= out[d];
    for (size_t d = static_cast<size_t>(axis) + 1; d < rank; ++d) inner *= out[d];
    if (ctx.types_only()) return {tensor_type(types[0].dtype, out)};
    const auto slots = ctx.tuple_slots("values");
    const int o = ctx.out_slot();
    return {tensor_type(types[0].dtype, out), [=](Frame& fr) {
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
