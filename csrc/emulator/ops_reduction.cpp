// Ops that combine many elements: reductions, softmax, layer_norm and attention. Intermediate
// sums are fp32; only the op's result is rounded to fp16.
#include <algorithm>
#include <cmath>
#include <limits>

#include "emulator/ops.h"

namespace orion::emu {

namespace {

// Walks the elements of `shape` in order, giving f(i, group, within): the flat index of the element's
// reduction group (the reduced `axes` dropped) and of its place inside the group (only the reduced
// axes). Counters, not tables: nothing is stored per element.
template <typename F>
void for_each_grouped(const Shape& shape, const std::vector<int64_t>& axes, F&& f) {
    Shape kept = shape, inner = shape;
    for (size_t d = 0; d < shape.size(); ++d)
        (std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end() ? kept : inner)[d] = 1;
    const auto kstr = strides_of(kept), istr = strides_of(inner);
    std::vector<int64_t> gstep(shape.size()), wstep(shape.size()), idx(shape.size(), 0);
    for (size_t d = 0; d < shape.size(); ++d) gstep[d] = kept[d] == 1 ? 0 : kstr[d], wstep[d] = inner[d] == 1 ? 0 : istr[d];
    const int64_t n = element_count(shape);
    int64_t g = 0, w = 0;
    for (int64_t i = 0; i < n; ++i) {
        f(i, g, w);
        for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
            g += gstep[d], w += wstep[d];
            if (++idx[d] < shape[d]) break;
            g -= gstep[d] * shape[d], w -= wstep[d] * shape[d];
            idx[d] = 0;
        }
    }
}

enum class Reduce { sum, max, mean };

// A reduction's parallel chunks: at least this many elements, and a kept last axis split in runs of at least
// this many lanes (whole cache lines and vectors).
constexpr int64_t kReduceWork = int64_t{1} << 15;
constexpr int64_t kReduceLanes = 64;

// Where each row (run along the last axis) of a tensor reduced over `axes` accumulates: the group of
// the row's first element, and whether the last axis is reduced (the row is one group) or kept (lane
// j goes to group start + j). Rows are walked in order by an odometer over the leading axes, so
// nothing is stored per row or per element: compiling a reduction costs the same for any shape.
struct RowGroups {
    Shape lead;                  // the axes before the last
    std::vector<int64_t> step;   // per leading axis: how far the group moves when its index grows by one
    int64_t rows = 0, width = 1;
    bool last_reduced = false;

    // Whether each row has a group of its own (no leading axis reduced): rows may then go to any thread.
    bool rows_apart() const {
        for (size_t d = 0; d < lead.size(); ++d)
            if (step[d] == 0 && lead[d] > 1) return false;
        return true;
    }

