// Type rules of int8/uint8 quantisation: quantize, dequantize, constexpr_affine_dequantize.
#include "frontend/types.h"

namespace orion::frontend {

namespace {

// Where each element finds its scale and zero point: one value for all, or one per index along `axis`.
AffineLayout affine_layout(const TypeContext& ctx, const Shape& shape, bool axis_required) {
    const int64_t scales = ctx.count("scale");
    if (scales == 0) ctx.fail("scale is empty: give one scale, or one per index along axis");
    int64_t zeros = 0;
    if (ctx.has("zero_point")) {
        zeros = ctx.count("zero_point");
        if (zeros == 0) ctx.fail("zero_point is empty: give one zero point, or one per index along axis");
    }
    AffineLayout layout;
    const bool per_axis = scales > 1 || zeros > 1;
    if (!per_axis && !axis_required) return layout;
    if (!ctx.has("axis")) ctx.fail("per-channel scale or zero_point needs an axis");
    const int64_t axis = normalize_axis(ctx, ctx.int_scalar("axis"), static_cast<int64_t>(shape.size()));
    layout.n = shape[axis];
    for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d) layout.inner *= shape[d];
    for (const int64_t entries : {scales, zeros})
        if (entries > 1 && entries != layout.n)
            ctx.fail("scale/zero_point have " + std::to_string(entries) + " entries but axis " + std::to_string(axis) +
                     " has " + std::to_string(layout.n));
    return layout;
}

TypedOp quantize(const TypeContext& ctx) {
    const mil::Type& t = ctx.type("input");
    const std::string dt = ctx.text("output_dtype");
    if (dt != "int8" && dt != "uint8") ctx.fail("output_dtype must be \"int8\" or \"uint8\"");
    const AffineLayout layout = affine_layout(ctx, t.shape, false);
    mil::Type out = t;
    out.dtype = dt == "int8" ? mil::DType::int8 : mil::DType::uint8;
    return {out, layout};
}

TypedOp dequantize(const TypeContext& ctx) {
    const mil::Type& t = ctx.type("input");
    if (t.dtype != mil::DType::int8 && t.dtype != mil::DType::uint8) ctx.fail("input must be int8 or uint8");
    const AffineLayout layout = affine_layout(ctx, t.shape, false);
    mil::Type out = t;
    out.dtype = ctx.type("scale").dtype;
    return {out, layout};
}

TypedOp constexpr_affine_dequantize(const TypeContext& ctx) {
    const mil::Type& t = *ctx.constant("quantized_data").type;
    if (t.dtype != mil::DType::int8 && t.dtype != mil::DType::uint8) ctx.fail("quantized_data must be int8 or uint8");
    const AffineLayout layout = affine_layout(ctx, t.shape, true);
    return {mil::Type::tensor(ctx.type("scale").dtype, t.shape), layout};
}

}  // namespace

std::vector<TypeRuleEntry> quantization_types() {
    return {
        {"quantize", quantize},
        {"dequantize", dequantize},
        {"constexpr_affine_dequantize", constexpr_affine_dequantize},
    };
}

}  // namespace orion::frontend
