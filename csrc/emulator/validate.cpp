#include "emulator/validate.h"

#include <map>
#include <set>

#include "errors.h"
#include "hardware_limits.h"

namespace orion::emu {

namespace {

std::string where(const mil::Operation& op) {
    std::string w = "op '" + op.name + "' (" + op.op + ")";
    return op.loc.line > 0 ? "line " + std::to_string(op.loc.line) + ": " + w : w;
}

// Ops the emulator runs but the ANE compiler rejects, with the rewrite that replaces each.
const std::map<std::string, std::pair<constraints::Constraint, const char*>>& banned_ops() {
    static const std::map<std::string, std::pair<constraints::Constraint, const char*>> banned = {
        {"concat", {constraints::CONCAT, "return the parts as separate outputs"}},
        {"gelu", {constraints::GELU, "use 0.5*x*(1+tanh(0.7978845608*(x+0.044715*x^3)))"}},
        {"rsqrt", {constraints::SQRT, "use pow(x, -0.5) with a named fp16 const"}},
        {"sqrt", {constraints::SQRT, "use pow(x, 0.5) with a named fp16 const"}},
        {"reduce_mean", {constraints::REDUCE_MEAN, "use reduce_sum then mul by a 1/N const"}},
        {"scaled_dot_product_attention", {constraints::SDPA, "write matmul, mul by scale, add a causal mask, softmax, matmul"}},
        {"slice_by_index", {constraints::SLICE_BY_INDEX, "use slice_by_size"}},
        {"real_div", {constraints::REAL_DIV, "mul by a reciprocal const (or pow(y, -1))"}},
        {"layer_norm", {constraints::LAYER_NORM, "decompose into reduce_sum, sub, mul, pow, add"}},
    };
    return banned;
}

bool is_power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

void check_op(const mil::Operation& op, const std::map<std::string, const mil::Operation*>& consts,
              const std::map<std::string, mil::Type>& types) {
    auto banned = banned_ops().find(op.op);
    if (banned != banned_ops().end())
        throw ConstraintError(banned->second.first, where(op) + " is not accepted by the ANE compiler: " + banned->second.second);
    for (const auto& a : op.args)
        if (a.kind == mil::Argument::Kind::literal)
            throw ConstraintError(constraints::INLINE_LITERAL,
                                  where(op) + ": argument '" + a.name +
                                      "' is an inline literal; declare it as a const() and pass its name");
    if (op.op == "conv") {
        if (op.arg("bias"))
            throw ConstraintError(constraints::CONV_BIAS, where(op) + " has bias=; drop it and add the bias with an add op");
        for (const char* required : {"dilations", "groups", "pad", "pad_type", "strides", "weight", "x"})
            if (!op.arg(required))
                throw ConstraintError(constraints::CONV_FORM, where(op) + " lacks '" + required +
                                                                  "': give all of dilations, groups, pad, pad_type, strides, weight, x");
        const auto* w = op.arg("weight");
        if (w->kind != mil::Argument::Kind::ref || !consts.count(w->refs[0]))
            throw ConstraintError(constraints::CONV_FORM,
                                  where(op) + ": weight must be a const() (a BLOBFILE); for runtime weights use matmul");
        const auto& wt = types.at(w->refs[0]);
        if (wt.shape.size() == 4 && wt.shape[1] >= limits::MAX_CONV_INPUT_CHANNELS)
            throw ConstraintError(constraints::CONV_CHANNELS,
                                  where(op) + " has " + std::to_string(wt.shape[1]) +
                                      " input channels; split the input channels into chunks below 32,000 and add the results");
    }
    if (op.op == "softmax") {
        const auto* x = op.arg("x");
        const auto* axis = op.arg("axis");
        if (x && x->kind == mil::Argument::Kind::ref && types.count(x->refs[0])) {
            const auto& shape = types.at(x->refs[0]).shape;
            int64_t ax = -1;
            if (axis && axis->kind == mil::Argument::Kind::ref && consts.count(axis->refs[0])) {
                const auto& v = consts.at(axis->refs[0])->val;
                if (v && v->numbers.size() == 1) ax = static_cast<int64_t>(v->numbers[0]);
            }
            if (ax < 0) ax += static_cast<int64_t>(shape.size());
            if (ax >= 0 && ax < static_cast<int64_t>(shape.size()) && !is_power_of_two(shape[ax]))
                throw ConstraintError(constraints::SOFTMAX_EXTENT,
                                      where(op) + " runs over an extent of " + std::to_string(shape[ax]) +
                                          "; pad that axis to a power of two (masking the padding with -65504)");
        }
    }
}

}  // namespace

void check_hardware_rules(const mil::Function& fn, runtime::Profile profile) {
    std::map<std::string, const mil::Operation*> consts;
    std::map<std::string, mil::Type> types;
    std::set<std::string> computed;
    for (const auto& p : fn.inputs) types[p.name] = p.type;
    for (const auto& op : fn.body) {
        types[op.output] = op.type;
        if (op.op == "const") {
            consts[op.output] = &op;
            continue;
        }
        computed.insert(op.output);
        if (profile == runtime::Profile::hardware) check_op(op, consts, types);
    }
    for (const auto& name : fn.outputs)
        if (!computed.count(name))
            throw ConstraintError(constraints::DEAD_RETURN,
                                  "returned name '" + name + "' is not computed by any op of " + fn.name +
                                      (consts.count(name) ? " (it is a const)" : types.count(name) ? " (it is an input)" : "") +
                                      "; return a value produced by an op (add an identity if needed)");
    if (profile != runtime::Profile::hardware) return;
    auto check_lanes = [&](const std::string& name, const mil::Type& t, const char* side) {
        if (t.dtype == mil::DType::fp16 && t.is_tensor && !t.shape.empty() && t.shape.back() < 32)
            throw ConstraintError(constraints::FP16_LANES, std::string(side) + " '" + name + "' is " + t.str() +
                                                               "; fp16 I/O needs at least 32 lanes in the last dimension "
                                                               "(pad it, or use fp32 I/O with 16 lanes)");
    };
    for (const auto& p : fn.inputs) check_lanes(p.name, p.type, "input");
    for (const auto& name : fn.outputs) check_lanes(name, types.at(name), "output");
}

}  // namespace orion::emu
