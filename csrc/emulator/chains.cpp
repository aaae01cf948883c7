#include "emulator/chains.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "emulator/causal_attention.h"
#include "emulator/kernels.h"

namespace orion::emu {

namespace {

int arg(const Step& step, const char* name) { return ProgramModel::arg(step, name); }

// How many consecutive rows of `row` ([.., 1, T]) one row of `mask` (broadcast to it) covers: 1 when the
// mask has every row, all of them for one [T] row, the heads of a lane for a [L, 1, 1, T] mask of
// [L, H, 1, T] rows; 0 when a row of the mask is not one contiguous run of rows.
int64_t mask_heads_per_row(Shape mask, const Shape& row) {
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

// An [S, S] additive mask (any ones in front): exactly 0 on and below the diagonal, <= -65504 above.
bool scan_causal_mask(const std::vector<float>& m, int64_t S) {
    for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j < S; ++j)
            if (j <= i ? m[static_cast<size_t>(i * S + j)] != 0.0f : !(m[static_cast<size_t>(i * S + j)] <= -65504.0f))
                return false;
    return true;
}

// is_causal_mask's answers for folded masks, by the folded values (shared by the programs that fold the same mask,
// fold_key: the 24 layer programs of a Qwen2.5-0.5B 1024-token bucket scan its 1M values once, not 24 times).
struct FoldedCausal {
    std::weak_ptr<const std::vector<float>> values;
    int64_t S;
    bool causal;
};
std::mutex folded_causal_mutex;
std::vector<FoldedCausal> folded_causal;

bool is_causal_mask(const ValueInfo& v, int64_t S) {
    if (v.type.element_count() != S * S || !mil::is_float(v.type.dtype)) return false;
    if (!v.folded) return scan_causal_mask(*const_floats(v), S);
    {
        std::lock_guard<std::mutex> lock(folded_causal_mutex);
        folded_causal.erase(std::remove_if(folded_causal.begin(), folded_causal.end(),
                                           [](const FoldedCausal& f) { return f.values.expired(); }),
                            folded_causal.end());
        for (const FoldedCausal& f : folded_causal)
            if (f.S == S && f.values.lock() == v.folded) return f.causal;
    }
    const bool causal = scan_causal_mask(*v.folded, S);
    std::lock_guard<std::mutex> lock(folded_causal_mutex);
    folded_causal.push_back({v.folded, S, causal});
    return causal;
}

// Whether a value is a const of shape `shape` whose every element is +0.
bool all_positive_zero(const ValueInfo& v, const Shape& shape) {
    if (!v.constant || !v.type.is_tensor || v.type.shape != shape) return false;
    if (v.blob) return std::all_of(v.blob->begin(), v.blob->end(), [](char b) { return b == 0; });
    if (v.folded) return std::all_of(v.folded->begin(), v.folded->end(), [](float f) { return f == 0.0f && !std::signbit(f); });
    return std::all_of(v.constant->numbers.begin(), v.constant->numbers.end(),
                       [](double d) { return d == 0.0 && !std::signbit(d); });
}

// Whether a reduction step reduces over the channel axis (1) alone.
bool reduces_channels(const Step& step) {
    return std::get<frontend::Reduction>(step.typed.attrs).axes == std::vector<int64_t>{1};
}

}  // namespace

std::shared_ptr<const std::vector<float>> const_floats(const ValueInfo& v) {
    if (v.folded) return v.folded;  // rounded to its dtype (evaluate_constant_op)
    std::vector<float> values = const_values(v);
    if (v.type.dtype == mil::DType::fp16 && !v.blob) kernels::round_fp16(values.data(), values.size());
    return std::make_shared<const std::vector<float>>(std::move(values));
}

ChainFinder::ChainFinder(const ProgramModel& model, const std::vector<runtime::TensorSpec>& outputs,
                         const std::set<int>& cut_values)
    : model_(model), outputs_(outputs), cut_values_(cut_values), producer_(model.producers()),
      readers_(model.values_.size(), 0) {
    for (const auto& step : model_.steps_)
        for (size_t a = 0; a < step.arg_ids.size(); ++a) {
            for (int id : step.tuple_ids[a]) ++readers_[static_cast<size_t>(id)];
            if (step.arg_ids[a] >= 0) ++readers_[static_cast<size_t>(step.arg_ids[a])];
        }
    for (const auto& spec : outputs_) readers_[static_cast<size_t>(model_.ids_.at(spec.name))] += 2;
}

const Step* ChainFinder::fp16_producer(int id, const char* op) const {
    const auto p = id >= 0 ? producer_.find(id) : producer_.end();
    if (p == producer_.end() || p->second->op->op != op || value(id).slot != id ||
        p->second->op->type.dtype != mil::DType::fp16)
        return nullptr;
    return p->second;
}

template <class Chain, class Match>
ChainsByStep<Chain> ChainFinder::fp16_chains(Match match) const {
    ChainsByStep<Chain> found;
    for (const auto& last : model_.steps_) {
        StepList steps;
        auto made = [&](int id, const char* op) {  // the chain's step computing `id`, or null
            const Step* step = fp16_producer(id, op);
            if (step) steps.push_back(step);
            return step;
        };
        std::optional<Chain> chain = match(last, made, steps);
        if (!chain) continue;
        std::sort(steps.begin(), steps.end());  // program order: steps_ is a vector
        chain->steps = steps;
        for (const Step* step : steps) found[step] = *chain;
    }
    return found;
}

bool ChainFinder::private_results(const StepList& steps, const Step* out) const {
    std::map<int, int> reads_inside;
    for (const Step* step : steps)
        for (int id : step->arg_ids) ++reads_inside[id];
    for (const Step* step : steps)
        if (step != out && reads(step->out) != reads_inside[step->out]) return false;
    return true;
}

const Step* ChainFinder::sole_reader(int id) const {
    if (reads(id) != 1) return nullptr;
    const StepList found = readers_of(id);
    return found.empty() ? nullptr : found.front();
}

const Step* ChainFinder::private_producer(int id, const char* op) const {
    if (id < 0 || reads(id) != 1 || value(id).slot != id) return nullptr;
    const auto found = producer_.find(id);
    return found != producer_.end() && found->second->op->op == op ? found->second : nullptr;
}

// The chain matmul(q, k, transpose_x) -> [mul(scale)] -> add(mask) -> softmax(last axis) ending at `probs`, every
// intermediate read by the chain only: its steps (program order) and its mask and scale ids, when the mask is
// causal over the scores' S keys (`causal` caches that per mask and S) and the queries are the S keys.
std::optional<AttentionChain> ChainFinder::probability_chain(const Step& probs, CausalMasks& causal) const {
    auto is_const = [&](int id) { return id >= 0 && value(id).constant != nullptr; };
    // Of a binary step's operands, the one that is not a const (and the const).
    auto split = [&](const Step& step, int* constant) {
        const int x = arg(step, "x"), y = arg(step, "y");
        if (is_const(x) == is_const(y)) return -1;
        *constant = is_const(x) ? x : y;
        return is_const(x) ? y : x;
    };
    const int64_t rank = static_cast<int64_t>(probs.op->type.shape.size());
    if (probs.op->op != "softmax" || std::get<frontend::Axis>(probs.typed.attrs).axis != rank - 1) return std::nullopt;
    const Step* masked = private_producer(arg(probs, "x"), "add");
    if (!masked) return std::nullopt;
    AttentionChain chain;
    int below = split(*masked, &chain.mask);
    const Step* scaled = nullptr;
    if (const Step* m = private_producer(below, "mul")) {
        scaled = m;
        below = split(*m, &chain.scale);
        if (below < 0 || value(chain.scale).type.element_count() != 1) return std::nullopt;
    }
    const Step* scores = private_producer(below, "matmul");
    if (!scores) return std::nullopt;
    const auto& sd = std::get<frontend::MatmulDims>(scores->typed.attrs);
    const int64_t S = sd.N;
    if (!sd.transpose_x || sd.transpose_y || sd.x_batch != sd.batch || sd.y_batch != sd.batch || sd.M != S)
        return std::nullopt;
    const auto known = causal.try_emplace({chain.mask, S}, false);  // each head group reads one mask
    if (known.second) known.first->second = is_causal_mask(value(chain.mask), S);
    if (!known.first->second) return std::nullopt;
    chain.steps = {scores};
    if (scaled) chain.steps.push_back(scaled);
    chain.steps.insert(chain.steps.end(), {masked, &probs});
    return chain;
}

ChainsByStep<AttentionChain> ChainFinder::causal_attention() const {
    ChainsByStep<AttentionChain> chains;
    CausalMasks causal;
    for (const auto& context : model_.steps_) {
        if (context.op->op != "matmul") continue;
        const auto& cd = std::get<frontend::MatmulDims>(context.typed.attrs);
        if (cd.transpose_x || !cd.transpose_y || cd.x_batch != cd.batch || cd.y_batch != cd.batch) continue;
        const Step* probs = private_producer(arg(context, "y"), "softmax");
        if (!probs) continue;
        std::optional<AttentionChain> chain = probability_chain(*probs, causal);
        if (!chain) continue;
        const auto& sd = std::get<frontend::MatmulDims>(chain->steps.front()->typed.attrs);
        const int64_t S = sd.N;
        if (sd.batch != cd.batch || cd.K != S || cd.N != S || !causal_attention_applies(S, cd.M)) continue;
        chain->steps.push_back(&context);
        for (const Step* step : chain->steps) chains[step] = *chain;
    }
    return chains;
}

ChainsByStep<AttentionChain> ChainFinder::causal_probabilities(const std::set<const Step*>& grouped) const {
    ChainsByStep<AttentionChain> chains;
    CausalMasks causal;
    for (const auto& probs : model_.steps_) {
        if (probs.op->op != "softmax" || grouped.count(&probs)) continue;
        std::optional<AttentionChain> chain = probability_chain(probs, causal);
        // The kernel's query blocks (value_depth: none is read; 16 passes the check)
        if (!chain || !causal_attention_applies(std::get<frontend::MatmulDims>(chain->steps.front()->typed.attrs).N, 16))
            continue;
        bool free = true;
        for (const Step* step : chain->steps) free &= !grouped.count(step);
        if (!free) continue;
        for (const Step* step : chain->steps) chains[step] = *chain;
    }
    return chains;
}

ChainsByStep<DecodeChain> ChainFinder::decode_attention() const {
    return fp16_chains<DecodeChain>([&](const Step& last, auto& made, StepList& steps) -> std::optional<DecodeChain> {
        const Step* out = made(last.out, "mul");
        const Step *num = out ? made(arg(*out, "x"), "add") : nullptr, *inv = out ? made(arg(*out, "y"), "pow") : nullptr;
        if (!num || !inv) return std::nullopt;
        const Step *ev = made(arg(*num, "x"), "matmul"), *ev_self = made(arg(*num, "y"), "mul");
        const Step* denom = made(arg(*inv, "x"), "add");
        if (!ev || !ev_self || !denom) return std::nullopt;
        const Step *esum = made(arg(*denom, "x"), "reduce_sum"), *e_self = made(arg(*denom, "y"), "exp");
        const Step* e = esum ? made(arg(*esum, "x"), "exp") : nullptr;
        if (!e || !e_self || arg(*ev, "x") != e->out || arg(*ev_self, "x") != e_self->out) return std::nullopt;
        const Step *shift = made(arg(*e, "x"), "sub"), *shift_self = made(arg(*e_self, "x"), "sub");
        if (!shift || !shift_self || arg(*shift, "y") != arg(*shift_self, "y")) return std::nullopt;
        const Step* m = made(arg(*shift, "y"), "add");
        const Step *masked = made(arg(*shift, "x"), "add"), *self = made(arg(*shift_self, "x"), "reduce_sum");
        if (!m || !masked || !self || arg(*m, "x") != self->out) return std::nullopt;
        const Step* over = made(arg(*m, "y"), "relu");
        const Step* gap = over ? made(arg(*over, "x"), "sub") : nullptr;
        const Step* top = gap ? made(arg(*gap, "x"), "reduce_max") : nullptr;
        if (!top || arg(*gap, "y") != self->out || arg(*top, "x") != masked->out) return std::nullopt;
        const Step *scores = made(arg(*masked, "x"), "matmul"), *qk = made(arg(*self, "x"), "mul");
        if (!scores || !qk || arg(*qk, "x") != arg(*scores, "x")) return std::nullopt;
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
            return std::nullopt;
        const int64_t rank = static_cast<int64_t>(scores->op->type.shape.size());
        for (const Step* r : {esum, self, top}) {
            const auto& axes = std::get<frontend::Reduction>(r->typed.attrs).axes;
            if (axes != std::vector<int64_t>{rank - 1} || r->op->type.shape.back() != 1) return std::nullopt;
        }
        const ValueInfo& exponent = value(chain.exponent);
        const Shape& row = scores->op->type.shape;  // [.., 1, T]
        const Shape& lane = ev->op->type.shape;     // [.., 1, D]
        chain.shape = {H, D, T, mask_heads_per_row(value(chain.mask).type.shape, row)};
        const bool ok = exponent.constant && exponent.type.element_count() == 1 && mil::is_float(exponent.type.dtype) &&
                        chain.shape.heads_per_mask_row > 0 && value(chain.k).type.shape == lane &&
                        value(chain.v).type.shape == lane && value(chain.q).type.shape == lane &&
                        private_results(steps, out);
        return ok ? std::optional(chain) : std::nullopt;
    });
}

ChainsByStep<ChunkChain> ChainFinder::chunk_attention() const {
    return fp16_chains<ChunkChain>([&](const Step& last, auto& made, StepList& steps) -> std::optional<ChunkChain> {
        // Made from the end: every step found once (made records it), every shared operand compared by id.
        const Step* out = made(last.out, "transpose");
        const Step* ctx = out ? made(arg(*out, "x"), "add") : nullptr;
        const Step* past_ctx = ctx ? made(arg(*ctx, "x"), "matmul") : nullptr;
        const Step* own_ctx = past_ctx ? made(arg(*ctx, "y"), "matmul") : nullptr;
        const Step* past_p = own_ctx ? made(arg(*past_ctx, "x"), "mul") : nullptr;
        const Step* own_p = past_p ? made(arg(*own_ctx, "x"), "mul") : nullptr;
        if (!own_p || arg(*past_p, "y") != arg(*own_p, "y")) return std::nullopt;
        const Step* inv = made(arg(*past_p, "y"), "pow");
        const Step* denom = inv ? made(arg(*inv, "x"), "add") : nullptr;
        const Step* past_sum = denom ? made(arg(*denom, "x"), "reduce_sum") : nullptr;
        const Step* own_sum = past_sum ? made(arg(*denom, "y"), "reduce_sum") : nullptr;
        const Step* past_e = own_sum ? made(arg(*past_p, "x"), "exp") : nullptr;
        const Step* own_e = past_e ? made(arg(*own_p, "x"), "exp") : nullptr;
        if (!own_e || arg(*past_sum, "x") != past_e->out || arg(*own_sum, "x") != own_e->out) return std::nullopt;
        const Step* past_shift = made(arg(*past_e, "x"), "sub");
        const Step* own_shift = past_shift ? made(arg(*own_e, "x"), "sub") : nullptr;
        if (!own_shift || arg(*past_shift, "y") != arg(*own_shift, "y")) return std::nullopt;
        const Step* m = made(arg(*past_shift, "y"), "add");
        const Step* over = m ? made(arg(*m, "y"), "relu") : nullptr;
        const Step* gap = over ? made(arg(*over, "x"), "sub") : nullptr;
        const Step* past = gap ? made(arg(*past_shift, "x"), "add") : nullptr;
        const Step* own = past ? made(arg(*own_shift, "x"), "add") : nullptr;
        const Step* top_past = own ? made(arg(*gap, "x"), "reduce_max") : nullptr;
        const Step* top_own = top_past ? made(arg(*m, "x"), "reduce_max") : nullptr;
        if (!top_own || arg(*gap, "y") != top_own->out || arg(*top_past, "x") != past->out ||
            arg(*top_own, "x") != own->out)
            return std::nullopt;
        const Step* past_scores = made(arg(*past, "x"), "matmul");
        const Step* own_scores = past_scores ? made(arg(*own, "x"), "matmul") : nullptr;
        if (!own_scores || arg(*past_scores, "x") != arg(*own_scores, "x")) return std::nullopt;
        ChunkChain chain;
        chain.q = arg(*past_scores, "x"), chain.keys = arg(*past_scores, "y"), chain.k = arg(*own_scores, "y");
        chain.values = arg(*past_ctx, "y"), chain.v = arg(*own_ctx, "y");
        chain.past_mask = arg(*past, "y"), chain.own_mask = arg(*own, "y"), chain.exponent = arg(*inv, "y");
        // Shapes: q, k, v [.., D, S] and the caches [.., D, T], one batch axis set for all four matmuls (the
        // heads), the scores transposing q, the contexts values and v; every reduction over the last axis; the
        // contexts' sum [.., S, D] transposed back to [.., D, S].
        using Dims = frontend::MatmulDims;
        const Dims &ps = std::get<Dims>(past_scores->typed.attrs), &os = std::get<Dims>(own_scores->typed.attrs);
        const Dims &pc = std::get<Dims>(past_ctx->typed.attrs), &oc = std::get<Dims>(own_ctx->typed.attrs);
        const int64_t D = ps.K, S = ps.M, T = ps.N;
        for (const Dims* d : {&ps, &os, &pc, &oc})
            if (d->x_batch != ps.batch || d->y_batch != ps.batch || d->batch != ps.batch) return std::nullopt;
        if (!ps.transpose_x || ps.transpose_y || !os.transpose_x || os.transpose_y || pc.transpose_x ||
            !pc.transpose_y || oc.transpose_x || !oc.transpose_y || os.M != S || os.K != D || os.N != S ||
            pc.M != S || pc.K != T || pc.N != D || oc.M != S || oc.K != S || oc.N != D || D <= 0 || S <= 0 || T <= 0)
            return std::nullopt;
        const int64_t rank = static_cast<int64_t>(past_scores->op->type.shape.size());
        std::vector<int64_t> swap(static_cast<size_t>(rank));
        for (int64_t d = 0; d < rank; ++d) swap[static_cast<size_t>(d)] = d;
        std::swap(swap[static_cast<size_t>(rank - 1)], swap[static_cast<size_t>(rank - 2)]);
        if (std::get<frontend::Permutation>(out->typed.attrs).perm != swap) return std::nullopt;
        for (const Step* r : {past_sum, own_sum, top_past, top_own}) {
            const auto& axes = std::get<frontend::Reduction>(r->typed.attrs).axes;
            if (axes != std::vector<int64_t>{rank - 1} || r->op->type.shape.back() != 1) return std::nullopt;
        }
        // The masks broadcast over the heads: [.., 1, T] or [.., S, T] past, [.., S, S] own, ones in front.
        auto mask_rows = [&](int id, int64_t width) -> int64_t {
            const Shape& shape = value(id).type.shape;
            if (shape.size() < 2 || shape.back() != width) return 0;
            for (size_t d = 0; d + 2 < shape.size(); ++d)
                if (shape[d] != 1) return 0;
            return shape[shape.size() - 2];
        };
        const int64_t past_rows = mask_rows(chain.past_mask, T);
        const ValueInfo& exponent = value(chain.exponent);
        const Shape& qs = value(chain.q).type.shape;
        const bool ok = (past_rows == 1 || past_rows == S) && mask_rows(chain.own_mask, S) == S &&
                        exponent.constant && exponent.type.element_count() == 1 && mil::is_float(exponent.type.dtype) &&
                        qs.size() >= 2 && qs[qs.size() - 2] == D && qs.back() == S &&
                        value(chain.k).type.shape == qs && value(chain.v).type.shape == qs &&
                        value(chain.keys).type.shape == value(chain.values).type.shape &&
                        out->op->type.shape == qs && private_results(steps, out);
        chain.shape = {element_count(ps.batch), D, S, T, past_rows};
        return ok ? std::optional(chain) : std::nullopt;
    });
}

ChainsByStep<NormChain> ChainFinder::stable_norms() const {
    return fp16_chains<NormChain>([&](const Step& last, auto& made, StepList& steps) -> std::optional<NormChain> {
        bool ok = true;
        // The scalar float const operand `name` of `step`, as the frame holds it.
        auto scalar = [&](const Step* step, const char* name) {
            const int id = step ? arg(*step, name) : -1;
            const ValueInfo* v = id >= 0 ? &value(id) : nullptr;
            ok = ok && v && v->constant && v->type.element_count() == 1 && mil::is_float(v->type.dtype);
            return ok ? const_floats(*v)->at(0) : 0.0f;
        };
        const Step* normed = made(last.out, "mul");
        const Step* rstd = normed ? made(arg(*normed, "y"), "pow") : nullptr;
        const Step* var = rstd ? made(arg(*rstd, "x"), "add") : nullptr;
        if (!var) return std::nullopt;
        const Step *meansq = made(arg(*var, "x"), "mul"), *eps = made(arg(*var, "y"), "mul");
        const Step* sqsum = meansq ? made(arg(*meansq, "x"), "reduce_sum") : nullptr;
        const Step* sq = sqsum ? made(arg(*sqsum, "x"), "mul") : nullptr;
        const Step* root = eps ? made(arg(*eps, "x"), "mul") : nullptr;
        const int y = arg(*normed, "x");
        if (!sq || !root || arg(*sq, "x") != y || arg(*sq, "y") != y || arg(*eps, "y") != root->out) return std::nullopt;
        const Step *centered = made(y, "sub"), *mean = nullptr, *sum = nullptr, *unit = nullptr;
        if (centered) {
            mean = made(arg(*centered, "y"), "mul");
            sum = mean ? made(arg(*mean, "x"), "reduce_sum") : nullptr;
            unit = sum ? made(arg(*centered, "x"), "mul") : nullptr;
            if (!unit || arg(*sum, "x") != unit->out) return std::nullopt;
        } else {
            unit = made(y, "mul");
        }
        const Step* inv = unit ? made(arg(*unit, "y"), "pow") : nullptr;
        const Step* scale = inv ? made(arg(*inv, "x"), "add") : nullptr;
        const Step* peak = scale ? made(arg(*scale, "x"), "add") : nullptr;
        const Step* top = peak ? made(arg(*peak, "x"), "reduce_max") : nullptr;
        const Step* over = peak ? made(arg(*peak, "y"), "relu") : nullptr;
        const Step* gap = over ? made(arg(*over, "x"), "sub") : nullptr;
        const Step* bottom = gap ? made(arg(*gap, "x"), "reduce_max") : nullptr;
        const Step* neg = bottom ? made(arg(*bottom, "x"), "mul") : nullptr;
        if (!top || !neg || arg(*root, "x") != inv->out || arg(*gap, "y") != top->out) return std::nullopt;
        NormChain chain;
        chain.x = arg(*unit, "x");
        if (arg(*top, "x") != chain.x || arg(*neg, "x") != chain.x) return std::nullopt;
        const Shape& shape = value(chain.x).type.shape;  // [1, C, 1, S]
        ok = shape.size() == 4 && shape[0] == 1 && shape[2] == 1 &&
             normed->op->type.shape == shape;
        for (const Step* r : {top, bottom, sqsum, sum}) ok = ok && (!r || reduces_channels(*r));  // sum: LayerNorm's
        StableNorm& n = chain.shape;
        n.channels = ok ? shape[1] : 0, n.lanes = ok ? shape[3] : 0, n.center = centered != nullptr;
        n.neg_y = scalar(neg, "y"), n.floor = scalar(scale, "y"), n.inv_y = scalar(inv, "y");
        n.mean_y = centered ? scalar(mean, "y") : 0.0f, n.meansq_y = scalar(meansq, "y");
        n.root_eps_y = scalar(root, "y"), n.rsqrt_y = scalar(rstd, "y");
        if (!ok || !private_results(steps, normed)) return std::nullopt;
        // The affine tail: mul by gamma, then (LayerNorm) add beta, each the only reader of what it reads.
        const Step* tail = normed;
        for (const auto& [op, operand] : {std::pair{"mul", &chain.gamma}, std::pair{"add", &chain.beta}}) {
            const Step* next = sole_reader(tail->out);
            const int p = next && next->op->op == op ? arg(*next, "y") : -1;
            const Shape* ps = p >= 0 ? &value(p).type.shape : nullptr;
            // [1, C, 1, 1], or one value (a const of equal values is held shrunk: shrink_repeated_consts)
            if (!ps || arg(*next, "x") != tail->out || next->op->type.dtype != mil::DType::fp16 ||
                (*ps != Shape{1, shape[1], 1, 1} && *ps != Shape{1, 1, 1, 1}))
                break;
            (op == std::string("mul") ? n.gamma_stride : n.beta_stride) = (*ps)[1] > 1 ? 1 : 0;
            *operand = p;
            steps.push_back(next);
            tail = next;
        }
        return chain;
    });
}

ChainsByStep<RotaryChain> ChainFinder::rotaries() const {
    auto made = [&](int id, const char* op) {  // read by the chain's next step only
        return id >= 0 && reads(id) == 1 ? fp16_producer(id, op) : nullptr;
    };
    auto shape_of = [&](int id) -> const Shape& { return value(id).type.shape; };
    ChainsByStep<RotaryChain> found;
    for (const auto& sum : model_.steps_) {
        if (sum.op->op != "add" || sum.op->type.dtype != mil::DType::fp16) continue;
        const Step *cos = made(arg(sum, "x"), "mul"), *sin = made(arg(sum, "y"), "mul");
        const Step* mate = sin ? made(arg(*sin, "x"), "matmul") : nullptr;
        RotaryChain chain;
        if (!mate && cos) {  // the gradient: add(mul(dy, cos), matmul(partner, mul(dy, sin), transpose_x))
            mate = made(arg(sum, "y"), "matmul");
            sin = mate ? made(arg(*mate, "y"), "mul") : nullptr;
            if (!sin || arg(*sin, "x") != arg(*cos, "x")) continue;
            chain.gradient = true;
        }
        if (!cos || !mate) continue;
        chain.x = arg(*cos, "x"), chain.cos = arg(*cos, "y"), chain.sin = arg(*sin, "y");
        chain.partner = arg(*mate, "x");
        const auto& md = std::get<frontend::MatmulDims>(mate->typed.attrs);
        const Shape& x = shape_of(chain.x);  // [1, H, D, S]
        if (arg(*mate, "y") != (chain.gradient ? sin->out : chain.x) || md.transpose_x != chain.gradient ||
            md.transpose_y || x.size() != 4 || x[0] != 1 ||
            md.M != x[2] || md.K != x[2] || md.N != x[3] || element_count(md.x_batch) != 1 || md.y_batch != md.batch ||
            !value(chain.partner).constant || shape_of(chain.partner) != Shape{1, 1, x[2], x[2]} ||
            shape_of(chain.cos) != Shape{1, 1, x[2], x[3]} || shape_of(chain.sin) != Shape{1, 1, x[2], x[3]} ||
            sum.op->type.shape != x)
            continue;
        chain.shape = {x[1], x[2], x[3]};
        chain.steps = {mate, cos, sin, &sum};
        std::sort(chain.steps.begin(), chain.steps.end());  // program order: steps_ is a vector
        for (const Step* step : chain.steps) found[step] = chain;
    }
    return found;
}

ChainsByStep<ReplicatedOutput> ChainFinder::replicated_outputs(const std::set<const Step*>& grouped,
                                                               const ElementwiseRuns& runs) const {
    ChainsByStep<ReplicatedOutput> found;
    for (size_t k = 0; k < outputs_.size(); ++k) {
        const int id = model_.ids_.at(outputs_[k].name);
        const auto made = producer_.find(id);
        const mil::DType dtype = outputs_[k].type.dtype;
        if (made == producer_.end()) continue;
        const Step* step = made->second;
        if (step->op->op != "add" || step->arg_ids.size() != 2 || grouped.count(step) || runs.count(step) ||
            reads(id) != 2 || (dtype != mil::DType::fp16 && dtype != mil::DType::fp32))
            continue;
        const Shape& out = step->op->type.shape;
        for (int z = 0; z < 2; ++z) {
            const int zeros = step->arg_ids[static_cast<size_t>(z)], other = step->arg_ids[static_cast<size_t>(1 - z)];
            if (zeros < 0 || other < 0 || !all_positive_zero(value(zeros), out)) continue;
            const Shape& o = value(other).type.shape;
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

int64_t ChainFinder::one_hot_row(int id) const {
    const ValueInfo& v = value(id);
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

ChainsByStep<PackedChain> ChainFinder::packed_outputs(const std::set<const Step*>& grouped) const {
    auto fp16_tensor = [&](int id) {
        return id >= 0 && value(id).type.is_tensor && value(id).type.dtype == mil::DType::fp16;
    };
    std::map<int, PackedChain> open;  // by the value id of its running sum
    for (const auto& step : model_.steps_) {
        const Shape& out = step.op->type.shape;
        if (grouped.count(&step) || step.arg_ids.size() != 2 || !fp16_tensor(step.out) || out.size() != 4 || out[0] != 1)
            continue;
        const int x = step.arg_ids[0], y = step.arg_ids[1];
        if (step.op->op == "mul") {
            for (const auto& [block, row] : {std::pair<int, int>{x, y}, {y, x}}) {
                if (!fp16_tensor(block) || value(block).constant || row < 0) continue;
                const Shape& b = value(block).type.shape;
                const int64_t hot = one_hot_row(row);
                if (hot < 0 || b.size() != 4 || b[0] != 1 || b[1] != 1 || out[1] != value(row).type.shape[1] ||
                    out[2] != b[2] || out[3] != b[3])
                    continue;
                PackedChain term{{&step}, {block}, {b[2] * b[3], out[1], {hot}}};
                // A block that a reshape changing the lane axis copies, for this mul alone: the placement
                // reads the reshape's operand (the same elements in the same order) and skips the copy.
                const auto made = producer_.find(block);
                const Step* reshape = made == producer_.end() ? nullptr : made->second;
                const int from = reshape && reshape->op->op == "reshape" ? arg(*reshape, "x") : -1;
                if (from >= 0 && reads(block) == 1 && fp16_tensor(from) && !cut_values_.count(block) &&
                    value(block).slot == block && !value(from).type.shape.empty() &&
                    value(from).type.shape.back() != b.back()) {
                    term.steps.insert(term.steps.begin(), reshape);
                    term.blocks[0] = from;
                }
                open[step.out] = std::move(term);
                break;
            }
        } else if (step.op->op == "add" && x != y && open.count(x) && open.count(y) && open.at(y).blocks.size() == 1 &&
                   reads(x) == 1 && reads(y) == 1) {
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
    ChainsByStep<PackedChain> found;
    for (const auto& [id, chain] : open)
        if (chain.blocks.size() >= 2)
            for (const Step* step : chain.steps) found[step] = chain;
    return found;
}

std::optional<ElementwiseRun::Kind> ChainFinder::operand_kind(int id, const Shape& out) const {
    const ValueInfo& v = value(id);
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

ElementwiseRuns ChainFinder::elementwise_runs(const std::set<const Step*>& grouped) const {
    auto fusable = [&](const Step& step) {
        ElementwiseRun::Fn fn;
        const mil::Type& t = step.op->type;
        if (grouped.count(&step) || !elementwise_fn(step.op->op, &fn) || !t.is_tensor || !mil::is_float(t.dtype) ||
            t.shape.empty() || t.element_count() == 0 || step.arg_ids.size() != (is_unary(fn) ? 1u : 2u))
            return false;
        for (int id : step.arg_ids)
            if (id < 0 || !operand_kind(id, t.shape)) return false;
        return true;
    };
    ElementwiseRuns runs;
    StepList run;
    auto close = [&] {
        if (run.size() >= 2)
            for (const Step* step : run) runs[step] = run;
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

StepList ChainFinder::readers_of(int id) const {
    StepList found;
    for (const auto& step : model_.steps_)
        if (std::find(step.arg_ids.begin(), step.arg_ids.end(), id) != step.arg_ids.end()) found.push_back(&step);
    return found;
}

ChainsByStep<LaneBlockChain> ChainFinder::lane_block_chains(const ElementwiseRuns& runs,
                                                            const std::set<const Step*>& grouped) const {
    // A 1x1 conv of one image whose rows are its channels ([1, C, 1, S] to [1, C', 1, S]), into its own slot.
    auto pointwise = [&](const Step* step) {
        if (!step || grouped.count(step) || step->op->op != "conv" || value(step->out).slot != step->out) return false;
        const auto* geometry = std::get_if<frontend::ConvGeometry>(&step->typed.attrs);
        if (!geometry) return false;
        const frontend::ConvGeometry& g = *geometry;
        return g.n == 1 && g.h == 1 && g.kh == 1 && g.kw == 1 && g.groups == 1 && g.sh == 1 && g.sw == 1 &&
               g.pt == 0 && g.pb == 0 && g.pl == 0 && g.pr == 0;
    };
    // The first channel of a slice of every lane of `id` ([1, C, 1, S]: begin [0, c0, 0, 0], stride 1, extent
    // [1, c, 1, S]) into its own slot, else -1.
    auto channel_slice = [&](const Step* step, int id) -> int64_t {
        const Shape& whole = value(id).type.shape;
        if (grouped.count(step) || step->op->op != "slice_by_size" || arg(*step, "x") != id ||
            value(step->out).slot != step->out)
            return -1;
        const auto& box = std::get<frontend::Slice>(step->typed.attrs);
        const bool fits = box.begin.size() == 4 && box.begin[0] == 0 && box.begin[2] == 0 && box.begin[3] == 0 &&
                          box.stride == std::vector<int64_t>(4, 1) && box.extent.size() == 4 && box.extent[0] == 1 &&
                          box.extent[2] == 1 && box.extent[3] == whole[3];
        return fits ? box.begin[1] : -1;
    };
    // One elementwise step a run would take (any operand per row or a scalar, or of its shape).
    auto elementwise = [&](const Step* step) {
        ElementwiseRun::Fn fn;
        if (grouped.count(step) || !elementwise_fn(step->op->op, &fn) || !mil::is_float(step->op->type.dtype) ||
            step->arg_ids.size() != (is_unary(fn) ? 1u : 2u))
            return false;
        for (int id : step->arg_ids)
            if (id < 0 || !operand_kind(id, step->op->type.shape)) return false;
        return true;
    };
    ChainsByStep<LaneBlockChain> found;
    for (const auto& up : model_.steps_) {
        const Shape& hidden = up.op->type.shape;
        if (!pointwise(&up) || found.count(&up)) continue;  // (a chain's second conv starts none)
        LaneBlockChain chain;
        chain.up = &up;
        StepList slices, consumers;  // up's channel slices; the steps reading up's result or a slice of it
        for (const Step* reader : readers_of(up.out)) {
            const int64_t channel = channel_slice(reader, up.out);
            if (channel < 0) {
                consumers.push_back(reader);
                continue;
            }
            slices.push_back(reader);
            chain.slices[reader->out] = channel;
            for (const Step* next : readers_of(reader->out)) consumers.push_back(next);
        }
        // The elementwise steps: the run of the first consumer, or that step alone; none when the first consumer is
        // no elementwise step (up's slices are then the outputs).
        std::sort(consumers.begin(), consumers.end());  // program order: steps_ is a vector
        if (!consumers.empty()) {
            const auto run = runs.find(consumers.front());
            if (run != runs.end()) chain.run = run->second;
            else if (elementwise(consumers.front())) chain.run = {consumers.front()};
        }
        bool fits = true;
        for (const Step* step : consumers)  // (with no run, the slices' readers are outside the chain)
            fits = fits && (chain.run.empty() || std::find(chain.run.begin(), chain.run.end(), step) != chain.run.end());
        std::set<int> computed;  // the run's results
        for (const Step* step : chain.run) computed.insert(step->out);
        for (const Step* step : chain.run)
            for (int id : step->arg_ids) {
                const auto kind = operand_kind(id, step->op->type.shape);
                if (kind == ElementwiseRun::Kind::full)
                    fits = fits && (computed.count(id) || id == up.out || chain.slices.count(id));
                else
                    fits = fits && (kind == ElementwiseRun::Kind::per_row || kind == ElementwiseRun::Kind::scalar);
            }
        // What reads the result: one pointwise conv, or channel slices of every lane.
        const int result = chain.run.empty() ? up.out : chain.run.back()->out;
        const Shape& shape = value(result).type.shape;
        if (!fits || shape.size() != 4 || shape[3] != hidden[3]) continue;
        if (chain.run.empty()) chain.slices.clear(), slices.clear();  // up's slices are the outputs
        const StepList sinks = readers_of(result);
        if (sinks.size() == 1 && pointwise(sinks[0]) && arg(*sinks[0], "x") == result) {
            chain.down = sinks[0];
        } else {
            for (const Step* sink : sinks) {
                const int64_t channel = channel_slice(sink, result);
                fits = fits && channel >= 0;
                chain.outputs.emplace_back(sink, channel);
            }
            if (!fits || sinks.empty()) continue;
        }
        chain.steps = {&up};
        chain.steps.insert(chain.steps.end(), slices.begin(), slices.end());
        chain.steps.insert(chain.steps.end(), chain.run.begin(), chain.run.end());
        if (chain.down) chain.steps.push_back(chain.down);
        for (const auto& [sink, channel] : chain.outputs) chain.steps.push_back(sink);
        // Every result but the sinks' is read in the chain alone (a program output never is); no step is in two chains.
        std::map<int, int> reads_inside;
        for (const Step* step : chain.steps)
            for (int id : step->arg_ids) ++reads_inside[id];
        for (const Step* step : chain.steps)
            fits = fits && (chain.sink(step) || reads(step->out) == reads_inside[step->out]) && !found.count(step);
        if (!fits) continue;
        std::sort(chain.steps.begin(), chain.steps.end());  // program order: steps_ is a vector
        for (const Step* step : chain.steps) found[step] = chain;
    }
    return found;
}

}  // namespace orion::emu
