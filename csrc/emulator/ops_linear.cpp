// conv and matmul: the hot path. 1x1 convolutions with const weights run on the packed fp16
// kernel, on the packed int8 kernel for a constexpr_affine_dequantize weight whose values it can
// form exactly (symmetric per-output-channel scales with fp16-exact products), or on the packed
// 4-/6-bit kernel for a constexpr_lut_to_dense weight (fp16 LUTs per group of output channels) or
// a constexpr_blockwise_shift_scale one (4-bit, per output channel and power-of-two block of input
// channels); any other quantized weight is dequantized once here to the fp16 values the ANE would use. Other convolutions take a
// direct loop; matmul runs on the strided GEMM.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include <utility>

#include "emulator/keyed_weights.h"
#include "emulator/ops.h"

namespace orion::emu {

namespace {

// fp16 bits of a const weight, whatever its declared float type, or of a quantized one dequantized.
std::vector<uint16_t> weight_halves(OpContext& ctx) {
    if (const CompressedConst* a = ctx.compressed("weight")) {
        const std::vector<float> f = dequantize(*a, ctx.value(a->data));
        std::vector<uint16_t> h(f.size());
        kernels::float_to_half(f.data(), h.data(), f.size());
        return h;
    }
    const ValueInfo& w = ctx.constant("weight");
    if (w.blob && w.type.dtype == mil::DType::fp16) {
        std::vector<uint16_t> h(w.blob->size() / 2);
        if (!h.empty()) std::memcpy(h.data(), w.blob->data(), h.size() * 2);  // no output channels: no bytes
        return h;
    }
    const std::vector<float> f = ctx.floats("weight");
    std::vector<uint16_t> h(f.size());
    kernels::float_to_half(f.data(), h.data(), f.size());
    return h;
}

// The int8 weight [cout][cin] and one scale per output channel of a quantized 1x1 conv weight, when
// the int8 kernel computes its fp16 values exactly: int8 data, zero points all 0, one scale for all
// or one per output channel (axis 0), every q * scale an fp16 value.
struct Int8Weight {
    const int8_t* q;
    std::vector<float> scale;
};
std::optional<Int8Weight> exact_int8_weight(const OpContext& ctx, const CompressedConst& a, int64_t cout, int64_t cin) {
    const ValueInfo& data = ctx.value(a.data);
    if (data.type.dtype != mil::DType::int8 || !data.blob) return std::nullopt;
    for (float z : a.params.zero)
        if (z != 0.0f) return std::nullopt;
    const bool per_channel = a.params.n == cout && a.params.inner == cin;
    if (a.params.scale.size() != 1 && !(per_channel && static_cast<int64_t>(a.params.scale.size()) == cout))
        return std::nullopt;
    Int8Weight w{reinterpret_cast<const int8_t*>(data.blob->data()), {}};
    for (int64_t o = 0; o < cout; ++o) w.scale.push_back(a.params.s(o * cin));
    if (!kernels::int8_weights_fp16_exact(w.q, w.scale.data(), cout, cin)) return std::nullopt;
    return w;
}

// The unsigned values of a uint4/int4/uint6/uint8 BLOBFILE const (int4 shifted by 8 into [0, 15]).
std::vector<uint8_t> unpacked(const ValueInfo& v) {
    const int64_t n = v.type.element_count();
    const int bits = static_cast<int>(mil::dtype_bits(v.type.dtype));
    const std::string_view bytes = *v.blob;
    std::vector<uint8_t> out(static_cast<size_t>(n));
    if (bits == 4) {  // two a byte, the low nibble first
        const uint8_t flip = v.type.dtype == mil::DType::int4 ? 0x88 : 0;
        for (int64_t i = 0; i + 1 < n; i += 2) {
            const uint8_t b = static_cast<uint8_t>(bytes[static_cast<size_t>(i / 2)]) ^ flip;
            out[static_cast<size_t>(i)] = b & 15;
            out[static_cast<size_t>(i + 1)] = b >> 4;
        }
        if (n % 2) out[static_cast<size_t>(n - 1)] = (static_cast<uint8_t>(bytes[static_cast<size_t>(n / 2)]) ^ flip) & 15;
        return out;
    }
    for (int64_t i = 0; i < n; ++i) {
        const int64_t bit = i * bits;
        uint32_t word = static_cast<uint8_t>(bytes[static_cast<size_t>(bit / 8)]);
        if (bit % 8 + bits > 8) word |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[static_cast<size_t>(bit / 8 + 1)])) << 8;
        const uint32_t value = (word >> (bit % 8)) & ((1u << bits) - 1);
        out[static_cast<size_t>(i)] = static_cast<uint8_t>(value);
    }
    return out;
}

