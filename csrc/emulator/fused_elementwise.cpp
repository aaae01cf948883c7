// Fused runs of binary elementwise ops (see fused_elementwise.h).
#include "emulator/fused_elementwise.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

namespace orion::emu {

namespace {

constexpr int64_t kRowGrain = int64_t{1} << 15;  // elements worth a thread's chunk, as ops_elementwise's
constexpr int64_t kFlatChunk = 4096;  // elements of a flat run computed together (in L1)

template <typename F>
void apply(const float* a, int64_t sa, const float* b, int64_t sb, float* c, int64_t n, F f) {
    // sa/sb: 1 for a row, 0 for a broadcast value (the compiler keeps the contiguous loops apart)
    if (sa == 1 && sb == 1)
        for (int64_t i = 0; i < n; ++i) c[i] = f(a[i], b[i]);
    else if (sa == 1)
        for (int64_t i = 0; i < n; ++i) c[i] = f(a[i], b[0]);
    else if (sb == 1)
        for (int64_t i = 0; i < n; ++i) c[i] = f(a[0], b[i]);
    else
        for (int64_t i = 0; i < n; ++i) c[i] = f(a[0], b[0]);
}

}  // namespace

bool elementwise_fn(const std::string& op, ElementwiseRun::Fn* fn) {
    using Fn = ElementwiseRun::Fn;
    if (op == "add") return *fn = Fn::add, true;
    if (op == "sub") return *fn = Fn::sub, true;
    if (op == "mul") return *fn = Fn::mul, true;
    if (op == "real_div") return *fn = Fn::div, true;
    if (op == "pow") return *fn = Fn::pow, true;
    if (op == "sigmoid") return *fn = Fn::sigmoid, true;
    if (op == "tanh") return *fn = Fn::tanh, true;
    return false;
}

std::vector<int64_t> live_lanes_of_steps(const ElementwiseRun& run, const Frame& frame) {
    std::vector<int64_t> live(run.steps.size(), run.width);
    auto lanes_of = [&](const ElementwiseRun::Operand& o) -> int64_t {
        if (o.step >= 0) return live[static_cast<size_t>(o.step)];
        if (o.kind != ElementwiseRun::Kind::full && o.kind != ElementwiseRun::Kind::lanes) return run.width;
        const Tensor& t = frame.values[static_cast<size_t>(o.slot)];
        return t.last_dim() == run.width ? std::min(t.lanes, run.width) : run.width;
    };
    for (size_t s = 0; s < run.steps.size(); ++s)
        live[s] = std::min(lanes_of(run.steps[s].x), lanes_of(run.steps[s].y));
    return live;
}

namespace {

// Rows whose steps all have the same `live` lanes, short rows or a short live prefix (a batched decode step's dead
// sequences, a short prompt in a large bucket): the run over
// the live lanes gathered into rows of that width, in a frame of its own, its stored results scattered back.
// Each live element is computed and rounded as the whole run computes it; the dead lanes stay stale.
void run_compacted(const ElementwiseRun& run, Frame& frame, int64_t live) {
    using Kind = ElementwiseRun::Kind;
    const int64_t W = run.width, R = run.rows;
    ElementwiseRun compact = run;
    compact.width = live;
    Frame local;
    // (frame slot, offset, local slot) of the run's stored results and of the operands it reads
    using Place = std::tuple<int, int64_t, int>;
    std::vector<Place> stored, read;
    auto local_slot = [&](int slot, int64_t offset, std::vector<Place>& table) {
        for (const auto& [from, at, to] : table)
            if (from == slot && at == offset) return to;
        table.emplace_back(slot, offset, static_cast<int>(local.values.size()));
        local.values.emplace_back();
        return std::get<2>(table.back());
    };
    for (ElementwiseRun::Step& step : compact.steps) {
        for (ElementwiseRun::Operand* o : {&step.x, &step.y}) {
            if (o->step >= 0) continue;
            const Tensor& t = frame.values[static_cast<size_t>(o->slot)];
            const auto from = t.data.begin() + o->offset;
            o->slot = local_slot(o->slot, o->offset, read);
            o->offset = 0;
            Tensor& copy = local.values[static_cast<size_t>(o->slot)];
            if (!copy.data.empty()) continue;
            if (o->kind == Kind::full) {
                copy.data.resize(static_cast<size_t>(R * live));
                kernels::gather_lanes(&*from, R, W, live, copy.data.data());
            } else {  // a row of lanes (its live prefix), a value per row or a scalar: read as they are
                copy.data.assign(from, o->kind == Kind::lanes ? from + live : t.data.end());
            }
        }
        if (step.out >= 0) {
            const int slot = local_slot(step.out, 0, stored);
            local.values[static_cast<size_t>(slot)].data.resize(static_cast<size_t>(R * live));
            step.out = slot;
        }
    }
    run_elementwise(compact, local, nullptr);
    for (const auto& [slot, at, from] : stored)
        kernels::scatter_lanes(local.values[static_cast<size_t>(from)].data.data(), R, live,
                      frame.values[static_cast<size_t>(slot)].data.data(), W);
}

}  // namespace

void run_elementwise(const ElementwiseRun& run, Frame& frame, const std::vector<int64_t>* live) {
    using Kind = ElementwiseRun::Kind;
    using Fn = ElementwiseRun::Fn;
    if (live) {
        // Short rows (a decode step's sequences): one kernel call per row would cost more than the dead lanes it
        // skips, so they are computed whole, or gathered when every step has the same live lanes. So are long rows
        // with a short live prefix (a short prompt in a large bucket: Qwen2.5-0.5B's 16 tokens on 1,024 lanes), where
        // a call per row of a few lanes costs more than gathering them.
        const int64_t first = live->empty() ? run.width : live->front();
        const bool uniform = std::all_of(live->begin(), live->end(), [&](int64_t l) { return l == first; });
        const bool short_rows = run.width <= Tensor::kShortRow;
        if (uniform && first > 0 && first < run.width && (short_rows || first <= Tensor::kShortRow))
            return run_compacted(run, frame, first);
        if (short_rows) live = nullptr;
    }
    const int64_t total = run.rows * run.width;
    // A "row" here is a chunk of the flat tensor (flat runs) or a row of the last axis. Short rows (a
    // decode step's lanes) are computed R at a time, as one block: a step over operands that are whole
    // (or scalars, or earlier steps' blocks) is one call over the block, and each step's result is
    // rounded once per block, not once per row. Every element is computed and rounded as before. A step
    // with dead lanes computes and rounds each row's live prefix on its own.
    auto live_of = [&](size_t s) { return live ? (*live)[s] : run.width; };
    bool any_partial = false;
    for (size_t s = 0; s < run.steps.size(); ++s) any_partial = any_partial || live_of(s) < run.width;
    const bool flat = run.flat && !any_partial;
    const int64_t W = flat ? std::min<int64_t>(total, kFlatChunk) : run.width;
    if (W <= 0) return;
    const int64_t rows_total = flat ? (total + W - 1) / W : run.rows;
    const int64_t R = flat ? 1 : std::max<int64_t>(1, kFlatChunk / W);
    const int64_t blocks = (rows_total + R - 1) / R;
    const size_t n_steps = run.steps.size();
    kernels::parallel_for(blocks, std::max<int64_t>(1, kRowGrain / (W * R)), [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> scratch;  // grown, never shrunk: a regrowth would zero it
        if (const size_t need = n_steps * static_cast<size_t>(R * W); scratch.size() < need) scratch.resize(need);
        std::vector<float*> results(n_steps);  // each step's block
        for (int64_t block = begin; block < end; ++block) {
            const int64_t r0 = block * R, r1 = std::min(rows_total, r0 + R);
            const int64_t first = r0 * W, n = std::min(total, r1 * W) - first;  // the block's elements
            // Where operand `o` of row r starts, and its stride (1: a row, 0: one value).
            auto source = [&](const ElementwiseRun::Operand& o, int64_t r, int64_t* stride) -> const float* {
                *stride = o.kind == Kind::full || o.kind == Kind::lanes ? 1 : 0;
                if (o.step >= 0) return results[static_cast<size_t>(o.step)] + (r - r0) * W;
                const float* d = frame.values[static_cast<size_t>(o.slot)].data.data() + o.offset;
                switch (o.kind) {
                    case Kind::full: return d + r * W;
                    case Kind::lanes: return d;
                    case Kind::per_row: return d + r;
                    case Kind::scalar: return d;
                }
                return d;
            };
            auto per_row = [](const ElementwiseRun::Operand& o) {
                return o.step < 0 && (o.kind == Kind::lanes || o.kind == Kind::per_row);
            };
            for (size_t s = 0; s < n_steps; ++s) {
                const ElementwiseRun::Step& step = run.steps[s];
                float* c = step.out >= 0 ? frame.values[static_cast<size_t>(step.out)].data.data() + first
                                         : scratch.data() + s * static_cast<size_t>(R * W);
                results[s] = c;
                // One call over the block when no operand changes from row to row, else one per row.
                const int64_t step_live = live_of(s);
                const bool partial = step_live < W && !flat;
                const bool rowwise = partial || (r1 - r0 > 1 && (per_row(step.x) || per_row(step.y)));
                for (int64_t r = r0; r < (rowwise ? r1 : r0 + 1); ++r) {
                    int64_t sa = 0, sb = 0;
                    const float* a = source(step.x, r, &sa);
                    const float* b = source(step.y, r, &sb);
                    float* cr = c + (r - r0) * W;
                    const int64_t m = partial ? step_live : rowwise ? W : n;
                    switch (step.fn) {
                        case Fn::add: apply(a, sa, b, sb, cr, m, [](float u, float v) { return u + v; }); break;
                        case Fn::sub: apply(a, sa, b, sb, cr, m, [](float u, float v) { return u - v; }); break;
                        case Fn::mul: apply(a, sa, b, sb, cr, m, [](float u, float v) { return u * v; }); break;
                        case Fn::div: apply(a, sa, b, sb, cr, m, [](float u, float v) { return u / v; }); break;
                        case Fn::pow: apply(a, sa, b, sb, cr, m, [](float u, float v) { return std::pow(u, v); }); break;
                        // unary: x has the step's shape, so `a` is a whole row or block
                        case Fn::sigmoid: kernels::sigmoid(a, cr, static_cast<size_t>(m)); break;
                        case Fn::tanh: kernels::tanh(a, cr, static_cast<size_t>(m)); break;
                    }
                }
                if (step.round && partial)
                    for (int64_t r = r0; r < r1; ++r) kernels::round_fp16(c + (r - r0) * W, static_cast<size_t>(step_live));
                else if (step.round)
                    kernels::round_fp16(c, static_cast<size_t>(n));
            }
        }
    });
}

}  // namespace orion::emu
