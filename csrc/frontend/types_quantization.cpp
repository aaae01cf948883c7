// Type rules of quantisation: quantize, dequantize, constexpr_affine_dequantize (int8/uint8), and the iOS 18
// compression ops constexpr_lut_to_dense (palettized weights) and constexpr_blockwise_shift_scale (int4/uint4/int8/uint8
// with block-wise scales), with the signatures of coremltools' iOS18 compression opset.
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

// Per axis, how many elements of `shape` share one entry of `table` (the table's extent must divide it).
Shape block_sizes(const TypeContext& ctx, const Shape& shape, const Shape& table, const char* what) {
    Shape block;
    for (size_t d = 0; d < shape.size(); ++d) {
        if (table[d] <= 0 || shape[d] % table[d] != 0)
            ctx.fail(std::string(what) + " has " + std::to_string(table[d]) + " entries along axis " + std::to_string(d) +
                     ", which does not divide the weight's " + std::to_string(shape[d]) +
                     ": give an extent that divides it (1 for one table along that axis)");
        block.push_back(shape[d] / table[d]);
    }
    return block;
}

TypedOp constexpr_lut_to_dense(const TypeContext& ctx) {
    const mil::Type& indices = *ctx.constant("indices").type;
    const mil::Type& lut = *ctx.constant("lut").type;
    int bits = 0;
    switch (indices.dtype) {
        case mil::DType::uint4: bits = 4; break;
        case mil::DType::uint6: bits = 6; break;
        case mil::DType::uint8: bits = 8; break;
        default: ctx.fail("indices must be uint4, uint6 or uint8 (Orion's subset of uint1..uint8), got " +
                          std::string(mil::dtype_name(indices.dtype)));
    }
    if (!mil::is_float(lut.dtype)) ctx.fail("lut must be fp16 or fp32 (int8/uint8 LUTs are not supported)");
    if (indices.shape.empty()) ctx.fail("indices must have at least rank 1");
    if (lut.shape.size() != indices.shape.size() + 2)
        ctx.fail("lut must have rank " + std::to_string(indices.shape.size() + 2) + " (the indices' rank + 2: the tables, "
                 "then [NUM_PALETTES, VECTOR_SIZE]), got " + lut.str());
    const int64_t entries = lut.shape[lut.shape.size() - 2], vector = lut.shape.back();
    if (entries != (int64_t{1} << bits))
        ctx.fail("lut has " + std::to_string(entries) + " entries per table but " + mil::dtype_name(indices.dtype) +
                 " indices need " + std::to_string(int64_t{1} << bits));
    if (vector != 1 || ctx.has("vector_axis"))
        ctx.fail("vector palettization (VECTOR_SIZE " + std::to_string(vector) + ", vector_axis) is not supported: "
                 "give a lut [..., NUM_PALETTES, 1] without vector_axis");
    const Shape tables(lut.shape.begin(), lut.shape.end() - 2);
    return {mil::Type::tensor(lut.dtype, indices.shape), BlockLayout{block_sizes(ctx, indices.shape, tables, "lut"), entries}};
}

TypedOp constexpr_blockwise_shift_scale(const TypeContext& ctx) {
    const mil::Type& data = *ctx.constant("data").type;
    const mil::Type& scale = *ctx.constant("scale").type;
    const mil::DType dt = data.dtype;
    if (dt != mil::DType::int4 && dt != mil::DType::uint4 && dt != mil::DType::int8 && dt != mil::DType::uint8)
        ctx.fail("data must be int4, uint4, int8 or uint8 (float data is not supported), got " +
                 std::string(mil::dtype_name(dt)));
    if (!mil::is_float(scale.dtype)) ctx.fail("scale must be fp16 or fp32");
    if (data.shape.empty()) ctx.fail("data must have at least rank 1");
    if (scale.shape.size() != data.shape.size())
        ctx.fail("scale must have the data's rank " + std::to_string(data.shape.size()) + ", got " + scale.str());
    if (ctx.has("offset")) {
        const mil::Type& offset = *ctx.constant("offset").type;
        if (offset.shape != scale.shape) ctx.fail("offset must have the scale's shape " + scale.str() + ", got " + offset.str());
        if (!mil::is_float(offset.dtype) && offset.dtype != dt)
            ctx.fail(std::string("offset must be ") + mil::dtype_name(dt) + " (the data's dtype) or a float, got " +
                     mil::dtype_name(offset.dtype));
    }
    return {mil::Type::tensor(scale.dtype, data.shape), BlockLayout{block_sizes(ctx, data.shape, scale.shape, "scale"), 0}};
}

}  // namespace

std::vector<TypeRuleEntry> quantization_types() {
    return {
        {"quantize", quantize},
        {"dequantize", dequantize},
        {"constexpr_affine_dequantize", constexpr_affine_dequantize},
        {"constexpr_lut_to_dense", constexpr_lut_to_dense},
        {"constexpr_blockwise_shift_scale", constexpr_blockwise_shift_scale},
    };
}

}  // namespace orion::frontend