// A few of a compressed weight's stored bytes (the first, middle and last 16 of its data and of each table): what
// a keyed weight is checked by on each use (kernels::KeyedWeights), a constant cost that catches a key naming
// other bytes.
std::string stored_samples(const OpContext& ctx, const CompressedConst& c) {
    std::string samples = kernels::sampled_bytes(ctx.value(c.data).blob.value_or(std::string_view()));
    for (const auto* table : {&c.table, &c.offset, &c.params.scale, &c.params.zero})
        samples += kernels::sampled_bytes(std::string_view(reinterpret_cast<const char*>(table->data()),
                                                           table->size() * sizeof(float)));
    return samples;
}

// The packed 4-/6-bit form of a LUT or block-wise weight [cout, cin, 1, 1], when the low-bit kernel takes
// its layout (see the file comment) and forms its fp16 values exactly.
std::optional<kernels::PackedConv1x1Q> low_bit_weight(const OpContext& ctx, const CompressedConst& c, int64_t cout,
                                                       int64_t cin) {
    const ValueInfo& data = ctx.value(c.data);
    const auto& block = c.blocks.block;
    if (!data.blob || c.type.dtype != mil::DType::fp16 || block.size() != 4 || block[1] == 0) return std::nullopt;
    if (c.kind == CompressedConst::Kind::lut) {
        const mil::DType dt = data.type.dtype;
        if ((dt != mil::DType::uint4 && dt != mil::DType::uint6) || block[1] != cin)
            return std::nullopt;
        return kernels::pack_conv1x1_lut(unpacked(data).data(), dt == mil::DType::uint4 ? 4 : 6, c.table.data(), block[0],
                                         cout, cin);
    }
    if (c.kind != CompressedConst::Kind::shift_scale) return std::nullopt;
    const mil::DType dt = data.type.dtype;
    const int64_t bs = block[1];
    if ((dt != mil::DType::uint4 && dt != mil::DType::int4) || block[0] != 1 || (bs & (bs - 1)) != 0) return std::nullopt;
    std::vector<float> zero(c.table.size(), dt == mil::DType::int4 ? 8.0f : 0.0f);  // int4 data is stored shifted by 8
    for (size_t e = 0; e < c.offset.size(); ++e) zero[e] += c.offset[e];
    for (size_t e = 0; e < zero.size(); ++e)
        if (!kernels::affine4_packable(c.table[e], zero[e])) return std::nullopt;
    return kernels::pack_conv1x1_affine4(unpacked(data).data(), c.table.data(), zero.data(), bs, cout, cin);
}

