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
#include "emulator/chains.h"
#include "emulator/chunk_attention.h"
#include "emulator/decode_attention.h"
#include "emulator/rotary.h"
#include "emulator/stable_norm.h"
#include "emulator/const_fold.h"
#include "emulator/fused_elementwise.h"
#include "emulator/lane_blocks.h"
#include "emulator/ops.h"
#include "emulator/packed_outputs.h"
#include "emulator/profile.h"
#include "emulator/shared_consts.h"
#include "emulator/surface_io.h"
#include "errors.h"
#include "runtime/budget.h"

namespace orion::emu {

namespace {

// Zeroes lanes [from, to) of every row of t's last axis (dead lanes a kernel reads as finite values).
void zero_lanes(Tensor& t, int64_t from, int64_t to) {
    const int64_t width = t.last_dim();
    if (t.data.empty() || from >= to || width <= 0) return;
    for (int64_t row = 0; row < t.size(); row += width)
        std::fill(t.data.begin() + row + from, t.data.begin() + row + std::min(to, width), 0.0f);
}

// Intermediates below this many elements (16 KiB of fp32) keep their own buffer. Larger ones are
// pooled: a short prompt's [768, 16] tensors or a decode program's padded I/O, held by each program
// of a bucket, came to about 2 MiB a program (28 MiB for GPT-2's 16-token bucket); a take and a give
// cost well under a microsecond, so a decode step's hundred of them are noise.
constexpr int64_t kMinPooledElements = int64_t{1} << 12;

// The profile row of the fused decode attention.
constexpr const char* kDecodeAttentionRow = "attention (decode, fused)";
constexpr const char* kChunkAttentionRow = "attention (chunk, fused)";

// The kernels of a program in order, each with the steps it computes, its profile row and cost, and
// the pooled buffers taken before it and given back after it (plan_buffers).
struct ScheduledKernel {
    Kernel run;
    StepList steps;
    std::string kind;                   // the profile's row: the op's kind, or the fused group's
    profile::Cost cost;                 // bytes and FLOPs by its operand and result types
    std::vector<int> acquire, release;  // pooled slots taken before it / given back after it
    std::vector<int> settle;  // slots it reads that must be whole (settle_prefix): it ignores live prefixes
};

// A fused group's own kernels by step (its fallback), gathered until its last step.
using GroupParts = std::map<const Step*, Kernel>;

// A fused group of steps: the last of them, where its one kernel is added, and what adds it.
struct FusedGroup {
    const Step* last = nullptr;
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
            const int fallbacks = frame_.fallbacks;
            run_kernel(kernel);
            const double seconds = std::chrono::duration<double>(clock::now() - start).count();
            profile::Row& row = by_kind[frame_.fallbacks == fallbacks ? kernel.kind : kernel.kind + kRanItsOps];
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
        free(lane_blocks_);
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
        std::vector<Step> kept;
        std::map<int, Step> folds;  // by the value each computes
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
            const Step& step = folds.at(id);
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
        const ChainFinder find(model_, outputs_, cut_values_);
        const std::vector<int>& readers = find.readers();
        const ChainsByStep<AttentionChain> chains = find.causal_attention();
        std::map<int, int> chain_reads;  // per mask: the fused chains reading it
        for (const auto& [step, chain] : chains)
            if (step == chain.steps.back()) ++chain_reads[chain.mask];
        const ChainsByStep<DecodeChain> decode_chains = find.decode_attention();
        const ChainsByStep<ChunkChain> chunk_chains = find.chunk_attention();
        const ChainsByStep<NormChain> norms = find.stable_norms();
        const ChainsByStep<RotaryChain> rotaries = find.rotaries();
        // Every fused group's steps (no step is in two): its last step, where its kernel is added, and how.
        std::map<const Step*, FusedGroup> groups;
        auto take = [&](const auto& found, auto add) {
            for (const auto& [step, chain] : found)
                groups[step] = {chain.steps.back(), [this, &chain = chain, add](GroupParts& parts) { (this->*add)(chain, parts); }};
        };
        for (const auto& [step, chain] : chains)
            groups[step] = {chain.steps.back(), [this, &chain = chain, shared = chain_reads[chain.mask] == readers[chain.mask]](
                                                    GroupParts& parts) { add_fused_attention(chain, shared, parts); }};
        take(decode_chains, &EmulatedProgram::add_decode_attention);
        take(chunk_chains, &EmulatedProgram::add_chunk_attention);
        take(norms, &EmulatedProgram::add_stable_norm);
        take(rotaries, &EmulatedProgram::add_rotary);
        std::set<const Step*> grouped;
        for (const auto& [step, group] : groups) grouped.insert(step);
        const ChainsByStep<AttentionChain> probabilities = find.causal_probabilities(grouped);
        take(probabilities, &EmulatedProgram::add_causal_probabilities);
        for (const auto& [step, chain] : probabilities) grouped.insert(step);
        const ChainsByStep<PackedChain> packs = find.packed_outputs(grouped);
        take(packs, &EmulatedProgram::add_packed_outputs);
        for (const auto& [step, chain] : packs) grouped.insert(step);
        const ElementwiseRuns runs = find.elementwise_runs(grouped);
        const ChainsByStep<LaneBlockChain> blocked = find.lane_block_chains(runs, grouped);
        for (const auto& [step, chain] : blocked) {
            groups[step] = {chain.steps.back(), [this, &chain = chain, &find](GroupParts& parts) {
                                add_lane_blocked_chain(chain, find, parts);
                            }};
            grouped.insert(step);
        }
        for (const auto& [step, run] : runs)
            if (!blocked.count(step))
                groups[step] = {run.back(), [this, &run = run, &find](GroupParts& parts) { add_fused_elementwise(run, find, parts); }};
        // A compile-time constant op's kernel (constexpr_*) is built after its readers,
        // and kept only if one of them reads its values or the program returns them: conv takes its
        // weight in its stored form (ValueInfo::compressed), so the values are never materialised.
        std::set<int> returned;
        for (const auto& spec : outputs_) returned.insert(model_.ids_.at(spec.name));
        StepList order;
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
            const Step& step = *order[i];
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
        const ChainsByStep<ReplicatedOutput> replicated = find.replicated_outputs(grouped, runs);
        io_.outputs.assign(outputs_.size(), {});
        std::set<const Step*> replaced;  // steps whose kernel reads their operands whole
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
            const Step& step = *order[i];
            if (built[i].view_of >= 0) continue;
            // An op whose output has no elements computes nothing: a kernel run over an empty tensor
            // may still loop over its other axes (a [2^31, 0, 1] concat walks 2^31 rows).
            if (step.op->type.element_count() == 0) continue;
            if (const auto found = groups.find(&step); found != groups.end()) {
                group_parts[&step] = std::move(built[i].kernel);
                if (built[i].lane_block) lane_blocks_[&step] = std::move(built[i].lane_block);
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
        std::vector<StepList> readers(values().size());
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
            for (const Step* step : readers[id]) {
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
    void plan_settles(const std::set<const Step*>& replaced) {
        for (ScheduledKernel& kernel : schedule_.kernels) {
            // These groups' kernels take live prefixes, and so do the ops they fall back to.
            bool aware = kernel.kind == "elementwise (fused)" || kernel.kind == kDecodeAttentionRow;
            if (!aware) {
                aware = true;
                for (const Step* step : kernel.steps)
                    aware = aware && !replaced.count(step) && prefix_aware_op(step->op->op);
                aware = aware && kernel.steps.size() == 1;
            }
            if (aware) continue;
            std::set<int> slots;
            for (const Step* step : kernel.steps)
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
            for (const Step* step : kernels[k].steps) {
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

    // The first block of a replicated output: source + 0 as add computes it (so -0 becomes +0), rounded
    // to the output's dtype; the store replicates it.
    Kernel replicated_block_kernel(const Step& step, const ReplicatedOutput& r) const {
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

    // One kernel for a placement: each row written once when every block is finite and has no live prefix,
    // else the chain's own kernels (add_group_kernel; its last add overwrites what a non-finite block left
    // written). Blocks with long rows of dead lanes (a prompt shorter than its bucket) are placed over their
    // live lanes when they all have the same: a block that keeps its lane axis leaves the output's dead lanes
    // as the ops' lane-separable kernels do, one reshaped to another last axis makes them +0, as the reshape
    // does. Dead lanes of short rows (a batched step's dead sequences) are placed, as the ops place them.
    void add_packed_outputs(const PackedChain& chain, GroupParts& parts) {
        std::vector<int> slots;
        for (int id : chain.blocks) slots.push_back(values()[static_cast<size_t>(id)].slot);
        const int o = values()[static_cast<size_t>(chain.steps.back()->out)].slot;
        add_group_kernel(chain.steps, results_before_last(chain.steps), parts, "I/O packing (placed)", [=, placement = chain.placement](Frame& fr) {
            std::vector<const float*> blocks;
            Tensor& out = fr.values[static_cast<size_t>(o)];
            DeadLanes dead;  // none, unless a block has some: then every block must have the same
            for (int slot : slots) {
                const Tensor& t = fr.values[static_cast<size_t>(slot)];
                if (t.half || t.prefix_partial() || t.size() < placement.block) return false;
                if (t.skips_dead_lanes()) dead = {t.last_dim(), t.lanes, t.last_dim() != out.last_dim()};
                blocks.push_back(t.data.data());
            }
            for (int slot : slots) {
                const Tensor& t = fr.values[static_cast<size_t>(slot)];
                if (dead.width && (t.last_dim() != dead.width || (t.skips_dead_lanes() ? t.lanes : t.last_dim()) != dead.lanes))
                    return false;
            }
            if (!run_packed_outputs(placement, blocks, out.data.data(), dead)) return false;
            out.lanes = dead.width && !dead.zeroed ? dead.lanes : out.last_dim(), out.live_prefix = -1;
            return true;
        });
    }

    // A run's steps as run_elementwise computes them: each operand a frame slot or an earlier step, each result
    // stored to its slot only when something outside the run reads it. `reads`: the frame slots the run reads;
    // `intermediates`: the results nothing outside the run reads.
    ElementwiseRun describe_run(const StepList& steps, const ChainFinder& find, std::vector<int>& reads,
                                std::vector<int>& intermediates) {
        const Shape& shape = steps.front()->op->type.shape;
        ElementwiseRun run;
        run.width = shape.back(), run.rows = element_count(shape) / shape.back();
        std::map<int, int> step_of;  // value id -> index in the run
        bool flat = true;
        auto all_whole_or_scalar = [&](const ElementwiseRun::Step& s) {
            for (const ElementwiseRun::Operand* o : {&s.x, &s.y})
                if (o->kind != ElementwiseRun::Kind::full && o->kind != ElementwiseRun::Kind::scalar) return false;
            return true;
        };
        for (const Step* step : steps) {
            ElementwiseRun::Step s;
            elementwise_fn(step->op->op, &s.fn);
            s.round = step->op->type.dtype == mil::DType::fp16;
            OpContext ctx(*step->op, step->typed, values(), step->arg_ids, step->tuple_ids, step->out, false);
            for (size_t a = 0; a < step->arg_ids.size(); ++a) {  // x, and y unless unary
                ElementwiseRun::Operand& o = a == 0 ? s.x : s.y;
                const int id = step->arg_ids[a];
                o.kind = *find.operand_kind(id, shape);
                if (const auto found = step_of.find(id); found != step_of.end()) {
                    o.step = found->second;
                } else {
                    o.slot = ctx.slot(a == 0 ? "x" : "y");
                    reads.push_back(o.slot);
                }
            }
            if (is_unary(s.fn)) s.y = s.x;
            int inside = 0;  // readers of this step's result within the run
            for (const Step* later : steps)
                for (int id : later->arg_ids) inside += id == step->out;
            if (find.readers()[static_cast<size_t>(step->out)] == inside)
                intermediates.push_back(step->out);
            else
                s.out = step->out;
            step_of[step->out] = static_cast<int>(run.steps.size());
            run.steps.push_back(s);
            flat = flat && all_whole_or_scalar(s);
        }
        run.flat = flat;
        return run;
    }

    // One kernel for a run: its rows in one pass when every operand is whole (no live-lane hint, no
    // fp16 read in place), else the run's own kernels (add_group_kernel).
    void add_fused_elementwise(const StepList& steps, const ChainFinder& find, GroupParts& parts) {
        std::vector<int> reads, intermediates;  // frame slots the run reads (checked whole at run time)
        ElementwiseRun run = describe_run(steps, find, reads, intermediates);
        add_group_kernel(steps, intermediates, parts, "elementwise (fused)", [run = std::move(run), reads](Frame& fr) {
            for (int slot : reads) {
                const Tensor& t = fr.values[static_cast<size_t>(slot)];
                if (t.half || t.prefix_partial()) return false;
            }
            // Each step's live lanes, as its op would give them (not the run's narrowest: a run may mix a KV
            // bucket's positions with head_dim lanes of the same width): their dead lanes are skipped.
            const std::vector<int64_t> live = live_lanes_of_steps(run, fr);
            run_elementwise(run, fr, &live);
            for (size_t s = 0; s < run.steps.size(); ++s)
                if (const int out = run.steps[s].out; out >= 0)
                    fr.values[static_cast<size_t>(out)].lanes = live[s], fr.values[static_cast<size_t>(out)].live_prefix = -1;
            return true;
        });
    }

    // One kernel for a lane-blocked conv chain: run_lane_blocked_chain when the run's other frame operands (values
    // per row) are whole fp32, else the chain's own kernels.
    void add_lane_blocked_chain(const LaneBlockChain& chain, const ChainFinder& find, GroupParts& parts) {
        LaneBlockedChain blocked;
        const Step& up = *chain.up;
        OpContext up_ctx(*up.op, up.typed, values(), up.arg_ids, up.tuple_ids, up.out, false);
        blocked.x = up_ctx.slot("x");
        blocked.hidden = up.out;
        blocked.hidden_rows = up.op->type.shape[1], blocked.lanes = up.op->type.shape[3];  // [1, C, 1, S]
        std::vector<int> frame_reads;  // the run's operands besides the hidden value and its slices
        if (!chain.run.empty()) {
            std::vector<int> reads, intermediates;
            blocked.run = describe_run(chain.run, find, reads, intermediates);
            blocked.act = chain.run.back()->out, blocked.act_rows = chain.run.back()->op->type.shape[1];
            for (int slot : reads)
                if (slot != blocked.hidden && !chain.slices.count(slot)) frame_reads.push_back(slot);
            // The result overwrites the hidden block when no row it writes is read but by the same row of the run
            // (the run's last step, its only stored one, computes a row block after every step reading it): every
            // read of the hidden value starts at channel 0 (the same rows) or at act_rows or later (rows not written).
            bool in_place = true;
            for (ElementwiseRun::Step& step : blocked.run.steps)
                for (ElementwiseRun::Operand* o : {&step.x, &step.y}) {
                    if (const auto slice = chain.slices.find(o->slot); o->step < 0 && slice != chain.slices.end())
                        o->slot = blocked.hidden, o->offset = slice->second;
                    if (o->step < 0 && o->slot == blocked.hidden)
                        in_place = in_place && (o->offset == 0 || o->offset >= blocked.act_rows);
                }
            if (in_place) blocked.act = blocked.run.steps.back().out = blocked.hidden;
        }
        auto lane_block = [&](const Step* conv) {
            const auto found = lane_blocks_.find(conv);
            if (found == lane_blocks_.end())
                throw std::logic_error("add_lane_blocked_chain: a conv of the chain has no lane-block kernel");
            return found->second;
        };
        blocked.up = lane_block(chain.up);
        if (chain.down) blocked.down = lane_block(chain.down), blocked.out = chain.down->out;
        for (const auto& [slice, channel] : chain.outputs)
            blocked.outputs.push_back({slice->out, channel, slice->op->type.shape[1]});
        add_group_kernel(chain.steps, internal_results(chain), parts, "conv chain (lane blocks)",
                         [blocked = std::move(blocked), frame_reads](Frame& fr) {
            for (int slot : frame_reads) {
                const Tensor& t = fr.values[static_cast<size_t>(slot)];
                if (t.half || t.prefix_partial()) return false;
            }
            return run_lane_blocked_chain(blocked, fr);
        });
    }

    // A lane-blocked chain's results but its sinks' (the second conv's, or the output slices'): what only it reads.
    static std::vector<int> internal_results(const LaneBlockChain& chain) {
        std::vector<int> results;
        for (const Step* step : chain.steps)
            if (!chain.sink(step)) results.push_back(step->out);
        return results;
    }

    // The results of a chain's steps but its last's: what only the chain reads (its fallback's intermediates).
    static std::vector<int> results_before_last(const StepList& steps) {
        std::vector<int> results;
        for (size_t i = 0; i + 1 < steps.size(); ++i) results.push_back(steps[i]->out);
        return results;
    }

    // One kernel for a fused group: `fused` computes the group and returns true, or returns false
    // (writing nothing) and the group's own kernels run instead, with its `intermediates` (value ids
    // nothing outside the group reads: in no frame or pool plan) taken from the buffer pool while they
    // are live (group_lifetimes).
    void add_group_kernel(const StepList& steps, const std::vector<int>& intermediates,
                          GroupParts& parts, const char* kind,
                          std::function<bool(Frame&)> fused) {
        std::vector<Kernel> unfused;
        profile::Cost cost;
        for (const Step* step : steps) {
            unfused.push_back(std::move(parts.at(step)));
            const profile::Cost c = profile::op_cost(*step->op, operand_types(*step), step->op->type);
            cost.bytes += c.bytes, cost.flops += c.flops;
        }
        for (int id : intermediates) internal_[static_cast<size_t>(id)] = true;
        Kernel run = [fused = std::move(fused), unfused = std::move(unfused),
                      life = group_lifetimes(steps, intermediates)](Frame& fr) {
            if (fused(fr)) return;
            ++fr.fallbacks;
            for (size_t i = 0; i < unfused.size(); ++i) {
                for (const auto& [slot, size] : life.take[i]) fr.values[slot].data = buffer_pool::take(size);
                unfused[i](fr);
                for (int slot : life.give[i]) buffer_pool::give(std::exchange(fr.values[slot].data, {}));
            }
        };
        schedule_.kernels.push_back({std::move(run), steps, kind, cost, {}, {}, {}});
    }

    // Per step of a group, the intermediates (slot, elements) taken before its kernel and those given back
    // after it.
    struct GroupLifetimes {
        std::vector<std::vector<std::pair<int, size_t>>> take;
        std::vector<std::vector<int>> give;
    };

    // Each of a group's intermediates is live from the step that computes it to its last reader in the group
    // (or that step, when none reads it), so a fallback holds only the intermediates live at once: taking them
    // all for the call held, in the I/O packing of a 1,000-token SmolLM2-135M prefill (which falls back on its
    // dead lanes), eleven [1, 6, 12, 16384] fp32 values at once, 50 MB of its 81 MB pool peak.
    GroupLifetimes group_lifetimes(const StepList& steps, const std::vector<int>& intermediates) {
        GroupLifetimes life;
        life.take.resize(steps.size()), life.give.resize(steps.size());
        for (int id : intermediates) {
            size_t first = steps.size(), last = 0;
            for (size_t i = 0; i < steps.size(); ++i) {
                if (steps[i]->out == id && first == steps.size()) first = last = i;
                for (int operand : operand_ids(steps[i]->arg_ids, steps[i]->tuple_ids))
                    if (operand == id) last = std::max(last, i);
            }
            if (first == steps.size())
                throw std::logic_error("group_lifetimes: intermediate " + std::to_string(id) + " has no step in its group");
            const size_t elements = static_cast<size_t>(values()[static_cast<size_t>(id)].type.element_count());
            life.take[first].emplace_back(id, elements);
            life.give[last].push_back(id);
        }
        return life;
    }

    static bool is_fp16(const Step* step) { return step->op->type.dtype == mil::DType::fp16; }

    // The fused causal form's scores of a chain: their geometry (the scores matmul, steps[0]: q and k of `depth`
    // x `seq` per batch) and roundings (the matmul, the scale when there is one, the mask add and the softmax, at
    // steps[softmax - 1] and steps[softmax]).
    static CausalAttention causal_scores(const AttentionChain& chain, size_t softmax) {
        const auto& sd = std::get<frontend::MatmulDims>(chain.steps.front()->typed.attrs);
        CausalAttention a;
        a.batches = element_count(sd.batch), a.depth = sd.K, a.seq = sd.N;
        for (int64_t b = 0; b < a.batches; ++b)
            a.q_offset.push_back(b * a.depth * a.seq), a.k_offset.push_back(b * a.depth * a.seq);
        a.has_scale = chain.scale >= 0;
        a.round_scores = is_fp16(chain.steps[0]);
        a.round_scaled = a.has_scale && is_fp16(chain.steps[1]);
        a.round_masked = is_fp16(chain.steps[softmax - 1]), a.round_probs = is_fp16(chain.steps[softmax]);
        return a;
    }

    // One kernel for a chain: the fused causal attention when it is exact for this call, else the
    // chain's own kernels (add_group_kernel). A const mask that only fused chains read is held once per
    // process (shared_floats: a prefill bucket's layer programs bake the same [S, S] mask, 4 MiB of fp32
    // each at 1024 tokens) rather than in each frame; a call that falls back copies it into the frame
    // for the chain's own kernels, and the next fused call frees that copy.
    void add_fused_attention(const AttentionChain& chain, bool only_chains_read_mask,
                             GroupParts& parts) {
        const Step& scores = *chain.steps.front();
        const Step& context = *chain.steps.back();
        CausalAttention a = causal_scores(chain, chain.steps.size() - 2);
        a.value_depth = std::get<frontend::MatmulDims>(context.typed.attrs).M;
        for (int64_t b = 0; b < a.batches; ++b) a.v_offset.push_back(b * a.value_depth * a.seq);
        a.round_out = is_fp16(&context);
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
        add_group_kernel(chain.steps, results_before_last(chain.steps), parts, "attention (causal, fused)", [=](Frame& fr) {
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

    // One kernel for causal attention probabilities (a layer gradient's recomputed ones): run_causal_probabilities
    // when q and k are whole fp32 tensors and the check holds, else the chain's own kernels.
    void add_causal_probabilities(const AttentionChain& chain, GroupParts& parts) {
        const Step& scores = *chain.steps.front();
        const CausalAttention a = causal_scores(chain, chain.steps.size() - 1);
        OpContext sc(*scores.op, scores.typed, values(), scores.arg_ids, scores.tuple_ids, scores.out, false);
        const int q = sc.slot("x"), k = sc.slot("y"), o = chain.steps.back()->out;  // fp32 (no in-place fp16)
        const int mask = values()[static_cast<size_t>(chain.mask)].slot;
        const int scale = a.has_scale ? values()[static_cast<size_t>(chain.scale)].slot : -1;
        add_group_kernel(chain.steps, results_before_last(chain.steps), parts, "attention probabilities (causal, fused)",
                         [=](Frame& fr) {
            const Tensor &tq = fr.values[q], &tk = fr.values[k];
            if (!tq.whole_fp32() || !tk.whole_fp32()) return false;
            Tensor& out = fr.values[o];
            if (!run_causal_probabilities(a, tq.data.data(), tk.data.data(), scale >= 0 ? fr.values[scale].data[0] : 1.0f,
                                          fr.values[mask].data.data(), out.data.data()))
                return false;
            out.lanes = out.last_dim(), out.live_prefix = -1;
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
        const DecodeAttention whole = chain.shape;
        const Shape lane = chain.steps.back()->op->type.shape;  // [.., 1, D]: q's, k's, v's and the output's
        add_group_kernel(chain.steps, results_before_last(chain.steps), parts, kDecodeAttentionRow, [=](Frame& fr) {
            for (int s : {q, k, v, keys, cache_values, mask}) {
                const Tensor& t = fr.values[static_cast<size_t>(s)];
                const bool cache = s == keys || s == cache_values;  // lanes: cached positions (as the matmuls take them)
                if ((t.prefix_partial() && (s != q && s != k && s != v)) ||
                    (t.partial() && !(cache && t.last_dim() == whole.positions) && s != mask) || (t.half && !cache))
                    return false;
            }
            // Dead sequences (a live prefix of the lanes' leading axis on q, k or v): as the ops, only the heads of
            // the live ones, the output live on the same prefix.
            int64_t lead = lane[0];
            for (int s : {q, k, v}) lead = std::min(lead, live_leading(fr.values[static_cast<size_t>(s)], lane));
            DecodeAttention a = whole;
            a.heads = whole.heads / lane[0] * lead;
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
            out.lanes = out.last_dim();
            set_live_leading(out, lane, lead);
            return true;
        });
    }

    // One kernel for a chunk attention chain: run_chunk_attention when its operands are fp32 tensors (the matmuls'
    // y operands, the caches, may be fp16 read in place) with no live prefix, else the chain's own kernels. Live
    // lanes bound the queries, the cached positions and the chunk's keys as they bound the ops'; the output is live
    // on the queries'.
    void add_chunk_attention(const ChunkChain& chain, GroupParts& parts) {
        auto slot = [&](int id) { return values()[static_cast<size_t>(id)].slot; };
        const int q = slot(chain.q), k = slot(chain.k), v = slot(chain.v), keys = slot(chain.keys);
        const int cache_values = slot(chain.values), past_mask = slot(chain.past_mask), own_mask = slot(chain.own_mask);
        const int exponent = slot(chain.exponent), o = chain.steps.back()->out;
        const ChunkAttention a = chain.shape;
        add_group_kernel(chain.steps, results_before_last(chain.steps), parts, kChunkAttentionRow, [=](Frame& fr) {
            auto at = [&](int s) -> const Tensor& { return fr.values[static_cast<size_t>(s)]; };
            for (int s : {q, k, v, keys, cache_values, past_mask, own_mask})
                if (at(s).prefix_partial() || (at(s).half && s != keys && s != k && s != cache_values && s != v))
                    return false;
            auto live = [&](int s, int64_t whole) { return at(s).partial() ? std::min(at(s).lanes, whole) : whole; };
            ChunkLive l;
            l.queries = live(q, a.seq);
            l.scored = std::min(live(keys, a.positions), live(past_mask, a.positions));
            l.summed = std::min(l.scored, live(cache_values, a.positions));
            l.own_scored = std::min(live(k, a.seq), live(own_mask, a.seq));
            l.own_summed = std::min(l.own_scored, live(v, a.seq));
            auto view = [&](int s) { return CacheView{at(s).half ? nullptr : at(s).data.data(), at(s).half}; };
            Tensor& out = fr.values[static_cast<size_t>(o)];
            run_chunk_attention(a, l, at(q).data.data(), view(k), view(v), view(keys), view(cache_values),
                                at(past_mask).data.data(), at(own_mask).data.data(), at(exponent).data[0],
                                out.data.data());
            out.lanes = l.queries, out.live_prefix = -1;
            return true;
        });
    }

    // One kernel for a stable norm chain: run_stable_norm over x's live lanes when x is an fp32 tensor with no live
    // prefix, else the chain's own kernels.
    void add_stable_norm(const NormChain& chain, GroupParts& parts) {
        auto slot = [&](int id) { return id >= 0 ? values()[static_cast<size_t>(id)].slot : -1; };
        const int x = slot(chain.x), gamma = slot(chain.gamma), beta = slot(chain.beta), o = chain.steps.back()->out;
        const StableNorm n = chain.shape;
        add_group_kernel(chain.steps, results_before_last(chain.steps), parts, "norm (fused)", [=](Frame& fr) {
            // x's dead lanes (a batched step's dead sequences, a prompt's lanes past its length) are left out: the
            // lanes are independent, each summed over the channels in order, so the live ones are the ops' bit for bit.
            const Tensor& in = fr.values[static_cast<size_t>(x)];
            if (in.prefix_partial() || in.half) return false;
            for (int s : {gamma, beta}) {
                const Tensor* t = s >= 0 ? &fr.values[static_cast<size_t>(s)] : nullptr;
                if (t && !t->whole_fp32()) return false;
            }
            auto data = [&](int s) { return s >= 0 ? fr.values[static_cast<size_t>(s)].data.data() : nullptr; };
            Tensor& out = fr.values[o];
            const int64_t live = in.lanes > 0 && in.partial() ? in.lanes : n.lanes;
            run_stable_norm(n, live, data(x), data(gamma), data(beta), out.data.data());
            out.lanes = in.lanes, out.live_prefix = -1;
            return true;
        });
    }

    // One kernel for a rotary embedding: run_rotary when its operands are fp32 tensors with no live prefix (and the
    // partner whole), else the chain's own kernels.
    void add_rotary(const RotaryChain& chain, GroupParts& parts) {
        auto slot = [&](int id) { return values()[static_cast<size_t>(id)].slot; };
        const int x = slot(chain.x), partner = slot(chain.partner), cos = slot(chain.cos), sin = slot(chain.sin);
        const int o = chain.steps.back()->out;
        Rotary r = chain.shape;
        read_permutation(const_floats(values()[static_cast<size_t>(chain.partner)])->data(), r, chain.gradient);
        if (chain.gradient) {  // every lane of fp32 operands, else the chain's own kernels
            add_group_kernel(chain.steps, results_before_last(chain.steps), parts, "rotary gradient (fused)",
                             [=](Frame& fr) {
                for (int s : {x, partner, cos, sin})
                    if (!fr.values[static_cast<size_t>(s)].whole_fp32()) return false;
                Tensor& out = fr.values[o];
                run_rotary_gradient(r, fr.values[x].data.data(), fr.values[partner].data.data(),
                                    fr.values[cos].data.data(), fr.values[sin].data.data(), out.data.data());
                out.lanes = out.last_dim(), out.live_prefix = -1;
                return true;
            });
            return;
        }
        add_group_kernel(chain.steps, results_before_last(chain.steps), parts, "rotary (fused)", [=](Frame& fr) {
            // Dead lanes (a batched step's dead sequences): as the ops, a long row's are not computed.
            int64_t lanes = fr.values[static_cast<size_t>(o)].last_dim();
            for (int s : {x, partner, cos, sin}) {
                const Tensor& t = fr.values[static_cast<size_t>(s)];
                if ((s == partner && t.partial()) || t.prefix_partial() || t.half) return false;
                if (s != partner) lanes = std::min(lanes, t.lanes);
            }
            Tensor& out = fr.values[o];
            const bool whole_rows = out.last_dim() <= Tensor::kShortRow;  // as the elementwise ops compute them
            run_rotary(r, fr.values[x].lanes, whole_rows ? out.last_dim() : lanes, fr.values[x].data.data(),
                       fr.values[partner].data.data(), fr.values[cos].data.data(), fr.values[sin].data.data(),
                       out.data.data());
            out.lanes = lanes, out.live_prefix = -1;
            return true;
        });
    }

    // The tensor operands of a step, by argument name (for its profile cost).
    profile::Operands operand_types(const Step& step) {
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
    std::map<const Step*, LaneBlockKernel> lane_blocks_;  // grouped convs' lane-block forms (add_lane_blocked_chain)
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
