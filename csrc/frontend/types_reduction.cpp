// Type rules of the ops that combine many elements: reductions, softmax, layer_norm, attention.
#include <algorithm>

#include "frontend/types.h"

namespace orion::frontend {

namespace {

// The reduced axes of an `axes` argument (all axes when absent), sorted and unique, and the
// elements each group reduces.
Reduction reduced_axes(const TypeContext& ctx, const Shape& shape) {
    Reduction r;
    const size_t rank = shape.size();
    if (!ctx.has("axes")) {
        for (size_t d = 0; d < rank; ++d) r.axes.push_back(static_cast<int64_t>(d));
    } else {
        for (int64_t a : ctx.ints("axes")) r.axes.push_back(normalize_axis(ctx, a, static_cast<int64_t>(rank)));
        std::sort(r.axes.begin(), r.axes.end());
        if (std::adjacent_find(r.axes.begin(), r.axes.end()) != r.axes.end()) ctx.fail("axes repeat an axis");
    }
    for (int64_t a : r.axes) r.count *= shape[a];
    return r;
}

TypedOp reduce(const TypeContext& ctx) {
    const mil::Type& tx = ctx.type("x");
    const Reduction r = reduced_axes(ctx, tx.shape);
    const bool keep = ctx.has("keep_dims") && ctx.boolean("keep_dims");
    Shape kept = tx.shape, out;
    for (int64_t a : r.axes) kept[a] = 1;
    for (size_t d = 0; d < kept.size(); ++d)
        if (keep || !std::binary_search(r.axes.begin(), r.axes.end(), static_cast<int64_t>(d))) out.push_back(kept[d]);
    return {mil::Type::tensor(tx.dtype, out), r};
}

TypedOp softmax(const TypeContext& ctx) {
    const mil::Type& tx = ctx.type("x");
    if (!mil::is_float(tx.dtype) || tx.shape.empty()) ctx.fail("x must be an fp16 or fp32 tensor");
    const int64_t axis =
        normalize_axis(ctx, ctx.has("axis") ? ctx.int_scalar("axis") : -1, static_cast<int64_t>(tx.shape.size()));
    return {tx, Axis{axis}};
}

TypedOp layer_norm(const TypeContext& ctx) {
    const mil::Type& tx = ctx.type("x");
    if (!mil::is_float(tx.dtype)) ctx.fail("x must be fp16 or fp32");
    Normalization norm{reduced_axes(ctx, tx.shape), 0.0f};
    for (const char* affine : {"gamma", "beta"})
        if (ctx.has(affine) && ctx.count(affine) != norm.reduced.count)
            ctx.fail(std::string(affine) + " must have " + std::to_string(norm.reduced.count) +
                     " elements (the normalised axes)");
    norm.epsilon = ctx.has("epsilon") ? static_cast<float>(ctx.number("epsilon")) : 1e-5f;
    return {tx, norm};
}

TypedOp scaled_dot_product_attention(const TypeContext& ctx) {
    const mil::Type &tq = ctx.type("query"), &tk = ctx.type("key"), &tv = ctx.type("value");
    const size_t r = tq.shape.size();
    if (r < 2 || tk.shape.size() != r || tv.shape.size() != r) ctx.fail("query, key and value need one rank >= 2");
    if (tq.dtype != tk.dtype || tq.dtype != tv.dtype || !mil::is_float(tq.dtype))
        ctx.fail("query, key and value need one float dtype");
    Attention a;
    a.L = tq.shape[r - 2], a.E = tq.shape[r - 1], a.S = tk.shape[r - 2], a.Ev = tv.shape[r - 1];
    a.batch = Shape(tq.shape.begin(), tq.shape.end() - 2);
    if (tk.shape[r - 1] != a.E || tv.shape[r - 2] != a.S || Shape(tk.shape.begin(), tk.shape.end() - 2) != a.batch ||
        Shape(tv.shape.begin(), tv.shape.end() - 2) != a.batch)
        ctx.fail("expected query [..., L, E], key [..., S, E], value [..., S, Ev] with one batch shape");
    if (ctx.has("attn_mask")) {
        Shape scores = a.batch;
        scores.push_back(a.L);
        scores.push_back(a.S);
        if (broadcast_shapes(ctx, scores, ctx.type("attn_mask").shape) != scores)
            ctx.fail("attn_mask must broadcast to [..., L, S]");
    }
    Shape out = a.batch;
    out.push_back(a.L);
    out.push_back(a.Ev);
    return {mil::Type::tensor(tq.dtype, out), a};
}

}  // namespace

std::vector<TypeRuleEntry> reduction_types() {
    return {
        {"reduce_sum", reduce},
        {"reduce_max", reduce},
        {"reduce_mean", reduce},
        {"softmax", softmax},
        {"layer_norm", layer_norm},
        {"scaled_dot_product_attention", scaled_dot_product_attention},
    };
}

}  // namespace orion::frontend
