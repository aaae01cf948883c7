// The emulator's hot loops: fp16 rounding, 1x1 convolution with fp16, int8, 4- or 6-bit weights, matrix multiply,
// and a small thread pool. AVX-512 and AVX2 (with F16C/FMA) paths are chosen at run time; a portable
// path is always there. Every kernel accumulates in fp32.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace orion::emu::kernels {

// Rounds every value to the nearest fp16 (ties to even; overflow -> +-inf), in place.
void round_fp16(float* data, size_t n);
void half_to_float(const uint16_t* src, float* dst, size_t n);
void float_to_half(const float* src, uint16_t* dst, size_t n);
// dst[i] = fp16(e^src[i]) for src[i] that are fp16 values: the exp op's std::exp and rounding, read from a table with
// one entry per fp16 input (so the same bits); src may be dst.
void exp_fp16(const float* src, float* dst, size_t n);

// dst[i] = tanh(src[i]) in fp32, within a few float ulps (far below fp16 rounding); src may be dst.
void tanh(const float* src, float* dst, size_t n);
// dst[i] = 1 / (1 + e^-src[i]) in fp32, within a few float ulps; src may be dst.
void sigmoid(const float* src, float* dst, size_t n);

// dst[i] = e^(src[i] - m) / sum_j e^(src[j] - m), m = max_j src[j], in fp32 for i < n (within a
// few float ulps); src may be dst.
void softmax(const float* src, float* dst, int64_t n);
// dst[i] = softmax's e^(src[i] - m) times 1 / (sum_j e^(src[j] - m) * count) in fp32, the sum in numpy's pairwise
// order (np.sum's), one product per value (cross-entropy's softmax / rows): numpy's roundings of it but for the
// exp's last bits. Returns the log-sum-exp m + log(sum). src may be dst; NaN or inf: IEEE's results.
double scaled_softmax(const float* src, float* dst, int64_t n, float count);

// What a causal attention does to a row of scores before its context matmul (causal_attention.h): times
// the scale (if has_scale), each step's result rounded to fp16 where its flag says so.
struct ScoreRowOps {
    bool has_scale = false;
    float scale = 1.0f;
    bool round_scaled = true, round_masked = true, round_probs = true;
};
// row[j] = softmax over j < n of (row[j] [* scale] + mask[j]), in place, with the roundings of `ops`: bit
// for bit the ops one by one (mul, round_fp16, add, round_fp16, softmax, round_fp16), in fewer passes.
void score_row_softmax(float* row, const float* mask, int64_t n, const ScoreRowOps& ops);

// A packed weight's panels, read-only: owned, or read in place from memory that `owner` keeps alive
// (a read-only map of a file of panels, map_conv1x1, or pack_conv1x1's anonymous map). Copies share the memory.
template <typename T>
class PanelData {
public:
    PanelData() = default;
    explicit PanelData(std::vector<T> owned) {
        auto held = std::make_shared<const std::vector<T>>(std::move(owned));
        data_ = held->data();
        size_ = held->size();
        owner_ = std::move(held);
    }
    // `mapped`: read from a file's map (map_conv1x1), not packed in this process.
    PanelData(const T* data, size_t size, std::shared_ptr<const void> owner, bool mapped = true)
        : data_(data), size_(size), owner_(std::move(owner)), mapped_(mapped) {}
    const T* data() const { return data_; }
    size_t size() const { return size_; }
    const T& operator[](size_t i) const { return data_[i]; }
    bool mapped() const { return mapped_; }  // read from a file's map, not packed in this process

private:
    const T* data_ = nullptr;
    size_t size_ = 0;
    std::shared_ptr<const void> owner_;
    bool mapped_ = false;
};

