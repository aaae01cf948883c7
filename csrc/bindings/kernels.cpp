// orion._core.kernels: the emulator's kernels on numpy arrays, for benchmarks and kernel tests.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "bindings/bindings.h"
#include "emulator/buffer_pool.h"
#include "emulator/const_fold.h"
#include "emulator/kernels.h"
#include "emulator/shared_consts.h"

namespace py = pybind11;
namespace kern = orion::emu::kernels;

namespace orion::bindings {
namespace {

// `obj` as a numpy array of exactly `dtype` (native byte order) with `ndim` dimensions (any if < 0).
py::array checked_array(const py::object& obj, const char* name, const char* dtype, int ndim) {
    if (!py::isinstance<py::array>(obj)) throw py::value_error(std::string(name) + " must be a numpy array");
    auto arr = py::reinterpret_borrow<py::array>(obj);
    if (!arr.dtype().equal(py::dtype(dtype)))
        throw py::value_error(std::string(name) + " must have dtype " + dtype + ", got " +
                              py::str(arr.dtype()).cast<std::string>());
    if (ndim >= 0 && arr.ndim() != ndim)
        throw py::value_error(std::string(name) + " must be " + std::to_string(ndim) + "-D, got " +
                              std::to_string(arr.ndim()) + "-D");
    return arr;
}

py::array c_contiguous(const py::array& arr) { return py::array::ensure(arr, py::array::c_style); }

py::array_t<float> zeros(int64_t rows, int64_t cols) {
    py::array_t<float> out({rows, cols});
    std::fill(out.mutable_data(), out.mutable_data() + rows * cols, 0.0f);
    return out;
}

kern::PackedConv1x1 pack(const py::object& weight_obj) {
    const py::array weight = c_contiguous(checked_array(weight_obj, "weight", "float16", 2));
    const auto* data = static_cast<const uint16_t*>(weight.data());
    const int64_t cout = weight.shape(0), cin = weight.shape(1);
    py::gil_scoped_release release;
    return kern::pack_conv1x1(data, cout, cin);
}

// An int8 [cout, cin] weight and its float32 [cout] scales, packed (ValueError unless fp16-exact).
kern::PackedConv1x1I8 pack_i8(const py::object& q_obj, const py::object& scale_obj) {
    const py::array q = c_contiguous(checked_array(q_obj, "q", "int8", 2));
    const py::array scale = c_contiguous(checked_array(scale_obj, "scale", "float32", 1));
    const int64_t cout = q.shape(0), cin = q.shape(1);
    if (scale.shape(0) != cout)
        throw py::value_error("scale has " + std::to_string(scale.shape(0)) + " entries, the weight " +
                              std::to_string(cout) + " output channels");
    const auto* q_data = static_cast<const int8_t*>(q.data());
    const auto* s_data = static_cast<const float*>(scale.data());
    py::gil_scoped_release release;
    try {
        return kern::pack_conv1x1_i8(q_data, s_data, cout, cin);
    } catch (const std::invalid_argument& e) {
        py::gil_scoped_acquire acquire;
        throw py::value_error(e.what());
    }
}

template <typename Packed>
py::array_t<float> run_conv(const Packed& w, const py::object& x_obj, std::optional<int64_t> lanes, bool round) {
    const py::array x = c_contiguous(checked_array(x_obj, "x", "float32", 2));
    if (x.shape(0) != w.cin)
        throw py::value_error("x has " + std::to_string(x.shape(0)) + " channels, the weight expects " +
                              std::to_string(w.cin));
    const int64_t S = x.shape(1);
    const int64_t live = lanes.value_or(S);
    if (live < 0 || live > S)
        throw py::value_error("lanes must be in [0, " + std::to_string(S) + "], got " + std::to_string(live));
    py::array_t<float> out = zeros(w.cout, S);
    const auto* x_data = static_cast<const float*>(x.data());
    float* out_data = out.mutable_data();
    {
        py::gil_scoped_release release;
        kern::conv1x1(w, x_data, S, live, out_data, round);
    }
    return out;
}

// Element stride of dimension `dim`; arrays whose byte strides are not whole elements are copied.
int64_t element_stride(const py::array& arr, int dim) { return arr.strides(dim) / static_cast<int64_t>(sizeof(float)); }

py::array_t<float> run_gemm(const py::object& a_obj, const py::object& b_obj, bool transpose_a, bool transpose_b,
                            bool round) {
    py::array a = checked_array(a_obj, "a", "float32", 2);
    py::array b = checked_array(b_obj, "b", "float32", 2);
    for (py::array* arr : {&a, &b})
        if (arr->strides(0) % sizeof(float) != 0 || arr->strides(1) % sizeof(float) != 0) *arr = c_contiguous(*arr);
    const int ar = transpose_a ? 1 : 0, ac = 1 - ar;  // A(m, k) = a[m, k] or a[k, m]
    const int br = transpose_b ? 1 : 0, bc = 1 - br;  // B(k, n) = b[k, n] or b[n, k]
    const int64_t M = a.shape(ar), K = a.shape(ac), N = b.shape(bc);
    if (b.shape(br) != K)
        throw py::value_error("gemm: inner dimensions differ: A is [" + std::to_string(M) + ", " + std::to_string(K) +
                              "], B is [" + std::to_string(b.shape(br)) + ", " + std::to_string(N) + "]");
    py::array_t<float> c({M, N});
    const auto* a_data = static_cast<const float*>(a.data());
    const auto* b_data = static_cast<const float*>(b.data());
    const int64_t a_rs = element_stride(a, ar), a_cs = element_stride(a, ac);
    const int64_t b_rs = element_stride(b, br), b_cs = element_stride(b, bc);
    float* c_data = c.mutable_data();
    {
        py::gil_scoped_release release;
        kern::gemm(M, N, K, a_data, a_rs, a_cs, b_data, b_rs, b_cs, c_data, N, round);
    }
    return c;
}

// Refuses a kernel's `dst` and `src` (named for the error) unless both are C-contiguous, `dst` is writable and they
// hold as many elements.
void check_flat_pair(const char* kernel, const py::array& dst, const char* dst_name, const py::array& src,
                     const char* src_name) {
    const std::string prefix = std::string(kernel) + ": " + dst_name + " ";
    if (!(src.flags() & py::array::c_style) || !(dst.flags() & py::array::c_style) || !dst.writeable())
        throw py::value_error(prefix + "and " + src_name + " must be C-contiguous and " + dst_name + " writable");
    if (src.size() != dst.size())
        throw py::value_error(prefix + "has " + std::to_string(dst.size()) + " elements, " + src_name + " " +
                              std::to_string(src.size()) + "; pass arrays of one size");
}

// `src` (float32) rounded to fp16 into `out` (float16, as many elements; both C-contiguous), on every thread.
void to_fp16(const py::array& src, py::array out) {
    if (!src.dtype().equal(py::dtype("float32")) || !out.dtype().equal(py::dtype("float16")))
        throw py::value_error("to_fp16: src must be float32 and out float16, got " + py::str(src.dtype()).cast<std::string>() +
                              " and " + py::str(out.dtype()).cast<std::string>());
    check_flat_pair("to_fp16", out, "out", src, "src");
    const auto* s = static_cast<const float*>(src.data());
    auto* d = static_cast<uint16_t*>(out.mutable_data());
    py::gil_scoped_release release;
    kern::parallel_for(src.size(), int64_t{1} << 18, [&](int64_t begin, int64_t end) {
        kern::float_to_half(s + begin, d + begin, static_cast<size_t>(end - begin));
    });
}

// `src` copied into `dst` (one dtype, as many elements, both C-contiguous), on every thread: a training
// step's weights and saved activations into a program's input surfaces and its gradients out, hundreds of
// MB a step, which numpy copies on one thread while the other cores wait.
void copy(py::array dst, const py::array& src) {
    if (!dst.dtype().equal(src.dtype()))
        throw py::value_error("copy: dst is " + py::str(dst.dtype()).cast<std::string>() + " and src " +
                              py::str(src.dtype()).cast<std::string>() + "; pass arrays of one dtype");
    check_flat_pair("copy", dst, "dst", src, "src");
    const auto* s = static_cast<const char*>(src.data());
    auto* d = static_cast<char*>(dst.mutable_data());
    const int64_t bytes = src.nbytes();
    if (bytes == 0) return;
    py::gil_scoped_release release;
    if (s < d + bytes && d < s + bytes) {  // overlapping: one memmove, which copies as if through a buffer
        std::memmove(d, s, static_cast<size_t>(bytes));
        return;
    }
    kern::parallel_for(bytes, int64_t{1} << 17, [&](int64_t begin, int64_t end) {
        std::memcpy(d + begin, s + begin, static_cast<size_t>(end - begin));
    });
}

// Whether a C-contiguous float16 or float32 array holds a NaN (one pass over its bits, on every thread).
bool has_nan(const py::array& arr) {
    const bool half = arr.dtype().equal(py::dtype("float16"));
    if (!half && !arr.dtype().equal(py::dtype("float32")))
        throw py::value_error("has_nan: the array must be float16 or float32, got " + py::str(arr.dtype()).cast<std::string>());
    if (!(arr.flags() & py::array::c_style)) throw py::value_error("has_nan: the array must be C-contiguous");
    const void* data = arr.data();
    std::atomic<bool> found{false};
    py::gil_scoped_release release;
    kern::parallel_for(arr.size(), int64_t{1} << 18, [&](int64_t begin, int64_t end) {
        // Chunks of unsigned OR-reductions the compiler vectorizes (a bool |= was scalar: ~1 ns an element);
        // a NaN found ends the scan at the next chunk, on every thread.
        constexpr int64_t kChunk = 8192;
        for (int64_t c0 = begin; c0 < end && !found.load(std::memory_order_relaxed); c0 += kChunk) {
            const int64_t c1 = std::min(end, c0 + kChunk);
            unsigned any = 0;
            if (half) {
                const auto* h = static_cast<const uint16_t*>(data);
                for (int64_t i = c0; i < c1; ++i) any |= static_cast<unsigned>((h[i] & 0x7fffu) > 0x7c00u);
            } else {
                const auto* f = static_cast<const uint32_t*>(data);
                for (int64_t i = c0; i < c1; ++i) any |= static_cast<unsigned>((f[i] & 0x7fffffffu) > 0x7f800000u);
            }
            if (any) found = true;
        }
    });
    return found;
}

// out[i, c] = float32(part[c', lanes[i]]) for c running over every part's channels in turn (each part a C-contiguous
// float16 or float32 array, lanes its last axis and its other axes flattened its channels): the logits of a decode
// step's lanes from the LM head programs' outputs, in one call holding the GIL (the pool's threads do not need it),
// instead of a strided copy, a conversion releasing the GIL and a concatenation per lane and head.
py::array_t<float> gather_lanes(const std::vector<py::array>& parts, const std::vector<int64_t>& lanes) {
    struct Part {
        const void* data;
        int64_t channels, lanes, offset;
    };
    std::vector<Part> from;
    int64_t total = 0;
    bool half = false;
    for (size_t j = 0; j < parts.size(); ++j) {
        const py::array& a = parts[j];
        const std::string where = "gather_lanes: part " + std::to_string(j) + ": ";
        const bool is_half = a.dtype().equal(py::dtype("float16"));
        if ((!is_half && !a.dtype().equal(py::dtype("float32"))) || (j && is_half != half))
            throw py::value_error(where + "give float16 or float32 parts of one dtype, got " +
                                  py::str(a.dtype()).cast<std::string>());
        if (a.ndim() < 1 || !(a.flags() & py::array::c_style) || a.shape(a.ndim() - 1) == 0)
            throw py::value_error(where + "must be C-contiguous with lanes on its last axis, got " + shape_text(a));
        half = is_half;
        const int64_t width = a.shape(a.ndim() - 1);
        for (int64_t lane : lanes)
            if (lane < 0 || lane >= width)
                throw py::value_error(where + "lane " + std::to_string(lane) + " is outside its " + std::to_string(width) + " lanes");
        from.push_back({a.data(), a.size() / width, width, total});
        total += a.size() / width;
    }
    py::array_t<float> out({static_cast<py::ssize_t>(lanes.size()), static_cast<py::ssize_t>(total)});
    float* dst = out.mutable_data();
    constexpr int64_t kBlock = 1024;  // channels a unit of work converts at once
    std::vector<std::tuple<size_t, size_t, int64_t>> units;  // (lane index, part, first channel)
    for (size_t i = 0; i < lanes.size(); ++i)
        for (size_t j = 0; j < from.size(); ++j)
            for (int64_t c = 0; c < from[j].channels; c += kBlock) units.emplace_back(i, j, c);
    kern::parallel_for(static_cast<int64_t>(units.size()), 8, [&](int64_t u0, int64_t u1) {
        uint16_t staged[kBlock];
        for (int64_t u = u0; u < u1; ++u) {
            const auto [i, j, c0] = units[static_cast<size_t>(u)];
            const Part& p = from[j];
            const int64_t n = std::min(kBlock, p.channels - c0), lane = lanes[i];
            float* row = dst + static_cast<int64_t>(i) * total + p.offset + c0;
            if (half) {
                const auto* src = static_cast<const uint16_t*>(p.data) + c0 * p.lanes + lane;
                for (int64_t c = 0; c < n; ++c) staged[c] = src[c * p.lanes];
                kern::half_to_float(staged, row, static_cast<size_t>(n));
            } else {
                const auto* src = static_cast<const float*>(p.data) + c0 * p.lanes + lane;
                for (int64_t c = 0; c < n; ++c) row[c] = src[c * p.lanes];
            }
        }
    });
    return out;
}

// Rows `rows` of the `count`-row table at byte `offset` of the file open as `fd` (`row_bytes` bytes a row) into
// C-contiguous `out` ([len(rows)] rows), consecutive rows in one read. The GIL stays held: a decode step's few
// page-cache reads are shorter than a thread switch, and os.preadv released it for each, so each read then waited
// for the server's event loop to hand it back. Returns the rows read in full: len(rows), or the first short one.
size_t read_rows(int fd, int64_t offset, int64_t row_bytes, int64_t count, const std::vector<int64_t>& rows,
                 py::array out) {
    if (!(out.flags() & py::array::c_style) || !out.writeable() || out.nbytes() != row_bytes * static_cast<int64_t>(rows.size()))
        throw py::value_error("read_rows: out must be a writeable C-contiguous array of len(rows) * row_bytes bytes");
    for (int64_t r : rows)
        if (r < 0 || r >= count)
            throw py::index_error("row " + std::to_string(r) + " is outside the table's " + std::to_string(count) + " rows");
    auto* dst = static_cast<char*>(out.mutable_data());
    for (size_t at = 0; at < rows.size();) {
        size_t run = 1;  // rows[at], rows[at] + 1, ...: one read
        while (at + run < rows.size() && rows[at + run] == rows[at] + static_cast<int64_t>(run)) ++run;
        const auto want = static_cast<ssize_t>(run) * row_bytes;
        ssize_t got = 0;
        while (got < want) {
            const ssize_t n = pread(fd, dst + at * row_bytes + got, static_cast<size_t>(want - got),
                                    static_cast<off_t>(offset + rows[at] * row_bytes + got));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return at + static_cast<size_t>(got / row_bytes);
            got += n;
        }
        at += run;
    }
    return rows.size();
}

// Test hook: how often each index of [0, n) was visited by parallel_for (`guided`: parallel_for_guided); raises
// ValueError from inside the chunk that holds `fail_at`; with `nested`, each chunk visits its range through a
// nested parallel_for.
py::array_t<int32_t> parallel_for_probe(int64_t n, int64_t grain, int64_t fail_at, bool nested, bool guided) {
    if (n < 0) throw py::value_error("n must be >= 0");
    std::vector<std::atomic<int32_t>> visits(static_cast<size_t>(n));
    auto visit = [&](int64_t begin, int64_t end) {
        if (fail_at >= begin && fail_at < end) throw std::invalid_argument("failure at index " + std::to_string(fail_at));
        for (int64_t i = begin; i < end; ++i) visits[static_cast<size_t>(i)].fetch_add(1);
    };
    {
        py::gil_scoped_release release;
        (guided ? kern::parallel_for_guided : kern::parallel_for)(n, grain, [&](int64_t begin, int64_t end) {
            if (nested)
                kern::parallel_for(end - begin, 1, [&](int64_t b, int64_t e) { visit(begin + b, begin + e); });
            else
                visit(begin, end);
        });
    }
    py::array_t<int32_t> out(n);
    for (int64_t i = 0; i < n; ++i) out.mutable_data()[i] = visits[static_cast<size_t>(i)].load();
    return out;
}

// Test hook: the chunks [begin, end) parallel_for_guided splits [0, n) into, in order.
std::vector<std::pair<int64_t, int64_t>> parallel_for_guided_chunks(int64_t n, int64_t grain) {
    std::mutex mutex;
    std::vector<std::pair<int64_t, int64_t>> chunks;
    {
        py::gil_scoped_release release;
        kern::parallel_for_guided(n, grain, [&](int64_t begin, int64_t end) {
            std::lock_guard<std::mutex> lock(mutex);
            chunks.emplace_back(begin, end);
        });
    }
    std::sort(chunks.begin(), chunks.end());
    return chunks;
}

// A float32 array of `a_obj`'s shape filled by fn(src, dst, n) from its data (numpy `dtype`, C order),
// with the GIL released.
template <typename Src, typename Fn>
py::array_t<float> map_to_float32(const py::object& a_obj, const char* dtype, Fn fn) {
    const py::array a = c_contiguous(checked_array(a_obj, "a", dtype, -1));
    py::array_t<float> out(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()));
    const auto n = static_cast<size_t>(a.size());
    const auto* src = static_cast<const Src*>(a.data());
    float* dst = out.mutable_data();
    py::gil_scoped_release release;
    fn(src, dst, n);
    return out;
}

// One KV-cache tensor's new columns: dst [lanes, width, positions] and src [width, lanes] (strides in bytes).
struct ColumnStore {
    char* out;
    const char* in;
    int64_t width, d0, d1, d2, s0, s1;
};

// dst[lanes[i], c, positions[i]] = src[c, lanes[i]] for channels [begin, end), elements of `bytes` bytes.
template <size_t bytes>
void store_channels(const ColumnStore& t, int64_t begin, int64_t end, const std::vector<int64_t>& lanes,
                    const std::vector<int64_t>& positions) {
    constexpr int64_t kAhead = 8;  // channels whose destinations (each on a cache line of its own) are fetched ahead
    for (int64_t c = begin; c < end; ++c)
        for (size_t i = 0; i < lanes.size(); ++i) {
            char* row = t.out + lanes[i] * t.d0 + positions[i] * t.d2;
            if (c + kAhead < end) __builtin_prefetch(row + (c + kAhead) * t.d1, 1);
            std::memcpy(row + c * t.d1, t.in + c * t.s0 + lanes[i] * t.s1, bytes);
        }
}

// For each pair j: dsts[j][lanes[i], :, positions[i]] = srcs[j][:, lanes[i]] for each i. Every pair is checked
// before any is written; the copies (a cache line per element: the columns of positions-last caches) run on
// every thread, without the GIL.
void store_columns(const std::vector<py::object>& dsts, const std::vector<py::object>& srcs,
                   const std::vector<int64_t>& lanes, const std::vector<int64_t>& positions) {
    if (dsts.size() != srcs.size())
        throw py::value_error("store_columns: give one src per dst (" + std::to_string(dsts.size()) + " dsts, " +
                              std::to_string(srcs.size()) + " srcs)");
    if (lanes.size() != positions.size())
        throw py::value_error("store_columns: give one position per lane (" + std::to_string(lanes.size()) + " lanes, " +
                              std::to_string(positions.size()) + " positions)");
    std::vector<ColumnStore> stores;
    py::ssize_t itemsize = 0;
    for (size_t j = 0; j < dsts.size(); ++j) {
        const std::string where = "store_columns: pair " + std::to_string(j) + ": ";
        if (!py::isinstance<py::array>(dsts[j]) || !py::isinstance<py::array>(srcs[j]))
            throw py::value_error(where + "dst and src must be numpy arrays");
        auto dst = py::reinterpret_borrow<py::array>(dsts[j]);
        const auto src = py::reinterpret_borrow<py::array>(srcs[j]);
        if (dst.ndim() != 3 || src.ndim() != 2 || dst.shape(1) != src.shape(0))
            throw py::value_error(where + "dst must be [lanes, width, positions] and src [width, lanes] with the same "
                                  "width; got " + shape_text(dst) + " and " + shape_text(src));
        if (!dst.dtype().equal(src.dtype()) || dst.dtype().kind() != 'f' || (dst.itemsize() != 2 && dst.itemsize() != 4) ||
            (itemsize && dst.itemsize() != itemsize))
            throw py::value_error(where + "every dst and src must have one dtype of 2 or 4 bytes (float16 or float32), "
                                  "got " + py::str(dst.dtype()).cast<std::string>() + " and " +
                                  py::str(src.dtype()).cast<std::string>());
        itemsize = dst.itemsize();
        if (!dst.writeable()) throw py::value_error(where + "dst is read-only");
        for (size_t i = 0; i < lanes.size(); ++i) {
            if (lanes[i] < 0 || lanes[i] >= std::min<int64_t>(dst.shape(0), src.shape(1)))
                throw py::value_error(where + "lane " + std::to_string(lanes[i]) + " is outside dst's " +
                                      std::to_string(dst.shape(0)) + " and src's " + std::to_string(src.shape(1)) +
                                      " lanes");
            if (positions[i] < 0 || positions[i] >= dst.shape(2))
                throw py::value_error(where + "position " + std::to_string(positions[i]) + " of lane " +
                                      std::to_string(lanes[i]) + " is outside dst's " + std::to_string(dst.shape(2)) +
                                      " positions");
        }
        stores.push_back({static_cast<char*>(dst.mutable_data()), static_cast<const char*>(src.data()), src.shape(0),
                          dst.strides(0), dst.strides(1), dst.strides(2), src.strides(0), src.strides(1)});
    }
    if (stores.empty() || lanes.empty()) return;
    // Blocks of kBlock channels of one pair; a thread's chunk holds about kChunkElements elements.
    constexpr int64_t kBlock = 64, kChunkElements = 4096;
    int64_t widest = 0;
    for (const ColumnStore& t : stores) widest = std::max(widest, t.width);
    const int64_t blocks = std::max<int64_t>(1, (widest + kBlock - 1) / kBlock);  // per pair
    const int64_t grain = std::max<int64_t>(1, kChunkElements / (kBlock * static_cast<int64_t>(lanes.size())));
    py::gil_scoped_release release;
    kern::parallel_for(static_cast<int64_t>(stores.size()) * blocks, grain, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
            const ColumnStore& t = stores[static_cast<size_t>(b / blocks)];
            const int64_t begin = b % blocks * kBlock, end = std::min(t.width, begin + kBlock);
            if (itemsize == 2) store_channels<2>(t, begin, end, lanes, positions);
            else store_channels<4>(t, begin, end, lanes, positions);
        }
    });
}

}  // namespace

