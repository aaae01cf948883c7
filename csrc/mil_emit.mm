// The MIL emitter: writes a Program in the exact conventions of docs/hardware.md §4. Portable C++17
// (no Objective-C) so that Linux builds compile it as C++.
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>

#include "errors.h"
#include "mil/text.h"

namespace orion::mil {

namespace {

constexpr const char* kIndent = "    ";

std::string quoted(const std::string& s) {
    static const char* hex = "0123456789abcdef";
    std::string out = "\"";
    for (char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\t': out += "\\t"; break;
            case '\r': out += "\\r"; break;
            default:
                if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
                    out += "\\x";
                    out += hex[(c >> 4) & 0xf];
                    out += hex[c & 0xf];
                } else {
                    out += c;
                }
        }
    }
    return out + "\"";
}

// Shortest round-tripping decimal; fixed notation for 1e-5 <= |v| < 1e16 (so epsilons read as
// `0.00001`, as in docs/hardware.md §4), scientific outside; always with a '.' or an exponent.
std::string float_literal(double v) {
    char buf[64];
    double magnitude = std::fabs(v);
    auto format = (magnitude == 0 || (magnitude >= 1e-5 && magnitude < 1e16)) ? std::chars_format::fixed
                                                                               : std::chars_format::scientific;
    std::string s(buf, std::to_chars(buf, buf + sizeof buf, v, format).ptr);
    if (s.find_first_of(".e") == std::string::npos) s += ".0";
    return s;
}

std::string integer_literal(double v) {
    char buf[32];
    char* end = v < 0 ? std::to_chars(buf, buf + sizeof buf, static_cast<int64_t>(v)).ptr
                      : std::to_chars(buf, buf + sizeof buf, static_cast<uint64_t>(v)).ptr;
    return std::string(buf, end);
}

class Emitter {
   public:
    std::string text(const Program& program) {
        if (!is_version_number(program.version))
            throw CompileError("program version '" + program.version + "' is not a number like 1.3");
        out_ = "program(" + program.version + ")\n[buildInfo = dict<string, string>({";
        for (size_t i = 0; i < program.build_info.size(); ++i) {
            if (i) out_ += ", ";
            out_ += "{" + quoted(program.build_info[i].first) + ", " + quoted(program.build_info[i].second) + "}";
        }
        out_ += "})]\n{\n";
        for (const Function& f : program.functions) function(f);
        out_ += "}\n";
        return std::move(out_);
    }

   private:
    std::string out_;
    std::string where_;  // the variable being written, for error messages

    const std::string& identifier(const std::string& s) const {
        if (!is_identifier(s)) throw CompileError(where_ + ": '" + s + "' is not a valid MIL identifier");
        return s;
    }

    void function(const Function& f) {
        where_ = "function '" + f.name + "'";
        out_ += std::string(kIndent) + "func " + identifier(f.name) + "<" + identifier(f.opset) + ">(";
        for (size_t i = 0; i < f.inputs.size(); ++i) {
            if (i) out_ += ", ";
            out_ += type(f.inputs[i].type) + " " + identifier(f.inputs[i].name);
        }
        out_ += ") {\n";
        for (const Operation& op : f.body) statement(op);
        out_ += std::string(kIndent) + "} -> (";
        for (size_t i = 0; i < f.outputs.size(); ++i) {
            if (i) out_ += ", ";
            out_ += identifier(f.outputs[i]);
        }
        out_ += ");\n";
    }

    void statement(const Operation& op) {
        where_ = "variable '" + op.output + "'";
        out_ += std::string(kIndent) + kIndent + type(op.type) + " " + identifier(op.output) + " = " +
                identifier(op.op) + "(";
        for (size_t i = 0; i < op.args.size(); ++i) {
            if (i) out_ += ", ";
            argument(op.args[i]);
        }
        out_ += ")[name=string(" + quoted(op.name) + ")";
        if (op.val) out_ += ", val=" + value(*op.val);
        out_ += "];\n";
    }

    void argument(const Argument& a) {
        out_ += identifier(a.name) + "=";
        switch (a.kind) {
            case Argument::Kind::ref:
                if (a.refs.size() != 1) throw CompileError(where_ + ": argument '" + a.name + "' needs one reference");
                out_ += identifier(a.refs[0]);
                break;
            case Argument::Kind::tuple:
                out_ += "(";
                for (size_t i = 0; i < a.refs.size(); ++i) {
                    if (i) out_ += ", ";
                    out_ += identifier(a.refs[i]);
                }
                out_ += ")";
                break;
            case Argument::Kind::literal: {
                const Value& v = a.literal;
                bool bare_bool = v.kind == Value::Kind::scalar && v.type == Type::scalar(DType::boolean);
                out_ += bare_bool ? number(DType::boolean, scalar_number(v)) : value(v);
                break;
            }
        }
    }

    std::string type(const Type& t) const {
        for (int64_t d : t.shape)
            if (d < 0) throw CompileError(where_ + ": negative dimension in " + t.str());
        if (!t.is_tensor && !t.shape.empty()) throw CompileError(where_ + ": a scalar type has a shape");
        return t.str();
    }

    std::string number(DType dtype, double v) const {
        if (!is_valid_number(dtype, v)) {
            char buf[64];
            std::string spelled(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
            throw CompileError(where_ + ": " + spelled + " is not a valid " + dtype_name(dtype) + " literal");
        }
        if (dtype == DType::boolean) return v != 0 ? "true" : "false";
        return is_float(dtype) ? float_literal(v) : integer_literal(v);
    }

    double scalar_number(const Value& v) const {
        if (v.numbers.size() != 1) throw CompileError(where_ + ": a scalar value needs exactly one number");
        return v.numbers[0];
    }

    std::string value(const Value& v) const {
        switch (v.kind) {
            case Value::Kind::scalar:
                if (v.type.is_tensor) throw CompileError(where_ + ": a scalar value has tensor type");
                if (v.type.dtype == DType::string) return "string(" + quoted(v.text) + ")";
                return std::string(dtype_name(v.type.dtype)) + "(" + number(v.type.dtype, scalar_number(v)) + ")";
            case Value::Kind::list: {
                if (!v.type.is_tensor) throw CompileError(where_ + ": a list value needs a tensor type");
                if (static_cast<int64_t>(v.numbers.size()) != v.type.element_count())
                    throw CompileError(where_ + ": " + std::to_string(v.numbers.size()) + " values for " +
                                       v.type.str());
                std::string s = type(v.type) + "([";
                for (size_t i = 0; i < v.numbers.size(); ++i) {
                    if (i) s += ",";
                    s += number(v.type.dtype, v.numbers[i]);
                }
                return s + "])";
            }
            case Value::Kind::blob:
                if (!v.type.is_tensor) throw CompileError(where_ + ": a BLOBFILE value needs a tensor type");
                return type(v.type) + "(BLOBFILE(path=string(" + quoted(v.blob_path) + "), offset=uint64(" +
                       std::to_string(v.blob_offset) + ")))";
        }
        return {};
    }
};

}  // namespace

std::string emit(const Program& program) { return Emitter().text(program); }

}  // namespace orion::mil