// A 1x1 convolution weight [cout][cin] in fp16, repacked once at compile (bake) time into the
// layout the kernel streams (held by a shared_ptr, it takes part in weight prefetching): panels of
// kConvPanel (16) output channels, each [cin][16], the last panel's missing channels zero.
struct PackedConv1x1 : std::enable_shared_from_this<PackedConv1x1> {
    int64_t cout = 0;
    int64_t cin = 0;
    PanelData<uint16_t> data;
};
PackedConv1x1 pack_conv1x1(const uint16_t* weight, int64_t cout, int64_t cin);
// The panel layout's name and version: a file of panels written under another is not read
// (map_conv1x1's callers name their files with it).
const char* conv1x1_panel_layout();
// The packed weight [cout][cin] read in place from `path`, a file holding exactly its panels (as
// keyed_conv1x1_panels gives them), mapped read-only; `weight` is the fp16 weight it stands for.
// Throws std::invalid_argument, naming the file, when it cannot be mapped, has the wrong size or
// differs from `weight` at a few sampled places (a stale or foreign file).
PackedConv1x1 map_conv1x1(const std::string& path, const uint16_t* weight, int64_t cout, int64_t cin);

// pack_conv1x1, held once per process for each distinct weight: programs baking the same weight
// (a model's prefill buckets and its decode programs) share one packed copy, freed with the last.
// With a `key` (a name the weight's bytes alone determine, e.g. its file's SHA-256 and offset) the
// weight is found by the key, neither hashed nor compared (a few sampled weights are checked: a key
// naming other bytes throws std::invalid_argument).
// `packed_file`: a file of the keyed weight's panels (map_conv1x1), read in place instead of packing
// when no weight is held under the key yet.
std::shared_ptr<const PackedConv1x1> shared_conv1x1(const uint16_t* weight, int64_t cout, int64_t cin,
                                                    std::string_view key = {}, const std::string& packed_file = {});
// The keyed fp16 weights alive in this process that were packed here (not mapped from a file), by
// their shaped key ("<key>/<cout>x<cin>"): what a program cache stores as files of panels.
std::vector<std::pair<std::string, std::shared_ptr<const PackedConv1x1>>> keyed_conv1x1_packed();
// (distinct packed weights alive, fp16 and int8, their bytes)
std::pair<int64_t, int64_t> shared_conv1x1_usage();

// A 1x1 convolution weight [cout][cin] in int8 with one scale per output channel (symmetric, zero
// point 0), packed like PackedConv1x1 and streamed at one byte per weight. Every dequantized weight
// q * scale[o] must be an fp16 value, computed exactly in fp32 (int8_weights_fp16_exact): the
// kernels form it in fp32 with no rounding step, so conv1x1 gives bit for bit what it gives the fp16
// weight fp16(q * scale[o]).
struct PackedConv1x1I8 : std::enable_shared_from_this<PackedConv1x1I8> {
    int64_t cout = 0;
    int64_t cin = 0;
    std::vector<int8_t> data;
    std::vector<float> scale;  // one per output channel, zero-padded to whole panels
    // Every scale a power of two: the kernels sum q * x and scale each output once (the same bits,
    // and a conversion per weight with no multiply).
    bool scale_after = false;
};
// Whether q[o][c] * scale[o] is, for every weight, an fp16 value exactly (the fp32 product is then
// exact too): the condition of PackedConv1x1I8.
bool int8_weights_fp16_exact(const int8_t* q, const float* scale, int64_t cout, int64_t cin);
// Throws std::invalid_argument when the weights are not fp16-exact.
PackedConv1x1I8 pack_conv1x1_i8(const int8_t* q, const float* scale, int64_t cout, int64_t cin);
// pack_conv1x1_i8, held once per process for each distinct weight (as shared_conv1x1).
std::shared_ptr<const PackedConv1x1I8> shared_conv1x1_i8(const int8_t* q, const float* scale, int64_t cout,
                                                         int64_t cin);

