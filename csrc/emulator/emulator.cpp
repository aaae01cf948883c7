#include "emulator/emulator.h"

#include <algorithm>
#include <cstring>
#include <unistd.h>
#include <map>

#include "emulator/ops.h"
#include "errors.h"
#include "mil/blobfile.h"
#include "runtime/budget.h"

namespace orion::emu {

namespace {

using frontend::where;

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
    if (n == 0) return;  // an empty tensor (memcpy may not be given its null data)
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
        default: throw EvaluateError(std::string("unsupported I/O dtype ") + mil::dtype_name(t.dtype) + " (the front end refuses it at compile)");
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
    if (n == 0) return;  // an empty tensor (memcpy may not be given its null data)
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
        default: throw EvaluateError(std::string("unsupported I/O dtype ") + mil::dtype_name(t.dtype) + " (the front end refuses it at compile)");
    }
}

// The compile-time state of a program: one ValueInfo per variable, and per op the ids its
// builder reads. The type step fills it for the whole program before the kernel step allocates.
class ProgramModel {
public:
    ProgramModel(const mil::Function& fn, const runtime::WeightFiles& weights) {
        for (const auto& p : fn.inputs) define(p.name, p.type);
        for (const auto& op : fn.body) {
            if (op.op == "const") {
                const int id = define(op.output, op.type);
                values_[id].constant = &*op.val;
                if (op.val->kind == mil::Value::Kind::blob) values_[id].blob = payload(*op.val, weights);
                continue;
            }
            Step step{&op, find_op(op.op), {}, {}, -1};
            if (!step.build) throw CompileError(where(op) + ": the emulator has no kernel for '" + op.op + "'");
            for (const auto& a : op.args) {
                std::vector<int> ids;
                int single = -1;
                if (a.kind == mil::Argument::Kind::literal) {  // permissive profile only
                    single = static_cast<int>(values_.size());
                    values_.push_back(ValueInfo{a.literal.type, single, &a.literal, std::nullopt, false, false});
                } else if (a.kind == mil::Argument::Kind::ref) {
                    single = ids_.at(a.refs[0]);  // the front end checked every name is defined before use
                } else {
                    for (const auto& r : a.refs) ids.push_back(ids_.at(r));
                }
                step.arg_ids.push_back(single);
                step.tuple_ids.push_back(std::move(ids));
            }
            step.out = static_cast<int>(values_.size());  // the slot define() gives
            OpContext ctx(op, values_, step.arg_ids, step.tuple_ids, step.out, /*types_only=*/true);
            const BuiltOp typed = step.build(ctx);
            if (typed.type != op.type)
                throw CompileError(where(op) + " declares " + op.type.str() + " but its inputs give " + typed.type.str());
            scratch_bytes_ += typed.scratch_bytes;
            const int id = define(op.output, op.type);
            if (typed.view_of >= 0) values_[id].slot = typed.view_of;
            steps_.push_back(std::move(step));
        }
    }

    // The fp32 memory the kernel step and the frame will hold at most: every tensor that owns its
    // data, every const (its payload may be materialised), and the builders' scratch.
    double planned_bytes(const ValueInfo** largest) const {
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

    std::string name_of(const ValueInfo* v) const {
        for (const auto& [n, id] : ids_)
            if (&values_[id] == v) return n;
        return "";
    }

    struct Step {
        const mil::Operation* op;
        OpBuilder build;
        std::vector<int> arg_ids;
        std::vector<std::vector<int>> tuple_ids;
        int out;
    };

    std::map<std::string, int> ids_;
    std::vector<ValueInfo> values_;
    std::vector<Step> steps_;

private:
    int define(const std::string& name, const mil::Type& type) {
        const int id = static_cast<int>(values_.size());
        ids_[name] = id;
        values_.push_back(ValueInfo{type, id, nullptr, std::nullopt, false, false});
        return id;
    }

    static std::string_view payload(const mil::Value& v, const runtime::WeightFiles& weights) {
        const std::string_view file = weights.at(v.blob_path);  // the front end checked path and size
        const auto chunk = mil::blobfile::read_chunk(file, v.blob_offset, v.blob_path);
        return file.substr(chunk.data_offset, chunk.size);
    }

    double scratch_bytes_ = 0;
};

class EmulatedProgram final : public runtime::LoadedProgram {
public:
    EmulatedProgram(std::string_view text, frontend::CheckedProgram checked, ProgramModel model,
                    runtime::CompileOptions options)
        : text_(text), options_(std::move(options)), program_(std::move(checked.program)), model_(std::move(model)) {
        inputs_ = std::move(checked.inputs);
        outputs_ = std::move(checked.outputs);
        build_kernels();
        for (const auto& s : outputs_) {
            output_slots_.push_back(values()[model_.ids_.at(s.name)].slot);
            values()[static_cast<size_t>(output_slots_.back())].needs_fp32 = true;  // stored from fp32 data
        }
        for (const auto& s : inputs_) {
            const int slot = values()[model_.ids_.at(s.name)].slot;
            input_slots_.push_back(slot);
            in_place_.push_back(s.type.dtype == mil::DType::fp16 && !values()[static_cast<size_t>(slot)].needs_fp32);
        }
        for (auto& v : values()) v.blob.reset();  // the caller's weight buffers are not kept
    }