    template <typename F>
    void for_each_row(F&& f, int64_t limit, int64_t first = 0) const {  // f(row, group start), rows [first, limit)
        std::vector<int64_t> idx(lead.size(), 0);
        int64_t g = 0;
        for (int64_t d = static_cast<int64_t>(lead.size()) - 1, rest = first; d >= 0; --d) {  // row `first`'s place
            idx[static_cast<size_t>(d)] = rest % lead[static_cast<size_t>(d)];
            g += idx[static_cast<size_t>(d)] * step[static_cast<size_t>(d)];
            rest /= lead[static_cast<size_t>(d)];
        }
        for (int64_t row = first; row < std::min(rows, limit); ++row) {
            f(row, g);
            for (int64_t d = static_cast<int64_t>(lead.size()) - 1; d >= 0; --d) {
                g += step[d];
                if (++idx[d] < lead[d]) break;
                g -= step[d] * lead[d];
                idx[d] = 0;
            }
        }
    }
};

RowGroups row_groups(const Shape& shape, const std::vector<int64_t>& axes) {
    RowGroups r;
    if (shape.empty()) {
        r.rows = 1;
        return r;
    }
    const size_t last = shape.size() - 1;
    Shape kept = shape;
    for (int64_t a : axes) kept[static_cast<size_t>(a)] = 1;
    const auto kstr = strides_of(kept);
    r.lead.assign(shape.begin(), shape.begin() + static_cast<int64_t>(last));
    for (size_t d = 0; d < last; ++d) r.step.push_back(kept[d] != 1 ? kstr[d] : 0);
    r.width = shape[last];
    r.last_reduced = std::find(axes.begin(), axes.end(), static_cast<int64_t>(last)) != axes.end();
    r.rows = r.width == 0 ? 0 : element_count(shape) / r.width;
    return r;
}

// Rows [r0, r1) of a reduction over the last axis whose rows have results of their own (RowGroups::rows_apart),
// kRowBatch rows at a time: each result is summed (or maxed) from its group's value in lane order, exactly as
// one row after another, but the rows' chains of dependent adds interleave, so an add waits on its own row's
// previous add only (one row alone is bound by the add latency: an attention gradient's [12, 256, 256]
// reduce_sum took ~1.4 ms).
constexpr int kRowBatch = 8;

template <Reduce kind>
void reduce_rows_interleaved(const RowGroups& g, const float* a, float* acc, int64_t r0, int64_t r1, int64_t lanes) {
    const float* src[kRowBatch];
    float* dst[kRowBatch];
    int n = 0;
    auto step = [](float v, float x) { return kind == Reduce::max ? std::max(v, x) : v + x; };
    auto flush = [&] {
        float v[kRowBatch];
        for (int j = 0; j < n; ++j) v[j] = *dst[j];
        if (n == kRowBatch) {
            for (int64_t i = 0; i < lanes; ++i)
                for (int j = 0; j < kRowBatch; ++j) v[j] = step(v[j], src[j][i]);
        } else {
            for (int j = 0; j < n; ++j)
                for (int64_t i = 0; i < lanes; ++i) v[j] = step(v[j], src[j][i]);
        }
        for (int j = 0; j < n; ++j) *dst[j] = v[j];
        n = 0;
    };
    g.for_each_row([&](int64_t row, int64_t start) {
        src[n] = a + row * g.width, dst[n] = acc + start;
        if (++n == kRowBatch) flush();
    }, r1, r0);
    flush();
}

BuiltOp build_reduce(OpContext& ctx, Reduce kind) {
    const mil::Type& tx = ctx.type("x");
    if (ctx.plan_only()) return {};
    const std::vector<int64_t>& axes = ctx.attrs<frontend::Reduction>().axes;
    const int64_t count = ctx.attrs<frontend::Reduction>().count;
    const auto groups = std::make_shared<const RowGroups>(row_groups(tx.shape, axes));
    const int x = ctx.slot("x"), o = ctx.out_slot();
    const bool reduces_lanes = !axes.empty() && axes.back() == static_cast<int64_t>(tx.shape.size()) - 1;
    // A partial live prefix (Tensor::live_prefix) over a kept leading axis: only its live entries' rows.
    const bool keeps_lead = tx.shape.size() >= 2 && std::find(axes.begin(), axes.end(), 0) == axes.end();
    const Shape out_shape = ctx.out_type().shape;
    return {[=](Frame& fr) {
                Tensor& in = fr.values[x];
                if (!keeps_lead) settle_prefix(in);
                const int64_t lead = keeps_lead ? live_leading(in, tx.shape) : 1;
                const float* a = in.data.data();
                Tensor& t = fr.values[o];
                if (keeps_lead) set_live_leading(t, out_shape, lead);
                t.lanes = reduces_lanes || !in.partial() ? t.last_dim() : in.lanes;
                const float init = kind == Reduce::max ? -std::numeric_limits<float>::infinity() : 0.0f;
                std::fill(t.data.begin(), t.data.end(), init);
                const RowGroups& g = *groups;
                const int64_t lanes = in.partial() ? in.lanes : g.width;
                float* acc = t.data.data();
                // Rows in order, each element in order: the same sums as element by element.
                if (g.width == 1 && lanes == 1 && t.data.size() == 1) {
                    // One element per row, one result (a [1, C, 1, 1] over C): the same order, in a register.
                    float v = acc[0];
                    if (kind == Reduce::max)
                        for (int64_t row = 0; row < g.rows; ++row) v = std::max(v, a[row]);
                    else
                        for (int64_t row = 0; row < g.rows; ++row) v += a[row];
                    acc[0] = v;
                } else {
                    const int64_t live_rows = keeps_lead && lead < tx.shape[0] ? lead * (g.rows / tx.shape[0]) : g.rows;
                    // Each result sums its elements in row order, then lane order, whatever thread computes it: a
                    // kept last axis splits the lanes over the threads, a reduced one the rows when each row has
                    // a group of its own; anything else runs on the caller's thread.
                    auto rows_of = [&](int64_t first, int64_t limit, int64_t i0, int64_t i1) {
                        g.for_each_row([&](int64_t row, int64_t start) {
                            const float* src = a + row * g.width;
                            float* dst = acc + start;
                            if (g.last_reduced) {
                                float v = *dst;
                                for (int64_t i = i0; i < i1; ++i)
                                    v = kind == Reduce::max ? std::max(v, src[i]) : v + src[i];
                                *dst = v;
                            } else {
                                for (int64_t i = i0; i < i1; ++i)
                                    dst[i] = kind == Reduce::max ? std::max(dst[i], src[i]) : dst[i] + src[i];
                            }
                        }, limit, first);
                    };
                    if (!g.last_reduced) {
                        const int64_t grain = std::max(kReduceLanes, kReduceWork / std::max<int64_t>(live_rows, 1));
                        kernels::parallel_for(lanes, grain,
                                              [&](int64_t i0, int64_t i1) { rows_of(0, live_rows, i0, i1); });
                    } else if (g.rows_apart()) {
                        const int64_t grain = std::max<int64_t>(1, kReduceWork / std::max<int64_t>(lanes, 1));
                        kernels::parallel_for(live_rows, grain, [&](int64_t r0, int64_t r1) {
                            if (kind == Reduce::max) reduce_rows_interleaved<Reduce::max>(g, a, acc, r0, r1, lanes);
                            else reduce_rows_interleaved<Reduce::sum>(g, a, acc, r0, r1, lanes);
                        });
                    } else {
                        rows_of(0, live_rows, 0, lanes);
                    }
                }
                if (kind == Reduce::mean) {
                    const bool lanes_cut = reduces_lanes && in.last_dim() > 0;  // an empty last axis: mean of nothing
                    const float live_count = static_cast<float>(lanes_cut ? count / in.last_dim() * in.lanes : count);
                    for (float& v : t.data) v /= live_count;
                }
                finish(t);
            }};
}

struct Lines {
    int64_t outer, n, inner;  // element (o, i, j) at (o * n + i) * inner + j
};

Lines lines_along(const Shape& shape, int64_t axis) {
    Lines l{1, shape[axis], 1};
    for (int64_t d = 0; d < axis; ++d) l.outer *= shape[d];
    for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d) l.inner *= shape[d];
    return l;
}