// A 1x1 convolution weight [cout][cin] of 4 or 6 bits per weight, packed like PackedConv1x1 (panels
// of 16 output channels, one row of 16 weights per input channel) and streamed at its stored width;
// the tile forms each weight in fp32 exactly (an fp16 value) before the same FMA as the fp16 tile, so
// conv1x1 gives bit for bit what it gives the fp16 weight of the same values (but the channel-major decode tiles,
// which sum the same weights in another order, and AVX2's int4 decode tile, which sums unrounded weights:
// within the fp16 rounding of the weights, low_bit_kernels.cpp).
//  - lut4, lut6: palettized (constexpr_lut_to_dense): weight = lut[o / group][index], the LUT's
//    entries fp16 values. With group % 8 == 0 a panel half (8 output channels) reads one LUT (lut4: a
//    register permute); otherwise each output channel's LUT is stored in its panel (a gather; AVX2 and
//    AVX-512 lut4: channel_major, decoded along the inputs).
//  - affine4: block-wise 4-bit (constexpr_blockwise_shift_scale): weight = fp16((u - z) * s) with u in
//    [0, 15] and fp16 (s, z) per output channel and block of `block` (a power of two) input channels,
//    u - z an fp16 value (checked at pack): the product of two fp16 values is exact in fp32, so one
//    rounding gives what coremltools' fp16 decompression gives.
// A row is 8 bytes (4-bit: output j in nibble j, low nibble first) or 12 (6-bit: those 8 bytes with
// the index's low 4 bits, then 4 bytes with its high 2 bits, output j at bits 2j..2j+1).
// The zeros after PackedConv1x1Q::channel_params' values.
constexpr size_t kChannelParamsTail = 16;

struct PackedConv1x1Q : std::enable_shared_from_this<PackedConv1x1Q> {
    enum class Kind { lut4, lut6, affine4 };
    Kind kind = Kind::lut4;
    int64_t cout = 0;
    int64_t cin = 0;
    int64_t row_bytes = 8;
    int64_t entries = 16;    // lut kinds: LUT entries (16 or 64)
    bool channel_luts = false;  // lut kinds: one LUT per output channel in each panel, not one per half
    int block_shift = 5;     // affine4: log2 of the input channels per (scale, bias)
    // affine4 in the AVX2 flavour's layout (blocks of 2+ rows): rows in pairs, byte j of pair q (16 bytes)
    // holding output j's u of row 2q in its low nibble and of row 2q + 1 in its high one.
    bool affine4_pairs = false;
    // affine4 in the AVX2 flavour's layout for blocks of 8+ rows (instead of pairs): rows in octets, 64 bytes each,
    // its bytes 32h to 32h + 31 8 little-endian 32-bit words, word j holding output 8h + j's u of row 8g + i (octet g)
    // in bits 4i to 4i + 3.
    bool affine4_octets = false;
    // lut4 with a LUT per output channel in the AVX2 flavour's layout: each panel's 16 channels one after
    // another, each its rows_stored() / 2 bytes, 16 per chunk of 32 rows (row r of a chunk: byte
    // (r / 16) * 8 + r % 8, its high nibble when r / 8 is odd), cin padded to a multiple of 32 with index 0.
    // (AVX-512: the same for lut4 with a LUT per output channel, and for affine4 with blocks of 32+ rows, whose
    // chunks hold row r at byte r % 16, its high nibble when r >= 16, and whose block parameters are then
    // channel_params instead of params.)
    bool channel_major = false;
    std::vector<uint8_t> data;     // panels x rows_stored() x row_bytes
    std::vector<float> lut;        // lut kinds: panels x (2 halves or 16 channels) x entries
    std::vector<uint16_t> params;  // affine4: panels x blocks x (16 fp16 scales, then 16 fp16 zero points)
    // affine4 channel-major: panels x 16 channels x (the blocks' fp16 scales, then their fp16 zero points), then
    // kChannelParamsTail zeros (the tile reads 16 values from any block's)
    std::vector<uint16_t> channel_params;
    // LUTs per panel half, packed for the AVX2 flavour (its lookups are vpshufb): the rows in pairs (2 *
    // row_bytes for rows 2q and 2q + 1: byte b < 16 holds in its low nibble the index's low 4 bits for
    // row 2q + b / 8, output b % 8, in its high nibble those of output 8 + b % 8; lut6: byte 16 + i holds
    // the high 2 bits of output i + 8h of row 2q + r at bits 2 * (2h + r); an odd cin padded with a zero
    // row) and, instead of `lut`, per panel the LUT entries' fp16 bytes as vpshufb tables of 16 entries:
    // [low bytes, high bytes][entries / 16 tables][panel half][16] (entries * 4 bytes).
    std::vector<uint8_t> lut_bytes;
    int64_t rows_stored() const {
        if (channel_major) return (cin + 31) / 32 * 32;
        return lut_bytes.empty() ? cin : cin + cin % 2;
    }
};
// Palettized weights: `indices` [cout][cin] (each < 2^bits, bits 4 or 6) and `lut` [ceil(cout/group)]
// [2^bits] (fp16 values, as float). Throws std::invalid_argument for a layout the kernels do not take.
PackedConv1x1Q pack_conv1x1_lut(const uint8_t* indices, int bits, const float* lut, int64_t group, int64_t cout,
                                int64_t cin);
