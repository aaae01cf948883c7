#include "emulator/program_model.h"

#include <optional>
#include <utility>

#include "errors.h"
#include "mil/blobfile.h"

namespace orion::emu {

namespace {

// A BLOBFILE const's payload bytes in the caller's weight file.
std::string_view payload(const mil::Value& v, const runtime::WeightFiles& weights) {
    const std::string_view file = weights.at(v.blob_path);  // the front end checked path and size
    const auto chunk = mil::blobfile::read_chunk(file, v.blob_offset, v.blob_path);
    return file.substr(chunk.data_offset, chunk.size);
}

}  // namespace

ProgramModel::ProgramModel(const mil::Function& fn, std::vector<frontend::TypedOp> typed,
                           const runtime::WeightFiles& weights, const std::map<std::string, runtime::InputPart>& cuts,
                           const runtime::CompileOptions& options) {
    for (const auto& p : fn.inputs) define(p.name, p.type);
    for (size_t i = 0; i < fn.body.size(); ++i) {
        const mil::Operation& op = fn.body[i];
        if (cuts.count(op.output)) {
            define(op.output, op.type);
            continue;
        }
        if (op.op == "const") {
            const int id = define(op.output, op.type);
            values_[id].constant = &*op.val;
            if (op.val->kind == mil::Value::Kind::blob) {
                values_[id].blob = payload(*op.val, weights);
                if (auto key = options.weight_keys.find(op.val->blob_path); key != options.weight_keys.end()) {
                    ValueInfo& v = values_[id];
                    v.blob_key = key->second + "@" + std::to_string(op.val->blob_offset);
                    const std::string prefix = v.blob_key + "/";
                    for (auto it = options.packed_weights.lower_bound(prefix);
                         it != options.packed_weights.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
                        v.packed_files.insert(*it);
                }
            }
            continue;
        }
        Step step{&op, find_op(op.op), {}, {}, -1, std::move(typed[i])};
        if (!step.build) throw CompileError(frontend::where(op) + ": the emulator has no kernel for '" + op.op + "'");
        for (const auto& a : op.args) {
            std::vector<int> ids;
            int single = -1;
            if (a.kind == mil::Argument::Kind::literal) {  // permissive profile only
                single = static_cast<int>(values_.size());
                values_.push_back(ValueInfo{a.literal.type, single, &a.literal, std::nullopt, false, false, {}, {}, {}, {}});
            } else if (a.kind == mil::Argument::Kind::ref) {
                single = ids_.at(a.refs[0]);  // the front end checked every name is defined before use
            } else {
                for (const auto& r : a.refs) ids.push_back(ids_.at(r));
            }
            step.arg_ids.push_back(single);
            step.tuple_ids.push_back(std::move(ids));
        }
        step.out = static_cast<int>(values_.size());  // the slot define() gives
        OpContext ctx(op, step.typed, values_, step.arg_ids, step.tuple_ids, step.out, /*plan_only=*/true);
        const BuiltOp planned = step.build(ctx);
        scratch_bytes_ += planned.scratch_bytes;
        const int id = define(op.output, op.type);
        if (planned.view_of >= 0) values_[id].slot = planned.view_of;
        values_[id].compressed = planned.compressed;
        steps_.push_back(std::move(step));
    }
}

double ProgramModel::planned_bytes(const ValueInfo** largest) const {
    double bytes = scratch_bytes_, worst = 0;
    for (size_t i = 0; i < values_.size(); ++i) {
        const ValueInfo& v = values_[i];
        if (v.slot != static_cast<int>(i)) continue;  // a view
        const double b = 4.0 * static_cast<double>(v.type.element_count()) +
                         (v.blob ? static_cast<double>(v.blob->size()) : 0.0);
        bytes += b;
        if (b > worst) worst = b, *largest = &v;
    }
    return bytes;
}

std::string ProgramModel::name_of(const ValueInfo* v) const {
    for (const auto& [n, id] : ids_)
        if (&values_[id] == v) return n;
    return "";
}

int ProgramModel::arg(const Step& step, const char* name) {
    for (size_t a = 0; a < step.op->args.size(); ++a)
        if (step.op->args[a].name == name) return step.arg_ids[a];
    return -1;
}

std::map<int, const Step*> ProgramModel::producers() const {
    std::map<int, const Step*> producer;
    for (const auto& step : steps_) producer[step.out] = &step;
    return producer;
}

int ProgramModel::define(const std::string& name, const mil::Type& type) {
    const int id = static_cast<int>(values_.size());
    ids_[name] = id;
    values_.push_back(ValueInfo{type, id, nullptr, std::nullopt, false, false, {}, {}, {}, {}});
    return id;
}

}  // namespace orion::emu
