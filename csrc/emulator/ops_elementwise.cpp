// Elementwise ops: binary arithmetic with numpy broadcasting, and unary activations.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <utility>

#include "emulator/ops.h"

namespace orion::emu {

namespace {

constexpr int64_t kElementwiseGrain = int64_t{1} << 15;  // elements worth a thread's chunk

// Calls fn(out_offset, x_offset, x_inner_stride, y_offset, y_inner_stride, inner_count) once per
// row of the innermost dimension of the broadcast output. With `coalesce`, dimensions that are
// contiguous (or broadcast) for both operands are merged first, so rows are as long as possible;
// without it a row is exactly the output's last axis (what live lanes restrict).
template <typename Fn>
void for_each_row(const Shape& out, const Shape& xs, const Shape& ys, bool coalesce, Fn&& fn) {
    const size_t rank = out.size();
    if (rank == 0) return fn(0, 0, 0, 0, 0, 1);
    auto broadcast_strides = [&](const Shape& s) {
        std::vector<int64_t> st(rank, 0);
        const auto own = strides_of(s);
        for (size_t i = 0; i < s.size(); ++i) {
            const size_t o = rank - s.size() + i;
            st[o] = s[i] == 1 ? 0 : own[i];
        }
        return st;
    };
    std::vector<int64_t> dims = out, sx = broadcast_strides(xs), sy = broadcast_strides(ys);
    if (coalesce) {
        std::vector<int64_t> d2, x2, y2;
        for (size_t i = 0; i < rank; ++i) {
            if (dims[i] == 1) continue;
            if (!d2.empty() && x2.back() == sx[i] * dims[i] && y2.back() == sy[i] * dims[i]) {
                d2.back() *= dims[i];
                x2.back() = sx[i];
                y2.back() = sy[i];
            } else {
                d2.push_back(dims[i]);
                x2.push_back(sx[i]);
                y2.push_back(sy[i]);
            }
        }
        if (d2.empty()) return fn(0, 0, 0, 0, 0, 1);
        dims = d2, sx = x2, sy = y2;
    }
    const size_t r = dims.size();
    const int64_t inner = dims[r - 1];
    if (inner == 0) return;
    const int64_t rows = element_count(dims) / inner;
    std::vector<int64_t> idx(r, 0);
    for (int64_t row = 0; row < rows; ++row) {
        int64_t ox = 0, oy = 0;
        for (size_t d = 0; d + 1 < r; ++d) {
            ox += idx[d] * sx[d];
            oy += idx[d] * sy[d];
        }
        fn(row * inner, ox, sx[r - 1], oy, sy[r - 1], inner);
        for (int64_t d = static_cast<int64_t>(r) - 2; d >= 0; --d) {
            if (++idx[d] < dims[d]) break;
            idx[d] = 0;
        }
    }
}

// Live prefixes (Tensor::live_prefix) of a binary op: the output's leading entries are live where every
// operand's that spans the output's leading axis is; an operand broadcast along it with a partial prefix
// is settled. Sets out's prefix and returns where it ends (elements).
int64_t live_prefix_of_binary(Tensor& out, const Shape& os, std::initializer_list<std::pair<Tensor*, const Shape*>> operands) {
    if (os.size() < 2) {  // the leading axis is the lane axis: live lanes say it
        for (const auto& operand : operands) settle_prefix(*operand.first);
        out.live_prefix = -1;
        return element_count(os);
    }
    int64_t lead = os[0];
    for (const auto& [t, shape] : operands) {
        if (!t->prefix_partial()) continue;
        if (shape->size() == os.size() && (*shape)[0] == os[0] && os[0] > 1) lead = std::min(lead, live_leading(*t, *shape));
        else settle_prefix(*t);
    }
    set_live_leading(out, os, lead);
    return lead * (element_count(os) / std::max<int64_t>(os[0], 1));
}

template <typename F>
BuiltOp binary(OpContext& ctx, F f) {
    if (ctx.plan_only()) return {};
    const int x = ctx.slot("x"), y = ctx.slot("y"), o = ctx.out_slot();
    const Shape xs = ctx.type("x").shape, ys = ctx.type("y").shape;  // a repeated const may be held shrunk
    const bool same = xs == ys;
    const Shape os = ctx.out_type().shape;
    return {[=](Frame& fr) {
                Tensor &ta = fr.values[x], &tb = fr.values[y];
                Tensor& out = fr.values[o];
                const int64_t end = live_prefix_of_binary(out, os, {{&ta, &xs}, {&tb, &ys}});
                // Live lanes: the narrowest live prefix among operands that span the output's last axis (a
                // lane dead in one operand is dead in the result; e.g. a residual add keeps the hinted lanes
                // of x past a batched attention, whose transposes made its own output whole).
                const int64_t width = out.last_dim();
                int64_t lanes = width;
                for (const Tensor* t : {&ta, &tb})
                    if (t->last_dim() == width) lanes = std::min(lanes, t->lanes);
                out.lanes = lanes;
                const float* a = ta.data.data();
                const float* b = tb.data.data();
                float* c = out.data.data();
                const bool full = !out.skips_dead_lanes(), round = out.dtype == mil::DType::fp16;
                if (same && full) {  // one flat range, split across the threads; fp16 rounding fused
                    kernels::parallel_for(end, kElementwiseGrain, [&](int64_t begin, int64_t end) {
                        for (int64_t i = begin; i < end; ++i) c[i] = f(a[i], b[i]);
                        if (round) kernels::round_fp16(c + begin, static_cast<size_t>(end - begin));
                    });
                    if (!round) finish(out);
                    return;
                }
                struct Row {
                    int64_t oo, ox, sx, oy, sy, n;
                };
                std::vector<Row> rows;
                const int64_t live = full ? std::numeric_limits<int64_t>::max() : out.lanes;
                for_each_row(out.shape, xs, ys, full,
                             [&](int64_t oo, int64_t ox, int64_t sx, int64_t oy, int64_t sy, int64_t n) {
                                 if (oo < end) rows.push_back({oo, ox, sx, oy, sy, std::min({n, live, end - oo})});
                             });
                const int64_t row_length = rows.empty() ? 1 : std::max<int64_t>(rows[0].n, 1);
                kernels::parallel_for(static_cast<int64_t>(rows.size()), std::max<int64_t>(1, kElementwiseGrain / row_length),
                                      [&](int64_t begin, int64_t end) {
                                          for (int64_t r = begin; r < end; ++r) {
                                              const auto [oo, ox, sx, oy, sy, m] = rows[static_cast<size_t>(r)];
                                              if (sx == 1 && sy == 0) {
                                                  const float bv = b[oy];
                                                  for (int64_t i = 0; i < m; ++i) c[oo + i] = f(a[ox + i], bv);
                                              } else if (sx == 0 && sy == 1) {
                                                  const float av = a[ox];
                                                  for (int64_t i = 0; i < m; ++i) c[oo + i] = f(av, b[oy + i]);
                                              } else {
                                                  for (int64_t i = 0; i < m; ++i) c[oo + i] = f(a[ox + i * sx], b[oy + i * sy]);
                                              }
                                              if (round && !full) kernels::round_fp16(c + oo, static_cast<size_t>(m));
                                          }
                                          if (round && full && begin < end) {  // whole rows are one range: round it once
                                              const Row& last = rows[static_cast<size_t>(end - 1)];
                                              const int64_t from = rows[static_cast<size_t>(begin)].oo;
                                              kernels::round_fp16(c + from, static_cast<size_t>(last.oo + last.n - from));
                                          }
                                      });
                if (!round) finish(out);
            }};
}

// A unary op computed row by row over the live lanes: rows(src, dst, n).
template <typename Rows>
BuiltOp unary_rows(OpContext& ctx, Rows rows) {
    if (ctx.plan_only()) return {};
    const int x = ctx.slot("x"), o = ctx.out_slot();
    const Shape xs = ctx.type("x").shape, os = ctx.out_type().shape;
    return {[=](Frame& fr) {
                Tensor& in = fr.values[x];
                const float* a = in.data.data();
                Tensor& out = fr.values[o];
                out.lanes = in.lanes;
                // A dead tail (Tensor::live_prefix) stays dead.
                const int64_t live_end = live_prefix_of_binary(out, os, {{&in, &xs}});
                float* c = out.data.data();
                if (!out.skips_dead_lanes()) {  // one flat range, split across the threads
                    kernels::parallel_for(live_end, kElementwiseGrain, [&](int64_t begin, int64_t end) {
                        rows(a + begin, c + begin, static_cast<size_t>(end - begin));
                    });
                } else {
                    const int64_t width = std::max<int64_t>(out.last_dim(), 1);
                    kernels::parallel_for(live_end / width, std::max<int64_t>(1, kElementwiseGrain / width),
                                          [&](int64_t begin, int64_t end) {
                                              for (int64_t r = begin; r < end; ++r)
                                                  rows(a + r * width, c + r * width, static_cast<size_t>(out.lanes));
                                          });
                }
                finish(out);
            }};
}

// A unary op from its per-element function.
template <typename F>
BuiltOp unary(OpContext& ctx, F f) {
    return unary_rows(ctx, [f](const float* src, float* dst, size_t n) {
        for (size_t i = 0; i < n; ++i) dst[i] = f(src[i]);
    });
}

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

BuiltOp build_gelu(OpContext& ctx) {
    using Mode = frontend::GeluMode::Kind;
    const Mode mode = ctx.attrs<frontend::GeluMode>().kind;
    if (mode == Mode::tanh_approximation)
        return unary(
            ctx, [](float v) { return 0.5f * v * (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v))); });
    if (mode == Mode::sigmoid_approximation) return unary(ctx, [](float v) { return v * sigmoid(1.702f * v); });
    return unary(ctx, [](float v) { return 0.5f * v * (1.0f + std::erf(v * 0.70710678f)); });
}

