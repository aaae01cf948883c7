#include "emulator/emulator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <unistd.h>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "emulator/buffer_pool.h"
#include "emulator/causal_attention.h"
#include "emulator/decode_attention.h"
#include "emulator/rotary.h"
#include "emulator/stable_norm.h"
#include "emulator/const_fold.h"
#include "emulator/fused_elementwise.h"
#include "emulator/ops.h"
#include "emulator/packed_outputs.h"
#include "emulator/profile.h"
#include "emulator/shared_consts.h"
#include "emulator/surface_io.h"
#include "errors.h"
#include "mil/blobfile.h"
#include "runtime/budget.h"

namespace orion::emu {

namespace {

using frontend::where;

// Zeroes lanes [from, to) of every row of t's last axis (dead lanes a kernel reads as finite values).
void zero_lanes(Tensor& t, int64_t from, int64_t to) {
    const int64_t width = t.last_dim();
    if (t.data.empty() || from >= to || width <= 0) return;
    for (int64_t row = 0; row < t.size(); row += width)
        std::fill(t.data.begin() + row + from, t.data.begin() + row + std::min(to, width), 0.0f);
}

// The compile-time state of a program: one ValueInfo per variable, and per op the ids its
// builder reads and the front end's type-step results. The plan step fills it for the whole
// program before the kernel step allocates.
class ProgramModel {
public:
    // `cuts`: the values cut from input surfaces (frontend::InputCuts::ranges): no op computes them;
    // the program reads the ones it uses from their place in the surface (EmulatedProgram::plan_loads).
    ProgramModel(const mil::Function& fn, std::vector<frontend::TypedOp> typed, const runtime::WeightFiles& weights,
                 const std::map<std::string, runtime::InputPart>& cuts,
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
            if (!step.build) throw CompileError(where(op) + ": the emulator has no kernel for '" + op.op + "'");
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
        frontend::TypedOp typed;  // its output type and what its type rule derived
    };

    // The value id of argument `name` of `step`, or -1.
    static int arg(const Step& step, const char* name) {
        for (size_t a = 0; a < step.op->args.size(); ++a)
            if (step.op->args[a].name == name) return step.arg_ids[a];
        return -1;
    }

    // The step computing each value, by value id.
    std::map<int, const Step*> producers() const {
        std::map<int, const Step*> producer;
        for (const auto& step : steps_) producer[step.out] = &step;
        return producer;
    }

    std::map<std::string, int> ids_;
    std::vector<ValueInfo> values_;
    std::vector<Step> steps_;

private:
    int define(const std::string& name, const mil::Type& type) {
        const int id = static_cast<int>(values_.size());
        ids_[name] = id;
        values_.push_back(ValueInfo{type, id, nullptr, std::nullopt, false, false, {}, {}, {}, {}});
        return id;
    }

    static std::string_view payload(const mil::Value& v, const runtime::WeightFiles& weights) {
        const std::string_view file = weights.at(v.blob_path);  // the front end checked path and size
        const auto chunk = mil::blobfile::read_chunk(file, v.blob_offset, v.blob_path);
        return file.substr(chunk.data_offset, chunk.size);
    }

    double scratch_bytes_ = 0;
};

// Intermediates below this many elements (16 KiB of fp32) keep their own buffer. Larger ones are
// pooled: a short prompt's [768, 16] tensors or a decode program's padded I/O, held by each program
// of a bucket, came to about 2 MiB a program (28 MiB for GPT-2's 16-token bucket); a take and a give
// cost well under a microsecond, so a decode step's hundred of them are noise.
constexpr int64_t kMinPooledElements = int64_t{1} << 12;

// The kernels of a program in order, each with the steps it computes, its profile row and cost, and
// the pooled buffers taken before it and given back after it (plan_buffers).
struct ScheduledKernel {
    Kernel run;
    std::vector<const ProgramModel::Step*> steps;
    std::string kind;                   // the profile's row: the op's kind, or the fused group's
    profile::Cost cost;                 // bytes and FLOPs by its operand and result types
    std::vector<int> acquire, release;  // pooled slots taken before it / given back after it
    std::vector<int> settle;  // slots it reads that must be whole (settle_prefix): it ignores live prefixes
};

// A fused group's own kernels by step (its fallback), gathered until its last step.
using GroupParts = std::map<const ProgramModel::Step*, Kernel>;

// A fused group of steps: the last of them, where its one kernel is added, and what adds it.
struct FusedGroup {
    const ProgramModel::Step* last = nullptr;
    std::function<void(GroupParts&)> add;
};

struct Schedule {
    std::vector<ScheduledKernel> kernels;
    std::vector<int> acquire_inputs, release_end;  // pooled slots taken before the input loads / given after the stores
};

class EmulatedProgram final : public runtime::LoadedProgram {
public:
    EmulatedProgram(std::string_view text, frontend::CheckedProgram checked, ProgramModel model,
                    runtime::CompileOptions options)
        : text_(text), options_(std::move(options)), program_(std::move(checked.program)), model_(std::move(model)) {
        inputs_ = std::move(checked.inputs);
        outputs_ = std::move(checked.outputs);
        used_parts_ = std::move(checked.cuts.parts);
        for (auto& [name, part] : checked.cuts.ranges) {
            cut_values_.insert(model_.ids_.at(name));
            parts_.push_back(std::move(part));
        }
        fold_constants();
        build_kernels();
        drop_build_state();
    }

    ~EmulatedProgram() override { buffer_pool::clear(); }

