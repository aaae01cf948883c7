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

// The const scale and zero point, laid out as the type rule derived.
Affine affine(OpContext& ctx) {
    Affine a;
    a.scale = ctx.floats("scale");
    if (ctx.has("zero_point")) a.zero = ctx.floats("zero_point");
    const frontend::AffineLayout& layout = ctx.attrs<frontend::AffineLayout>();
    a.n = layout.n, a.inner = layout.inner;
    return a;
}

BuiltOp build_quantize(OpContext& ctx) {
    if (ctx.plan_only()) return {};
    const Affine a = affine(ctx);
    const bool to_int8 = ctx.out_type().dtype == mil::DType::int8;
    const float lo = to_int8 ? -128.0f : 0.0f, hi = to_int8 ? 127.0f : 255.0f;
    const int x = ctx.slot("input"), o = ctx.out_slot();
    return {[=](Frame& fr) {
                const float* v = fr.values[x].data.data();
                Tensor& r = fr.values[o];
                for (int64_t i = 0; i < r.size(); ++i)
                    r.data[i] = std::clamp(std::nearbyint(v[i] / a.s(i)) + a.z(i), lo, hi);
            }};
}

BuiltOp build_dequantize(OpContext& ctx) {
    if (ctx.plan_only()) return {};
    const Affine a = affine(ctx);
    const int x = ctx.slot("input"), o = ctx.out_slot();
    return {[=](Frame& fr) {
                const float* v = fr.values[x].data.data();
                Tensor& r = fr.values[o];
                for (int64_t i = 0; i < r.size(); ++i) r.data[i] = (v[i] - a.z(i)) * a.s(i);
                finish(r);
            }};
}

BuiltOp build_constexpr_affine_dequantize(OpContext& ctx) {
    if (ctx.plan_only()) return {nullptr, -1, 8.0 * static_cast<double>(ctx.out_type().element_count())};
    const Affine a = affine(ctx);
    const std::vector<float> q = ctx.floats("quantized_data");
    Tensor folded;
    folded.dtype = ctx.out_type().dtype;
    folded.shape = ctx.out_type().shape;
    folded.data.resize(q.size());
    for (size_t i = 0; i < q.size(); ++i) folded.data[i] = (q[i] - a.z(static_cast<int64_t>(i))) * a.s(static_cast<int64_t>(i));
    finish(folded);
    const int o = ctx.out_slot();
    return {[=](Frame& fr) { fr.values[o].data = folded.data; }};
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