// In-place softmax of each line of `v` along the axis described by `l` (kernels::softmax). Only the
// first `lanes` entries of each run of `width` along the inner dimensions are computed.
void softmax_lines(float* v, const Lines& l, int64_t width = 1, int64_t lanes = 1) {
    if (l.n == 0 || l.inner == 0 || l.outer == 0) return;  // an empty tensor: no line (and v may be null)
    std::vector<float> line(l.inner == 1 ? 0 : static_cast<size_t>(l.n));  // a strided line, gathered
    for (int64_t o = 0; o < l.outer; ++o)
        for (int64_t j = 0; j < l.inner; ++j) {
            if (j % width >= lanes) continue;
            float* p = v + o * l.n * l.inner + j;
            if (l.inner == 1) {
                kernels::softmax(p, p, l.n);
                continue;
            }
            for (int64_t i = 0; i < l.n; ++i) line[i] = p[i * l.inner];
            kernels::softmax(line.data(), line.data(), l.n);
            for (int64_t i = 0; i < l.n; ++i) p[i * l.inner] = line[i];
        }
}

BuiltOp build_softmax(OpContext& ctx) {
    if (ctx.plan_only()) return {};
    const Shape& shape = ctx.type("x").shape;
    const int64_t axis = ctx.attrs<frontend::Axis>().axis;
    const Lines l = lines_along(shape, axis);
    const bool over_lanes = axis == static_cast<int64_t>(shape.size()) - 1;
    const int x = ctx.slot("x"), o = ctx.out_slot();
    return {[=](Frame& fr) {
                const Tensor& in = fr.values[x];
                Tensor& t = fr.values[o];
                t.lanes = in.lanes;
                if (over_lanes) {  // each row's live prefix is one line, rows in parallel
                    const int64_t width = t.last_dim(), rows = width > 0 ? t.size() / width : 0, lanes = t.lanes;
                    kernels::parallel_for(rows, 16, [&](int64_t begin, int64_t end) {
                        for (int64_t r = begin; r < end; ++r)
                            kernels::softmax(in.data.data() + r * width, t.data.data() + r * width, lanes);
                    });
                } else {
                    t.data = in.data;
                    softmax_lines(t.data.data(), l, in.last_dim(), in.lanes);
                }
                finish(t);
            }};
}

