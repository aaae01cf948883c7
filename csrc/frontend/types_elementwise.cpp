// Type rules of the elementwise ops: binary arithmetic with numpy broadcasting, unary activations.
#include "frontend/types.h"

namespace orion::frontend {

namespace {

TypedOp binary(const TypeContext& ctx) {
    const mil::Type &tx = ctx.type("x"), &ty = ctx.type("y");
    if (tx.dtype != ty.dtype)
        ctx.fail(std::string("x is ") + mil::dtype_name(tx.dtype) + " but y is " + mil::dtype_name(ty.dtype) +
                 ": cast one of them first");
    const Shape out = broadcast_shapes(ctx, tx.shape, ty.shape);
    return {tx.is_tensor || ty.is_tensor ? mil::Type::tensor(tx.dtype, out) : mil::Type::scalar(tx.dtype), {}};
}

// fp16 or fp32 in, the same type out.
TypedOp float_unary(const TypeContext& ctx) {
    const mil::Type& tx = ctx.type("x");
    if (!mil::is_float(tx.dtype)) ctx.fail(std::string("x must be fp16 or fp32, got ") + mil::dtype_name(tx.dtype));
    return {tx, {}};
}

TypedOp gelu(const TypeContext& ctx) {
    using Kind = GeluMode::Kind;
    const std::string mode = ctx.has("mode") ? ctx.text("mode") : "EXACT";
    Kind kind = Kind::exact;
    if (mode == "TANH_APPROXIMATION")
        kind = Kind::tanh_approximation;
    else if (mode == "SIGMOID_APPROXIMATION")
        kind = Kind::sigmoid_approximation;
    else if (mode != "EXACT")
        ctx.fail("unknown gelu mode '" + mode + "' (EXACT, TANH_APPROXIMATION or SIGMOID_APPROXIMATION)");
    TypedOp typed = float_unary(ctx);
    typed.attrs = GeluMode{kind};
    return typed;
}

TypedOp rsqrt(const TypeContext& ctx) {
    const float epsilon = ctx.has("epsilon") ? static_cast<float>(ctx.number("epsilon")) : 1e-12f;
    TypedOp typed = float_unary(ctx);
    typed.attrs = Epsilon{epsilon};
    return typed;
}

}  // namespace

std::vector<TypeRuleEntry> elementwise_types() {
    return {
        {"add", binary},          {"sub", binary},          {"mul", binary},         {"real_div", binary},
        {"pow", binary},          {"tanh", float_unary},    {"sigmoid", float_unary}, {"exp", float_unary},
        {"relu", float_unary},    {"identity", float_unary}, {"sqrt", float_unary},  {"rsqrt", rsqrt},
        {"gelu", gelu},
    };
}

}  // namespace orion::frontend