BuiltOp build_conv(OpContext& ctx) {
    if (ctx.plan_only()) return {nullptr, -1, 6.0 * ctx.type("weight").element_count()};  // fp16 + fp32 weight copies
    const frontend::ConvGeometry g = ctx.attrs<frontend::ConvGeometry>();
    const bool round = ctx.out_type().dtype == mil::DType::fp16;
    std::vector<float> bias;
    if (ctx.has("bias")) {
        bias = ctx.floats("bias");
        if (static_cast<int64_t>(bias.size()) != g.cout) ctx.fail("bias must have Cout = " + std::to_string(g.cout) + " entries");
    }
    const int x = ctx.slot("x"), o = ctx.out_slot();
    auto add_bias = [bias, g](float* c) {
        if (bias.empty()) return;
        const int64_t plane = g.oh * g.ow;
        for (int64_t oc = 0; oc < g.cout; ++oc)
            for (int64_t i = 0; i < plane; ++i) c[oc * plane + i] += bias[oc];
    };
    const bool pointwise = g.kh == 1 && g.kw == 1 && g.groups == 1 && g.sh == 1 && g.sw == 1 && g.pt == 0 && g.pb == 0 &&
                           g.pl == 0 && g.pr == 0;
    // The pointwise kernel over a packed weight (fp16 or int8: the same sums, bit for bit), with its lane-block
    // form when the lanes are independent (one image, H = 1): conv1x1 sums each lane alike for any strides, and
    // the bias is added and the sum rounded once, as the whole op does.
    auto pointwise_kernel = [=](auto packed) -> BuiltOp {
        LaneBlockKernel lane_block;
        if (g.n == 1 && g.h == 1)
            lane_block = [=](const float* in, int64_t in_stride, float* c, int64_t c_stride, int64_t lanes) {
                kernels::conv1x1(*packed, in, in_stride, lanes, c, round && bias.empty(), c_stride);
                for (int64_t oc = 0; oc < g.cout && !bias.empty(); ++oc) {
                    float* row = c + oc * c_stride;
                    for (int64_t s = 0; s < lanes; ++s) row[s] += bias[static_cast<size_t>(oc)];
                    if (round) kernels::round_fp16(row, static_cast<size_t>(lanes));
                }
            };
        return {[=](Frame& fr) {
                    const int64_t S = g.h * g.w;
                    const Tensor& in = fr.values[x];
                    Tensor& out = fr.values[o];
                    // With one row per channel (H = 1) the lanes are independent: compute the live ones.
                    out.lanes = g.h == 1 ? in.lanes : out.last_dim();
                    const int64_t lanes = g.h == 1 ? in.lanes : S;
                    for (int64_t b = 0; b < g.n; ++b) {
                        float* c = out.data.data() + b * g.cout * S;
                        kernels::conv1x1(*packed, in.data.data() + b * g.cin * S, S, lanes, c, round && bias.empty());
                        add_bias(c);
                    }
                    if (!bias.empty()) finish(out);
                }, -1, 0, nullptr, std::move(lane_block)};
    };
    if (pointwise) {
        if (const CompressedConst* a = ctx.compressed("weight")) {
            // (held under its key when another program packed it: checked and packed once per process)
            const std::string key = a->key.empty() ? "" : a->key + "/" + std::to_string(g.cout) + "x" + std::to_string(g.cin);
            const std::string samples = key.empty() ? "" : stored_samples(ctx, *a);
            if (a->kind == CompressedConst::Kind::affine) {
                if (auto w = kernels::keyed_conv1x1_i8(key, samples, [&]() -> std::shared_ptr<const kernels::PackedConv1x1I8> {
                        const auto exact = exact_int8_weight(ctx, *a, g.cout, g.cin);
                        return exact ? kernels::shared_conv1x1_i8(exact->q, exact->scale.data(), g.cout, g.cin) : nullptr;
                    }))
                    return pointwise_kernel(std::move(w));
            } else if (auto w = kernels::keyed_conv1x1_q(key, samples, [&]() -> std::shared_ptr<const kernels::PackedConv1x1Q> {
                           auto packed = low_bit_weight(ctx, *a, g.cout, g.cin);
                           return packed ? kernels::shared_conv1x1_q(std::move(*packed)) : nullptr;
                       })) {
                return pointwise_kernel(std::move(w));
            }
        }
        if (!ctx.compressed("weight")) {  // an fp16 BLOBFILE weight is packed from its bytes: no transient copy
            const ValueInfo& w = ctx.constant("weight");
            if (w.blob && w.type.dtype == mil::DType::fp16 && reinterpret_cast<uintptr_t>(w.blob->data()) % 2 == 0) {
                const auto file = w.packed_files.find(w.blob_key + "/" + std::to_string(g.cout) + "x" + std::to_string(g.cin));
                return pointwise_kernel(kernels::shared_conv1x1(reinterpret_cast<const uint16_t*>(w.blob->data()),
                                                                g.cout, g.cin, w.blob_key,
                                                                file == w.packed_files.end() ? std::string() : file->second));
            }
        }
        const auto halves = weight_halves(ctx);
        return pointwise_kernel(kernels::shared_conv1x1(halves.data(), g.cout, g.cin));  // one copy across programs
    }
    const auto halves = weight_halves(ctx);
    auto weight = std::make_shared<std::vector<float>>(halves.size());
    kernels::half_to_float(halves.data(), weight->data(), halves.size());
    return {[=](Frame& fr) {
                const float* a = fr.values[x].data.data();
                Tensor& out = fr.values[o];
                const int64_t cin_g = g.cin / g.groups, cout_g = g.cout / g.groups;
                kernels::parallel_for(g.n * g.cout, 1, [&](int64_t begin, int64_t end) {
                    for (int64_t job = begin; job < end; ++job) {
                        const int64_t b = job / g.cout, oc = job % g.cout, grp = oc / cout_g;
                        const float* wrow = weight->data() + oc * cin_g * g.kh * g.kw;
                        float* c = out.data.data() + (b * g.cout + oc) * g.oh * g.ow;
                        for (int64_t y = 0; y < g.oh; ++y)
                            for (int64_t xo = 0; xo < g.ow; ++xo) {
                                float acc = 0.0f;
                                for (int64_t ic = 0; ic < cin_g; ++ic)
                                    for (int64_t ky = 0; ky < g.kh; ++ky) {
                                        const int64_t iy = y * g.sh + ky * g.dh - g.pt;
                                        if (iy < 0 || iy >= g.h) continue;
                                        for (int64_t kx = 0; kx < g.kw; ++kx) {
                                            const int64_t ix = xo * g.sw + kx * g.dw - g.pl;
                                            if (ix < 0 || ix >= g.w) continue;
                                            acc += wrow[(ic * g.kh + ky) * g.kw + kx] *
                                                   a[((b * g.cin + grp * cin_g + ic) * g.h + iy) * g.w + ix];
                                        }
                                    }
                                c[y * g.ow + xo] = acc;
                            }
                    }
                });
                add_bias(out.data.data());
                finish(out);
            }};
}

