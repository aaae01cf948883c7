#include "emulator/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

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
    if (types_only_) return v.slot;
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
        if (types_only_) {
            slots.push_back(values_[static_cast<size_t>(id)].slot);
            continue;
        }
        values_[static_cast<size_t>(id)].used_as_data = true;
        values_[static_cast<size_t>(values_[static_cast<size_t>(id)].slot)].needs_fp32 = true;
        slots.push_back(values_[static_cast<size_t>(id)].slot);
    }
    return slots;
}

std::vector<mil::Type> OpContext::tuple_types(const char* arg) const {
    size_t index = 0;
    const mil::Argument* a = find_arg(op_, arg, &index);
    if (!a || a->kind != mil::Argument::Kind::tuple) fail(std::string("argument '") + arg + "' must be a tuple like (a, b)");
    std::vector<mil::Type> types;
    for (int id : tuple_ids_[index]) types.push_back(values_[static_cast<size_t>(id)].type);
    return types;
}

const ValueInfo& OpContext::constant(const char* arg) const {
    const ValueInfo& v = info(arg);
    if (!v.constant) fail(std::string("argument '") + arg + "' must be a const() value");
    return v;
}

std::vector<float> OpContext::floats(const char* arg) const {
    const ValueInfo& v = constant(arg);
    if (v.blob) return blob_floats(v);
    return std::vector<float>(v.constant->numbers.begin(), v.constant->numbers.end());
}

std::vector<int64_t> OpContext::ints(const char* arg) const {
    const ValueInfo& v = constant(arg);
    if (v.blob || v.type.dtype == mil::DType::string || mil::is_float(v.type.dtype))
        fail(std::string("argument '") + arg + "' must be an integer const, got " + v.type.str());
    std::vector<int64_t> out;
    for (double d : v.constant->numbers) out.push_back(static_cast<int64_t>(d));
    return out;
}

int64_t OpContext::int_scalar(const char* arg) const {
    auto v = ints(arg);
    if (v.size() != 1) fail(std::string("argument '") + arg + "' must be a single integer");
    return v[0];
}

double OpContext::number(const char* arg) const {
    const ValueInfo& v = constant(arg);
    if (v.blob || v.constant->numbers.size() != 1) fail(std::string("argument '") + arg + "' must be a scalar const");
    return v.constant->numbers[0];
}

bool OpContext::boolean(const char* arg) const {
    const ValueInfo& v = constant(arg);
    if (v.type.dtype != mil::DType::boolean || v.constant->numbers.size() != 1)
        fail(std::string("argument '") + arg + "' must be a bool const, got " + v.type.str());
    return v.constant->numbers[0] != 0.0;
}

std::string OpContext::text(const char* arg) const {
    const ValueInfo& v = constant(arg);
    if (v.type.dtype != mil::DType::string) fail(std::string("argument '") + arg + "' must be a string const");
    return v.constant->text;
}

Shape broadcast_shapes(OpContext& ctx, const Shape& a, const Shape& b) {
    const size_t rank = std::max(a.size(), b.size());
    Shape out(rank);
    for (size_t i = 0; i < rank; ++i) {
        const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
        const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
        if (da != db && da != 1 && db != 1)
            ctx.fail("shapes " + shape_str(a) + " and " + shape_str(b) + " do not broadcast (dimension " +
                     std::to_string(i) + ": " + std::to_string(da) + " vs " + std::to_string(db) + ")");
        out[i] = da == 1 ? db : da;
    }
    return out;
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

mil::Type tensor_type(mil::DType dtype, const Shape& shape) { return mil::Type::tensor(dtype, shape); }

int64_t normalize_axis(OpContext& ctx, int64_t axis, int64_t rank) {
    const int64_t a = axis < 0 ? axis + rank : axis;
    if (a < 0 || a >= rank)
        ctx.fail("axis " + std::to_string(axis) + " is out of range for a rank-" + std::to_string(rank) + " tensor");
    return a;
}

std::vector<float> blob_floats(const ValueInfo& v) {
    const std::string_view bytes = *v.blob;
    std::vector<float> out;
    switch (v.type.dtype) {
        case mil::DType::fp16: {
            std::vector<uint16_t> h(bytes.size() / 2);
            std::memcpy(h.data(), bytes.data(), h.size() * 2);
            out.resize(h.size());
            kernels::half_to_float(h.data(), out.data(), h.size());
            break;
        }
        case mil::DType::fp32:
            out.resize(bytes.size() / 4);
            std::memcpy(out.data(), bytes.data(), out.size() * 4);
            break;
        case mil::DType::int8:
            for (char c : bytes) out.push_back(static_cast<float>(static_cast<int8_t>(c)));
            break;
        case mil::DType::uint8:
            for (char c : bytes) out.push_back(static_cast<float>(static_cast<uint8_t>(c)));
            break;
        default:
            throw CompileError(std::string("BLOBFILE payloads of ") + mil::dtype_name(v.type.dtype) + " are not supported");
    }
    return out;
}

OpBuilder find_op(const std::string& op) {
    static const std::map<std::string, OpBuilder> registry = [] {
        std::map<std::string, OpBuilder> r;
        for (auto* group : {elementwise_ops, tensor_ops, linear_ops, reduction_ops, quantization_ops})
            for (const OpEntry& e : group()) r[e.name] = e.build;
        return r;
    }();
    auto it = registry.find(op);
    return it == registry.end() ? nullptr : it->second;
}

}  // namespace orion::emu
