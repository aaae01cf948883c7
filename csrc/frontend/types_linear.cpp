// Type rules of conv and matmul.
#include <algorithm>

#include "frontend/types.h"

namespace orion::frontend {

namespace {

using mil::shape_str;

ConvGeometry conv_geometry(const TypeContext& ctx, const mil::Type& tx, const mil::Type& tw) {
    if (tx.shape.size() != 4 || tw.shape.size() != 4)
        ctx.fail("conv needs rank-4 x [N, Cin, H, W] and weight [Cout, Cin/groups, kH, kW], got x " + shape_str(tx.shape) +
                 " and weight " + shape_str(tw.shape));
    ConvGeometry g{};
    g.n = tx.shape[0], g.cin = tx.shape[1], g.h = tx.shape[2], g.w = tx.shape[3];
    g.cout = tw.shape[0], g.kh = tw.shape[2], g.kw = tw.shape[3];
    g.groups = ctx.has("groups") ? ctx.int_scalar("groups") : 1;
    if (g.groups <= 0 || g.cin % g.groups || g.cout % g.groups || tw.shape[1] * g.groups != g.cin)
        ctx.fail("weight " + shape_str(tw.shape) + " does not fit x with " + std::to_string(g.cin) + " channels in " +
                 std::to_string(g.groups) + " group(s)");
    auto pair = [&](const char* arg) {
        if (!ctx.has(arg)) return std::vector<int64_t>{1, 1};
        auto v = ctx.ints(arg);
        if (v.size() != 2 || v[0] <= 0 || v[1] <= 0) ctx.fail(std::string(arg) + " must be two positive integers");
        return v;
    };
    const auto st = pair("strides"), dl = pair("dilations");
    g.sh = st[0], g.sw = st[1], g.dh = dl[0], g.dw = dl[1];
    const std::string pad_type = ctx.has("pad_type") ? ctx.text("pad_type") : "valid";
    const int64_t eff_kh = g.dh * (g.kh - 1) + 1, eff_kw = g.dw * (g.kw - 1) + 1;
    if (pad_type == "custom") {
        auto p = ctx.ints("pad");
        if (p.size() != 4) ctx.fail("pad must have 4 entries [top, bottom, left, right]");
        g.pt = p[0], g.pb = p[1], g.pl = p[2], g.pr = p[3];
    } else if (pad_type == "same") {
        const int64_t ph = std::max<int64_t>(0, ((g.h + g.sh - 1) / g.sh - 1) * g.sh + eff_kh - g.h);
        const int64_t pw = std::max<int64_t>(0, ((g.w + g.sw - 1) / g.sw - 1) * g.sw + eff_kw - g.w);
        g.pt = ph / 2, g.pb = ph - ph / 2, g.pl = pw / 2, g.pr = pw - pw / 2;
    } else if (pad_type == "valid") {
        if (ctx.has("pad")) {
            auto p = ctx.ints("pad");
            if (std::any_of(p.begin(), p.end(), [](int64_t v) { return v != 0; }))
                ctx.fail("pad must be all zeros with pad_type \"valid\" (use \"custom\" to pad)");
        }
    } else {
        ctx.fail("unknown pad_type '" + pad_type + "' (valid, same or custom)");
    }
    g.oh = (g.h + g.pt + g.pb - eff_kh) / g.sh + 1;
    g.ow = (g.w + g.pl + g.pr - eff_kw) / g.sw + 1;
    if (g.oh <= 0 || g.ow <= 0) ctx.fail("the kernel is larger than the padded input");
    return g;
}

TypedOp conv(const TypeContext& ctx) {
    const mil::Type &tx = ctx.type("x"), &tw = ctx.type("weight");
    if (!mil::is_float(tx.dtype)) ctx.fail("x must be fp16 or fp32");
    const ConvGeometry g = conv_geometry(ctx, tx, tw);
    return {mil::Type::tensor(tx.dtype, {g.n, g.cout, g.oh, g.ow}), g};
}

TypedOp matmul(const TypeContext& ctx) {
    const mil::Type &tx = ctx.type("x"), &ty = ctx.type("y");
    if (tx.dtype != ty.dtype || !mil::is_float(tx.dtype)) ctx.fail("x and y must both be fp16 or both fp32");
    if (tx.shape.size() < 2 || ty.shape.size() < 2) ctx.fail("matmul operands must have rank >= 2");
    MatmulDims d;
    d.transpose_x = ctx.has("transpose_x") && ctx.boolean("transpose_x");
    d.transpose_y = ctx.has("transpose_y") && ctx.boolean("transpose_y");
    const size_t rx = tx.shape.size(), ry = ty.shape.size();
    d.M = d.transpose_x ? tx.shape[rx - 1] : tx.shape[rx - 2];
    d.K = d.transpose_x ? tx.shape[rx - 2] : tx.shape[rx - 1];
    const int64_t K2 = d.transpose_y ? ty.shape[ry - 1] : ty.shape[ry - 2];
    d.N = d.transpose_y ? ty.shape[ry - 2] : ty.shape[ry - 1];
    if (d.K != K2) ctx.fail("inner dimensions differ: x gives " + std::to_string(d.K) + ", y gives " + std::to_string(K2));
    d.x_batch = Shape(tx.shape.begin(), tx.shape.end() - 2);
    d.y_batch = Shape(ty.shape.begin(), ty.shape.end() - 2);
    d.batch = broadcast_shapes(ctx, d.x_batch, d.y_batch);
    Shape out = d.batch;
    out.push_back(d.M);
    out.push_back(d.N);
    return {mil::Type::tensor(tx.dtype, out), d};
}

}  // namespace

std::vector<TypeRuleEntry> linear_types() { return {{"conv", conv}, {"matmul", matmul}}; }

}  // namespace orion::frontend