    const char* backend() const override { return "emulator"; }

private:
    // After the shared checks (runtime::LoadedProgram::evaluate), under the program's lock.
    void run(const runtime::Bindings& inputs, const runtime::Bindings& outputs,
             const runtime::LiveLanes& live) override {
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

    void release() override {
        kernels_.clear();
        frame_.values.clear();
    }

    // Re-bakes the same MIL with new weights: a new program, no compile counted.
    std::unique_ptr<runtime::LoadedProgram> reload(const runtime::WeightFiles& weights) override {
        return build(text_, weights, options_);
    }

    std::vector<ValueInfo>& values() { return model_.values_; }

    // The kernel step, after the type step passed for every op and the memory guard.
    void build_kernels() {
        check_frame_size();
        for (const auto& step : model_.steps_) {
            OpContext ctx(*step.op, values(), step.arg_ids, step.tuple_ids, step.out, /*types_only=*/false);
            BuiltOp built = step.build(ctx);
            if (built.view_of < 0) kernels_.push_back(std::move(built.kernel));
        }
        frame_.values.resize(values().size());
        for (size_t i = 0; i < values().size(); ++i) {
            const ValueInfo& v = values()[i];
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
    // that cannot fit in half of this machine's memory, before anything is allocated. The host-memory
    // limit is the emulator's alone: the ane backend never runs it.
    void check_frame_size() const {
        const ValueInfo* worst = nullptr;
        const double bytes = model_.planned_bytes(&worst);
        const double limit = 0.5 * static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
        if (worst && limit > 0 && bytes > limit)
            throw CompileError("the program needs " + std::to_string(static_cast<int64_t>(bytes / 1e9)) +
                               " GB of emulator memory (largest tensor '" + model_.name_of(worst) + "', " +
                               worst->type.str() + "), more than half of this machine's; split it into smaller programs");
    }

    std::string text_;
    runtime::CompileOptions options_;
    mil::Program program_;  // owns the statements that the model points into
    ProgramModel model_;
    std::vector<Kernel> kernels_;
    std::vector<int> input_slots_, output_slots_;
    std::vector<bool> in_place_;  // per input: fp16 read in place from the surface (Tensor::half)
    Frame frame_;
};

std::unique_ptr<runtime::LoadedProgram> build_checked(std::string_view text, const runtime::WeightFiles& weights,
                                                      const runtime::CompileOptions& options, bool count_compile) {
    frontend::CheckedProgram checked = frontend::check(text, weights, options);
    ProgramModel model(checked.main(), weights);
    if (count_compile) runtime::consume_compile();
    return std::make_unique<EmulatedProgram>(text, std::move(checked), std::move(model), options);
}

runtime::Backend backend() {
    runtime::Backend b;
    b.name = "emulator";
    b.compile = &compile;
    b.probe = [] { return runtime::BackendStatus{"emulator", true, "software ANE emulator (always available)"}; };
    b.surfaces = []() -> const runtime::SurfaceAllocator* { return nullptr; };
    return b;
}

[[maybe_unused]] const bool registered = (runtime::register_backend(backend()), true);

}  // namespace

std::unique_ptr<runtime::LoadedProgram> compile(std::string_view mil_text, const runtime::WeightFiles& weights,
                                                const runtime::CompileOptions& options) {
    return build_checked(mil_text, weights, options, /*count_compile=*/true);
}

std::unique_ptr<runtime::LoadedProgram> build(std::string_view mil_text, const runtime::WeightFiles& weights,
                                              const runtime::CompileOptions& options) {
    return build_checked(mil_text, weights, options, /*count_compile=*/false);
}

void check_types(const frontend::CheckedProgram& checked, const runtime::WeightFiles& weights) {
    const ProgramModel typed(checked.main(), weights);  // throws on the first op whose type does not check
    (void)typed;
}

}  // namespace orion::emu