// Whether scale and zero are fp16 values and so is u - zero for every u in [0, 15]: what
// pack_conv1x1_affine4 needs of each (scale, zero) pair.
bool affine4_packable(float scale, float zero);
// Block-wise 4-bit weights: `u` [cout][cin] in [0, 15], `scale` and `zero` [cout][cin / block], block a
// power of two dividing cin. Throws std::invalid_argument when a pair is not affine4_packable.
PackedConv1x1Q pack_conv1x1_affine4(const uint8_t* u, const float* scale, const float* zero, int64_t block,
                                    int64_t cout, int64_t cin);
// A packed weight held once per process for each distinct content (as shared_conv1x1).
std::shared_ptr<const PackedConv1x1Q> shared_conv1x1_q(PackedConv1x1Q packed);

// A keyed int8 or low-bit weight (CompressedConst::key with its shape, keyed_weights.h): the one held under
// `key`, else make()'s (shared_conv1x1_i8's or shared_conv1x1_q's; nullptr when the kernels do not take it).
// `samples`: a few of its stored bytes; a key held with other samples throws std::invalid_argument.
std::shared_ptr<const PackedConv1x1I8> keyed_conv1x1_i8(
    const std::string& key, const std::string& samples,
    const std::function<std::shared_ptr<const PackedConv1x1I8>()>& make);
std::shared_ptr<const PackedConv1x1Q> keyed_conv1x1_q(
    const std::string& key, const std::string& samples,
    const std::function<std::shared_ptr<const PackedConv1x1Q>()>& make);

// out[o*S + s] = sum_c W[o][c] * x[c*S + s] for s < lanes (fp32 accumulation); the first `lanes`
// lanes of each output row are written (rounded to fp16 when round_fp16 is set), the others are
// left untouched. x is [cin][S], out is [cout][S], both channel-major fp32. `out_stride` > 0: out's rows
// are that far apart instead (a lane block of wider rows written to rows of its own width, or back):
// the sums depend only on `lanes`, not on either stride.
void conv1x1(const PackedConv1x1& w, const float* x, int64_t S, int64_t lanes, float* out, bool round_fp16,
             int64_t out_stride = 0);
// The same with int8 weights: equal, bit for bit, to conv1x1 of the fp16 weight q * scale[o].
void conv1x1(const PackedConv1x1I8& w, const float* x, int64_t S, int64_t lanes, float* out, bool round_fp16,
             int64_t out_stride = 0);
// The same with 4- or 6-bit weights: equal, bit for bit, to conv1x1 of the fp16 weight they stand for
// (AVX2 int4 and per-channel lut4 on up to 12 lanes: within the fp16 rounding of those weights, see PackedConv1x1Q).
void conv1x1(const PackedConv1x1Q& w, const float* x, int64_t S, int64_t lanes, float* out, bool round_fp16,
             int64_t out_stride = 0);

// C[m][n] = sum_k A(m,k) * B(k,n), with A(m,k) = a[m*a_rs + k*a_cs] and B(k,n) = b[k*b_rs + n*b_cs]
// (strides express transposes), C row-major with row stride c_rs; fp32 accumulation, rounded to
// fp16 when round_fp16 is set.
void gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
          int64_t b_rs, int64_t b_cs, float* c, int64_t c_rs, bool round_fp16);

