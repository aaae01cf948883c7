// int8/uint8 quantisation: quantize, dequantize and the const-folded constexpr_affine_dequantize.
#include <algorithm>
#include <cmath>

#include "emulator/ops.h"

namespace orion::emu {

namespace {

// Scale and zero point per element: a single value, or one per index along `axis`.
struct Affine {
    std::vector<float> scale, zero;
    int64_t n = 1, inner = 1;  // element i uses entry (i / inner) % n

    float s(int64_t i) const { return scale.size() == 1 ? scale[0] : scale[(i / inner) % n]; }
    float z(int64_t i) const { return zero.empty() ? 0.0f : zero.size() == 1 ? zero[0] : zero[(i / inner) % n]; }
};

Affine affine(OpContext& ctx, const Shape& shape, bool axis_required) {
    Affine a;
    a.scale = ctx.floats("scale");
    if (a.scale.empty()) ctx.fail("scale is empty: give one scale, or one per index along axis");
    if (ctx.has("zero_point")) {
        a.zero = ctx.floats("zero_point");
        if (a.zero.empty()) ctx.fail("zero_point is empty: give one zero point, or one per index along axis");
    }
    const bool per_axis = a.scale.size() > 1 || a.zero.size() > 1;
    if (!per_axis && !axis_required) return a;
    if (!ctx.has("axis")) ctx.fail("per-channel scale or zero_point needs an axis");
    const int64_t axis = normalize_axis(ctx, ctx.int_scalar("axis"), static_cast<int64_t>(shape.size()));
    a.n = shape[axis];
    for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d) a.inner *= shape[d];
    for (const auto* v : {&a.scale, &a.zero})
        if (v->size() > 1 && static_cast<int64_t>(v->size()) != a.n)
            ctx.fail("scale/zero_point have " + std::to_string(v->size()) + " entries but axis " + std::to_string(axis) +
                     " has " + std::to_string(a.n));
    return a;
}

BuiltOp build_quantize(OpContext& ctx) {
    const mil::Type t = ctx.type("input");
    const std::string dt = ctx.text("output_dtype");
    if (dt != "int8" && dt != "uint8") ctx.fail("output_dtype must be \"int8\" or \"uint8\"");
    const Affine a = affine(ctx, t.shape, false);
    const float lo = dt == "int8" ? -128.0f : 0.0f, hi = dt == "int8" ? 127.0f : 255.0f;
    mil::Type out = t;
    out.dtype = dt == "int8" ? mil::DType::int8 : mil::DType::uint8;
    if (ctx.types_only()) return {out};
    const int x = ctx.slot("input"), o = ctx.out_slot();
    return {out, [=](Frame& fr) {
                const float* v = fr.values[x].data.data();
                Tensor& r = fr.values[o];
                for (int64_t i = 0; i < r.size(); ++i)
                    r.data[i] = std::clamp(std::nearbyint(v[i] / a.s(i)) + a.z(i), lo, hi);
            }};
}

BuiltOp build_dequantize(OpContext& ctx) {
    const mil::Type t = ctx.type("input");
    if (t.dtype != mil::DType::int8 && t.dtype != mil::DType::uint8) ctx.fail("input must be int8 or uint8");
    const Affine a = affine(ctx, t.shape, false);
    mil::Type out = t;
    out.dtype = ctx.type("scale").dtype;
    if (ctx.types_only()) return {out};
    const int x = ctx.slot("input"), o = ctx.out_slot();
    return {out, [=](Frame& fr) {
                const float* v = fr.values[x].data.data();
                Tensor& r = fr.values[o];
                for (int64_t i = 0; i < r.size(); ++i) r.data[i] = (v[i] - a.z(i)) * a.s(i);
                finish(r);
            }};
}

BuiltOp build_constexpr_affine_dequantize(OpContext& ctx) {
    const mil::Type t = ctx.constant("quantized_data").type;
    if (t.dtype != mil::DType::int8 && t.dtype != mil::DType::uint8) ctx.fail("quantized_data must be int8 or uint8");
    const Affine a = affine(ctx, t.shape, true);
    if (ctx.types_only()) return {tensor_type(ctx.type("scale").dtype, t.shape), nullptr, -1, 8 * t.element_count()};
    const std::vector<float> q = ctx.floats("quantized_data");
    Tensor folded;
    folded.dtype = ctx.type("scale").dtype;
    folded.shape = t.shape;
    folded.data.resize(q.size());
    for (size_t i = 0; i < q.size(); ++i) folded.data[i] = (q[i] - a.z(static_cast<int64_t>(i))) * a.s(static_cast<int64_t>(i));
    finish(folded);
    const int o = ctx.out_slot();
    return {tensor_type(folded.dtype, t.shape), [=](Frame& fr) { fr.values[o].data = folded.data; }};
}

}  // namespace

std::vector<OpEntry> quantization_ops() {
    return {
        {"quantize", build_quantize},
        {"dequantize", build_dequantize},
        {"constexpr_affine_dequantize", build_constexpr_affine_dequantize},
    };
}

}  // namespace orion::emu
