#include "emulator/emulator.h"

#include <algorithm>
#include <cstring>
#include <unistd.h>
#include <map>
#include <mutex>

#include "emulator/ops.h"
#include "emulator/validate.h"
#include "errors.h"
#include "mil/blobfile.h"
#include "mil/text.h"
#include "runtime/budget.h"

namespace orion::emu {

namespace {

std::string where(const mil::Operation& op) {
    std::string w = "op '" + op.name + "' (" + op.op + ")";
    return op.loc.line > 0 ? "line " + std::to_string(op.loc.line) + ": " + w : w;
}

// Reads a BLOBFILE const's payload out of the weight files: the bytes are copied (baked), so
// later changes to the caller's buffers change nothing (ANE-24).
std::shared_ptr<const std::string> bake_blob(const mil::Operation& op, const runtime::WeightFiles& weights) {
    const mil::Value& v = *op.val;
    auto file = weights.find(v.blob_path);
    if (file == weights.end())
        throw CompileError(where(op) + " reads BLOBFILE '" + v.blob_path + "' but no weight file has that path: pass it in "
                           "weights={'" + v.blob_path + "': bytes}");
    const auto chunk = mil::blobfile::read_chunk(file->second, v.blob_offset, v.blob_path);
    const int64_t expected = v.type.byte_size();
    if (static_cast<int64_t>(chunk.size) != expected)
        throw CompileError(where(op) + ": BLOBFILE '" + v.blob_path + "' chunk at offset " + std::to_string(v.blob_offset) +
                           " holds " + std::to_string(chunk.size) + " bytes but " + v.type.str() + " needs " +
                           std::to_string(expected));
    return std::make_shared<const std::string>(file->second.substr(chunk.data_offset, chunk.size));
}

// Converts between a surface's packed bytes and a frame tensor (the live lanes of each row when
// the tensor is partially live, the whole tensor otherwise).
void load_input(const uint8_t* src, Tensor& t) {
    if (t.partial() && mil::is_float(t.dtype)) {
        for_each_live_row(t, [&](int64_t at, int64_t n) {
            if (t.dtype == mil::DType::fp16)
                kernels::half_to_float(reinterpret_cast<const uint16_t*>(src) + at, t.data.data() + at, static_cast<size_t>(n));
            else
                std::memcpy(t.data.data() + at, src + at * 4, static_cast<size_t>(n) * 4);
        });
        return;
    }
    const size_t n = t.data.size();
    switch (t.dtype) {
        case mil::DType::fp16: kernels::half_to_float(reinterpret_cast<const uint16_t*>(src), t.data.data(), n); break;
        case mil::DType::fp32: std::memcpy(t.data.data(), src, n * 4); break;
        case mil::DType::int32:
            for (size_t i = 0; i < n; ++i) {
                int32_t v;
                std::memcpy(&v, src + 4 * i, 4);
                t.data[i] = static_cast<float>(v);
            }
            break;
        case mil::DType::int8:
            for (size_t i = 0; i < n; ++i) t.data[i] = static_cast<float>(static_cast<int8_t>(src[i]));
            break;
        case mil::DType::uint8:
        case mil::DType::boolean:
            for (size_t i = 0; i < n; ++i) t.data[i] = static_cast<float>(src[i]);
            break;
        default: throw EvaluateError(std::string("unsupported I/O dtype ") + mil::dtype_name(t.dtype));
    }
}

void store_output(const Tensor& t, uint8_t* dst) {
    if (t.partial() && mil::is_float(t.dtype)) {
        for_each_live_row(t, [&](int64_t at, int64_t n) {
            if (t.dtype == mil::DType::fp16)
                kernels::float_to_half(t.data.data() + at, reinterpret_cast<uint16_t*>(dst) + at, static_cast<size_t>(n));
            else
                std::memcpy(dst + at * 4, t.data.data() + at, static_cast<size_t>(n) * 4);
        });
        return;
    }
    const size_t n = t.data.size();
    switch (t.dtype) {
        case mil::DType::fp16: kernels::float_to_half(t.data.data(), reinterpret_cast<uint16_t*>(dst), n); break;
        case mil::DType::fp32: std::memcpy(dst, t.data.data(), n * 4); break;
        case mil::DType::int32:
            for (size_t i = 0; i < n; ++i) {
                const int32_t v = static_cast<int32_t>(t.data[i]);
                std::memcpy(dst + 4 * i, &v, 4);
            }
            break;
        case mil::DType::int8:
        case mil::DType::uint8:
        case mil::DType::boolean:
            for (size_t i = 0; i < n; ++i) dst[i] = static_cast<uint8_t>(static_cast<int32_t>(t.data[i]));
            break;
        default: throw EvaluateError(std::string("unsupported I/O dtype ") + mil::dtype_name(t.dtype));
    }
}

class EmulatedProgram final : public runtime::LoadedProgram {
public:
    EmulatedProgram(std::string_view text, const runtime::WeightFiles& weights, runtime::Profile profile)
        : text_(text), profile_(profile), program_(mil::parse(text)) {
        const mil::Function* fn = program_.find_function("main");
        if (!fn) throw CompileError("the program has no function 'main' (the ANE runs main)");
        check_hardware_rules(*fn, profile);
        build(*fn, weights);
        inputs_ = runtime::sorted_inputs(*fn);
        outputs_ = runtime::sorted_outputs(*fn);
        for (const auto& s : outputs_) {
            output_slots_.push_back(values_[ids_.at(s.name)].slot);
            values_[static_cast<size_t>(output_slots_.back())].needs_fp32 = true;  // stored from fp32 data
        }
        for (const auto& s : inputs_) {
            const int slot = values_[ids_.at(s.name)].slot;
            input_slots_.push_back(slot);
            in_place_.push_back(s.type.dtype == mil::DType::fp16 && !values_[static_cast<size_t>(slot)].needs_fp32);
        }
    }

