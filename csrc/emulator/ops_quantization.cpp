// Quantisation: quantize, dequantize, and the compile-time constant ops constexpr_affine_dequantize,
// constexpr_lut_to_dense and constexpr_blockwise_shift_scale, which conv reads in their stored form.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "emulator/fp16.h"
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

// CompressedConst::key of the consts `args` (those the op has) holding data of `dtype` in blocks of `blocks`.
std::string compressed_key(const OpContext& ctx, std::initializer_list<const char*> args, mil::DType dtype,
                           const Shape& blocks) {
    std::string key = mil::dtype_name(dtype);
    for (int64_t b : blocks) key += "x" + std::to_string(b);
    for (const char* arg : args) {
        if (!ctx.has(arg)) continue;
        const ValueInfo& v = ctx.constant(arg);
        key += ";" + std::string(arg) + "=" + v.type.str() + ":";
        if (!v.blob_key.empty()) {
            key += v.blob_key;
            continue;
        }
        if (v.blob || v.folded || v.constant->numbers.size() > 16) return {};  // unkeyed bytes
        for (double n : v.constant->numbers) {  // a few values written in the text: themselves, exactly
            char exact[32];
            std::snprintf(exact, sizeof exact, "%a,", n);
            key += exact;
        }
    }
    return key;
}

// A compile-time constant: conv reads it in its stored form (ValueInfo::compressed); the emulator
// runs this kernel only when some other kernel reads the values (or the program returns them).
BuiltOp constexpr_op(OpContext& ctx, std::shared_ptr<CompressedConst> c) {
    c->type = ctx.out_type();
    if (ctx.plan_only()) return {nullptr, -1, 4.0 * static_cast<double>(ctx.out_type().element_count()), std::move(c)};
    const std::vector<float> folded = dequantize(*c, ctx.value(c->data));
    const int o = ctx.out_slot();
    return {[=](Frame& fr) { fr.values[o].data = folded; }};
}

BuiltOp build_constexpr_affine_dequantize(OpContext& ctx) {
    auto c = std::make_shared<CompressedConst>();
    c->data = ctx.constant("quantized_data").slot;  // a const is its own slot
    c->params = affine(ctx);
    c->key = compressed_key(ctx, {"quantized_data", "scale", "zero_point"}, ctx.value(c->data).type.dtype,
                            {c->params.n, c->params.inner});
    return constexpr_op(ctx, std::move(c));
}

BuiltOp build_constexpr_lut_to_dense(OpContext& ctx) {
    auto c = std::make_shared<CompressedConst>();
    c->kind = CompressedConst::Kind::lut;
    c->data = ctx.constant("indices").slot;
    c->table = ctx.floats("lut");
    c->blocks = ctx.attrs<frontend::BlockLayout>();
    c->key = compressed_key(ctx, {"indices", "lut"}, ctx.value(c->data).type.dtype, c->blocks.block);
    return constexpr_op(ctx, std::move(c));
}

BuiltOp build_constexpr_blockwise_shift_scale(OpContext& ctx) {
    auto c = std::make_shared<CompressedConst>();
    c->kind = CompressedConst::Kind::shift_scale;
    c->data = ctx.constant("data").slot;
    c->table = ctx.floats("scale");
    if (ctx.has("offset")) c->offset = ctx.floats("offset");
    c->blocks = ctx.attrs<frontend::BlockLayout>();
    c->key = compressed_key(ctx, {"data", "scale", "offset"}, ctx.value(c->data).type.dtype, c->blocks.block);
    return constexpr_op(ctx, std::move(c));
}

}  // namespace

int64_t block_entry(const frontend::BlockLayout& blocks, const mil::Type& type, int64_t i) {
    int64_t entry = 0, stride = 1;
    for (size_t d = type.shape.size(); d-- > 0;) {
        const int64_t extent = type.shape[d], coordinate = i % extent;
        i /= extent;
        entry += coordinate / blocks.block[d] * stride;
        stride *= extent / blocks.block[d];
    }
    return entry;
}

std::vector<float> dequantize(const CompressedConst& c, const ValueInfo& q) {
    const std::vector<float> values = const_values(q);
    Tensor folded;
    folded.dtype = c.type.dtype;
    folded.shape = c.type.shape;
    folded.data.resize(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
        const auto at = static_cast<int64_t>(i);
        switch (c.kind) {
            case CompressedConst::Kind::affine: folded.data[i] = (values[i] - c.params.z(at)) * c.params.s(at); break;
            case CompressedConst::Kind::lut:
                folded.data[i] = c.table[static_cast<size_t>(block_entry(c.blocks, c.type, at) * c.blocks.entries +
                                                             static_cast<int64_t>(values[i]))];
                break;
            case CompressedConst::Kind::shift_scale: {
                const auto e = static_cast<size_t>(block_entry(c.blocks, c.type, at));
                // as coremltools decompresses: data - offset in the output type, then times scale (rounded by finish)
                float shifted = values[i] - (c.offset.empty() ? 0.0f : c.offset[e]);
                if (c.type.dtype == mil::DType::fp16) shifted = round_to_fp16(shifted);
                folded.data[i] = shifted * c.table[e];
                break;
            }
        }
    }
    finish(folded);
    return std::move(folded.data);
}

std::vector<OpEntry> quantization_ops() {
    return {
        {"quantize", build_quantize},
        {"dequantize", build_dequantize},
        {"constexpr_affine_dequantize", build_constexpr_affine_dequantize},
        {"constexpr_lut_to_dense", build_constexpr_lut_to_dense},
        {"constexpr_blockwise_shift_scale", build_constexpr_blockwise_shift_scale},
    };
}

}  // namespace orion::emu
