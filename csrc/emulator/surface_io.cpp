#include "emulator/surface_io.h"

#include <algorithm>
#include <cmath>
#include <climits>
#include <cstring>

#include "emulator/kernels.h"
#include "errors.h"
#include "runtime/surface.h"

namespace orion::emu {

namespace {

// Elements of an fp16 conversion worth a thread's share: a Stories110M layer gradient's input (11M values:
// weights, saved activations, dy) and its outputs were converted on the calling thread alone.
constexpr int64_t kConvertGrain = int64_t{1} << 18;

// dst[i] = src[i] widened (exact), over the threads.
void widen(const uint16_t* src, float* dst, int64_t n) {
    kernels::parallel_for(n, kConvertGrain, [&](int64_t begin, int64_t end) {
        kernels::half_to_float(src + begin, dst + begin, static_cast<size_t>(end - begin));
    });
}

// dst[i] = src[i] rounded to fp16 (each element alone), over the threads.
void narrow(const float* src, uint16_t* dst, int64_t n) {
    kernels::parallel_for(n, kConvertGrain, [&](int64_t begin, int64_t end) {
        kernels::float_to_half(src + begin, dst + begin, static_cast<size_t>(end - begin));
    });
}

// Converts between a surface's packed bytes and a frame tensor (the live lanes of each row when
// the tensor is partially live, the whole tensor otherwise).
void load_input(const uint8_t* src, Tensor& t) {
    if (t.data.empty()) return;  // an empty tensor (memcpy may not be given its null data)
    if (t.skips_dead_lanes() && mil::is_float(t.dtype)) {
        for_each_live_row(t, [&](int64_t at, int64_t n) {
            if (t.dtype == mil::DType::fp16)
                kernels::half_to_float(reinterpret_cast<const uint16_t*>(src) + at, t.data.data() + at, static_cast<size_t>(n));
            else
                std::memcpy(t.data.data() + at, src + at * 4, static_cast<size_t>(n) * 4);
        });
        return;
    }
    const size_t n = t.data.size();
    switch (t.dtype) {
        case mil::DType::fp16: widen(reinterpret_cast<const uint16_t*>(src), t.data.data(), static_cast<int64_t>(n)); break;
        case mil::DType::fp32: std::memcpy(t.data.data(), src, n * 4); break;
        case mil::DType::int32:
            for (size_t i = 0; i < n; ++i) {
                int32_t v;
                std::memcpy(&v, src + 4 * i, 4);
                t.data[i] = static_cast<float>(v);
            }
            break;
        case mil::DType::int8:
            for (size_t i = 0; i < n; ++i) t.data[i] = static_cast<float>(static_cast<int8_t>(src[i]));
            break;
        case mil::DType::uint8:
        case mil::DType::boolean:
            for (size_t i = 0; i < n; ++i) t.data[i] = static_cast<float>(src[i]);
            break;
        default: throw EvaluateError(std::string("unsupported I/O dtype ") + mil::dtype_name(t.dtype) + " (the front end refuses it at compile)");
    }
}

// An integer output element: the value saturated to [lo, hi], NaN as 0 (converting a float outside the
// target's range is undefined behaviour in C++, and an integer has no NaN).
template <typename Int>
Int saturate(float v, double lo, double hi) {
    if (std::isnan(v)) return 0;
    return static_cast<Int>(std::clamp(static_cast<double>(v), lo, hi));
}

void store_output(const Tensor& t, uint8_t* dst) {
    if (t.data.empty()) return;
    if (t.skips_dead_lanes() && mil::is_float(t.dtype)) {
        for_each_live_row(t, [&](int64_t at, int64_t n) {
            if (t.dtype == mil::DType::fp16)
                kernels::float_to_half(t.data.data() + at, reinterpret_cast<uint16_t*>(dst) + at, static_cast<size_t>(n));
            else
                std::memcpy(dst + at * 4, t.data.data() + at, static_cast<size_t>(n) * 4);
        });
        return;
    }
    const size_t n = t.data.size();
    switch (t.dtype) {
        case mil::DType::fp16: narrow(t.data.data(), reinterpret_cast<uint16_t*>(dst), static_cast<int64_t>(n)); break;
        case mil::DType::fp32: std::memcpy(dst, t.data.data(), n * 4); break;
        case mil::DType::int32:
            for (size_t i = 0; i < n; ++i) {
                const int32_t v = saturate<int32_t>(t.data[i], INT32_MIN, INT32_MAX);
                std::memcpy(dst + 4 * i, &v, 4);
            }
            break;
        case mil::DType::int8:
        case mil::DType::uint8:
        case mil::DType::boolean:
            for (size_t i = 0; i < n; ++i) {
                const double lo = t.dtype == mil::DType::int8 ? -128 : 0, hi = t.dtype == mil::DType::int8 ? 127 : 255;
                dst[i] = static_cast<uint8_t>(saturate<int32_t>(t.data[i], lo, hi));
            }
            break;
        default: throw EvaluateError(std::string("unsupported I/O dtype ") + mil::dtype_name(t.dtype) + " (the front end refuses it at compile)");
    }
}

// A float output whose data is its first `block` elements repeated (find_replicated_outputs): the
// block stored once, then copied in the surface's dtype.
void store_replicated(const Tensor& t, int64_t block, uint8_t* dst) {
    const size_t element = t.dtype == mil::DType::fp16 ? 2 : 4, bytes = static_cast<size_t>(block) * element;
    if (t.dtype == mil::DType::fp16)
        kernels::float_to_half(t.data.data(), reinterpret_cast<uint16_t*>(dst), static_cast<size_t>(block));
    else
        std::memcpy(dst, t.data.data(), bytes);
    for (int64_t at = block; at < t.size(); at += block) std::memcpy(dst + static_cast<size_t>(at) * element, dst, bytes);
}

}  // namespace

bool SurfaceIO::reads_in_place(int slot) const {
    return std::any_of(inputs.begin(), inputs.end(), [slot](const Input& in) { return in.slot == slot && in.in_place; });
}

void SurfaceIO::load(const runtime::Bindings& surfaces, const runtime::LiveLanes& live, Frame& frame) const {
    for (const Input& in : inputs) {
        Tensor& t = frame.values[static_cast<size_t>(in.slot)];
        t.lanes = t.last_dim();
        t.live_prefix = -1;
        for (const auto& name : in.hint_names)
            if (const auto hint = live.find(name); hint != live.end()) {
                t.lanes = hint->second;
                break;
            }
        const uint8_t* data = surfaces[in.surface].second->data() + in.byte_offset;
        if (in.in_place)
            t.half = reinterpret_cast<const uint16_t*>(data);
        else
            load_input(data, t);
    }
}

void SurfaceIO::store(const runtime::Bindings& surfaces, const Frame& frame) const {
    for (size_t i = 0; i < outputs.size(); ++i) {
        const Tensor& t = frame.values[static_cast<size_t>(outputs[i].slot)];
        if (outputs[i].replicated_block) store_replicated(t, outputs[i].replicated_block, surfaces[i].second->data());
        else store_output(t, surfaces[i].second->data());
    }
}

}  // namespace orion::emu