    void evaluate(const runtime::Bindings& inputs, const runtime::Bindings& outputs,
                  const runtime::LiveLanes& live) override {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!loaded_) throw EvaluateError("the program was unloaded; compile it again");
        runtime::check_bindings(inputs_, inputs, outputs_, outputs, min_surface_bytes_);
        runtime::check_live_lanes(inputs_, live);
        for (size_t i = 0; i < inputs.size(); ++i) {
            Tensor& t = frame_.values[input_slots_[i]];
            auto hint = live.find(inputs_[i].name);
            t.lanes = hint == live.end() ? t.last_dim() : hint->second;
            if (in_place_[i])  // every reader takes fp16 as it is: no conversion
                t.half = reinterpret_cast<const uint16_t*>(inputs[i].second->data());
            else
                load_input(inputs[i].second->data(), t);
        }
        for (const Kernel& k : kernels_) k(frame_);
        for (size_t i = 0; i < outputs.size(); ++i) store_output(frame_.values[output_slots_[i]], outputs[i].second->data());
    }

    void unload() override {
        std::lock_guard<std::mutex> lock(mutex_);
        loaded_ = false;
        kernels_.clear();
        frame_.values.clear();
    }

    bool loaded() const override { return loaded_; }

    // Re-bakes the same MIL with new weights: a new program, no compile counted.
    std::unique_ptr<runtime::LoadedProgram> with_weights(const runtime::WeightFiles& weights) override {
        if (!loaded_) throw CompileError("with_weights: the program was unloaded");
        for (const auto& [key, bytes] : weights) runtime::weight_file_relpath(key);
        auto p = std::make_unique<EmulatedProgram>(text_, weights, profile_);
        p->set_min_surface_bytes(min_surface_bytes_);
        return p;
    }

    const char* backend() const override { return "emulator"; }

private:
    int define(const std::string& name, const mil::Type& type, const mil::Operation* op) {
        if (ids_.count(name)) throw CompileError((op ? where(*op) : "input '" + name + "'") + ": '" + name + "' is defined twice");
        const int id = static_cast<int>(values_.size());
        ids_[name] = id;
        values_.push_back(ValueInfo{type, id, nullptr, nullptr, false});
        return id;
    }

    int lookup(const mil::Operation& op, const std::string& ref) const {
        auto it = ids_.find(ref);
        if (it == ids_.end()) throw CompileError(where(op) + " uses '" + ref + "', which is not defined before it");
        return it->second;
    }