// Multiply-adds worth a thread's share of a batched matmul's batches.
constexpr int64_t kMatmulBatchWork = int64_t{1} << 16;
// Bytes of an fp16 y read in place (a KV cache: bound by its rows' cache misses, not by the multiply-adds)
// worth a thread's share: a decode step's short cache (SmolLM2-135M's 3 heads at 150 positions, 58 KB) is
// read on the calling thread, where handing it to the pool costs more than the reads.
constexpr int64_t kMatmulHalfBatchBytes = int64_t{1} << 16;

BuiltOp build_matmul(OpContext& ctx) {
    const frontend::MatmulDims& dims = ctx.attrs<frontend::MatmulDims>();
    const Shape &batch = dims.batch, &bx = dims.x_batch, &by = dims.y_batch;
    const bool tx_t = dims.transpose_x, ty_t = dims.transpose_y;
    const int64_t M = dims.M, K = dims.K, N = dims.N;
    const int64_t nb = element_count(batch);
    if (ctx.plan_only())  // per-batch offsets, and an fp16 y read in place is converted one [K, N] matrix at a time
        return {nullptr, -1, 16.0 * static_cast<double>(nb) + 4.0 * static_cast<double>(K) * static_cast<double>(N)};
    const bool round = ctx.out_type().dtype == mil::DType::fp16;
    const int x = ctx.slot("x"), y = ctx.slot("y", /*fp16_in_place=*/true), o = ctx.out_slot();
    // Offsets of each batch's x and y matrices (broadcast batch dims repeat a matrix).
    std::vector<int64_t> xoff(static_cast<size_t>(nb)), yoff(static_cast<size_t>(nb));
    const auto bstr = strides_of(batch);
    for (int64_t i = 0; i < nb; ++i) {
        int64_t ox = 0, oy = 0, sx = M * K, sy = K * N;
        for (int64_t d = static_cast<int64_t>(batch.size()) - 1; d >= 0; --d) {
            const int64_t idx = (i / bstr[d]) % batch[d];
            const int64_t dx = d - static_cast<int64_t>(batch.size() - bx.size());
            const int64_t dy = d - static_cast<int64_t>(batch.size() - by.size());
            if (dx >= 0) {
                if (bx[dx] != 1) ox += idx * sx;
                sx *= bx[dx];
            }
            if (dy >= 0) {
                if (by[dy] != 1) oy += idx * sy;
                sy *= by[dy];
            }
        }
        xoff[i] = ox, yoff[i] = oy;
    }
    // Element strides of op(x) [M, K] and op(y) [K, N] inside one matrix.
    const int64_t a_rs = tx_t ? 1 : K, a_cs = tx_t ? M : 1;
    const int64_t b_rs = ty_t ? 1 : N, b_cs = ty_t ? K : 1;
    // Live prefixes (Tensor::live_prefix) over the leading batch axis: only the live batches are computed.
    const Shape xs = ctx.type("x").shape, ys = ctx.type("y").shape, os = ctx.out_type().shape;
    const bool batched_lead = !batch.empty() && batch[0] > 1;
    return {[=](Frame& fr) {
                Tensor &tx_v = fr.values[x], &ty_v = fr.values[y];
                Tensor& out_v = fr.values[o];
                int64_t lead = batched_lead ? batch[0] : 1;
                for (const auto& [t, shape] : {std::pair<Tensor*, const Shape*>{&tx_v, &xs}, {&ty_v, &ys}}) {
                    if (!t->prefix_partial()) continue;
                    if (batched_lead && shape->size() == os.size() && (*shape)[0] == batch[0]) lead = std::min(lead, live_leading(*t, *shape));
                    else settle_prefix(*t);
                }
                set_live_leading(out_v, os, lead);
                const int64_t live_batches = batched_lead ? lead * (nb / batch[0]) : nb;
                // Live lanes: a partially live contracted axis is summed over its live prefix only;
                // a partially live N axis (y's last) leaves the output live on the same prefix.
                int64_t k = K;
                if (!tx_t && tx_v.partial()) k = std::min(k, tx_v.lanes);
                if (ty_t && ty_v.partial()) k = std::min(k, ty_v.lanes);
                const int64_t n = !ty_t && ty_v.partial() ? ty_v.lanes : N;
                out_v.lanes = n;
                const float* a = tx_v.data.data();
                float* c = out_v.data.data();
                // The batches (heads) split across the threads; each gemm then runs on its own thread.
                // An fp16 y read in place (a KV cache) is split by the bytes it reads, not its multiply-adds.
                const int64_t grain = ty_v.half ? kMatmulHalfBatchBytes / std::max<int64_t>(2 * k * n, 1)
                                                : kMatmulBatchWork / std::max<int64_t>(M * n * k, 1);
                kernels::parallel_for(live_batches, std::max<int64_t>(1, grain),
                                      [&](int64_t begin, int64_t end) {
                    for (int64_t i = begin; i < end; ++i) {
                        if (ty_v.half)  // an fp16 input read in place (e.g. a KV cache)
                            kernels::gemm_f16b(M, n, k, a + xoff[i], a_rs, a_cs, ty_v.half + yoff[i], b_rs, b_cs,
                                               c + i * M * N, N, round);
                        else
                            kernels::gemm(M, n, k, a + xoff[i], a_rs, a_cs, ty_v.data.data() + yoff[i], b_rs, b_cs,
                                          c + i * M * N, N, round);
                    }
                });
            }};
}

}  // namespace

std::vector<OpEntry> linear_ops() { return {{"conv", build_conv}, {"matmul", build_matmul}}; }

}  // namespace orion::emu