// gemm with B in fp16, read in place (e.g. a KV cache straight from its surface); same contract.
void gemm_f16b(int64_t M, int64_t N, int64_t K, const float* a, int64_t a_rs, int64_t a_cs, const uint16_t* b,
               int64_t b_rs, int64_t b_cs, float* c, int64_t c_rs, bool round_fp16);

// Runs fn(begin, end) over [0, n) split across the pool's threads in chunks of at least `grain`.
// Runs inline when the work is small or when called from inside a pool thread.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);
// parallel_for in guided chunks: each a 1/(2 * threads) share of the work left (at least `grain`), so the first are
// long (contiguous streams) and the last short, and the threads finish together. For memory-bound loops, where
// parallel_for's equal quarters left a thread waiting up to a quarter of its share (decode's weight streams).
void parallel_for_guided(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);
int num_threads();  // ORION_NUM_THREADS, else the hardware's

// Memory to read into the caches: ranges[i] belongs to owners[i], and is read only while that owner lives.
struct PrefetchRanges {
    std::vector<std::weak_ptr<const void>> owners;
    std::vector<std::pair<const char*, size_t>> ranges;
};

// Reads `request` into the caches on an idle pool thread while the caller goes on. A newer request
// replaces one not yet done (its ranges that the older one had read already are skipped), and pool
// jobs come first: it is only a hint, and no result depends on whether or when the data arrives.
void prefetch_in_background(std::shared_ptr<const PrefetchRanges> request);

// Which SIMD path the kernels use on this CPU: "avx512f+f16c+fma", "avx2+f16c+fma" or "portable"
// (ORION_SIMD=avx2 or ORION_SIMD=portable picks a narrower one).
const char* simd_path();

namespace detail {
template <int64_t N>
inline void copy_short_rows(const float* from, int64_t from_stride, float* to, int64_t to_stride, int64_t rows) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < N; ++j) to[r * to_stride + j] = from[r * from_stride + j];
}
}  // namespace detail

// The first `n` floats of each of `rows` rows, from rows `from_stride` apart to rows `to_stride` apart. A few lanes
// (a check's drafts, a batch's live sequences) are copied by a loop of that constant width: a library copy per row
// of 1-8 floats (what std::copy_n becomes) cost a check's fused norm and elementwise runs more than their arithmetic.
inline void copy_lanes(const float* from, int64_t from_stride, float* to, int64_t to_stride, int64_t rows, int64_t n) {
    switch (n) {
        case 1: return detail::copy_short_rows<1>(from, from_stride, to, to_stride, rows);
        case 2: return detail::copy_short_rows<2>(from, from_stride, to, to_stride, rows);
        case 3: return detail::copy_short_rows<3>(from, from_stride, to, to_stride, rows);
        case 4: return detail::copy_short_rows<4>(from, from_stride, to, to_stride, rows);
        case 5: return detail::copy_short_rows<5>(from, from_stride, to, to_stride, rows);
        case 6: return detail::copy_short_rows<6>(from, from_stride, to, to_stride, rows);
        case 7: return detail::copy_short_rows<7>(from, from_stride, to, to_stride, rows);
        case 8: return detail::copy_short_rows<8>(from, from_stride, to, to_stride, rows);
        default:
            for (int64_t r = 0; r < rows; ++r) std::copy_n(from + r * from_stride, n, to + r * to_stride);
    }
}

// The first `live` lanes of each of `rows` rows of `width` lanes, written to `packed` as rows of `live` (a few live
// lanes of wide rows computed together: conv1x1's compact path, the fused norm and elementwise runs).
inline void gather_lanes(const float* src, int64_t rows, int64_t width, int64_t live, float* packed) {
    copy_lanes(src, width, packed, live, rows, live);
}

// Rows of `live` lanes written back as the first `live` lanes of each row of `width` (the rest untouched).
inline void scatter_lanes(const float* packed, int64_t rows, int64_t live, float* dst, int64_t width) {
    copy_lanes(packed, live, dst, width, rows, live);
}

}  // namespace orion::emu::kernels