BuiltOp build_rsqrt(OpContext& ctx) {
    const float eps = ctx.attrs<frontend::Epsilon>().value;
    return unary(ctx, [eps](float v) { return 1.0f / std::sqrt(v + eps); });
}

}  // namespace

std::vector<OpEntry> elementwise_ops() {
    return {
        {"add", [](OpContext& c) { return binary(c, [](float a, float b) { return a + b; }); }},
        {"sub", [](OpContext& c) { return binary(c, [](float a, float b) { return a - b; }); }},
        {"mul", [](OpContext& c) { return binary(c, [](float a, float b) { return a * b; }); }},
        {"real_div", [](OpContext& c) { return binary(c, [](float a, float b) { return a / b; }); }},
        {"pow", [](OpContext& c) { return binary(c, [](float a, float b) { return std::pow(a, b); }); }},
        {"tanh", [](OpContext& c) { return unary_rows(c, kernels::tanh); }},  // the vectorised kernel
        {"sigmoid", [](OpContext& c) { return unary_rows(c, kernels::sigmoid); }},  // the vectorised kernel
        {"exp", [](OpContext& c) { return unary(c, [](float v) { return std::exp(v); }); }},
        {"relu", [](OpContext& c) { return unary(c, [](float v) { return v > 0.0f ? v : 0.0f; }); }},
        {"identity", [](OpContext& c) { return unary(c, [](float v) { return v; }); }},
        {"sqrt", [](OpContext& c) { return unary(c, [](float v) { return std::sqrt(v); }); }},
        {"rsqrt", build_rsqrt},
        {"gelu", build_gelu},
    };
}

}  // namespace orion::emu
