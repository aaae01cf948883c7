#include "frontend/frontend.h"

#include <algorithm>
#include <map>
#include <set>

#include "errors.h"
#include "frontend/rules.h"
#include "hardware_limits.h"
#include "mil/blobfile.h"
#include "mil/op_table.h"
#include "mil/text.h"

namespace orion::frontend {

namespace {

// A constexpr op written with its parameters as attributes (the form coremltools writes for the iOS 16
// ops) or as inline values (its form for the iOS 18 compression ops) becomes, for the checks and the
// emulator, the operand form: one const per parameter, named `<output>_<parameter>` (underscores added
// until the name is free), passed as the argument of that name. The text sent to the device is left as
// written.
void expand_constexpr_attributes(mil::Function& fn) {
    std::set<std::string> taken;
    for (const auto& in : fn.inputs) taken.insert(in.name);
    for (const auto& op : fn.body) taken.insert({op.output, op.name});
    std::vector<mil::Operation> body;
    body.reserve(fn.body.size());
    for (auto& op : fn.body) {
        for (auto& [key, value] : op.attributes) {
            if (op.arg(key))
                throw CompileError(where(op) + ": '" + key + "' is given both as an argument and as an attribute");
            std::string name = op.output + "_" + key;
            while (taken.count(name)) name += "_";
            taken.insert(name);
            mil::Operation c;
            c.op = "const", c.output = name, c.name = name, c.type = value.type, c.loc = op.loc;
            c.val = std::move(value);
            body.push_back(std::move(c));
            op.args.push_back(mil::Argument::reference(key, name));
        }
        op.attributes.clear();
        if (op.op.rfind("constexpr_", 0) == 0)
            for (auto& a : op.args) {
                if (a.kind != mil::Argument::Kind::literal) continue;
                std::string name = op.output + "_" + a.name;
                while (taken.count(name)) name += "_";
                taken.insert(name);
                mil::Operation c;
                c.op = "const", c.output = name, c.name = name, c.type = a.literal.type, c.loc = op.loc;
                c.val = std::move(a.literal);
                body.push_back(std::move(c));
                a = mil::Argument::reference(a.name, name);
            }
        body.push_back(std::move(op));
    }
    fn.body = std::move(body);
}

std::string joined(const std::vector<std::string>& names) {
    std::string out;
    for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
    return out;
}

// Every statement uses names defined before it, and every op's arguments match its op-table row.
void check_statements(const mil::Function& fn) {
    std::set<std::string> defined;
    for (const auto& p : fn.inputs) defined.insert(p.name);
    for (const auto& op : fn.body) {
        if (op.op == "const") {
            if (!op.val) throw CompileError(where(op) + " has no val");
        } else {
            const mil::OpSpec* spec = mil::find_op_spec(op.op);
            if (!spec) throw CompileError(where(op) + ": unknown op '" + op.op + "'");
            for (const auto& r : spec->required)
                if (!op.arg(r)) throw CompileError(where(op) + ": missing required argument '" + r + "'");
            for (const auto& a : op.args) {
                const auto known = [&](const std::vector<std::string>& names) {
                    return std::find(names.begin(), names.end(), a.name) != names.end();
                };
                if (!known(spec->required) && !known(spec->optional)) {
                    std::vector<std::string> all = spec->required;
                    all.insert(all.end(), spec->optional.begin(), spec->optional.end());
                    throw CompileError(where(op) + ": unknown argument '" + a.name + "' (expected: " + joined(all) + ")");
                }
                for (const auto& r : a.refs)
                    if (!defined.count(r))
                        throw CompileError(where(op) + " uses '" + r + "', which is not defined before it");
            }
        }
        if (!defined.insert(op.output).second)
            throw CompileError(where(op) + ": '" + op.output + "' is defined twice");
    }
}

// The dtypes a surface can carry in both directions (the emulator converts these, the ANE runs them).
bool is_io_dtype(mil::DType d) {
    using mil::DType;
    return d == DType::fp16 || d == DType::fp32 || d == DType::int32 || d == DType::int8 || d == DType::uint8 ||
           d == DType::boolean;
}

void check_io(const mil::Function& fn, const std::vector<runtime::TensorSpec>& inputs,
              const std::vector<runtime::TensorSpec>& outputs) {
    std::set<std::string> returned;
    for (const auto& name : fn.outputs)
        if (!returned.insert(name).second)
            throw CompileError("function " + fn.name + " returns '" + name +
                               "' twice: return each value once (add an identity for a second copy)");
    for (const auto* side : {&inputs, &outputs})
        for (const auto& s : *side) {
            if (!is_io_dtype(s.type.dtype))
                throw CompileError(std::string(side == &inputs ? "input '" : "output '") + s.name + "' is " + s.type.str() +
                                   ": I/O tensors must be fp16, fp32, int32, int8, uint8 or bool; cast it inside the "
                                   "program");
        }
}

// Each BLOBFILE const names a given weight file whose chunk at its offset holds exactly its bytes.
void check_weights(const mil::Function& fn, const runtime::WeightFiles& weights) {
    for (const auto& op : fn.body) {
        if (op.op != "const" || !op.val || op.val->kind != mil::Value::Kind::blob) continue;
        const mil::Value& v = *op.val;
        auto file = weights.find(v.blob_path);
        if (file == weights.end())
            throw CompileError(where(op) + " reads BLOBFILE '" + v.blob_path +
                               "' but no weight file has that path: pass it in weights={'" + v.blob_path + "': bytes}");
        const auto chunk = mil::blobfile::read_chunk(file->second, v.blob_offset, v.blob_path);
        const int64_t expected = v.type.byte_size();
        if (static_cast<int64_t>(chunk.size) != expected)
            throw CompileError(where(op) + ": BLOBFILE '" + v.blob_path + "' chunk at offset " +
                               std::to_string(v.blob_offset) + " holds " + std::to_string(chunk.size) + " bytes but " +
                               v.type.str() + " needs " + std::to_string(expected));
    }
}

}  // namespace

std::string where(const mil::Operation& op) {
    std::string w = "op '" + op.name + "' (" + op.op + ")";
    return op.loc.line > 0 ? "line " + std::to_string(op.loc.line) + ": " + w : w;
}

void check_weight_keys(const runtime::WeightFiles& weights) {
    if (weights.size() > limits::MAX_WEIGHT_FILES)
        throw CompileError(std::to_string(weights.size()) + " weight files are over MAX_WEIGHT_FILES (" +
                           std::to_string(limits::MAX_WEIGHT_FILES) + "): pack tensors into fewer BLOBFILEs");
    for (const auto& [key, bytes] : weights) runtime::weight_file_relpath(key);
}

CheckedProgram check(std::string_view text, const runtime::WeightFiles& weights, const runtime::CompileOptions& options) {
    check_weight_keys(weights);
    CheckedProgram checked{mil::parse(text), {}, {}, {}, {}};
    for (auto& f : checked.program.functions) expand_constexpr_attributes(f);
    const mil::Function* fn = checked.program.find_function("main");
    if (!fn) throw CompileError("the program has no function 'main' (the ANE runs main)");
    check_hardware_rules(*fn, options);  // first: a broken rule is named by its id
    check_statements(*fn);
    checked.inputs = runtime::sorted_inputs(*fn);
    checked.outputs = runtime::sorted_outputs(*fn);
    check_io(*fn, checked.inputs, checked.outputs);
    check_weights(*fn, weights);
    checked.typed = check_types(*fn);
    checked.cuts = find_input_cuts(*fn, checked.inputs, checked.typed);
    return checked;
}

}  // namespace orion::frontend
