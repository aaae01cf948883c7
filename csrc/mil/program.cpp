#include "mil/program.h"

#include "errors.h"
#include "hardware_limits.h"

#include <cmath>

namespace orion::mil {

namespace {
struct DTypeInfo {
    DType dtype;
    const char* name;
    size_t size;
    size_t bits;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::fp16, "fp16", 2, 16},   {DType::fp32, "fp32", 4, 32},     {DType::int32, "int32", 4, 32},
    {DType::int16, "int16", 2, 16}, {DType::int8, "int8", 1, 8},      {DType::uint16, "uint16", 2, 16},
    {DType::uint8, "uint8", 1, 8},  {DType::boolean, "bool", 1, 8},   {DType::string, "string", 0, 0},
    {DType::uint64, "uint64", 8, 64}, {DType::int4, "int4", 0, 4},    {DType::uint4, "uint4", 0, 4},
    {DType::uint6, "uint6", 0, 6},
};
const DTypeInfo& info(DType d) {
    for (const auto& i : kDTypes)
        if (i.dtype == d) return i;
    return kDTypes[0];
}
}  // namespace

const char* dtype_name(DType dtype) { return info(dtype).name; }
size_t dtype_size(DType dtype) { return info(dtype).size; }
size_t dtype_bits(DType dtype) { return info(dtype).bits; }
bool is_float(DType dtype) { return dtype == DType::fp16 || dtype == DType::fp32; }

bool is_valid_number(DType dtype, double v) {
    if (!std::isfinite(v)) return false;
    double lo = 0, hi = 0;  // inclusive integer range
    switch (dtype) {
        case DType::fp16:
        case DType::fp32: return true;
        case DType::string: return false;
        case DType::boolean: return v == 0 || v == 1;
        case DType::int32: lo = -2147483648.0, hi = 2147483647.0; break;
        case DType::int16: lo = -32768, hi = 32767; break;
        case DType::int8: lo = -128, hi = 127; break;
        case DType::uint16: hi = 65535; break;
        case DType::uint8: hi = 255; break;
        case DType::int4: lo = -8, hi = 7; break;
        case DType::uint4: hi = 15; break;
        case DType::uint6: hi = 63; break;
        case DType::uint64: hi = 18446744073709549568.0; break;  // largest double below 2^64
    }
    return v == std::floor(v) && v >= lo && v <= hi;
}

bool is_identifier(std::string_view s) {
    auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
    if (s.empty() || !alpha(s[0])) return false;
    for (char c : s)
        if (!alpha(c) && !(c >= '0' && c <= '9')) return false;
    return true;
}

bool is_version_number(std::string_view s) {
    auto digits = [](std::string_view d) { return !d.empty() && d.find_first_not_of("0123456789") == d.npos; };
    size_t dot = s.find('.');
    return digits(s.substr(0, dot)) && (dot == s.npos || digits(s.substr(dot + 1)));
}

std::optional<DType> dtype_from_name(std::string_view name) {
    for (const auto& i : kDTypes)
        if (name == i.name) return i.dtype;
    return std::nullopt;
}

int64_t Type::element_count() const {
    int64_t n = 1;
    for (int64_t d : shape) {
        if (d == 0) return 0;
        if (d < 0 || n > limits::MAX_ELEMENTS / d)
            throw CompileError(str() + " has more than MAX_ELEMENTS (" + std::to_string(limits::MAX_ELEMENTS) +
                               ") elements: split the tensor");
        n *= d;
    }
    return n;
}

std::string shape_str(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

std::string Type::str() const {
    if (!is_tensor) return dtype_name(dtype);
    return std::string("tensor<") + dtype_name(dtype) + ", " + shape_str(shape) + ">";
}

bool Value::operator==(const Value& o) const {
    if (kind != o.kind || type != o.type) return false;
    switch (kind) {
        case Kind::blob: return blob_path == o.blob_path && blob_offset == o.blob_offset;
        case Kind::scalar:
            if (type.dtype == DType::string) return text == o.text;
            [[fallthrough]];
        case Kind::list:
            if (numbers.size() != o.numbers.size()) return false;
            for (size_t i = 0; i < numbers.size(); ++i) {
                // NaN equals NaN here: a program equals its own re-parse.
                if (!(numbers[i] == o.numbers[i]) && !(std::isnan(numbers[i]) && std::isnan(o.numbers[i])))
                    return false;
            }
            return true;
    }
    return false;
}

const Argument* Operation::arg(const std::string& arg_name) const {
    for (const auto& a : args)
        if (a.name == arg_name) return &a;
    return nullptr;
}

bool is_constexpr_op(const std::string& op) { return op.rfind("constexpr_", 0) == 0; }

BuildInfo default_build_info() {
    return {{"coremlc-component-MIL", "3510.2.1"},
            {"coremlc-version", "3505.4.1"},
            {"coremltools-component-milinternal", ""},
            {"coremltools-version", "9.0"}};
}

const Function* Program::find_function(const std::string& name) const {
    for (const auto& f : functions)
        if (f.name == name) return &f;
    return nullptr;
}

}  // namespace orion::mil
