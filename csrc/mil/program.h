// The in-memory model of a MIL program, in the dialect the ANE compiler accepts (docs/hardware.md §4).
//
//   program(1.3) [buildInfo = ...] { func main<ios18>(inputs) { statements } -> (outputs); }
//
// A statement is `TYPE var = op(arg=ref, ...)[name=string("..."), val=...];`. Constants are
// `const()` statements whose value is a scalar, a literal list or a BLOBFILE reference. The
// model keeps everything needed to re-emit the text byte-for-byte (argument order, literal
// spelling of floats is normalised by the emitter) and nothing more.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace orion::mil {

// int4, uint4 and uint6 are sub-byte types: only constexpr ops' BLOBFILE payloads carry them, packed
// LSB first as coremltools' MILBlob writer packs them (element i at bits [i*b, (i+1)*b) of the payload).
enum class DType { fp16, fp32, int32, int16, int8, uint16, uint8, boolean, string, uint64, int4, uint4, uint6 };

const char* dtype_name(DType dtype);                    // "fp16", ..., "bool", "string"
std::optional<DType> dtype_from_name(std::string_view name);
size_t dtype_size(DType dtype);                          // bytes per element (0 for string and sub-byte types)
size_t dtype_bits(DType dtype);                          // bits per element (0 for string)
bool is_float(DType dtype);
// Whether `v` can be a literal of `dtype`: finite for floats, 0/1 for bool, an integer in range
// for integer dtypes, never for string.
bool is_valid_number(DType dtype, double v);
// `[A-Za-z_][A-Za-z0-9_]*`: the spelling of variables, ops, functions and opsets in MIL text.
bool is_identifier(std::string_view s);
// `1.3`: digits, optionally a '.' and more digits (the `program(...)` version).
bool is_version_number(std::string_view s);
// "[1, 768, 1, 32]": how messages spell a shape.
std::string shape_str(const std::vector<int64_t>& shape);

// `tensor<fp16, [1, 768, 1, 32]>` (is_tensor) or a scalar `fp16`.
struct Type {
    DType dtype = DType::fp16;
    bool is_tensor = false;
    std::vector<int64_t> shape;  // empty for scalars

    static Type scalar(DType d) { return Type{d, false, {}}; }
    static Type tensor(DType d, std::vector<int64_t> s) { return Type{d, true, std::move(s)}; }
    int64_t element_count() const;
    // Bytes of the packed payload (sub-byte types rounded up to whole bytes).
    int64_t byte_size() const { return (element_count() * static_cast<int64_t>(dtype_bits(dtype)) + 7) / 8; }
    std::string str() const;  // MIL spelling
    bool operator==(const Type& o) const {
        return dtype == o.dtype && is_tensor == o.is_tensor && shape == o.shape;
    }
    bool operator!=(const Type& o) const { return !(*this == o); }
};

// A literal value: `fp16(0.5)`, `tensor<int32, [4]>([0,0,0,0])`, `string("valid")`,
// `bool(true)` or `tensor<fp16, [..]>(BLOBFILE(path=string("@model_path/..."), offset=uint64(64)))`.
struct Value {
    enum class Kind { scalar, list, blob };
    Kind kind = Kind::scalar;
    Type type;                    // for scalars a scalar type; for lists and blobs the tensor type
    std::vector<double> numbers;  // numeric/bool payload (scalar: one element)
    std::string text;             // string scalar payload
    std::string blob_path;        // BLOBFILE path string
    uint64_t blob_offset = 0;     // BLOBFILE offset (the chunk header, conventionally 64)

    static Value number(DType d, double v) { return Value{Kind::scalar, Type::scalar(d), {v}, {}, {}, 0}; }
    static Value string(std::string s) {
        return Value{Kind::scalar, Type::scalar(DType::string), {}, std::move(s), {}, 0};
    }
    static Value list(Type t, std::vector<double> v) { return Value{Kind::list, std::move(t), std::move(v), {}, {}, 0}; }
    static Value blob(Type t, std::string path, uint64_t offset) {
        return Value{Kind::blob, std::move(t), {}, {}, std::move(path), offset};
    }
    bool operator==(const Value& o) const;
    bool operator!=(const Value& o) const { return !(*this == o); }
};

// An operation argument: `x=ref`, `values=(a, b)` (a tuple) or an inline literal `transpose_x=false`
// (legal MIL but rejected by the ANE; the parser keeps it so the validator can name it).
struct Argument {
    enum class Kind { ref, tuple, literal };
    std::string name;
    Kind kind = Kind::ref;
    std::vector<std::string> refs;  // one for ref, several for tuple
    Value literal;                  // for literal

    static Argument reference(std::string n, std::string r) {
        return Argument{std::move(n), Kind::ref, {std::move(r)}, {}};
    }
    static Argument tuple(std::string n, std::vector<std::string> rs) {
        return Argument{std::move(n), Kind::tuple, std::move(rs), {}};
    }
    static Argument inline_literal(std::string n, Value v) { return Argument{std::move(n), Kind::literal, {}, std::move(v)}; }
    bool operator==(const Argument& o) const {
        return name == o.name && kind == o.kind && refs == o.refs && (kind != Kind::literal || literal == o.literal);
    }
};

// Where a statement came from in the source text (0 when built in memory).
struct SourceLocation {
    int line = 0;
    int column = 0;
};

// `TYPE output = op(args)[name=string("name"), val=VALUE];`  (val only for const). A compile-time
// constant op may take its parameters as attributes instead, the form coremltools writes and [M] ran:
// `constexpr_affine_dequantize()[axis=int32(0), name=string("w"), quantized_data=..., scale=..., zero_point=...]`.
struct Operation {
    std::string op;                 // "conv", "const", ...
    std::string output;             // the variable it defines
    Type type;                      // declared type of that variable
    std::vector<Argument> args;     // in source order
    std::string name;               // the `name=string(...)` attribute
    std::optional<Value> val;       // the `val=` attribute of a const
    std::vector<std::pair<std::string, Value>> attributes;  // other attributes, in source order
    SourceLocation loc;

    const Argument* arg(const std::string& arg_name) const;
    bool operator==(const Operation& o) const {
        return op == o.op && output == o.output && type == o.type && args == o.args && name == o.name &&
               val == o.val && attributes == o.attributes;
    }
};

// Whether `op` is a compile-time constant op (`constexpr_*`), the only ops that take attributes.
bool is_constexpr_op(const std::string& op);

struct Parameter {
    std::string name;
    Type type;
    bool operator==(const Parameter& o) const { return name == o.name && type == o.type; }
};

struct Function {
    std::string name = "main";
    std::string opset = "ios18";
    std::vector<Parameter> inputs;   // declaration order
    std::vector<Operation> body;
    std::vector<std::string> outputs;  // return tuple, in written order
    bool operator==(const Function& o) const {
        return name == o.name && opset == o.opset && inputs == o.inputs && body == o.body && outputs == o.outputs;
    }
};

using BuildInfo = std::vector<std::pair<std::string, std::string>>;

// The build info every known working program carries (docs/hardware.md §4).
BuildInfo default_build_info();

struct Program {
    std::string version = "1.3";
    BuildInfo build_info = default_build_info();
    std::vector<Function> functions;  // the ANE runs `main`

    const Function* find_function(const std::string& name) const;
    bool operator==(const Program& o) const {
        return version == o.version && build_info == o.build_info && functions == o.functions;
    }
};

}  // namespace orion::mil