BuiltOp build_layer_norm(OpContext& ctx) {
    const mil::Type& tx = ctx.type("x");
    const frontend::Normalization& norm = ctx.attrs<frontend::Normalization>();
    const int64_t count = norm.reduced.count;
    const int64_t ngroups = element_count(tx.shape) / std::max<int64_t>(count, 1);
    if (ctx.plan_only()) return {nullptr, -1, 8.0 * static_cast<double>(ngroups)};  // means and variances
    const std::vector<int64_t> axes = norm.reduced.axes;
    const float eps = norm.epsilon;
    auto affine = [&](const char* arg, float fill) {
        return ctx.has(arg) ? ctx.floats(arg) : std::vector<float>(static_cast<size_t>(count), fill);
    };
    const auto gamma = affine("gamma", 1.0f), beta = affine("beta", 0.0f);
    const Shape shape = tx.shape;
    const int x = ctx.slot("x"), o = ctx.out_slot();
    return {[=](Frame& fr) {
                const float* a = fr.values[x].data.data();
                Tensor& t = fr.values[o];
                std::vector<float> mean(static_cast<size_t>(ngroups), 0.0f), var(static_cast<size_t>(ngroups), 0.0f);
                for_each_grouped(shape, axes, [&](int64_t i, int64_t g, int64_t) { mean[g] += a[i]; });
                for (float& m : mean) m /= static_cast<float>(count);
                for_each_grouped(shape, axes, [&](int64_t i, int64_t g, int64_t) {
                    var[g] += (a[i] - mean[g]) * (a[i] - mean[g]);
                });
                for (float& v : var) v = 1.0f / std::sqrt(v / static_cast<float>(count) + eps);
                for_each_grouped(shape, axes, [&](int64_t i, int64_t g, int64_t w) {
                    t.data[i] = (a[i] - mean[g]) * var[g] * gamma[w] + beta[w];
                });
                finish(t);
            }};
}

BuiltOp build_sdpa(OpContext& ctx) {
    const frontend::Attention& dims = ctx.attrs<frontend::Attention>();
    if (ctx.plan_only()) return {nullptr, -1, 4.0 * static_cast<double>(dims.L) * static_cast<double>(dims.S)};  // scores
    const int64_t L = dims.L, E = dims.E, S = dims.S, Ev = dims.Ev;
    const Shape batch = dims.batch;
    int mask = -1;
    bool bool_mask = false;
    Shape mask_shape;
    if (ctx.has("attn_mask")) {
        mask = ctx.slot("attn_mask");
        bool_mask = ctx.type("attn_mask").dtype == mil::DType::boolean;
        mask_shape = ctx.type("attn_mask").shape;
    }
    const int q = ctx.slot("query"), k = ctx.slot("key"), v = ctx.slot("value"), o = ctx.out_slot();
    const int64_t nb = element_count(batch);
    const bool round = ctx.out_type().dtype == mil::DType::fp16;
    return {[=](Frame& fr) {
                std::vector<float> scores(static_cast<size_t>(L * S));
                const float scale = 1.0f / std::sqrt(static_cast<float>(E));
                Shape full = batch;
                full.push_back(L);
                full.push_back(S);
                const auto mstr = strides_of(mask_shape);
                for (int64_t b = 0; b < nb; ++b) {
                    kernels::gemm(L, S, E, fr.values[q].data.data() + b * L * E, E, 1, fr.values[k].data.data() + b * S * E, 1,
                                  E, scores.data(), S, false);
                    for (int64_t i = 0; i < L * S; ++i) {
                        float s = scores[i] * scale;
                        if (mask >= 0) {
                            // Index of this score in the (broadcast) mask.
                            int64_t flat = b * L * S + i, mi = 0;
                            for (int64_t d = static_cast<int64_t>(full.size()) - 1, rest = flat; d >= 0; --d) {
                                const int64_t idx = rest % full[d];
                                rest /= full[d];
                                const int64_t md = d - static_cast<int64_t>(full.size() - mask_shape.size());
                                if (md >= 0 && mask_shape[md] != 1) mi += idx * mstr[md];
                            }
                            const float m = fr.values[mask].data[mi];
                            s = bool_mask ? (m != 0.0f ? s : -std::numeric_limits<float>::infinity()) : s + m;
                        }
                        scores[i] = s;
                    }
                    softmax_lines(scores.data(), Lines{L, S, 1});
                    kernels::gemm(L, Ev, S, scores.data(), S, 1, fr.values[v].data.data() + b * S * Ev, Ev, 1,
                                  fr.values[o].data.data() + b * L * Ev, Ev, round);
                }
            }};
}

}  // namespace

std::vector<OpEntry> reduction_ops() {
    return {
        {"reduce_sum", [](OpContext& c) { return build_reduce(c, Reduce::sum); }},
        {"reduce_max", [](OpContext& c) { return build_reduce(c, Reduce::max); }},
        {"reduce_mean", [](OpContext& c) { return build_reduce(c, Reduce::mean); }},
        {"softmax", build_softmax},
        {"layer_norm", build_layer_norm},
        {"scaled_dot_product_attention", build_sdpa},
    };
}

}  // namespace orion::emu
