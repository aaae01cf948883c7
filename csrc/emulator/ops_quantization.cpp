// int8/uint8 quantisation: quantize, dequantize and the const-folded constexpr_affine_dequantize.
#include <algorithm>
#include <cmath>

#include "emulator/ops.h"

namespace orion::emu {

namespace {

// The const scale and zero point, laid out as the type rule derived.
AffineParams affine(OpContext& ctx) {
    AffineParams a;
    a.scale = ctx.floats("scale");
    if (ctx.has("zero_point")) a.zero = ctx.floats("zero_point");
    const frontend::AffineLayout& layout = ctx.attrs<frontend::AffineLayout>();
    a.n = layout.n, a.inner = layout.inner;
    return a;
}

BuiltOp build_quantize(OpContext& ctx) {
    if (ctx.plan_only()) return {};
    const AffineParams a = affine(ctx);
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
    const AffineParams a = affine(ctx);
    const int x = ctx.slot("input"), o = ctx.out_slot();
    return {[=](Frame& fr) {
                const float* v = fr.values[x].data.data();
                Tensor& r = fr.values[o];
                for (int64_t i = 0; i < r.size(); ++i) r.data[i] = (v[i] - a.z(i)) * a.s(i);
                finish(r);
            }};
}

// A compile-time constant: conv reads it in its quantized form (ValueInfo::affine); the emulator
// runs this kernel only when some other kernel reads the values (or the program returns them).
BuiltOp build_constexpr_affine_dequantize(OpContext& ctx) {
    if (ctx.plan_only()) {
        auto a = std::make_shared<AffineConst>();
        a->data = ctx.constant("quantized_data").slot;  // a const is its own slot
        a->params = affine(ctx);
        a->type = ctx.out_type();
        return {nullptr, -1, 4.0 * static_cast<double>(ctx.out_type().element_count()), std::move(a)};
    }
    AffineConst a;
    a.params = affine(ctx);
    a.type = ctx.out_type();
    const std::vector<float> folded = dequantize(a, ctx.constant("quantized_data"));
    const int o = ctx.out_slot();
    return {[=](Frame& fr) { fr.values[o].data = folded; }};
}

}  // namespace

std::vector<float> dequantize(const AffineConst& a, const ValueInfo& q) {
    const std::vector<float> values =
        q.blob ? blob_floats(q) : std::vector<float>(q.constant->numbers.begin(), q.constant->numbers.end());
    Tensor folded;
    folded.dtype = a.type.dtype;
    folded.shape = a.type.shape;
    folded.data.resize(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
        const auto at = static_cast<int64_t>(i);
        folded.data[i] = (values[i] - a.params.z(at)) * a.params.s(at);
    }
    finish(folded);
    return std::move(folded.data);
}

std::vector<OpEntry> quantization_ops() {
    return {
        {"quantize", build_quantize},
        {"dequantize", build_dequantize},
        {"constexpr_affine_dequantize", build_constexpr_affine_dequantize},
    };
}

}  // namespace orion::emu