    void build(const mil::Function& fn, const runtime::WeightFiles& weights) {
        for (const auto& p : fn.inputs) define(p.name, p.type, nullptr);
        for (const auto& op : fn.body) {
            if (op.op == "const") {
                if (!op.val) throw CompileError(where(op) + " has no val");
                const int id = define(op.output, op.type, &op);
                values_[id].constant = &*op.val;
                if (op.val->kind == mil::Value::Kind::blob) values_[id].blob = bake_blob(op, weights);
                continue;
            }
            std::vector<int> arg_ids;
            std::vector<std::vector<int>> tuple_ids;
            for (const auto& a : op.args) {
                std::vector<int> ids;
                int single = -1;
                if (a.kind == mil::Argument::Kind::literal) {  // permissive profile only
                    single = static_cast<int>(values_.size());
                    values_.push_back(ValueInfo{a.literal.type, single, &a.literal, nullptr, false});
                } else if (a.kind == mil::Argument::Kind::ref) {
                    single = lookup(op, a.refs[0]);
                } else {
                    for (const auto& r : a.refs) ids.push_back(lookup(op, r));
                }
                arg_ids.push_back(single);
                tuple_ids.push_back(std::move(ids));
            }
            const OpBuilder builder = find_op(op.op);
            if (!builder) throw CompileError(where(op) + ": unknown op '" + op.op + "'");
            const int out = static_cast<int>(values_.size());  // the slot define() will give
            OpContext ctx(op, values_, arg_ids, std::move(tuple_ids), out);
            BuiltOp built = builder(ctx);
            if (built.type != op.type)
                throw CompileError(where(op) + " declares " + op.type.str() + " but its inputs give " + built.type.str());
            const int id = define(op.output, op.type, &op);
            if (built.view_of >= 0) {
                values_[id].slot = built.view_of;  // shares the data; no kernel to run
                continue;
            }
            kernels_.push_back(std::move(built.kernel));
        }
        check_frame_size();
        frame_.values.resize(values_.size());
        for (size_t i = 0; i < values_.size(); ++i) {
            const ValueInfo& v = values_[i];
            if (v.slot != static_cast<int>(i)) continue;  // a view: its data lives in another slot
            Tensor& t = frame_.values[v.slot];
            t.dtype = v.type.dtype;
            t.shape = v.type.shape;
            t.lanes = t.last_dim();
            const bool is_const = v.constant != nullptr;
            if (is_const && !v.used_as_data) continue;  // read at build time only (e.g. packed conv weights)
            if (!is_const) {
                t.data.assign(static_cast<size_t>(v.type.element_count()), 0.0f);
            } else if (v.blob) {
                t.data = blob_floats(v);
            } else {
                t.data.assign(v.constant->numbers.begin(), v.constant->numbers.end());
                finish(t);  // an fp16 const holds the fp16 nearest its literal
            }
        }
    }

    // The emulator holds every intermediate tensor in fp32: refuse, with the culprit named, a program
    // that cannot fit in half of this machine's memory instead of failing deep inside an allocation.
    void check_frame_size() const {
        double bytes = 0, largest = 0;
        const ValueInfo* worst = nullptr;
        for (size_t i = 0; i < values_.size(); ++i) {
            const ValueInfo& v = values_[i];
            if (v.slot != static_cast<int>(i) || (v.constant && !v.used_as_data)) continue;
            const double b = 4.0 * static_cast<double>(v.type.element_count());
            bytes += b;
            if (b > largest) largest = b, worst = &v;
        }
        const double limit = 0.5 * static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
        if (worst && limit > 0 && bytes > limit) {
            std::string name;
            for (const auto& [n, id] : ids_)
                if (&values_[id] == worst) name = n;
            throw CompileError("the program needs " + std::to_string(static_cast<int64_t>(bytes / 1e9)) +
                               " GB of emulator memory (largest tensor '" + name + "', " + worst->type.str() +
                               "), more than half of this machine's; split it into smaller programs");
        }
    }

    std::string text_;
    runtime::Profile profile_;
    mil::Program program_;  // owns the statements that values_ point into
    std::map<std::string, int> ids_;
    std::vector<ValueInfo> values_;
    std::vector<Kernel> kernels_;
    std::vector<int> input_slots_, output_slots_;
    std::vector<bool> in_place_;  // per input: fp16 read in place from the surface (Tensor::half)
    Frame frame_;
    std::mutex mutex_;
    bool loaded_ = true;
};

}  // namespace

std::unique_ptr<runtime::LoadedProgram> compile(std::string_view mil_text, const runtime::WeightFiles& weights,
                                                runtime::Profile profile) {
    runtime::consume_compile();
    return build(mil_text, weights, profile);
}

std::unique_ptr<runtime::LoadedProgram> build(std::string_view mil_text, const runtime::WeightFiles& weights,
                                              runtime::Profile profile) {
    for (const auto& [key, bytes] : weights) runtime::weight_file_relpath(key);
    return std::make_unique<EmulatedProgram>(mil_text, weights, profile);
}

std::pair<std::vector<runtime::TensorSpec>, std::vector<runtime::TensorSpec>> check(
    std::string_view mil_text, const runtime::WeightFiles& weights, runtime::Profile profile) {
    for (const auto& [key, bytes] : weights) runtime::weight_file_relpath(key);
    EmulatedProgram p(mil_text, weights, profile);
    return {p.inputs(), p.outputs()};
}

runtime::Backend backend() {
    runtime::Backend b;
    b.name = "emulator";
    b.compile = &compile;
    b.probe = [] { return runtime::BackendStatus{"emulator", true, "software ANE emulator (always available)"}; };
    b.surfaces = []() -> const runtime::SurfaceAllocator* { return nullptr; };
    return b;
}

}  // namespace orion::emu
