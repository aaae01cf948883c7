// conv and matmul: the hot path. 1x1 convolutions with const weights run on the packed fp16
// kernel; other convolutions take a direct loop; matmul runs on the strided GEMM.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "emulator/ops.h"

namespace orion::emu {

namespace {

// fp16 bits of a const weight, whatever its declared float type.
std::vector<uint16_t> weight_halves(OpContext& ctx) {
    const ValueInfo& w = ctx.constant("weight");
    if (w.blob && w.type.dtype == mil::DType::fp16) {
        std::vector<uint16_t> h(w.blob->size() / 2);
        std::memcpy(h.data(), w.blob->data(), h.size() * 2);
        return h;
    }
    const std::vector<float> f = ctx.floats("weight");
    std::vector<uint16_t> h(f.size());
    kernels::float_to_half(f.data(), h.data(), f.size());
    return h;
}

struct ConvGeometry {
    int64_t n, cin, h, w, cout, kh, kw, groups, sh, sw, dh, dw, pt, pb, pl, pr, oh, ow;
};

ConvGeometry conv_geometry(OpContext& ctx, const mil::Type& tx, const mil::Type& tw) {
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

BuiltOp build_conv(OpContext& ctx) {
    const mil::Type tx = ctx.type("x"), tw = ctx.type("weight");
    if (!mil::is_float(tx.dtype)) ctx.fail("x must be fp16 or fp32");
    const ConvGeometry g = conv_geometry(ctx, tx, tw);
    const mil::Type out_type = tensor_type(tx.dtype, {g.n, g.cout, g.oh, g.ow});
    if (ctx.types_only()) return {out_type, nullptr, -1, 6 * tw.element_count()};  // fp16 + fp32 weight copies
    const bool round = tx.dtype == mil::DType::fp16;
    std::vector<float> bias;
    if (ctx.has("bias")) {
        bias = ctx.floats("bias");
        if (static_cast<int64_t>(bias.size()) != g.cout) ctx.fail("bias must have Cout = " + std::to_string(g.cout) + " entries");
    }
    const auto halves = weight_halves(ctx);
    const int x = ctx.slot("x"), o = ctx.out_slot();
    auto add_bias = [bias, g](float* c) {
        if (bias.empty()) return;
        const int64_t plane = g.oh * g.ow;
        for (int64_t oc = 0; oc < g.cout; ++oc)
            for (int64_t i = 0; i < plane; ++i) c[oc * plane + i] += bias[oc];
    };
    const bool pointwise = g.kh == 1 && g.kw == 1 && g.groups == 1 && g.sh == 1 && g.sw == 1 && g.pt == 0 && g.pb == 0 &&
                           g.pl == 0 && g.pr == 0;
    if (pointwise) {
        auto packed = kernels::shared_conv1x1(halves.data(), g.cout, g.cin);  // one copy across programs
        return {out_type, [=](Frame& fr) {
                    const int64_t S = g.h * g.w;
                    const Tensor& in = fr.values[x];
                    Tensor& out = fr.values[o];
                    // With one row per channel (H = 1) the lanes are independent: compute the live ones.
                    out.lanes = g.h == 1 ? in.lanes : out.last_dim();
                    const int64_t lanes = g.h == 1 ? in.lanes : S;
                    for (int64_t b = 0; b < g.n; ++b) {
                        float* c = out.data.data() + b * g.cout * S;
                        kernels::conv1x1(*packed, in.data.data() + b * g.cin * S, S, lanes, c, round && bias.empty());
                        add_bias(c);
                    }
                    if (!bias.empty()) finish(out);
                }};
    }
    auto weight = std::make_shared<std::vector<float>>(halves.size());
    kernels::half_to_float(halves.data(), weight->data(), halves.size());
    return {out_type, [=](Frame& fr) {
                const float* a = fr.values[x].data.data();
                Tensor& out = fr.values[o];
                const int64_t cin_g = g.cin / g.groups, cout_g = g.cout / g.groups;
                kernels::parallel_for(g.n * g.cout, 1, [&](int64_t begin, int64_t end) {
                    for (int64_t job = begin; job < end; ++job) {
                        const int64_t b = job / g.cout, oc = job % g.cout, grp = oc / cout_g;
                        const float* wrow = weight->data() + oc * cin_g * g.kh * g.kw;
                        float* c = out.data.data() + (b * g.cout + oc) * g.oh * g.ow;
                        for (int64_t y = 0; y < g.oh; ++y)
                            for (int64_t xo = 0; xo < g.ow; ++xo) {
                                float acc = 0.0f;
                                for (int64_t ic = 0; ic < cin_g; ++ic)
                                    for (int64_t ky = 0; ky < g.kh; ++ky) {
                                        const int64_t iy = y * g.sh + ky * g.dh - g.pt;
                                        if (iy < 0 || iy >= g.h) continue;
                                        for (int64_t kx = 0; kx < g.kw; ++kx) {
                                            const int64_t ix = xo * g.sw + kx * g.dw - g.pl;
                                            if (ix < 0 || ix >= g.w) continue;
                                            acc += wrow[(ic * g.kh + ky) * g.kw + kx] *
                                                   a[((b * g.cin + grp * cin_g + ic) * g.h + iy) * g.w + ix];
                                        }
                                    }
                                c[y * g.ow + xo] = acc;
                            }
                    }
                });
                add_bias(out.data.data());
                finish(out);
            }};
}

BuiltOp build_matmul(OpContext& ctx) {
    const mil::Type tx = ctx.type("x"), ty = ctx.type("y");
    if (tx.dtype != ty.dtype || !mil::is_float(tx.dtype)) ctx.fail("x and y must both be fp16 or both fp32");
    if (tx.shape.size() < 2 || ty.shape.size() < 2) ctx.fail("matmul operands must have rank >= 2");
    const bool tx_t = ctx.has("transpose_x") && ctx.boolean("transpose_x");
    const bool ty_t = ctx.has("transpose_y") && ctx.boolean("transpose_y");
    const size_t rx = tx.shape.size(), ry = ty.shape.size();
    const int64_t M = tx_t ? tx.shape[rx - 1] : tx.shape[rx - 2], K = tx_t ? tx.shape[rx - 2] : tx.shape[rx - 1];
    const int64_t K2 = ty_t ? ty.shape[ry - 1] : ty.shape[ry - 2], N = ty_t ? ty.shape[ry - 2] : ty.shape[ry - 1];
    if (K != K2) ctx.fail("inner dimensions differ: x gives " + std::to_string(K) + ", y gives " + std::to_string(K2));
    const Shape bx(tx.shape.begin(), tx.shape.end() - 2), by(ty.shape.begin(), ty.shape.end() - 2);
    const Shape batch = broadcast_shapes(ctx, bx, by);
    Shape out = batch;
    out.push_back(M);
    out.push_back(N);
    const int64_t nb = element_count(batch);
    if (ctx.types_only()) return {tensor_type(tx.dtype, out), nullptr, -1, 16 * nb};  // per-batch offsets
    const bool round = tx.dtype == mil::DType::fp16;
    const int x = ctx.slot("x"), y = ctx.slot("y", /*fp16_in_place=*/true), o = ctx.out_slot();
    // Offsets of each batch's x and y matrices (broadcast batch dims repeat a matrix).
    std::vector<int64_t> xoff(static_cast<size_t>(nb)), yoff(static_cast<size_t>(nb));
    const auto bstr = strides_of(batch);
    for (int64_t i = 0; i < nb; ++i) {
        int64_t ox = 0, oy = 0, sx = M * K, sy = K * N;
        for (int64_t d = static_cast<int64_t>(batch.size()) - 1; d >= 0; --d) {
            const int64_t idx = (i / bstr[d]) % batch[d];
            const int64_t dx = d - static_cast<int64_t>(batch.size() - bx.size());
            const int64_t dy = d - static_cast<int64_t>(batch.size() - by.size());
            if (dx >= 0) {
                if (bx[dx] != 1) ox += idx * sx;
                sx *= bx[dx];
            }
            if (dy >= 0) {
                if (by[dy] != 1) oy += idx * sy;
                sy *= by[dy];
            }
        }
        xoff[i] = ox, yoff[i] = oy;
    }
    // Element strides of op(x) [M, K] and op(y) [K, N] inside one matrix.
    const int64_t a_rs = tx_t ? 1 : K, a_cs = tx_t ? M : 1;
    const int64_t b_rs = ty_t ? 1 : N, b_cs = ty_t ? K : 1;
    return {tensor_type(tx.dtype, out), [=](Frame& fr) {
                const Tensor &tx_v = fr.values[x], &ty_v = fr.values[y];
                Tensor& out_v = fr.values[o];
                // Live lanes: a partially live contracted axis is summed over its live prefix only;
                // a partially live N axis (y's last) leaves the output live on the same prefix.
                int64_t k = K;
                if (!tx_t && tx_v.partial()) k = std::min(k, tx_v.lanes);
                if (ty_t && ty_v.partial()) k = std::min(k, ty_v.lanes);
                const int64_t n = !ty_t && ty_v.partial() ? ty_v.lanes : N;
                out_v.lanes = n;
                const float* a = tx_v.data.data();
                float* c = out_v.data.data();
                for (int64_t i = 0; i < nb; ++i) {
                    if (ty_v.half)  // an fp16 input read in place (e.g. a KV cache)
                        kernels::gemm_f16b(M, n, k, a + xoff[i], a_rs, a_cs, ty_v.half + yoff[i], b_rs, b_cs,
                                           c + i * M * N, N, round);
                    else
                        kernels::gemm(M, n, k, a + xoff[i], a_rs, a_cs, ty_v.data.data() + yoff[i], b_rs, b_cs,
                                      c + i * M * N, N, round);
                }
            }};
}

}  // namespace

std::vector<OpEntry> linear_ops() { return {{"conv", build_conv}, {"matmul", build_matmul}}; }

}  // namespace orion::emu
