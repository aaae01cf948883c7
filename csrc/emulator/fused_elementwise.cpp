// Fused runs of binary elementwise ops (see fused_elementwise.h).
#include "emulator/fused_elementwise.h"

#include <cmath>

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
    return false;
}

void run_elementwise(const ElementwiseRun& run, Frame& frame) {
    using Kind = ElementwiseRun::Kind;
    using Fn = ElementwiseRun::Fn;
    const int64_t total = run.rows * run.width;
    // A "row" here is a chunk of the flat tensor (flat runs) or a row of the last axis.
    const int64_t W = run.flat ? std::min<int64_t>(total, kFlatChunk) : run.width;
    const int64_t rows_total = run.flat ? (total + W - 1) / W : run.rows;
    const size_t n_steps = run.steps.size();
    kernels::parallel_for(rows_total, std::max<int64_t>(1, kRowGrain / std::max<int64_t>(W, 1)), [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> scratch;
        scratch.resize(n_steps * static_cast<size_t>(W));
        std::vector<float*> rows(n_steps);
        for (int64_t r = begin; r < end; ++r) {
            const int64_t n = std::min(W, total - r * W);  // a flat run's last chunk may be short
            // Where operand `o` of row r starts, and its stride (1: a row, 0: one value).
            auto source = [&](const ElementwiseRun::Operand& o, int64_t* stride) -> const float* {
                *stride = o.kind == Kind::full || o.kind == Kind::lanes ? 1 : 0;
                if (o.step >= 0) return rows[static_cast<size_t>(o.step)];
                const float* d = frame.values[static_cast<size_t>(o.slot)].data.data();
                switch (o.kind) {
                    case Kind::full: return d + r * W;
                    case Kind::lanes: return d;
                    case Kind::per_row: return d + r;
                    case Kind::scalar: return d;
                }
                return d;
            };
            for (size_t s = 0; s < n_steps; ++s) {
                const ElementwiseRun::Step& step = run.steps[s];
                float* c = step.out >= 0 ? frame.values[static_cast<size_t>(step.out)].data.data() + r * W
                                         : scratch.data() + s * static_cast<size_t>(W);
                rows[s] = c;
                int64_t sa = 0, sb = 0;
                const float* a = source(step.x, &sa);
                const float* b = source(step.y, &sb);
                switch (step.fn) {
                    case Fn::add: apply(a, sa, b, sb, c, n, [](float u, float v) { return u + v; }); break;
                    case Fn::sub: apply(a, sa, b, sb, c, n, [](float u, float v) { return u - v; }); break;
                    case Fn::mul: apply(a, sa, b, sb, c, n, [](float u, float v) { return u * v; }); break;
                    case Fn::div: apply(a, sa, b, sb, c, n, [](float u, float v) { return u / v; }); break;
                    case Fn::pow: apply(a, sa, b, sb, c, n, [](float u, float v) { return std::pow(u, v); }); break;
                }
                if (step.round) kernels::round_fp16(c, static_cast<size_t>(n));
            }
        }
    });
}

}  // namespace orion::emu
