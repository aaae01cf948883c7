#include "emulator/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "errors.h"
#include "frontend/frontend.h"

namespace orion::emu {

namespace {
const mil::Argument* find_arg(const mil::Operation& op, const char* name, size_t* index = nullptr) {
    for (size_t i = 0; i < op.args.size(); ++i) {
        if (op.args[i].name == name) {
            if (index) *index = i;
            return &op.args[i];
        }
    }
    return nullptr;
}
}  // namespace

void OpContext::fail(const std::string& message) const { throw CompileError(frontend::where(op_) + ": " + message); }

bool OpContext::has(const char* arg) const { return find_arg(op_, arg) != nullptr; }

const ValueInfo& OpContext::info(const char* arg) const {
    size_t index = 0;
    const mil::Argument* a = find_arg(op_, arg, &index);
    if (!a) fail(std::string("missing required argument '") + arg + "'");
    if (a->kind == mil::Argument::Kind::tuple) fail(std::string("argument '") + arg + "' must be a single value, not a tuple");
    return values_[static_cast<size_t>(arg_ids_[index])];
}

int OpContext::slot(const char* arg, bool fp16_in_place) {
    const ValueInfo& v = info(arg);
    if (plan_only_) return v.slot;
    const_cast<ValueInfo&>(v).used_as_data = true;
    if (!fp16_in_place) values_[static_cast<size_t>(v.slot)].needs_fp32 = true;
    return v.slot;
}

const mil::Type& OpContext::type(const char* arg) const { return info(arg).type; }

std::vector<int> OpContext::tuple_slots(const char* arg) {
    size_t index = 0;
    const mil::Argument* a = find_arg(op_, arg, &index);
    if (!a) fail(std::string("missing required argument '") + arg + "'");
    if (a->kind != mil::Argument::Kind::tuple) fail(std::string("argument '") + arg + "' must be a tuple like (a, b)");
    std::vector<int> slots;
    for (int id : tuple_ids_[index]) {
        if (plan_only_) {
            slots.push_back(values_[static_cast<size_t>(id)].slot);
            continue;
        }
        values_[static_cast<size_t>(id)].used_as_data = true;
        values_[static_cast<size_t>(values_[static_cast<size_t>(id)].slot)].needs_fp32 = true;
        slots.push_back(values_[static_cast<size_t>(id)].slot);
    }
    return slots;
}

const ValueInfo& OpContext::constant(const char* arg) const {
    const ValueInfo& v = info(arg);
    if (!v.constant) fail(std::string("argument '") + arg + "' must be a const() value");
    return v;
}

std::vector<float> OpContext::floats(const char* arg) const { return const_values(constant(arg)); }

std::vector<float> const_values(const ValueInfo& v) {
    if (v.blob) return blob_floats(v);
    if (v.folded) return *v.folded;
    return std::vector<float>(v.constant->numbers.begin(), v.constant->numbers.end());
}

void finish(Tensor& t) {
    float* d = t.data.data();
    switch (t.dtype) {
        case mil::DType::fp16:
            for_each_live_row(t, [&](int64_t at, int64_t n) { kernels::round_fp16(d + at, static_cast<size_t>(n)); });
            break;
        case mil::DType::fp32: break;
        case mil::DType::boolean:
            for (float& v : t.data) v = v != 0.0f ? 1.0f : 0.0f;
            break;
        default:
            for (float& v : t.data) v = std::nearbyint(v);
            break;
    }
}

std::vector<float> blob_floats(const ValueInfo& v) {
    const std::string_view bytes = *v.blob;
    std::vector<float> out;
    switch (v.type.dtype) {
        case mil::DType::fp16: {
            std::vector<uint16_t> h(bytes.size() / 2);
            if (!h.empty()) std::memcpy(h.data(), bytes.data(), h.size() * 2);  // (memcpy may not take null)
            out.resize(h.size());
            kernels::half_to_float(h.data(), out.data(), h.size());
            break;
        }
        case mil::DType::fp32:
            out.resize(bytes.size() / 4);
            if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * 4);
            break;
        case mil::DType::int8:
            for (char c : bytes) out.push_back(static_cast<float>(static_cast<int8_t>(c)));
            break;
        case mil::DType::uint8:
            for (char c : bytes) out.push_back(static_cast<float>(static_cast<uint8_t>(c)));
            break;
        case mil::DType::int4:
        case mil::DType::uint4:
        case mil::DType::uint6: {
            // Packed LSB first (coremltools' MILBlob): element i at bits [i*b, (i+1)*b).
            const int64_t n = v.type.element_count();
            const int bits = static_cast<int>(mil::dtype_bits(v.type.dtype));
            out.resize(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; ++i) {
                const int64_t bit = i * bits;
                uint32_t word = static_cast<uint8_t>(bytes[static_cast<size_t>(bit / 8)]);
                if (bit / 8 + 1 < static_cast<int64_t>(bytes.size()))
                    word |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[static_cast<size_t>(bit / 8 + 1)])) << 8;
                int value = static_cast<int>((word >> (bit % 8)) & ((1u << bits) - 1));
                if (v.type.dtype == mil::DType::int4 && value >= 8) value -= 16;
                out[static_cast<size_t>(i)] = static_cast<float>(value);
            }
            break;
        }
        default:
            throw CompileError(std::string("BLOBFILE payloads of ") + mil::dtype_name(v.type.dtype) + " are not supported");
    }
    return out;
}

OpBuilder find_op(const std::string& op) {
    static const mil::NameIndex<OpBuilder> builders{elementwise_ops, tensor_ops, linear_ops, reduction_ops, quantization_ops};
    return builders.find(op);
}

}  // namespace orion::emu