void bind_kernels(py::module_& m) {
    py::module_ k = m.def_submodule("kernels", "The emulator's fp16/fp32 kernels on numpy arrays.");

    k.def(
        "round_fp16",
        [](const py::object& a) {
            return map_to_float32<float>(a, "float32", [](const float* src, float* dst, size_t n) {
                std::memcpy(dst, src, n * sizeof(float));
                kern::round_fp16(dst, n);
            });
        },
        py::arg("a"), "A float32 copy of `a` rounded to the nearest fp16 (ties to even, overflow to inf).");
    k.def(
        "half_to_float", [](const py::object& a) { return map_to_float32<uint16_t>(a, "float16", kern::half_to_float); },
        py::arg("a"), "A float32 copy of a float16 array: exact, with the CPU's conversion instructions where it "
                      "has them (numpy's astype converts in software, about 25x slower).");
    k.def(
        "tanh", [](const py::object& a) { return map_to_float32<float>(a, "float32", kern::tanh); }, py::arg("a"),
        "tanh of a float32 array, as the emulator's tanh op computes it (before fp16 rounding).");

    k.def(
        "softmax",
        [](const py::object& a_obj) {
            const py::array a = c_contiguous(checked_array(a_obj, "a", "float32", -1));
            py::array_t<float> out(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()));
            const int64_t width = a.ndim() ? static_cast<int64_t>(a.shape(a.ndim() - 1)) : 1;
            const int64_t rows = width ? static_cast<int64_t>(a.size()) / width : 0;
            const float* src = static_cast<const float*>(a.data());
            float* dst = out.mutable_data();
            py::gil_scoped_release release;
            for (int64_t r = 0; r < rows; ++r) kern::softmax(src + r * width, dst + r * width, width);
            return out;
        },
        py::arg("a"), "softmax over the last axis of a float32 array, as the emulator's softmax op computes it "
                      "(before fp16 rounding).");

    py::class_<kern::PackedConv1x1, std::shared_ptr<kern::PackedConv1x1>>(k, "PackedConv1x1", "A float16 [cout, cin] 1x1 conv weight, packed once.")
        .def(py::init(&pack), py::arg("weight"))
        .def_readonly("cout", &kern::PackedConv1x1::cout)
        .def_readonly("cin", &kern::PackedConv1x1::cin)
        .def("__call__", &run_conv<kern::PackedConv1x1>, py::arg("x"), py::arg("lanes") = py::none(), py::arg("round") = true,
             "float32 [cout, S] = W @ x[:, :lanes] in fp32, rounded to fp16 if `round`; other lanes are 0.");

    k.def(
        "conv1x1",
        [](const py::object& weight, const py::object& x, std::optional<int64_t> lanes, bool round) {
            return run_conv(pack(weight), x, lanes, round);
        },
        py::arg("weight"), py::arg("x"), py::arg("lanes") = py::none(), py::arg("round") = true,
        "Packs a float16 [cout, cin] weight and applies it to float32 x [cin, S] (see PackedConv1x1).");

    py::class_<kern::PackedConv1x1I8, std::shared_ptr<kern::PackedConv1x1I8>>(
        k, "PackedConv1x1I8",
        "An int8 [cout, cin] 1x1 conv weight with float32 [cout] scales whose products q * scale are fp16 values, "
        "packed once.")
        .def(py::init(&pack_i8), py::arg("q"), py::arg("scale"))
        .def_readonly("cout", &kern::PackedConv1x1I8::cout)
        .def_readonly("cin", &kern::PackedConv1x1I8::cin)
        .def("__call__", &run_conv<kern::PackedConv1x1I8>, py::arg("x"), py::arg("lanes") = py::none(),
             py::arg("round") = true,
             "float32 [cout, S] = (q * scale) @ x[:, :lanes] in fp32, rounded to fp16 if `round`; other lanes are 0.");
    k.def(
        "conv1x1_i8",
        [](const py::object& q, const py::object& scale, const py::object& x, std::optional<int64_t> lanes, bool round) {
            return run_conv(pack_i8(q, scale), x, lanes, round);
        },
        py::arg("q"), py::arg("scale"), py::arg("x"), py::arg("lanes") = py::none(), py::arg("round") = true,
        "Packs an int8 [cout, cin] weight with float32 [cout] scales and applies it to float32 x [cin, S] "
        "(see PackedConv1x1I8).");
    k.def(
        "int8_weights_fp16_exact",
        [](const py::object& q_obj, const py::object& scale_obj) {
            const py::array q = c_contiguous(checked_array(q_obj, "q", "int8", 2));
            const py::array scale = c_contiguous(checked_array(scale_obj, "scale", "float32", 1));
            if (scale.shape(0) != q.shape(0)) throw py::value_error("scale needs one entry per row of q");
            return kern::int8_weights_fp16_exact(static_cast<const int8_t*>(q.data()),
                                                 static_cast<const float*>(scale.data()), q.shape(0), q.shape(1));
        },
        py::arg("q"), py::arg("scale"),
        "Whether every q[o, c] * scale[o] is an fp16 value (the int8 kernel's exact path applies).");
    k.def("gemm", &run_gemm, py::arg("a"), py::arg("b"), py::arg("transpose_a") = false,
          py::arg("transpose_b") = false, py::arg("round") = true,
          "float32 op(a) @ op(b) with fp32 accumulation, rounded to fp16 if `round`; op transposes if asked.");
    k.def("to_fp16", &to_fp16, py::arg("src"), py::arg("out"),
          "Rounds float32 `src` to fp16 into float16 `out` (same size, C-contiguous; ties to even, as numpy).");
    k.def("store_columns", &store_columns, py::arg("dsts"), py::arg("srcs"), py::arg("lanes"), py::arg("positions"),
          "dsts[j][lanes[i], :, positions[i]] = srcs[j][:, lanes[i]] for each pair j and each i (dst [lanes, width, "
          "positions], src [width, lanes], any strides, one float16 or float32 dtype): a decode step's new keys and "
          "values of every layer into the KV cache in one call, on every thread, instead of a numpy assignment per "
          "lane and layer.");
    k.def("gather_lanes", &gather_lanes, py::arg("parts"), py::arg("lanes"),
          "float32 [len(lanes), channels]: row i holds lane lanes[i] of every part in turn (C-contiguous float16 or "
          "float32 arrays, lanes on the last axis, the other axes their channels): a decode step's logits from the LM "
          "head programs' outputs in one call, holding the GIL.");
    k.def("read_rows", &read_rows, py::arg("fd"), py::arg("offset"), py::arg("row_bytes"), py::arg("count"),
          py::arg("rows"), py::arg("out"),
          "Rows `rows` of the `count`-row table at byte `offset` of the file open as `fd` into C-contiguous `out`, "
          "holding the GIL (os.preadv releases it for each read); returns how many rows were read in full.");
    k.def("copy", &copy, py::arg("dst"), py::arg("src"),
          "Copies `src` into `dst` (one dtype, as many elements, both C-contiguous) on every thread.");
    k.def("has_nan", &has_nan, py::arg("array"), "Whether a C-contiguous float16 or float32 array holds a NaN.");
    k.def("shared_conv_weights", &kern::shared_conv1x1_usage,
          "(count, bytes) of the packed 1x1 conv weights alive in this process: one per distinct weight, "
          "shared by every program that bakes it.");
    k.def(
        "keyed_conv_panels",
        [] {
            py::list out;
            for (auto& [key, packed] : kern::keyed_conv1x1_packed()) {
                auto* held = new std::shared_ptr<const kern::PackedConv1x1>(packed);  // alive while the view is
                py::capsule owner(held, [](void* p) { delete static_cast<std::shared_ptr<const kern::PackedConv1x1>*>(p); });
                py::array_t<uint16_t> panels({static_cast<py::ssize_t>(packed->data.size())}, {sizeof(uint16_t)},
                                             packed->data.data(), owner);
                py::detail::array_proxy(panels.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
                out.append(py::make_tuple(key, panels));
            }
            return out;
        },
        "[(key, uint16 panels)] of the keyed fp16 conv weights this process packed (not read from a file of "
        "panels), by shaped key '<weight key>/<cout>x<cin>': read-only views, what the program cache stores.");
    k.def("conv_panel_layout", &kern::conv1x1_panel_layout,
          "The packed fp16 conv panels' layout name: files of panels written under another are not read.");
    k.def(
        "shared_consts",
        [] {
            const auto stored = orion::emu::shared_floats_usage(), folded = orion::emu::folded_usage();
            return std::make_pair(stored.first + folded.first, stored.second + folded.second);
        },
        "(count, bytes) of the const tensors held once per process (causal masks of fused attention, stored "
        "or folded), shared by every program that bakes them.");
    k.def(
        "buffer_pool",
        [](bool reset_peak) {
            const auto u = orion::emu::buffer_pool::usage();
            if (reset_peak) orion::emu::buffer_pool::reset_peak();
            return py::dict(py::arg("live") = u.live, py::arg("idle") = u.idle, py::arg("peak") = u.peak);
        },
        py::arg("reset_peak") = false,
        "Bytes of the emulator's pooled frame buffers: live (taken by a running program), idle, and the "
        "peak of live + idle since the last reset_peak=True.");
    k.def("release_idle_buffers", [] {
              const size_t idle = orion::emu::buffer_pool::pooled_bytes();
              orion::emu::buffer_pool::clear();
              return idle;
          },
          "Frees the pool's idle buffers (e.g. a long prompt's activations once its prefill is done, so decode "
          "does not keep them resident) and returns the heap's free pages to the OS (buffer_pool::clear); returns "
          "the pool bytes freed. Later evaluates allocate what they need again.");
    k.def("num_threads", &kern::num_threads, "Threads the kernels use (ORION_NUM_THREADS, else the hardware's).");
    k.def("simd_path", &kern::simd_path, "\"avx512f+f16c+fma\", \"avx2+f16c+fma\" or \"portable\" (ORION_SIMD=avx2 or =portable narrows it).");
    k.def("_parallel_for_probe", &parallel_for_probe, py::arg("n"), py::arg("grain"), py::arg("fail_at") = -1,
          py::arg("nested") = false, py::arg("guided") = false);
    k.def("_parallel_for_guided_chunks", &parallel_for_guided_chunks, py::arg("n"), py::arg("grain"));
}

}  // namespace orion::bindings
