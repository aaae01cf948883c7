#include "frontend/rules.h"

#include <map>
#include <set>

#include "errors.h"
#include "frontend/frontend.h"
#include "hardware_limits.h"
#include "mil/op_table.h"

namespace orion::frontend {

namespace {

bool is_power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// The op's status in the op table: banned ops always refused, disputed ones unless relaxed.
void check_status(const mil::Operation& op, const std::set<std::string>& relaxed_ops) {
    const mil::OpSpec* spec = mil::find_op_spec(op.op);
    if (!spec || spec->status == mil::OpStatus::allowed) return;
    if (spec->status == mil::OpStatus::banned)
        throw ConstraintError(*spec->constraint, where(op) + " is not accepted by the ANE compiler: " + spec->fix);
    if (!relaxed_ops.count(op.op))
        throw ConstraintError(*spec->constraint, where(op) + " works on some ANE generations and fails to compile on "
                                                 "others; " + spec->fix + " (orion.probes.Relaxations.ops)");
}

void check_op(const mil::Operation& op, const std::map<std::string, const mil::Operation*>& consts,
              const std::map<std::string, mil::Type>& types, const std::set<std::string>& relaxed_ops) {
    check_status(op, relaxed_ops);
    for (const auto& a : op.args)
        if (a.kind == mil::Argument::Kind::literal)
            throw ConstraintError(constraints::INLINE_LITERAL,
                                  where(op) + ": argument '" + a.name +
                                      "' is an inline literal; declare it as a const() and pass its name");
    if (op.op == "conv") {
        if (op.arg("bias"))
            throw ConstraintError(constraints::CONV_BIAS, where(op) + " has bias=; drop it and add the bias with an add op");
        for (const std::string& required : mil::find_op_spec("conv")->required)
            if (!op.arg(required))
                throw ConstraintError(constraints::CONV_FORM, where(op) + " lacks '" + required +
                                                                  "': give all of dilations, groups, pad, pad_type, strides, weight, x");
        // The weight is a const() or a compile-time constant op's output (constexpr_*: int8, LUT or
        // block-wise weights, themselves refused unless relaxed, ANE-35, ANE-38).
        const auto* w = op.arg("weight");
        if (w->kind != mil::Argument::Kind::ref || !consts.count(w->refs[0]))
            throw ConstraintError(constraints::CONV_FORM,
                                  where(op) + ": weight must be a const() (a BLOBFILE) or a constexpr_* op's output "
                                              "(a quantized weight); for runtime weights use matmul");
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

void check_hardware_rules(const mil::Function& fn, const runtime::CompileOptions& options) {
    const runtime::Profile profile = options.profile;
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
        if (op.op.rfind("constexpr_", 0) == 0) consts[op.output] = &op;  // a compile-time constant
        computed.insert(op.output);
        if (profile == runtime::Profile::hardware) check_op(op, consts, types, options.relaxed_ops);
    }
    for (const auto& name : fn.outputs)
        if (!computed.count(name))
            throw ConstraintError(constraints::DEAD_RETURN,
                                  "returned name '" + name + "' is not computed by any op of " + fn.name +
                                      (consts.count(name) ? " (it is a const)" : types.count(name) ? " (it is an input)" : "") +
                                      "; return a value produced by an op (add an identity if needed)");
    if (profile != runtime::Profile::hardware) return;
    const auto check_count = [&](const char* side, size_t count, size_t allowed) {
        if (count > allowed)
            throw ConstraintError(constraints::SURFACE_COUNT,
                                  fn.name + " binds " + std::to_string(count) + " " + side + " surfaces; " +
                                      std::to_string(allowed) + " are proven on the ANE (more than one input failed "
                                      "with 0x1d for maderix/ANE, mechramc/Orion ran up to 6 outputs): pack the " +
                                      side + "s into fewer surfaces (orion.compile_graph does), or pass the "
                                      "surface_counts a probe report proved on this machine");
    };
    check_count("input", fn.inputs.size(), options.max_inputs);
    check_count("output", fn.outputs.size(), options.max_outputs);
    auto check_lanes = [&](const std::string& name, const mil::Type& t, const char* side) {
        if (t.dtype == mil::DType::fp16 && t.is_tensor && !t.shape.empty() && t.shape.back() < 32)
            throw ConstraintError(constraints::FP16_LANES, std::string(side) + " '" + name + "' is " + t.str() +
                                                               "; fp16 I/O needs at least 32 lanes in the last dimension "
                                                               "(pad it, or use fp32 I/O with 16 lanes)");
    };
    for (const auto& p : fn.inputs) check_lanes(p.name, p.type, "input");
    for (const auto& name : fn.outputs) check_lanes(name, types.at(name), "output");
}

}  // namespace orion::frontend
