// Type rules of data movement: reshape, transpose, cast, slicing and concat.
#include <algorithm>

#include "frontend/types.h"
#include "hardware_limits.h"

namespace orion::frontend {

namespace {

using mil::shape_str;

TypedOp reshape(const TypeContext& ctx) {
    const mil::Type& tx = ctx.type("x");
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
    return {mil::Type::tensor(tx.dtype, shape), {}};
}

TypedOp transpose(const TypeContext& ctx) {
    const mil::Type& tx = ctx.type("x");
    std::vector<int64_t> perm = ctx.ints("perm");
    const int64_t rank = static_cast<int64_t>(tx.shape.size());
    if (static_cast<int64_t>(perm.size()) != rank)
        ctx.fail("perm has " + std::to_string(perm.size()) + " entries for a rank-" + std::to_string(rank) + " tensor");
    std::vector<bool> seen(static_cast<size_t>(rank), false);
    for (auto& p : perm) {
        p = normalize_axis(ctx, p, rank);
        if (seen[static_cast<size_t>(p)]) ctx.fail("perm " + shape_str(ctx.ints("perm")) + " is not a permutation");
        seen[static_cast<size_t>(p)] = true;
    }
    Shape out(static_cast<size_t>(rank));
    for (int64_t i = 0; i < rank; ++i) out[i] = tx.shape[perm[i]];
    return {mil::Type::tensor(tx.dtype, out), Permutation{perm}};
}

TypedOp cast(const TypeContext& ctx) {
    const mil::Type& tx = ctx.type("x");
    const std::string name = ctx.text("dtype");
    const auto dtype = mil::dtype_from_name(name);
    if (!dtype || *dtype == mil::DType::string || *dtype == mil::DType::uint64)
        ctx.fail("cannot cast to '" + name + "' (use fp16, fp32, int32, int16, int8, uint16, uint8 or bool)");
    mil::Type type = tx;
    type.dtype = *dtype;
    return {type, {}};
}

TypedOp slice_by_size(const TypeContext& ctx) {
    const mil::Type& tx = ctx.type("x");
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
    return {mil::Type::tensor(tx.dtype, box), Slice{begin, std::vector<int64_t>(rank, 1), box}};
}

std::vector<bool> bool_mask(const TypeContext& ctx, const char* arg, size_t rank) {
    if (!ctx.has(arg)) return std::vector<bool>(rank, false);
    const Operand v = ctx.constant(arg);
    if (v.type->dtype != mil::DType::boolean || v.constant->numbers.size() != rank)
        ctx.fail(std::string(arg) + " must be a bool tensor with one entry per dimension");
    std::vector<bool> m;
    for (double d : v.constant->numbers) m.push_back(d != 0.0);
    return m;
}

TypedOp slice_by_index(const TypeContext& ctx) {
    const mil::Type& tx = ctx.type("x");
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
    return {mil::Type::tensor(tx.dtype, out), Slice{begin, stride, box}};
}

TypedOp concat(const TypeContext& ctx) {
    const auto types = ctx.tuple_types("values");
    if (types.empty()) ctx.fail("values must hold at least one tensor");
    const size_t rank = types[0].shape.size();
    Concat c;
    c.axis = normalize_axis(ctx, ctx.int_scalar("axis"), static_cast<int64_t>(rank));
    c.interleave = ctx.has("interleave") && ctx.boolean("interleave");
    Shape out = types[0].shape;
    out[c.axis] = 0;
    for (const auto& t : types) {
        if (t.dtype != types[0].dtype || t.shape.size() != rank) ctx.fail("values differ in dtype or rank");
        for (size_t d = 0; d < rank; ++d)
            if (static_cast<int64_t>(d) != c.axis && t.shape[d] != types[0].shape[d])
                ctx.fail("values differ in dimension " + std::to_string(d) + " (" + shape_str(t.shape) + " vs " +
                         shape_str(types[0].shape) + ")");
        if (c.interleave && t.shape[c.axis] != types[0].shape[c.axis]) ctx.fail("interleave needs equal sizes along axis");
        c.widths.push_back(t.shape[c.axis]);
        out[c.axis] += t.shape[c.axis];
    }
    return {mil::Type::tensor(types[0].dtype, out), c};
}

}  // namespace

std::vector<TypeRuleEntry> tensor_types() {
    return {
        {"reshape", reshape},         {"transpose", transpose},           {"cast", cast},
        {"slice_by_size", slice_by_size}, {"slice_by_index", slice_by_index}, {"concat", concat},
    };
}

}  // namespace orion::frontend
