// The MIL emitter: writes a Program in the exact conventions of docs/hardware.md §4. Portable C++17
// (no Objective-C) so that Linux builds compile it as C++.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>

#include "errors.h"
#include "mil/number_text.h"
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

// Shortest round-tripping decimal (mil/number_text.h: not std::to_chars, which Apple's libc++ lacks
// before macOS 13.3); fixed notation for 1e-5 <= |v| < 1e16 (so epsilons read as `0.00001`, as in
// docs/hardware.md §4), scientific outside; always with a '.' or an exponent.
std::string float_literal(double v) {
    const double magnitude = std::fabs(v);
    std::string s = format_shortest(v, magnitude == 0 || (magnitude >= 1e-5 && magnitude < 1e16));
    if (s.find_first_of(".e") == std::string::npos) s += ".0";
    return s;
}

std::string integer_literal(double v) {
    char buf[32];
    char* end = v < 0 ? std::to_chars(buf, buf + sizeof buf, static_cast<int64_t>(v)).ptr
                      : std::to_chars(buf, buf + sizeof buf, static_cast<uint64_t>(v)).ptr;
    return std::string(buf, end);
}

// `[buildInfo = dict<string, string>({{"k", "v"}, ...})]`
std::string build_info_block(const BuildInfo& info) {
    std::string out = "[buildInfo = dict<string, string>({";
    for (size_t i = 0; i < info.size(); ++i) {
        if (i) out += ", ";
        out += "{" + quoted(info[i].first) + ", " + quoted(info[i].second) + "}";
    }
    return out + "})]";
}

// Skips spaces and `//` comments from `at`; returns the first other position.
size_t skip_blank(std::string_view text, size_t at) {
    while (at < text.size()) {
        if (text[at] == ' ' || text[at] == '\t' || text[at] == '\n' || text[at] == '\r') {
            ++at;
        } else if (text.compare(at, 2, "//") == 0) {
            const size_t eol = text.find('\n', at);
            at = eol == std::string_view::npos ? text.size() : eol;
        } else {
            break;
        }
    }
    return at;
}

class Emitter {
   public:
    std::string text(const Program& program) {
        if (!is_version_number(program.version))
            throw CompileError("program version '" + program.version + "' is not a number like 1.3");
        out_ = "program(" + program.version + ")\n" + build_info_block(program.build_info) + "\n{\n";
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
        // attributes in alphabetical order, name among them, as coremltools writes them
        std::vector<std::pair<std::string, std::string>> attributes = {{"name", "string(" + quoted(op.name) + ")"}};
        if (op.val) attributes.emplace_back("val", value(*op.val));
        for (const auto& [key, v] : op.attributes) attributes.emplace_back(identifier(key), value(v));
        if (!op.attributes.empty())
            std::sort(attributes.begin(), attributes.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        out_ += ")[";
        for (size_t i = 0; i < attributes.size(); ++i) out_ += (i ? ", " : "") + attributes[i].first + "=" + attributes[i].second;
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
            throw CompileError(where_ + ": " + format_general(v) + " is not a valid " + dtype_name(dtype) + " literal");
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

std::string with_build_info(std::string_view text) {
    size_t at = skip_blank(text, 0);
    if (text.compare(at, 7, "program") != 0) return std::string(text);  // the parser names what is wrong
    at = skip_blank(text, at + 7);
    if (at >= text.size() || text[at] != '(') return std::string(text);
    const size_t close = text.find(')', at);
    if (close == std::string_view::npos) return std::string(text);
    const size_t next = skip_blank(text, close + 1);
    if (next < text.size() && text[next] == '[') return std::string(text);  // has its attributes
    std::string out(text.substr(0, close + 1));
    out += " " + build_info_block(default_build_info());  // on the program line: error lines stay the caller's
    out.append(text.substr(close + 1));
    return out;
}

}  // namespace orion::mil