    const char* backend() const override { return "emulator"; }

private:
    // After the shared checks (runtime::LoadedProgram::evaluate), under the program's lock.
    void run(const runtime::Bindings& inputs, const runtime::Bindings& outputs,
             const runtime::LiveLanes& live) override {
        allocate_frame();
        const bool profiling = profile::enabled();
        const auto start = profiling ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
        for (int slot : schedule_.acquire_inputs) frame_.values[slot].data = buffer_pool::take(pooled_size(slot));
        io_.load(inputs, live, frame_);
        if (profiling) return run_profiled(outputs, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        for (const ScheduledKernel& kernel : schedule_.kernels) run_kernel(kernel);
        store_outputs(outputs);
    }

    // The frame's own (unpooled) tensors, zeroed, on the first evaluate: compiling a program costs no
    // memory of its data, so programs compiled and never run (other prefill buckets, a program that
    // only checks) hold nothing.
    void allocate_frame() {
        for (int slot : unallocated_)
            frame_.values[static_cast<size_t>(slot)].data.assign(pooled_size(slot), 0.0f);
        unallocated_.clear();
    }

    // A kernel with the pooled buffers of the values it defines taken before it and those whose
    // last reader it is given back after it.
    void run_kernel(const ScheduledKernel& kernel) {
        for (int slot : kernel.acquire) frame_.values[slot].data = buffer_pool::take(pooled_size(slot));
        for (int slot : kernel.settle) settle_prefix(frame_.values[slot]);
        kernel.run(frame_);
        for (int slot : kernel.release) buffer_pool::give(std::exchange(frame_.values[slot].data, {}));
    }

    size_t pooled_size(int slot) const { return slot_elements_[static_cast<size_t>(slot)]; }

    // Stores the outputs, then gives back the pooled buffers live to the end (the outputs').
    void store_outputs(const runtime::Bindings& outputs) {
        for (const auto& out : io_.outputs) settle_prefix(frame_.values[static_cast<size_t>(out.slot)]);  // stored whole
        io_.store(outputs, frame_);
        for (int slot : schedule_.release_end) buffer_pool::give(std::exchange(frame_.values[slot].data, {}));
    }

    // The kernels and the output stores of run(), each timed and recorded per op kind; the input
    // loads took load_seconds. Surface loads and stores are the "(io)" row.
    void run_profiled(const runtime::Bindings& outputs, double load_seconds) {
        using clock = std::chrono::steady_clock;
        std::map<std::string, profile::Row> by_kind;
        for (const ScheduledKernel& kernel : schedule_.kernels) {
            const auto start = clock::now();
            run_kernel(kernel);
            const double seconds = std::chrono::duration<double>(clock::now() - start).count();
            profile::Row& row = by_kind[kernel.kind];
            row.calls += 1, row.seconds += seconds;
            row.bytes += kernel.cost.bytes, row.flops += kernel.cost.flops;
        }
        const auto start = clock::now();
        store_outputs(outputs);
        profile::Row& io = by_kind["(io)"];
        io.calls += 1;
        io.seconds += load_seconds + std::chrono::duration<double>(clock::now() - start).count();
        for (const auto& s : inputs_) io.bytes += static_cast<double>(s.type.byte_size());
        for (const auto& s : outputs_) io.bytes += static_cast<double>(s.type.byte_size());
        std::vector<profile::Row> rows;
        for (auto& [kind, row] : by_kind) {
            row.program = label_, row.op = kind;
            rows.push_back(std::move(row));
        }
        profile::record(rows);
    }

    void release() override {
        schedule_ = {};
        unallocated_.clear();
        frame_.values.clear();
        buffer_pool::clear();
    }

    // Re-bakes the same MIL with new weights: a new program, no compile counted.
    std::unique_ptr<runtime::LoadedProgram> reload(const runtime::WeightFiles& weights) override {
        runtime::CompileOptions options = options_;
        options.weight_keys.clear();  // they named the compiled files' bytes, not these: shared by content
        options.packed_weights.clear();
        return build(text_, weights, options);
    }

    std::vector<ValueInfo>& values() { return model_.values_; }

    // Once the kernels are built, a program runs on its schedule, frame, I/O plan and each slot's
    // element count alone: the parsed MIL, the model of its values and steps, the folded consts and
    // the build's bookkeeping are freed (a 1024-lane prefill layer's came to ~0.3 MB, kept by every
    // program of every bucket: SmolLM2-135M's ~190 programs held ~50 MB). The MIL text stays (reload).
    void drop_build_state() {
        slot_elements_.resize(values().size());
        for (size_t i = 0; i < values().size(); ++i)
            slot_elements_[i] = static_cast<size_t>(values()[i].type.element_count());
        auto free = [](auto& member) { std::decay_t<decltype(member)>().swap(member); };  // `= {}` keeps a vector's capacity
        for (ScheduledKernel& kernel : schedule_.kernels) free(kernel.steps);
        free(model_.ids_), free(model_.values_), free(model_.steps_), free(program_.functions), free(folded_);
        free(used_parts_), free(cut_values_), free(unread_), free(unmaterialised_), free(held_masks_), free(internal_);
    }

    // Folds every op whose operands are all constants (const_fold.h): its result becomes a constant and
    // the op leaves the program, up to kMaxFoldedElements per program. Views (a reshape of a const) stay
    // views: they cost nothing. Returned values stay ops (their frame slot is stored at every evaluate),
    // and so do quantized weights (kept int8). A folded value is computed only when a remaining op reads
    // it, and not at all when a program still holds the values of its derivation (fold_key): then the
    // ops it was folded from are not computed either.
    void fold_constants() {
        std::set<int> returned;
        for (const auto& spec : outputs_) returned.insert(model_.ids_.at(spec.name));
        std::vector<ProgramModel::Step> kept;
        std::map<int, ProgramModel::Step> folds;  // by the value each computes
        std::vector<std::optional<std::string>> keys(values().size());  // set for the values folded here
        int64_t computed = 0;
        for (auto& step : model_.steps_) {
            ValueInfo& out = values()[static_cast<size_t>(step.out)];
            // A constexpr op's output stays compressed (ValueInfo::compressed): conv reads int8, LUT or 4-bit data.
            if (out.slot != step.out || returned.count(step.out) || out.compressed ||
                !foldable(values(), step.arg_ids, step.tuple_ids, out.type) ||
                computed + out.type.element_count() > kMaxFoldedElements) {
                kept.push_back(std::move(step));
                continue;
            }
            keys[static_cast<size_t>(step.out)] = fold_key(*step.op, step.typed, values(), step.arg_ids, step.tuple_ids, keys);
            folded_.push_back(std::make_unique<mil::Value>(mil::Value::list(out.type, {})));  // its values: ValueInfo::folded
            out.constant = folded_.back().get();
            computed += out.type.element_count();
            const int id = step.out;
            folds.emplace(id, std::move(step));
        }
        model_.steps_ = std::move(kept);
        if (folds.empty()) return;
        std::function<void(int)> materialise = [&](int id) {
            ValueInfo& v = values()[static_cast<size_t>(id)];
            const std::string& key = *keys[static_cast<size_t>(id)];
            if (v.folded || (!key.empty() && (v.folded = find_folded(key)))) return;
            const ProgramModel::Step& step = folds.at(id);
            for (const int operand : operand_ids(step.arg_ids, step.tuple_ids))
                if (keys[static_cast<size_t>(operand)]) materialise(operand);
            auto computed_values = std::make_shared<const std::vector<float>>(evaluate_constant_op(
                *step.op, step.typed, step.build, values(), step.arg_ids, step.tuple_ids, step.out));
            v.folded = key.empty() ? std::move(computed_values) : keep_folded(key, std::move(computed_values));
        };
        for (const auto& step : model_.steps_)
            for (const int operand : operand_ids(step.arg_ids, step.tuple_ids))
                if (keys[static_cast<size_t>(operand)]) materialise(operand);
        for (auto& v : values()) v.used_as_data = v.needs_fp32 = false;  // the kernel step marks its own reads
    }

    // The kernel step, after the plan step of every op and the memory guard.
    void build_kernels() {
        check_frame_size();
        shrink_repeated_consts();
        internal_.assign(values().size(), false);
        const std::vector<int> readers = reader_counts();
        const std::map<const ProgramModel::Step*, AttentionChain> chains = find_causal_attention(readers);
        std::map<int, int> chain_reads;  // per mask: the fused chains reading it
        for (const auto& [step, chain] : chains)
            if (step == chain.steps.back()) ++chain_reads[chain.mask];
        const std::map<const ProgramModel::Step*, DecodeChain> decode_chains = find_decode_attention(readers);
        const std::map<const ProgramModel::Step*, NormChain> norms = find_stable_norms(readers);
        const std::map<const ProgramModel::Step*, RotaryChain> rotaries = find_rotaries(readers);
        // Every fused group's steps (no step is in two): its last step, where its kernel is added, and how.
        std::map<const ProgramModel::Step*, FusedGroup> groups;
        auto take = [&](const auto& found, auto add) {
            for (const auto& [step, chain] : found)
                groups[step] = {chain.steps.back(), [this, &chain = chain, add](GroupParts& parts) { (this->*add)(chain, parts); }};
        };
        for (const auto& [step, chain] : chains)
            groups[step] = {chain.steps.back(), [this, &chain = chain, shared = chain_reads[chain.mask] == readers[chain.mask]](
                                                    GroupParts& parts) { add_fused_attention(chain, shared, parts); }};
        take(decode_chains, &EmulatedProgram::add_decode_attention);
        take(norms, &EmulatedProgram::add_stable_norm);
        take(rotaries, &EmulatedProgram::add_rotary);
        std::set<const ProgramModel::Step*> grouped;
        for (const auto& [step, group] : groups) grouped.insert(step);
        const std::map<const ProgramModel::Step*, PackedChain> packs = find_packed_outputs(readers, grouped);
        take(packs, &EmulatedProgram::add_packed_outputs);
        for (const auto& [step, chain] : packs) grouped.insert(step);
        const std::map<const ProgramModel::Step*, std::vector<const ProgramModel::Step*>> runs = find_elementwise_runs(grouped);
        for (const auto& [step, run] : runs)
            groups[step] = {run.back(), [this, &run = run, &readers](GroupParts& parts) { add_fused_elementwise(run, readers, parts); }};
        // A compile-time constant op's kernel (constexpr_*) is built after its readers,
        // and kept only if one of them reads its values or the program returns them: conv takes its
        // weight in its stored form (ValueInfo::compressed), so the values are never materialised.
        std::set<int> returned;
        for (const auto& spec : outputs_) returned.insert(model_.ids_.at(spec.name));
        std::vector<const ProgramModel::Step*> order;
        std::vector<BuiltOp> built;
        for (const auto& step : model_.steps_) {
            order.push_back(&step);
            if (values()[static_cast<size_t>(step.out)].compressed) {
                built.emplace_back();  // built below, once its readers are known
                continue;
            }
            OpContext ctx(*step.op, step.typed, values(), step.arg_ids, step.tuple_ids, step.out, /*plan_only=*/false);
            built.push_back(step.build(ctx));
        }
        for (size_t i = 0; i < order.size(); ++i) {
            const ProgramModel::Step& step = *order[i];
            ValueInfo& out = values()[static_cast<size_t>(step.out)];
            if (!out.compressed) continue;
            if (!out.used_as_data && !returned.count(step.out)) {
                unmaterialised_.insert(step.out);
                built[i].view_of = step.out;  // no kernel
                continue;
            }
            OpContext ctx(*step.op, step.typed, values(), step.arg_ids, step.tuple_ids, step.out, /*plan_only=*/false);
            built[i] = step.build(ctx);
        }
        const std::map<const ProgramModel::Step*, ReplicatedOutput> replicated = find_replicated_outputs(readers, grouped, runs);
        io_.outputs.assign(outputs_.size(), {});
        std::set<const ProgramModel::Step*> replaced;  // steps whose kernel reads their operands whole
        for (size_t i = 0; i < order.size(); ++i)
            if (const auto r = replicated.find(order[i]); r != replicated.end()) {
                replaced.insert(order[i]);
                built[i].kernel = replicated_block_kernel(*order[i], r->second);
                io_.outputs[r->second.output].replicated_block = r->second.block;
                for (int id : order[i]->arg_ids)  // the +0 const the block kernel never reads: not in the frame
                    if (id != r->second.source && readers[static_cast<size_t>(id)] == 1)
                        values()[static_cast<size_t>(id)].used_as_data = false;
            }
        GroupParts group_parts;  // a fused group's own kernels, until its last
        for (size_t i = 0; i < order.size(); ++i) {
            const ProgramModel::Step& step = *order[i];
            if (built[i].view_of >= 0) continue;
            // An op whose output has no elements computes nothing: a kernel run over an empty tensor
            // may still loop over its other axes (a [2^31, 0, 1] concat walks 2^31 rows).
            if (step.op->type.element_count() == 0) continue;
            if (const auto found = groups.find(&step); found != groups.end()) {
                group_parts[&step] = std::move(built[i].kernel);
                if (&step == found->second.last) found->second.add(group_parts);
                continue;  // the group runs at its last step
            }
            schedule_.kernels.push_back({std::move(built[i].kernel), {&step}, step.op->op,
                                         profile::op_cost(*step.op, operand_types(step), step.op->type), {}, {}, {}});
        }
        plan_settles(replaced);
        label_ = program_label();
        for (size_t i = 0; i < outputs_.size(); ++i) {
            io_.outputs[i].slot = values()[model_.ids_.at(outputs_[i].name)].slot;
            values()[static_cast<size_t>(io_.outputs[i].slot)].needs_fp32 = true;  // stored from fp32 data
        }
        plan_loads(readers);
        const std::vector<bool> pooled = plan_buffers();
        frame_.values.resize(values().size());
        for (size_t i = 0; i < values().size(); ++i) {
            const ValueInfo& v = values()[i];
            if (v.slot != static_cast<int>(i)) continue;  // a view: its data lives in another slot
            if (internal_[i]) {  // a fused chain's intermediate: pooled by its kernel when it falls back
                frame_.values[i].dtype = v.type.dtype, frame_.values[i].shape = v.type.shape;
                frame_.values[i].lanes = frame_.values[i].last_dim();
                continue;
            }
            Tensor& t = frame_.values[v.slot];
            t.dtype = v.type.dtype;
            t.shape = v.type.shape;
            t.lanes = t.last_dim();
            const bool is_const = v.constant != nullptr;
            if (is_const && !v.used_as_data) continue;  // read at build time only (e.g. packed conv weights)
            if (unmaterialised_.count(static_cast<int>(i))) continue;  // a constexpr value read in quantized form
            if (held_masks_.count(static_cast<int>(i))) continue;  // held once per process (add_fused_attention)
            if (pooled[i]) continue;  // taken from the buffer pool while it is live (run_kernel)
            if (!is_const && io_.reads_in_place(v.slot)) continue;  // its readers take fp16 from the surface
            if (!is_const && unread_.count(static_cast<int>(i))) continue;  // an input (or a cut of one) nothing reads
            if (!is_const) {
                unallocated_.push_back(v.slot);  // allocated by the first evaluate (allocate_frame)
            } else {
                t.data = const_values(v);
                if (!v.blob) finish(t);  // an fp16 const holds the fp16 nearest its literal
            }
        }
    }

    // A BLOBFILE const that repeats one block along its leading axes (e.g. a [1, H, S, S] causal mask,
    // the same [S, S] for every head) and that only elementwise binary ops read, each against an
    // operand of the full shape, is held once: its type becomes the block's, with ones in front, and
    // those ops broadcast it. Values are unchanged; only the frame's copy shrinks.
    void shrink_repeated_consts() {
        static const std::set<std::string> broadcasting = {"add", "sub", "mul", "real_div", "maximum", "minimum"};
        std::vector<std::vector<const ProgramModel::Step*>> readers(values().size());
        for (const auto& step : model_.steps_)
            for (size_t a = 0; a < step.arg_ids.size(); ++a) {
                for (int id : step.tuple_ids[a]) readers[static_cast<size_t>(id)].push_back(nullptr);  // not shrinkable
                if (step.arg_ids[a] >= 0) readers[static_cast<size_t>(step.arg_ids[a])].push_back(&step);
            }
        for (size_t id = 0; id < values().size(); ++id) {
            ValueInfo& v = values()[id];
            if (!v.blob || readers[id].empty() || v.type.shape.size() < 2) continue;
            const size_t element = mil::dtype_size(v.type.dtype);
            // The longest run of leading axes the payload repeats along.
            size_t keep_from = 0;  // axes [keep_from, rank) form the block
            for (size_t axis = 0; axis + 1 < v.type.shape.size(); ++axis) {
                size_t block = element;
                for (size_t d = axis + 1; d < v.type.shape.size(); ++d) block *= static_cast<size_t>(v.type.shape[d]);
                if (block == 0) break;
                if (v.type.shape[axis] != 1 && !repeats(*v.blob, block)) break;
                keep_from = axis + 1;
            }
            if (keep_from == 0) continue;
            Shape shrunk(keep_from, 1);
            shrunk.insert(shrunk.end(), v.type.shape.begin() + static_cast<std::ptrdiff_t>(keep_from), v.type.shape.end());
            if (shrunk == v.type.shape) continue;
            bool all_broadcast = true;
            for (const ProgramModel::Step* step : readers[id]) {
                if (!step || !broadcasting.count(step->op->op) || step->arg_ids.size() != 2) {
                    all_broadcast = false;
                    break;
                }
                const int other = step->arg_ids[0] == static_cast<int>(id) ? step->arg_ids[1] : step->arg_ids[0];
                if (other < 0 || other == static_cast<int>(id) || values()[static_cast<size_t>(other)].type.shape != step->op->type.shape) {
                    all_broadcast = false;
                    break;
                }
            }
            if (!all_broadcast) continue;
            v.type = mil::Type::tensor(v.type.dtype, shrunk);
            v.blob = v.blob->substr(0, static_cast<size_t>(element_count(shrunk)) * element);
        }
    }

    // The ops whose kernels honour live prefixes (Tensor::live_prefix): a decode step's dead sequences,
    // made the attention's leading batch axis, cost them nothing.
    static bool prefix_aware_op(const std::string& op) {
        static const std::set<std::string> aware = {"add", "sub", "mul", "real_div", "pow", "tanh", "sigmoid", "exp",
                                                    "relu", "identity", "sqrt", "rsqrt", "gelu", "transpose", "matmul",
                                                    "reduce_sum", "reduce_max", "reduce_mean"};
        return aware.count(op) > 0;
    }

    // Every other kernel (and a fused attention chain, a replicated output's block) first settles the
    // tensors it reads: their dead tail becomes zeros, as when a transpose or reshape moves the lane axis.
    void plan_settles(const std::set<const ProgramModel::Step*>& replaced) {
        for (ScheduledKernel& kernel : schedule_.kernels) {
            bool aware = kernel.kind == "elementwise (fused)";  // it runs its binary ops' own kernels on a live prefix
            if (!aware) {
                aware = true;
                for (const ProgramModel::Step* step : kernel.steps)
                    aware = aware && !replaced.count(step) && prefix_aware_op(step->op->op);
                aware = aware && kernel.steps.size() == 1;
            }
            if (aware) continue;
            std::set<int> slots;
            for (const ProgramModel::Step* step : kernel.steps)
                for (size_t a = 0; a < step->arg_ids.size(); ++a) {
                    std::vector<int> ids = step->tuple_ids[a];
                    if (step->arg_ids[a] >= 0) ids.push_back(step->arg_ids[a]);
                    for (int id : ids)
                        if (!values()[static_cast<size_t>(id)].constant) slots.insert(values()[static_cast<size_t>(id)].slot);
                }
            kernel.settle.assign(slots.begin(), slots.end());
        }
    }

    // Whether `bytes` is one block of `block` bytes repeated.
    static bool repeats(std::string_view bytes, size_t block) {
        if (bytes.size() % block != 0 || bytes.size() == block) return false;
        for (size_t at = block; at < bytes.size(); at += block)
            if (std::memcmp(bytes.data(), bytes.data() + at, block) != 0) return false;
        return true;
    }

    // What run() fills from the input surfaces (io_.inputs): each input something reads, and each tensor
    // cut from one (InputPart) straight from its place in the surface, instead of the whole surface
    // loaded and copied apart by the cut ops (which have no kernel). The inputs and cuts nothing reads
    // are never loaded nor allocated (unread_): a packed input whose tensors all are cuts costs only
    // their live lanes, and an fp16 cut only fp16 readers take is read in place.
    void plan_loads(const std::vector<int>& readers) {
        auto add = [&](const std::string& name, size_t surface, int64_t offset, std::vector<std::string> hint_names) {
            const int id = model_.ids_.at(name);
            const int slot = values()[static_cast<size_t>(id)].slot;
            const ValueInfo& v = values()[static_cast<size_t>(slot)];
            const size_t element = mil::dtype_size(v.type.dtype);
            io_.inputs.push_back({slot, surface, static_cast<size_t>(offset) * element,
                                  v.type.dtype == mil::DType::fp16 && !v.needs_fp32, std::move(hint_names)});
        };
        for (size_t i = 0; i < inputs_.size(); ++i) {
            const int id = model_.ids_.at(inputs_[i].name);
            if (readers[static_cast<size_t>(id)] > 0) add(inputs_[i].name, i, 0, {inputs_[i].name});
            else unread_.insert(id);
        }
        for (const auto& part : used_parts_) add(part.name, part.input, part.offset, part.hint_names);
        for (int id : cut_values_)
            if (!readers[static_cast<size_t>(id)]) unread_.insert(id);
    }

    // Liveness of the frame's tensors: each one of at least kMinPooledElements that is not a const (nor
    // an input read in place) gets a pooled buffer while it is live: an intermediate from its producing
    // kernel to its last reader, an input from its load to its last reader, an output until it is
    // stored (the schedule's acquire and release lists). So a program holds no memory of its
    // data between evaluates, and tensors with disjoint lifetimes, in one program or in programs run
    // one after the other (prefill layers, buckets, decode), share the same buffers.
    // Returns, per slot, whether it is pooled.
    std::vector<bool> plan_buffers() {
        const size_t n = values().size();
        std::vector<ScheduledKernel>& kernels = schedule_.kernels;
        const int64_t end = static_cast<int64_t>(kernels.size());  // "after the outputs are stored"
        std::vector<bool> pooled(n, false);
        std::vector<int64_t> first(n, -2), last(n, -2);  // -2: unused; -1: before the first kernel
        auto owner = [&](int id) { return values()[static_cast<size_t>(id)].slot; };
        for (const auto& in : io_.inputs) first[static_cast<size_t>(in.slot)] = last[static_cast<size_t>(in.slot)] = -1;
        for (size_t k = 0; k < kernels.size(); ++k)
            for (const ProgramModel::Step* step : kernels[k].steps) {
                const auto out = static_cast<size_t>(owner(step->out));
                if (first[out] == -2) first[out] = static_cast<int64_t>(k);
                last[out] = std::max<int64_t>(last[out], static_cast<int64_t>(k));
                for (size_t a = 0; a < step->arg_ids.size(); ++a) {
                    std::vector<int> ids = step->tuple_ids[a];
                    if (step->arg_ids[a] >= 0) ids.push_back(step->arg_ids[a]);
                    for (int id : ids) {
                        const auto o = static_cast<size_t>(owner(id));
                        last[o] = std::max<int64_t>(last[o], static_cast<int64_t>(k));
                    }
                }
            }
        for (const auto& out : io_.outputs) last[static_cast<size_t>(out.slot)] = end;
        for (size_t slot = 0; slot < n; ++slot) {
            const ValueInfo& v = values()[slot];
            if (v.slot != static_cast<int>(slot) || v.constant || first[slot] == -2 || internal_[slot]) continue;
            if (io_.reads_in_place(static_cast<int>(slot))) continue;
            if (v.type.element_count() < kMinPooledElements) continue;  // small: cheaper to keep than to pool
            pooled[slot] = true;
            (first[slot] < 0 ? schedule_.acquire_inputs : kernels[static_cast<size_t>(first[slot])].acquire)
                .push_back(static_cast<int>(slot));
            if (last[slot] < 0) last[slot] = end;  // an input no kernel reads
            (last[slot] == end ? schedule_.release_end : kernels[static_cast<size_t>(last[slot])].release)
                .push_back(static_cast<int>(slot));
        }
        return pooled;
    }

    // A causal attention chain (causal_attention.h): its steps in order (scores, the optional scale,
    // the mask, softmax, context) and its const operands.
    struct AttentionChain {
        std::vector<const ProgramModel::Step*> steps;
        int scale = -1, mask = -1;  // value ids
    };

    // The chains whose intermediates nothing else reads, by each of their steps.
    std::map<const ProgramModel::Step*, AttentionChain> find_causal_attention(const std::vector<int>& readers) const {
        const auto& vals = model_.values_;
        const std::map<int, const ProgramModel::Step*> producer = model_.producers();
        auto arg = &ProgramModel::arg;
        auto is_const = [&](int id) { return id >= 0 && vals[static_cast<size_t>(id)].constant != nullptr; };
        // The step computing `id`, when `op` is its kind and the chain is its only reader.
        auto private_producer = [&](int id, const char* op) -> const ProgramModel::Step* {
            if (id < 0 || readers[static_cast<size_t>(id)] != 1 || vals[static_cast<size_t>(id)].slot != id) return nullptr;
            const auto found = producer.find(id);
            return found != producer.end() && found->second->op->op == op ? found->second : nullptr;
        };
        // Of a binary step's operands, the one that is not a const (and the const).
        auto split = [&](const ProgramModel::Step& step, int* constant) {
            const int x = arg(step, "x"), y = arg(step, "y");
            if (is_const(x) == is_const(y)) return -1;
            *constant = is_const(x) ? x : y;
            return is_const(x) ? y : x;
        };
        std::map<const ProgramModel::Step*, AttentionChain> chains;
        std::map<std::pair<int, int64_t>, bool> causal;  // (mask, S) checked: is_causal_mask reads S * S values
        for (const auto& context : model_.steps_) {
            if (context.op->op != "matmul") continue;
            const auto& cd = std::get<frontend::MatmulDims>(context.typed.attrs);
            if (cd.transpose_x || !cd.transpose_y || cd.x_batch != cd.batch || cd.y_batch != cd.batch) continue;
            const ProgramModel::Step* probs = private_producer(arg(context, "y"), "softmax");
            if (!probs) continue;
            const int64_t rank = static_cast<int64_t>(probs->op->type.shape.size());
            if (std::get<frontend::Axis>(probs->typed.attrs).axis != rank - 1) continue;
            const ProgramModel::Step* masked = private_producer(arg(*probs, "x"), "add");
            if (!masked) continue;
            AttentionChain chain;
            int below = split(*masked, &chain.mask);
            const ProgramModel::Step* scaled = nullptr;
            if (const ProgramModel::Step* m = private_producer(below, "mul")) {
                scaled = m;
                below = split(*m, &chain.scale);
                if (below < 0 || vals[static_cast<size_t>(chain.scale)].type.element_count() != 1) continue;
            }
            const ProgramModel::Step* scores = private_producer(below, "matmul");
            if (!scores) continue;
            const auto& sd = std::get<frontend::MatmulDims>(scores->typed.attrs);
            const int64_t S = sd.N;
            if (!sd.transpose_x || sd.transpose_y || sd.x_batch != sd.batch || sd.y_batch != sd.batch ||
                sd.batch != cd.batch || sd.M != S || cd.K != S || cd.N != S || !causal_attention_applies(S, cd.M))
                continue;
            const auto known = causal.try_emplace({chain.mask, S}, false);  // each head group reads one mask
            if (known.second) known.first->second = is_causal_mask(vals[static_cast<size_t>(chain.mask)], S);
            if (!known.first->second) continue;
            chain.steps = {scores};
            if (scaled) chain.steps.push_back(scaled);
            chain.steps.insert(chain.steps.end(), {masked, probs, &context});
            for (const ProgramModel::Step* step : chain.steps) chains[step] = chain;
        }
        return chains;
    }

    // The fp16 step computing value `id` into its own slot (not a view) when `op` is its kind, else null: a step
    // a fused decode chain can take in.
    const ProgramModel::Step* fp16_producer(const std::map<int, const ProgramModel::Step*>& producer, int id,
                                            const char* op) const {
        const auto p = id >= 0 ? producer.find(id) : producer.end();
        if (p == producer.end() || p->second->op->op != op || model_.values_[static_cast<size_t>(id)].slot != id ||
            p->second->op->type.dtype != mil::DType::fp16)
            return nullptr;
        return p->second;
    }

    // Whether every result of `steps` but `out`'s is read by `steps` only (a program output never is).
    static bool private_results(const std::vector<const ProgramModel::Step*>& steps, const ProgramModel::Step* out,
                                const std::vector<int>& readers) {
        std::map<int, int> reads;
        for (const ProgramModel::Step* step : steps)
            for (int id : step->arg_ids) ++reads[id];
        for (const ProgramModel::Step* step : steps)
            if (step != out && readers[static_cast<size_t>(step->out)] != reads[step->out]) return false;
        return true;
    }

    // A decode step's attention of one lane (decode_attention.h): its 19 steps in program order, its
    // operands' value ids and its shape.
    struct DecodeChain {
        std::vector<const ProgramModel::Step*> steps;
        int q = -1, k = -1, v = -1, keys = -1, values = -1, mask = -1, exponent = -1;
        DecodeAttention shape;
    };

    // The chains whose intermediates nothing else reads, all in fp16, by each of their steps.
    std::map<const ProgramModel::Step*, DecodeChain> find_decode_attention(const std::vector<int>& readers) const {
        const auto& vals = model_.values_;
        const std::map<int, const ProgramModel::Step*> producer = model_.producers();
        auto arg = &ProgramModel::arg;
        std::map<const ProgramModel::Step*, DecodeChain> found;
        for (const auto& last : model_.steps_) {
            std::vector<const ProgramModel::Step*> steps;
            auto made = [&](int id, const char* op) {  // the chain's step computing `id`, or null
                const ProgramModel::Step* step = fp16_producer(producer, id, op);
                if (step) steps.push_back(step);
                return step;
            };
            const ProgramModel::Step* out = made(last.out, "mul");
            const ProgramModel::Step *num = out ? made(arg(*out, "x"), "add") : nullptr, *inv = out ? made(arg(*out, "y"), "pow") : nullptr;
            if (!num || !inv) continue;
            const ProgramModel::Step *ev = made(arg(*num, "x"), "matmul"), *ev_self = made(arg(*num, "y"), "mul");
            const ProgramModel::Step* denom = made(arg(*inv, "x"), "add");
            if (!ev || !ev_self || !denom) continue;
            const ProgramModel::Step *esum = made(arg(*denom, "x"), "reduce_sum"), *e_self = made(arg(*denom, "y"), "exp");
            const ProgramModel::Step* e = esum ? made(arg(*esum, "x"), "exp") : nullptr;
            if (!e || !e_self || arg(*ev, "x") != e->out || arg(*ev_self, "x") != e_self->out) continue;
            const ProgramModel::Step *shift = made(arg(*e, "x"), "sub"), *shift_self = made(arg(*e_self, "x"), "sub");
            if (!shift || !shift_self || arg(*shift, "y") != arg(*shift_self, "y")) continue;
            const ProgramModel::Step* m = made(arg(*shift, "y"), "add");
            const ProgramModel::Step *masked = made(arg(*shift, "x"), "add"), *self = made(arg(*shift_self, "x"), "reduce_sum");
            if (!m || !masked || !self || arg(*m, "x") != self->out) continue;
            const ProgramModel::Step* over = made(arg(*m, "y"), "relu");
            const ProgramModel::Step* gap = over ? made(arg(*over, "x"), "sub") : nullptr;
            const ProgramModel::Step* top = gap ? made(arg(*gap, "x"), "reduce_max") : nullptr;
            if (!top || arg(*gap, "y") != self->out || arg(*top, "x") != masked->out) continue;
            const ProgramModel::Step *scores = made(arg(*masked, "x"), "matmul"), *qk = made(arg(*self, "x"), "mul");
            if (!scores || !qk || arg(*qk, "x") != arg(*scores, "x")) continue;
            DecodeChain chain;
            chain.q = arg(*scores, "x"), chain.keys = arg(*scores, "y"), chain.k = arg(*qk, "y");
            chain.values = arg(*ev, "y"), chain.v = arg(*ev_self, "y"), chain.mask = arg(*masked, "y");
            chain.exponent = arg(*inv, "y");
            // Shapes: one query row per head ([.., 1, D] against [.., D, T] keys and values), every
            // reduction over the last axis, the exponent a scalar const.
            const auto& sd = std::get<frontend::MatmulDims>(scores->typed.attrs);
            const auto& ed = std::get<frontend::MatmulDims>(ev->typed.attrs);
            const int64_t D = sd.K, T = sd.N, H = element_count(sd.batch);
            auto batched = [](const frontend::MatmulDims& d) { return d.x_batch == d.batch && d.y_batch == d.batch; };
            if (sd.transpose_x || sd.transpose_y || !ed.transpose_y || ed.transpose_x || !batched(sd) || !batched(ed) ||
                sd.M != 1 || ed.M != 1 || ed.K != T || ed.N != D || sd.batch != ed.batch || D <= 0 || T <= 0)
                continue;
            const int64_t rank = static_cast<int64_t>(scores->op->type.shape.size());
            bool ok = true;
            for (const ProgramModel::Step* r : {esum, self, top}) {
                const auto& axes = std::get<frontend::Reduction>(r->typed.attrs).axes;
                ok = ok && axes == std::vector<int64_t>{rank - 1} && r->op->type.shape.back() == 1;
            }
            const ValueInfo& exponent = vals[static_cast<size_t>(chain.exponent)];
            const Shape& mask = vals[static_cast<size_t>(chain.mask)].type.shape;
            const Shape& row = scores->op->type.shape;  // [.., 1, T]
            const Shape& lane = ev->op->type.shape;     // [.., 1, D]
            chain.shape = {H, D, T, mask_heads_per_row(mask, row)};
            ok = ok && exponent.constant && exponent.type.element_count() == 1 && mil::is_float(exponent.type.dtype) &&
                 chain.shape.heads_per_mask_row > 0 &&
                 vals[static_cast<size_t>(chain.k)].type.shape == lane && vals[static_cast<size_t>(chain.v)].type.shape == lane &&
                 vals[static_cast<size_t>(chain.q)].type.shape == lane;
            ok = ok && private_results(steps, out, readers);
            if (!ok) continue;
            std::sort(steps.begin(), steps.end());  // program order: steps_ is a vector
            chain.steps = steps;
            for (const ProgramModel::Step* step : steps) found[step] = chain;
        }
        return found;
    }

    // A stable norm over the channels of a decode step's [1, C, 1, S] (stable_norm.h): its steps in program
    // order, its input and its consts.
    struct NormChain {
        std::vector<const ProgramModel::Step*> steps;
        int x = -1, gamma = -1, beta = -1;  // gamma, beta: [1, C, 1, 1] operands of the optional mul and add
        StableNorm shape;
    };

    // The chains whose intermediates nothing else reads, all in fp16, by each of their steps.
    std::map<const ProgramModel::Step*, NormChain> find_stable_norms(const std::vector<int>& readers) const {
        const auto& vals = model_.values_;
        const std::map<int, const ProgramModel::Step*> producer = model_.producers();
        auto arg = &ProgramModel::arg;
        std::map<const ProgramModel::Step*, NormChain> found;
        for (const auto& last : model_.steps_) {
            std::vector<const ProgramModel::Step*> steps;
            auto made = [&](int id, const char* op) {  // the chain's step computing `id`, or null
                const ProgramModel::Step* step = fp16_producer(producer, id, op);
                if (step) steps.push_back(step);
                return step;
            };
            bool ok = true;
            // The scalar float const operand `name` of `step`, as the frame holds it.
            auto scalar = [&](const ProgramModel::Step* step, const char* name) {
                const int id = step ? arg(*step, name) : -1;
                const ValueInfo* v = id >= 0 ? &vals[static_cast<size_t>(id)] : nullptr;
                ok = ok && v && v->constant && v->type.element_count() == 1 && mil::is_float(v->type.dtype);
                return ok ? const_floats(*v)->at(0) : 0.0f;
            };
            auto channel_reduction = [&](const ProgramModel::Step* step) {
                ok = ok && step && std::get<frontend::Reduction>(step->typed.attrs).axes == std::vector<int64_t>{1};
            };
            const ProgramModel::Step* normed = made(last.out, "mul");
            const ProgramModel::Step* rstd = normed ? made(arg(*normed, "y"), "pow") : nullptr;
            const ProgramModel::Step* var = rstd ? made(arg(*rstd, "x"), "add") : nullptr;
            if (!var) continue;
            const ProgramModel::Step *meansq = made(arg(*var, "x"), "mul"), *eps = made(arg(*var, "y"), "mul");
            const ProgramModel::Step* sqsum = meansq ? made(arg(*meansq, "x"), "reduce_sum") : nullptr;
            const ProgramModel::Step* sq = sqsum ? made(arg(*sqsum, "x"), "mul") : nullptr;
            const ProgramModel::Step* root = eps ? made(arg(*eps, "x"), "mul") : nullptr;
            const int y = arg(*normed, "x");
            if (!sq || !root || arg(*sq, "x") != y || arg(*sq, "y") != y || arg(*eps, "y") != root->out) continue;
            const ProgramModel::Step *centered = made(y, "sub"), *mean = nullptr, *sum = nullptr, *unit = nullptr;
            if (centered) {
                mean = made(arg(*centered, "y"), "mul");
                sum = mean ? made(arg(*mean, "x"), "reduce_sum") : nullptr;
                unit = sum ? made(arg(*centered, "x"), "mul") : nullptr;
                if (!unit || arg(*sum, "x") != unit->out) continue;
            } else {
                unit = made(y, "mul");
            }
            const ProgramModel::Step* inv = unit ? made(arg(*unit, "y"), "pow") : nullptr;
            const ProgramModel::Step* scale = inv ? made(arg(*inv, "x"), "add") : nullptr;
            const ProgramModel::Step* peak = scale ? made(arg(*scale, "x"), "add") : nullptr;
            const ProgramModel::Step* top = peak ? made(arg(*peak, "x"), "reduce_max") : nullptr;
            const ProgramModel::Step* over = peak ? made(arg(*peak, "y"), "relu") : nullptr;
            const ProgramModel::Step* gap = over ? made(arg(*over, "x"), "sub") : nullptr;
            const ProgramModel::Step* bottom = gap ? made(arg(*gap, "x"), "reduce_max") : nullptr;
            const ProgramModel::Step* neg = bottom ? made(arg(*bottom, "x"), "mul") : nullptr;
            if (!top || !neg || arg(*root, "x") != inv->out || arg(*gap, "y") != top->out) continue;
            NormChain chain;
            chain.x = arg(*unit, "x");
            if (arg(*top, "x") != chain.x || arg(*neg, "x") != chain.x) continue;
            const Shape& shape = vals[static_cast<size_t>(chain.x)].type.shape;  // [1, C, 1, S]
            ok = shape.size() == 4 && shape[0] == 1 && shape[2] == 1 && shape[3] <= kStableNormMaxLanes &&
                 normed->op->type.shape == shape;
            for (const ProgramModel::Step* r : {top, bottom, sqsum, sum}) channel_reduction(r ? r : top);
            StableNorm& n = chain.shape;
            n.channels = ok ? shape[1] : 0, n.lanes = ok ? shape[3] : 0, n.center = centered != nullptr;
            n.neg_y = scalar(neg, "y"), n.floor = scalar(scale, "y"), n.inv_y = scalar(inv, "y");
            n.mean_y = centered ? scalar(mean, "y") : 0.0f, n.meansq_y = scalar(meansq, "y");
            n.root_eps_y = scalar(root, "y"), n.rsqrt_y = scalar(rstd, "y");
            ok = ok && private_results(steps, normed, readers);
            if (!ok) continue;
            // The affine tail: mul by gamma, then (LayerNorm) add beta, each the only reader of what it reads.
            const ProgramModel::Step* tail = normed;
            for (const auto& [op, operand] : {std::pair{"mul", &chain.gamma}, std::pair{"add", &chain.beta}}) {
                const ProgramModel::Step* next = sole_reader(tail->out, readers);
                const int p = next && next->op->op == op ? arg(*next, "y") : -1;
                const Shape* ps = p >= 0 ? &vals[static_cast<size_t>(p)].type.shape : nullptr;
                // [1, C, 1, 1], or one value (a const of equal values is held shrunk: shrink_repeated_consts)
                if (!ps || arg(*next, "x") != tail->out || next->op->type.dtype != mil::DType::fp16 ||
                    (*ps != Shape{1, shape[1], 1, 1} && *ps != Shape{1, 1, 1, 1}))
                    break;
                (op == std::string("mul") ? chain.shape.gamma_stride : chain.shape.beta_stride) = (*ps)[1] > 1 ? 1 : 0;
                *operand = p;
                steps.push_back(next);
                tail = next;
            }
            std::sort(steps.begin(), steps.end());  // program order: steps_ is a vector
            chain.steps = steps;
            for (const ProgramModel::Step* step : steps) found[step] = chain;
        }
        return found;
    }

    // A rotary embedding (rotary.h): its 4 steps in program order and its operands' value ids.
    struct RotaryChain {
        std::vector<const ProgramModel::Step*> steps;
        int x = -1, partner = -1, cos = -1, sin = -1;
        Rotary shape;
    };

    // The chains whose intermediates nothing else reads, all in fp16, by each of their steps.
    std::map<const ProgramModel::Step*, RotaryChain> find_rotaries(const std::vector<int>& readers) const {
        const auto& vals = model_.values_;
        const std::map<int, const ProgramModel::Step*> producer = model_.producers();
        auto arg = &ProgramModel::arg;
        auto made = [&](int id, const char* op) {  // read by the chain's next step only
            return id >= 0 && readers[static_cast<size_t>(id)] == 1 ? fp16_producer(producer, id, op) : nullptr;
        };
        auto shape_of = [&](int id) -> const Shape& { return vals[static_cast<size_t>(id)].type.shape; };
        std::map<const ProgramModel::Step*, RotaryChain> found;
        for (const auto& sum : model_.steps_) {
            if (sum.op->op != "add" || sum.op->type.dtype != mil::DType::fp16) continue;
            const ProgramModel::Step *cos = made(arg(sum, "x"), "mul"), *sin = made(arg(sum, "y"), "mul");
            const ProgramModel::Step* mate = sin ? made(arg(*sin, "x"), "matmul") : nullptr;
            if (!cos || !mate) continue;
            RotaryChain chain;
            chain.x = arg(*cos, "x"), chain.cos = arg(*cos, "y"), chain.sin = arg(*sin, "y");
            chain.partner = arg(*mate, "x");
            const auto& md = std::get<frontend::MatmulDims>(mate->typed.attrs);
            const Shape& x = shape_of(chain.x);  // [1, H, D, S]
            if (arg(*mate, "y") != chain.x || md.transpose_x || md.transpose_y || x.size() != 4 || x[0] != 1 ||
                md.M != x[2] || md.K != x[2] || md.N != x[3] || element_count(md.x_batch) != 1 || md.y_batch != md.batch ||
                !vals[static_cast<size_t>(chain.partner)].constant || shape_of(chain.partner) != Shape{1, 1, x[2], x[2]} ||
                shape_of(chain.cos) != Shape{1, 1, x[2], x[3]} || shape_of(chain.sin) != Shape{1, 1, x[2], x[3]} ||
                sum.op->type.shape != x)
                continue;
            chain.shape = {x[1], x[2], x[3]};
            chain.steps = {mate, cos, sin, &sum};
            std::sort(chain.steps.begin(), chain.steps.end());  // program order: steps_ is a vector
            for (const ProgramModel::Step* step : chain.steps) found[step] = chain;
        }
        return found;
    }

    // The step that reads value `id` when it is its only reader (and the program does not return it), else null.
    const ProgramModel::Step* sole_reader(int id, const std::vector<int>& readers) const {
        if (readers[static_cast<size_t>(id)] != 1) return nullptr;
        for (const auto& step : model_.steps_)
            if (std::find(step.arg_ids.begin(), step.arg_ids.end(), id) != step.arg_ids.end()) return &step;
        return nullptr;
    }

    // How many consecutive rows of `row` ([.., 1, T]) one row of `mask` (broadcast to it) covers: 1 when the
    // mask has every row, all of them for one [T] row, the heads of a lane for a [L, 1, 1, T] mask of
    // [L, H, 1, T] rows; 0 when a row of the mask is not one contiguous run of rows.
    static int64_t mask_heads_per_row(Shape mask, const Shape& row) {
        if (mask.size() > row.size() || mask.empty() || mask.back() != row.back()) return 0;
        mask.insert(mask.begin(), row.size() - mask.size(), 1);
        size_t kept = 0;  // the mask's leading axes equal to the rows', then ones
        while (kept + 1 < row.size() && mask[kept] == row[kept]) ++kept;
        for (size_t d = kept; d + 1 < row.size(); ++d)
            if (mask[d] != 1) return 0;
        int64_t shared = 1;
        for (size_t d = kept; d + 1 < row.size(); ++d) shared *= row[d];
        return shared;
    }

    // A float const's values as its frame tensor holds them: a BLOBFILE's, a folded op's (held, not
    // copied), or the literal's rounded to fp16 for an fp16 const.
    static std::shared_ptr<const std::vector<float>> const_floats(const ValueInfo& v) {
        if (v.folded) return v.folded;  // rounded to its dtype (evaluate_constant_op)
        std::vector<float> values = const_values(v);
        if (v.type.dtype == mil::DType::fp16 && !v.blob) kernels::round_fp16(values.data(), values.size());
        return std::make_shared<const std::vector<float>>(std::move(values));
    }

    // An [S, S] additive mask (any ones in front): exactly 0 on and below the diagonal, <= -65504 above.
    static bool is_causal_mask(const ValueInfo& v, int64_t S) {
        if (v.type.element_count() != S * S || !mil::is_float(v.type.dtype)) return false;
        const std::shared_ptr<const std::vector<float>> held = const_floats(v);
        const std::vector<float>& m = *held;
        for (int64_t i = 0; i < S; ++i)
            for (int64_t j = 0; j < S; ++j)
                if (j <= i ? m[static_cast<size_t>(i * S + j)] != 0.0f : !(m[static_cast<size_t>(i * S + j)] <= -65504.0f))
                    return false;
        return true;
    }

    // An output the I/O padding writes as add(all-+0 const, value repeated along the output's leading
    // axes): which output, the repeated block's element count and the value repeated.
    struct ReplicatedOutput {
        size_t output;
        int64_t block;
        int source;
    };

    // Such outputs ([1, k, 1, C*S], the value in every row), by their step. Their kernel computes one
    // block and the store copies it, in the surface's dtype, into the other rows: the same bytes for a
    // k-th of the work.
    std::map<const ProgramModel::Step*, ReplicatedOutput> find_replicated_outputs(
        const std::vector<int>& readers, const std::set<const ProgramModel::Step*>& grouped,
        const std::map<const ProgramModel::Step*, std::vector<const ProgramModel::Step*>>& runs) const {
        const std::map<int, const ProgramModel::Step*> producer = model_.producers();
        std::map<const ProgramModel::Step*, ReplicatedOutput> found;
        for (size_t k = 0; k < outputs_.size(); ++k) {
            const int id = model_.ids_.at(outputs_[k].name);
            const auto made = producer.find(id);
            const mil::DType dtype = outputs_[k].type.dtype;
            if (made == producer.end()) continue;
            const ProgramModel::Step* step = made->second;
            if (step->op->op != "add" || step->arg_ids.size() != 2 || grouped.count(step) || runs.count(step) ||
                readers[static_cast<size_t>(id)] != 2 || (dtype != mil::DType::fp16 && dtype != mil::DType::fp32))
                continue;
            const Shape& out = step->op->type.shape;
            for (int z = 0; z < 2; ++z) {
                const int zeros = step->arg_ids[static_cast<size_t>(z)], other = step->arg_ids[static_cast<size_t>(1 - z)];
                if (zeros < 0 || other < 0 || !all_positive_zero(model_.values_[static_cast<size_t>(zeros)], out)) continue;
                const Shape& o = model_.values_[static_cast<size_t>(other)].type.shape;
                const int64_t block = element_count(o);
                // `other`, padded with leading ones, must be out's trailing axes: out repeats it whole.
                if (o.size() != out.size() || block == 0 || element_count(out) % block != 0) continue;
                size_t lead = 0;
                while (lead < o.size() && o[lead] == 1) ++lead;
                if (!std::equal(o.begin() + static_cast<std::ptrdiff_t>(lead), o.end(), out.begin() + static_cast<std::ptrdiff_t>(lead)))
                    continue;
                found[step] = {k, block, other};
                break;
            }
        }
        return found;
    }

    // Whether a value is a const of shape `shape` whose every element is +0.
    static bool all_positive_zero(const ValueInfo& v, const Shape& shape) {
        if (!v.constant || !v.type.is_tensor || v.type.shape != shape) return false;
        if (v.blob) return std::all_of(v.blob->begin(), v.blob->end(), [](char b) { return b == 0; });
        if (v.folded) return std::all_of(v.folded->begin(), v.folded->end(), [](float f) { return f == 0.0f && !std::signbit(f); });
        return std::all_of(v.constant->numbers.begin(), v.constant->numbers.end(),
                           [](double d) { return d == 0.0 && !std::signbit(d); });
    }

    // The first block of a replicated output: source + 0 as add computes it (so -0 becomes +0), rounded
    // to the output's dtype; the store replicates it.
    Kernel replicated_block_kernel(const ProgramModel::Step& step, const ReplicatedOutput& r) const {
        const int from = model_.values_[static_cast<size_t>(r.source)].slot;
        const int o = model_.values_[static_cast<size_t>(step.out)].slot;
        const bool round = step.op->type.dtype == mil::DType::fp16;
        const int64_t block = r.block;
        return [=](Frame& fr) {
            const float* a = fr.values[from].data.data();
            Tensor& out = fr.values[o];
            out.lanes = out.last_dim();
            float* c = out.data.data();
            for (int64_t i = 0; i < block; ++i) c[i] = a[i] + 0.0f;
            if (round) kernels::round_fp16(c, static_cast<size_t>(block));
        };
    }

    // The I/O packing's placement of outputs in one surface (packed_outputs.h): its steps in order (the
    // one-hot muls, the reshapes copying their blocks, the adds summing them), the values placed (value
    // ids: a block, or the operand of the reshape copying it) and where.
    struct PackedChain {
        std::vector<const ProgramModel::Step*> steps;
        std::vector<int> blocks;
        PackedOutputs placement;
    };

    // The row a const [1, rows, 1, 1] of fp16 +0s and one 1 selects, or -1.
    int64_t one_hot_row(int id) const {
        const ValueInfo& v = model_.values_[static_cast<size_t>(id)];
        const Shape& s = v.type.shape;
        if (!v.constant || !v.type.is_tensor || v.type.dtype != mil::DType::fp16 || s.size() != 4 || s[0] != 1 ||
            s[2] != 1 || s[3] != 1)
            return -1;
        const std::shared_ptr<const std::vector<float>> held = const_floats(v);
        int64_t hot = -1;
        for (size_t r = 0; r < held->size(); ++r) {
            const float f = (*held)[r];
            if (f == 1.0f && hot < 0) hot = static_cast<int64_t>(r);
            else if (f != 0.0f || std::signbit(f)) return -1;
        }
        return hot;
    }

    // Chains sum_i mul(block_i [1, 1, r, W], one-hot [1, rows, 1, 1]) of two or more fp16 blocks in
    // distinct rows, added in order, whose partial sums and products nothing else reads (outside the other fused
    // groups; an elementwise run does not take them), by each of their steps.
    std::map<const ProgramModel::Step*, PackedChain> find_packed_outputs(
        const std::vector<int>& readers, const std::set<const ProgramModel::Step*>& grouped) const {
        const auto& vals = model_.values_;
        auto fp16_tensor = [&](int id) {
            return id >= 0 && vals[static_cast<size_t>(id)].type.is_tensor &&
                   vals[static_cast<size_t>(id)].type.dtype == mil::DType::fp16;
        };
        std::map<int, const ProgramModel::Step*> producer;
        for (const auto& step : model_.steps_) producer[step.out] = &step;
        auto arg_id = [](const ProgramModel::Step& step, const char* name) {
            for (size_t a = 0; a < step.op->args.size(); ++a)
                if (step.op->args[a].name == name) return step.arg_ids[a];
            return -1;
        };
        std::map<int, PackedChain> open;  // by the value id of its running sum
        for (const auto& step : model_.steps_) {
            const Shape& out = step.op->type.shape;
            if (grouped.count(&step) || step.arg_ids.size() != 2 || !fp16_tensor(step.out) ||
                out.size() != 4 || out[0] != 1)
                continue;
            const int x = step.arg_ids[0], y = step.arg_ids[1];
            if (step.op->op == "mul") {
                for (const auto& [block, row] : {std::pair<int, int>{x, y}, {y, x}}) {
                    if (!fp16_tensor(block) || vals[static_cast<size_t>(block)].constant || row < 0) continue;
                    const Shape& b = vals[static_cast<size_t>(block)].type.shape;
                    const int64_t hot = one_hot_row(row);
                    if (hot < 0 || b.size() != 4 || b[0] != 1 || b[1] != 1 || out[1] != vals[static_cast<size_t>(row)].type.shape[1] ||
                        out[2] != b[2] || out[3] != b[3])
                        continue;
                    PackedChain term{{&step}, {block}, {b[2] * b[3], out[1], {hot}}};
                    // A block that a reshape changing the lane axis copies, for this mul alone: the placement
                    // reads the reshape's operand (the same elements in the same order) and skips the copy.
                    const auto made = producer.find(block);
                    const ProgramModel::Step* reshape = made == producer.end() ? nullptr : made->second;
                    const int from = reshape && reshape->op->op == "reshape" ? arg_id(*reshape, "x") : -1;
                    if (from >= 0 && readers[static_cast<size_t>(block)] == 1 && fp16_tensor(from) &&
                        !cut_values_.count(block) && vals[static_cast<size_t>(block)].slot == block &&
                        !vals[static_cast<size_t>(from)].type.shape.empty() &&
                        vals[static_cast<size_t>(from)].type.shape.back() != b.back()) {
                        term.steps.insert(term.steps.begin(), reshape);
                        term.blocks[0] = from;
                    }
                    open[step.out] = std::move(term);
                    break;
                }
            } else if (step.op->op == "add" && x != y && open.count(x) && open.count(y) && open.at(y).blocks.size() == 1 &&
                       readers[static_cast<size_t>(x)] == 1 && readers[static_cast<size_t>(y)] == 1) {
                PackedChain sum = open.at(x);
                const PackedChain& term = open.at(y);
                const std::vector<int64_t>& rows = sum.placement.hot;
                if (term.placement.block != sum.placement.block || term.placement.rows != sum.placement.rows ||
                    std::find(rows.begin(), rows.end(), term.placement.hot[0]) != rows.end())
                    continue;
                sum.steps.insert(sum.steps.end(), term.steps.begin(), term.steps.end());
                sum.steps.push_back(&step);
                sum.blocks.push_back(term.blocks[0]);
                sum.placement.hot.push_back(term.placement.hot[0]);
                open.erase(x), open.erase(y);
                open[step.out] = std::move(sum);
            }
        }
        std::map<const ProgramModel::Step*, PackedChain> found;
        for (const auto& [id, chain] : open)
            if (chain.blocks.size() >= 2)
                for (const ProgramModel::Step* step : chain.steps) found[step] = chain;
        return found;
    }

    // One kernel for a placement: each row written once when every block is finite and whole, else the
    // chain's own kernels (add_group_kernel; its last add overwrites what a non-finite block left written).
    void add_packed_outputs(const PackedChain& chain, GroupParts& parts) {
        std::vector<int> intermediates, slots;
        for (const ProgramModel::Step* step : chain.steps)
            if (step != chain.steps.back()) intermediates.push_back(step->out);
        for (int id : chain.blocks) slots.push_back(values()[static_cast<size_t>(id)].slot);
        const int o = values()[static_cast<size_t>(chain.steps.back()->out)].slot;
        add_group_kernel(chain.steps, intermediates, parts, "I/O packing (placed)", [=, placement = chain.placement](Frame& fr) {
            std::vector<const float*> blocks;
            for (int slot : slots) {
                const Tensor& t = fr.values[static_cast<size_t>(slot)];
                if (t.half || t.prefix_partial() || t.partial() || t.size() < placement.block) return false;
                blocks.push_back(t.data.data());
            }
            Tensor& out = fr.values[static_cast<size_t>(o)];
            if (!run_packed_outputs(placement, blocks, out.data.data())) return false;
            out.lanes = out.last_dim(), out.live_prefix = -1;
            return true;
        });
    }

    // How many steps read each value (a program output counts as a reader outside every group).
    std::vector<int> reader_counts() const {
        std::vector<int> readers(model_.values_.size(), 0);
        for (const auto& step : model_.steps_)
            for (size_t a = 0; a < step.arg_ids.size(); ++a) {
                for (int id : step.tuple_ids[a]) ++readers[static_cast<size_t>(id)];
                if (step.arg_ids[a] >= 0) ++readers[static_cast<size_t>(step.arg_ids[a])];
            }
        for (const auto& spec : outputs_) readers[static_cast<size_t>(model_.ids_.at(spec.name))] += 2;
        return readers;
    }

    // How operand `id` of a binary op with output shape `out` is read row by row, if it can be.
    std::optional<ElementwiseRun::Kind> operand_kind(int id, const Shape& out) const {
        const ValueInfo& v = model_.values_[static_cast<size_t>(id)];
        if (!mil::is_float(v.type.dtype) || v.type.shape.size() > out.size()) return std::nullopt;
        if (!v.type.is_tensor) return ElementwiseRun::Kind::scalar;  // fp16 eps = const()...
        Shape t(out.size() - v.type.shape.size(), 1);
        t.insert(t.end(), v.type.shape.begin(), v.type.shape.end());
        if (t == out) return ElementwiseRun::Kind::full;
        if (element_count(t) == 1) return ElementwiseRun::Kind::scalar;
        const Shape leading(out.begin(), out.end() - 1);
        if (t.back() == 1 && Shape(t.begin(), t.end() - 1) == leading) return ElementwiseRun::Kind::per_row;
        if (t.back() == out.back() && element_count(t) == out.back()) return ElementwiseRun::Kind::lanes;
        return std::nullopt;
    }

    // Runs of two or more consecutive elementwise steps (binary, sigmoid or tanh) of one float output shape
    // (none of them in a fused attention), by each of their steps.
    std::map<const ProgramModel::Step*, std::vector<const ProgramModel::Step*>> find_elementwise_runs(
        const std::set<const ProgramModel::Step*>& grouped) const {
        auto fusable = [&](const ProgramModel::Step& step) {
            ElementwiseRun::Fn fn;
            const mil::Type& t = step.op->type;
            if (grouped.count(&step) || !elementwise_fn(step.op->op, &fn) || !t.is_tensor || !mil::is_float(t.dtype) ||
                t.shape.empty() || t.element_count() == 0 || step.arg_ids.size() != (is_unary(fn) ? 1u : 2u))
                return false;
            for (int id : step.arg_ids)
                if (id < 0 || !operand_kind(id, t.shape)) return false;
            return true;
        };
        std::map<const ProgramModel::Step*, std::vector<const ProgramModel::Step*>> runs;
        std::vector<const ProgramModel::Step*> run;
        auto close = [&] {
            if (run.size() >= 2)
                for (const ProgramModel::Step* step : run) runs[step] = run;
            run.clear();
        };
        for (const auto& step : model_.steps_) {
            if (!fusable(step)) {
                close();
                continue;
            }
            if (!run.empty() && run.front()->op->type.shape != step.op->type.shape) close();
            run.push_back(&step);
        }
        close();
        return runs;
    }

    // One kernel for a run: its rows in one pass when every operand is whole (no live-lane hint, no
    // fp16 read in place), else the run's own kernels (add_group_kernel).
    void add_fused_elementwise(const std::vector<const ProgramModel::Step*>& steps, const std::vector<int>& readers,
                               GroupParts& parts) {
        const Shape& shape = steps.front()->op->type.shape;
        ElementwiseRun run;
        run.width = shape.back(), run.rows = element_count(shape) / shape.back();
        std::map<int, int> step_of;  // value id -> index in the run
        std::vector<int> reads;      // frame slots the run reads (checked whole at run time)
        std::vector<int> intermediates;
        bool flat = true;
        auto all_whole_or_scalar = [&](const ElementwiseRun::Step& s) {
            for (const ElementwiseRun::Operand* o : {&s.x, &s.y})
                if (o->kind != ElementwiseRun::Kind::full && o->kind != ElementwiseRun::Kind::scalar) return false;
            return true;
        };
        for (const ProgramModel::Step* step : steps) {
            ElementwiseRun::Step s;
            elementwise_fn(step->op->op, &s.fn);
            s.round = step->op->type.dtype == mil::DType::fp16;
            OpContext ctx(*step->op, step->typed, values(), step->arg_ids, step->tuple_ids, step->out, false);
            for (size_t a = 0; a < step->arg_ids.size(); ++a) {  // x, and y unless unary
                ElementwiseRun::Operand& o = a == 0 ? s.x : s.y;
                const int id = step->arg_ids[a];
                o.kind = *operand_kind(id, shape);
                if (const auto found = step_of.find(id); found != step_of.end()) {
                    o.step = found->second;
                } else {
                    o.slot = ctx.slot(a == 0 ? "x" : "y");
                    reads.push_back(o.slot);
                }
            }
            if (is_unary(s.fn)) s.y = s.x;
            int inside = 0;  // readers of this step's result within the run
            for (const ProgramModel::Step* later : steps)
                for (int id : later->arg_ids) inside += id == step->out;
            if (readers[static_cast<size_t>(step->out)] == inside)
                intermediates.push_back(step->out);
            else
                s.out = step->out;
            step_of[step->out] = static_cast<int>(run.steps.size());
            run.steps.push_back(s);
            flat = flat && all_whole_or_scalar(s);
        }
        run.flat = flat;
        add_group_kernel(steps, intermediates, parts, "elementwise (fused)", [run = std::move(run), reads](Frame& fr) {
            for (int slot : reads) {
                const Tensor& t = fr.values[static_cast<size_t>(slot)];
                if (t.half || t.prefix_partial()) return false;
            }
            // Each step's live lanes, as its op would give them (not the run's narrowest: a run may mix a KV
            // bucket's positions with head_dim lanes of the same width). Long rows skip their dead lanes;
            // short ones (a decode step's sequences) are computed whole.
            const std::vector<int64_t> live = live_lanes_of_steps(run, fr);
            run_elementwise(run, fr, run.width > Tensor::kShortRow ? &live : nullptr);
            for (size_t s = 0; s < run.steps.size(); ++s)
                if (const int out = run.steps[s].out; out >= 0)
                    fr.values[static_cast<size_t>(out)].lanes = live[s], fr.values[static_cast<size_t>(out)].live_prefix = -1;
            return true;
        });
    }

    // One kernel for a fused group: `fused` computes the group and returns true, or returns false
    // (writing nothing) and the group's own kernels run instead, with its `intermediates` (value ids
    // nothing outside the group reads: in no frame or pool plan) taken from the buffer pool for the call.
    void add_group_kernel(const std::vector<const ProgramModel::Step*>& steps, const std::vector<int>& intermediates,
                          GroupParts& parts, const char* kind,
                          std::function<bool(Frame&)> fused) {
        std::vector<Kernel> unfused;
        profile::Cost cost;
        for (const ProgramModel::Step* step : steps) {
            unfused.push_back(std::move(parts.at(step)));
            const profile::Cost c = profile::op_cost(*step->op, operand_types(*step), step->op->type);
            cost.bytes += c.bytes, cost.flops += c.flops;
        }
        std::vector<std::pair<int, size_t>> pooled;  // (slot, elements)
        for (int id : intermediates) {
            internal_[static_cast<size_t>(id)] = true;
            pooled.emplace_back(id, static_cast<size_t>(values()[static_cast<size_t>(id)].type.element_count()));
        }
        Kernel run = [fused = std::move(fused), unfused = std::move(unfused), pooled](Frame& fr) {
            if (fused(fr)) return;
            for (const auto& [slot, size] : pooled) fr.values[slot].data = buffer_pool::take(size);
            for (const Kernel& kernel : unfused) kernel(fr);
            for (const auto& [slot, size] : pooled) buffer_pool::give(std::exchange(fr.values[slot].data, {}));
        };
        schedule_.kernels.push_back({std::move(run), steps, kind, cost, {}, {}, {}});
    }

    // One kernel for a chain: the fused causal attention when it is exact for this call, else the
    // chain's own kernels (add_group_kernel). A const mask that only fused chains read is held once per
    // process (shared_floats: a prefill bucket's layer programs bake the same [S, S] mask, 4 MiB of fp32
    // each at 1024 tokens) rather than in each frame; a call that falls back copies it into the frame
    // for the chain's own kernels, and the next fused call frees that copy.
    void add_fused_attention(const AttentionChain& chain, bool only_chains_read_mask,
                             GroupParts& parts) {
        const ProgramModel::Step& scores = *chain.steps.front();
        const ProgramModel::Step& context = *chain.steps.back();
        const auto& sd = std::get<frontend::MatmulDims>(scores.typed.attrs);
        const auto& cd = std::get<frontend::MatmulDims>(context.typed.attrs);
        CausalAttention a;
        a.batches = element_count(sd.batch), a.depth = sd.K, a.value_depth = cd.M, a.seq = sd.N;
        for (int64_t b = 0; b < a.batches; ++b) {
            a.q_offset.push_back(b * a.depth * a.seq), a.k_offset.push_back(b * a.depth * a.seq);
            a.v_offset.push_back(b * a.value_depth * a.seq);
        }
        auto is_fp16 = [](const ProgramModel::Step* step) { return step->op->type.dtype == mil::DType::fp16; };
        const size_t n = chain.steps.size();
        a.has_scale = chain.scale >= 0;
        a.round_scores = is_fp16(chain.steps[0]);
        a.round_scaled = a.has_scale && is_fp16(chain.steps[1]);
        a.round_masked = is_fp16(chain.steps[n - 3]), a.round_probs = is_fp16(chain.steps[n - 2]);
        a.round_out = is_fp16(chain.steps[n - 1]);
        OpContext sc(*scores.op, scores.typed, values(), scores.arg_ids, scores.tuple_ids, scores.out, false);
        OpContext cc(*context.op, context.typed, values(), context.arg_ids, context.tuple_ids, context.out, false);
        const int q = sc.slot("x"), k = sc.slot("y"), v = cc.slot("x"), o = context.out;  // fp32 (no in-place fp16)
        const int mask = values()[static_cast<size_t>(chain.mask)].slot;
        const int scale = a.has_scale ? values()[static_cast<size_t>(chain.scale)].slot : -1;
        std::shared_ptr<const std::vector<float>> held;
        if (const ValueInfo& m = values()[static_cast<size_t>(mask)]; only_chains_read_mask && m.constant) {
            auto& shared = held_masks_[mask];  // a folded mask is shared already; a stored one by content
            if (!shared) shared = m.folded ? m.folded : shared_floats(*const_floats(m));
            held = shared;
        }
        std::vector<int> intermediates;  // every step's result but the context's
        for (const ProgramModel::Step* step : chain.steps)
            if (step != &context) intermediates.push_back(step->out);
        add_group_kernel(chain.steps, intermediates, parts, "attention (causal, fused)", [=](Frame& fr) {
            Tensor &tq = fr.values[q], &tk = fr.values[k], &tv = fr.values[v];
            Tensor& out = fr.values[o];
            std::vector<float>& own_mask = fr.values[mask].data;
            // With a live-lanes hint (a prompt shorter than its bucket) the lanes past the live ones are
            // dead queries and keys: only the live queries' blocks are computed, and the dead lanes those
            // blocks reach are zeroed first (finite, so their exact-0 probabilities stay 0).
            const int64_t live = std::min({tq.lanes, tk.lanes, tv.lanes, a.seq});
            if (live < a.seq)
                for (Tensor* t : {&tq, &tk, &tv}) zero_lanes(*t, live, causal_attention_dead_end(a, live));
            if (!run_causal_attention(a, tq.data.data(), tk.data.data(), tv.data.data(),
                                      scale >= 0 ? fr.values[scale].data[0] : 1.0f,
                                      held ? held->data() : own_mask.data(), out.data.data(), live)) {
                if (held) own_mask.assign(held->begin(), held->end());  // for the chain's own kernels
                return false;
            }
            if (held && !own_mask.empty()) std::vector<float>().swap(own_mask);  // a fallback's copy
            out.lanes = live, out.live_prefix = -1;
            return true;
        });
    }

    // One kernel for a decode attention chain: run_decode_attention when its operands are fp32 tensors (or an fp16
    // cache read in place) with no live prefix, else the chain's own kernels. The live lanes of the cache and the
    // mask (a cache filled up to some position) bound the positions as they bound the ops'.
    void add_decode_attention(const DecodeChain& chain, GroupParts& parts) {
        auto slot = [&](int id) { return values()[static_cast<size_t>(id)].slot; };
        const int q = slot(chain.q), k = slot(chain.k), v = slot(chain.v), keys = slot(chain.keys);
        const int cache_values = slot(chain.values), mask = slot(chain.mask), exponent = slot(chain.exponent);
        const int o = chain.steps.back()->out;
        std::vector<int> intermediates;
        for (const ProgramModel::Step* step : chain.steps)
            if (step->out != o) intermediates.push_back(step->out);
        const DecodeAttention a = chain.shape;
        add_group_kernel(chain.steps, intermediates, parts, "attention (decode, fused)", [=](Frame& fr) {
            for (int s : {q, k, v, keys, cache_values, mask}) {
                const Tensor& t = fr.values[static_cast<size_t>(s)];
                const bool cache = s == keys || s == cache_values;  // lanes: cached positions (as the matmuls take them)
                if (t.prefix_partial() || (t.partial() && !(cache && t.last_dim() == a.positions) && s != mask) ||
                    (t.half && !cache))
                    return false;
            }
            // The live positions of a cache or the mask (the add takes the mask's lanes when its rows are positions).
            auto live = [&](int s) {
                const Tensor& t = fr.values[static_cast<size_t>(s)];
                return t.partial() && t.last_dim() == a.positions ? t.lanes : a.positions;
            };
            const int64_t scored = std::min(live(keys), live(mask)), summed = std::min(scored, live(cache_values));
            auto cache = [&](int s) { return CacheView{fr.values[s].half ? nullptr : fr.values[s].data.data(), fr.values[s].half}; };
            Tensor& out = fr.values[o];
            run_decode_attention(a, scored, summed, fr.values[q].data.data(), fr.values[k].data.data(), fr.values[v].data.data(),
                                 cache(keys), cache(cache_values), fr.values[mask].data.data(),
                                 fr.values[exponent].data[0], out.data.data());
            out.lanes = out.last_dim(), out.live_prefix = -1;
            return true;
        });
    }

    // One kernel for a stable norm chain: run_stable_norm when x is a whole fp32 tensor, else the chain's own
    // kernels.
    void add_stable_norm(const NormChain& chain, GroupParts& parts) {
        auto slot = [&](int id) { return id >= 0 ? values()[static_cast<size_t>(id)].slot : -1; };
        const int x = slot(chain.x), gamma = slot(chain.gamma), beta = slot(chain.beta), o = chain.steps.back()->out;
        std::vector<int> intermediates;
        for (const ProgramModel::Step* step : chain.steps)
            if (step->out != o) intermediates.push_back(step->out);
        const StableNorm n = chain.shape;
        add_group_kernel(chain.steps, intermediates, parts, "norm (fused)", [=](Frame& fr) {
            for (int s : {x, gamma, beta}) {
                const Tensor* t = s >= 0 ? &fr.values[static_cast<size_t>(s)] : nullptr;
                if (t && (t->partial() || t->prefix_partial() || t->half)) return false;
            }
            auto data = [&](int s) { return s >= 0 ? fr.values[static_cast<size_t>(s)].data.data() : nullptr; };
            Tensor& out = fr.values[o];
            run_stable_norm(n, data(x), data(gamma), data(beta), out.data.data());
            out.lanes = out.last_dim(), out.live_prefix = -1;
            return true;
        });
    }

    // One kernel for a rotary embedding: run_rotary when its operands are whole fp32 tensors, else the chain's
    // own kernels.
    void add_rotary(const RotaryChain& chain, GroupParts& parts) {
        auto slot = [&](int id) { return values()[static_cast<size_t>(id)].slot; };
        const int x = slot(chain.x), partner = slot(chain.partner), cos = slot(chain.cos), sin = slot(chain.sin);
        const int o = chain.steps.back()->out;
        std::vector<int> intermediates;
        for (const ProgramModel::Step* step : chain.steps)
            if (step->out != o) intermediates.push_back(step->out);
        const Rotary r = chain.shape;
        add_group_kernel(chain.steps, intermediates, parts, "rotary (fused)", [=](Frame& fr) {
            for (int s : {x, partner, cos, sin}) {
                const Tensor& t = fr.values[static_cast<size_t>(s)];
                if (t.partial() || t.prefix_partial() || t.half) return false;
            }
            Tensor& out = fr.values[o];
            run_rotary(r, fr.values[x].data.data(), fr.values[partner].data.data(), fr.values[cos].data.data(),
                       fr.values[sin].data.data(), out.data.data());
            out.lanes = out.last_dim(), out.live_prefix = -1;
            return true;
        });
    }

    // The tensor operands of a step, by argument name (for its profile cost).
    profile::Operands operand_types(const ProgramModel::Step& step) {
        profile::Operands types;
        for (size_t a = 0; a < step.arg_ids.size(); ++a) {
            std::vector<int> ids = step.tuple_ids[a];
            if (step.arg_ids[a] >= 0) ids.push_back(step.arg_ids[a]);
            for (int id : ids) {
                const ValueInfo& v = values()[static_cast<size_t>(id)];
                // a quantized weight is read as stored (int8, indices, 4-bit data), not as the fp16 tensor it stands for
                const mil::Type& type = v.compressed ? values()[static_cast<size_t>(v.compressed->data)].type : v.type;
                if (type.is_tensor) types.emplace_back(step.op->args[a].name, &type);
            }
        }
        return types;
    }

    // "x[1, 768, 1, 1024] -> y[1, 768, 1, 1024] (97 ops)": how the profile names this program.
    std::string program_label() const {
        auto list = [](const std::vector<runtime::TensorSpec>& specs) {
            std::string s;
            for (const auto& t : specs) s += (s.empty() ? "" : ", ") + t.name + shape_str(t.type.shape);
            return s;
        };
        return list(inputs_) + " -> " + list(outputs_) + " (" + std::to_string(schedule_.kernels.size()) + " ops)";
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
    std::vector<std::unique_ptr<mil::Value>> folded_;  // the values of folded ops (fold_constants)
    Schedule schedule_;
    SurfaceIO io_;
    std::vector<runtime::InputPart> used_parts_;  // the cuts something other than a cut reads (loaded)
    std::set<int> cut_values_, unread_;  // values cut from inputs (no kernel); inputs and cuts nothing reads
    std::vector<int> unallocated_;  // frame slots allocate_frame() still has to allocate
    std::set<int> unmaterialised_;  // constexpr outputs no kernel reads as data: never computed nor allocated
    // causal-mask consts held once per process, not in the frame (add_fused_attention)
    std::map<int, std::shared_ptr<const std::vector<float>>> held_masks_;
    std::vector<bool> internal_;  // per slot: an intermediate of a fused chain (in no frame or pool plan)
    std::string label_;                         // the program's name in the profile
    std::vector<size_t> slot_elements_;         // per frame slot, its tensor's element count (drop_build_state)
    Frame frame_;
};

std::unique_ptr<runtime::LoadedProgram> build_checked(std::string_view text, const runtime::WeightFiles& weights,
                                                      const runtime::CompileOptions& options, bool count_compile) {
    frontend::CheckedProgram checked = frontend::check(text, weights, options);
    ProgramModel model(checked.main(), std::move(checked.typed), weights, checked.cuts.ranges, options);
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

}  // namespace orion::emu
