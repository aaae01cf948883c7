// The MIL text parser: a lexer and a recursive-descent parser for the dialect of docs/hardware.md §4,
// with the variations seen in the wild (free whitespace, `//` comments, hex floats, optional
// buildInfo). Every error is a ParseError at the offending token.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "errors.h"
#include "hardware_limits.h"
#include "mil/number_text.h"
#include "mil/text.h"

namespace orion::mil {

namespace {

struct Token {
    enum class Kind { identifier, number, string, punct, arrow, end };
    Kind kind;
    // Identifier / number spelling, punctuation character: a view of the MIL text. A string's decoded value:
    // a view of the text between its quotes, or of the lexer's copy when it has escapes.
    std::string_view text;
    int line, column;
};

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_hex_digit(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
bool is_word_char(char c) { return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

// A character as it may appear in a message (messages must stay ASCII).
std::string printable(char c) {
    auto u = static_cast<unsigned char>(c);
    if (u > 0x20 && u < 0x7f) return std::string("'") + c + "'";
    static const char* hex = "0123456789ABCDEF";
    return std::string("byte 0x") + hex[u >> 4] + hex[u & 0xf];
}

// Strict UTF-8 (no overlong forms, no surrogates), as Python decodes it.
bool valid_utf8(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        auto c = static_cast<unsigned char>(s[i]);
        size_t continuation = 0;
        unsigned char lo = 0x80, hi = 0xBF;  // range of the first continuation byte
        if (c < 0x80) {
            ++i;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            continuation = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            continuation = 2;
            lo = c == 0xE0 ? 0xA0 : 0x80;
            hi = c == 0xED ? 0x9F : 0xBF;
        } else if (c >= 0xF0 && c <= 0xF4) {
            continuation = 3;
            lo = c == 0xF0 ? 0x90 : 0x80;
            hi = c == 0xF4 ? 0x8F : 0xBF;
        } else {
            return false;
        }
        if (continuation >= s.size() - i) return false;
        for (size_t k = 1; k <= continuation; ++k) {
            auto b = static_cast<unsigned char>(s[i + k]);
            if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return false;
        }
        i += continuation + 1;
    }
    return true;
}

class Lexer {
   public:
    // `decoded` keeps the strings with escapes, which tokens view (a deque: its strings never move).
    Lexer(std::string_view text, std::deque<std::string>& decoded) : text_(text), decoded_(decoded) {}

    std::vector<Token> tokens() {
        std::vector<Token> out;
        for (;;) {
            skip_space_and_comments();
            if (pos_ >= text_.size()) {
                out.push_back({Token::Kind::end, "", line_, column()});
                return out;
            }
            out.push_back(next());
        }
    }

   private:
    std::string_view text_;
    std::deque<std::string>& decoded_;
    size_t pos_ = 0;
    int line_ = 1;
    size_t line_start_ = 0;

    int column() const { return static_cast<int>(pos_ - line_start_) + 1; }
    char at(size_t i) const { return i < text_.size() ? text_[i] : '\0'; }

    void advance() {
        if (text_[pos_] == '\n') ++line_, line_start_ = pos_ + 1;
        ++pos_;
    }

    void skip_space_and_comments() {
        while (pos_ < text_.size()) {
            char c = text_[pos_];
            if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
                advance();
            } else if (c == '/' && at(pos_ + 1) == '/') {
                while (pos_ < text_.size() && text_[pos_] != '\n') advance();
            } else {
                return;
            }
        }
    }

    Token next() {
        Token t{Token::Kind::punct, "", line_, column()};
        char c = text_[pos_];
        size_t start = pos_;
        if (is_word_char(c) && !is_digit(c)) {
            while (pos_ < text_.size() && is_word_char(text_[pos_])) advance();
            t.kind = Token::Kind::identifier;
        } else if (c == '-' && at(pos_ + 1) == '>') {
            advance(), advance();
            t.kind = Token::Kind::arrow;
        } else if (c == '"') {
            t.kind = Token::Kind::string;
            t.text = string_literal(t);
            return t;
        } else if (starts_number()) {
            number();
            t.kind = Token::Kind::number;
        } else if (std::string_view("()[]{}<>,=;").find(c) != std::string_view::npos) {
            advance();
        } else {
            throw ParseError("unexpected character " + printable(c), t.line, t.column);
        }
        t.text = text_.substr(start, pos_ - start);
        return t;
    }

    bool starts_number() const {
        size_t i = pos_ + ((text_[pos_] == '-' || text_[pos_] == '+') ? 1 : 0);
        return is_digit(at(i)) || (at(i) == '.' && is_digit(at(i + 1)));
    }

    void digits(bool hex) {
        while (pos_ < text_.size() && (hex ? is_hex_digit(text_[pos_]) : is_digit(text_[pos_]))) advance();
    }

    // `-3`, `0.00001`, `.5`, `1e-5`, `0x1p-3`, `-0x1.8p+1`; the value is converted by the parser.
    void number() {
        if (text_[pos_] == '-' || text_[pos_] == '+') advance();
        bool hex = text_[pos_] == '0' && (at(pos_ + 1) == 'x' || at(pos_ + 1) == 'X') && is_hex_digit(at(pos_ + 2));
        if (hex) advance(), advance();
        digits(hex);
        if (at(pos_) == '.') advance(), digits(hex);
        char exponent = hex ? 'p' : 'e';
        size_t sign = (at(pos_ + 1) == '-' || at(pos_ + 1) == '+') ? 1 : 0;
        if ((at(pos_) | 0x20) == exponent && is_digit(at(pos_ + 1 + sign))) {
            advance();
            if (sign) advance();
            digits(false);
        }
    }

    std::string_view string_literal(const Token& t) {
        advance();  // opening quote
        const size_t begin = pos_;
        while (pos_ < text_.size() && text_[pos_] != '"' && text_[pos_] != '\\' && text_[pos_] != '\n') ++pos_;
        if (pos_ < text_.size() && text_[pos_] == '"') {  // no escapes: the text itself
            const std::string_view out = text_.substr(begin, pos_ - begin);
            advance();  // closing quote
            if (!valid_utf8(out)) throw ParseError("string is not valid UTF-8", t.line, t.column);
            return out;
        }
        std::string out(text_.substr(begin, pos_ - begin));
        for (;;) {
            if (pos_ >= text_.size() || text_[pos_] == '\n')
                throw ParseError("unterminated string", t.line, t.column);
            char c = text_[pos_];
            if (c == '"') break;
            if (c != '\\') {
                out += c;
                advance();
                continue;
            }
            int escape_column = column();
            advance();
            char e = at(pos_);
            if (e == 'x' && is_hex_digit(at(pos_ + 1)) && is_hex_digit(at(pos_ + 2))) {
                out += static_cast<char>(std::stoi(std::string(text_.substr(pos_ + 1, 2)), nullptr, 16));
                advance(), advance();
            } else if (e == 'n' || e == 't' || e == 'r' || e == '"' || e == '\\') {
                out += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
            } else {
                throw ParseError("unknown escape sequence in string", line_, escape_column);
            }
            advance();
        }
        advance();  // closing quote
        if (!valid_utf8(out)) throw ParseError("string is not valid UTF-8", t.line, t.column);
        return decoded_.emplace_back(std::move(out));
    }
};

class Parser {
   public:
    explicit Parser(std::string_view text) : tokens_(Lexer(text, decoded_).tokens()) {}

    Program program() {
        Program p;
        keyword("program", "at the start of the program");
        expect('(', "after 'program'");
        const Token& version = take(Token::Kind::number, "a version number like 1.3");
        p.version = version.text;
        if (!is_version_number(p.version)) fail("a version number like 1.3", version);
        expect(')', "after the program version");
        if (peek_punct('[')) p.build_info = build_info();
        expect('{', "to open the program body");
        while (peek().kind == Token::Kind::identifier && peek().text == "func") p.functions.push_back(function());
        expect('}', "to close the program body (or 'func')");
        if (peek().kind != Token::Kind::end) fail("end of input after the program", peek());
        return p;
    }

   private:
    using Names = std::unordered_set<std::string_view>;  // views of the text or of decoded_
    std::deque<std::string> decoded_;  // before tokens_, which view it
    std::vector<Token> tokens_;
    size_t pos_ = 0;

    const Token& peek(size_t ahead = 0) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
    const Token& advance() {
        const Token& t = tokens_[pos_];
        if (pos_ + 1 < tokens_.size()) ++pos_;
        return t;
    }

    static std::string describe(const Token& t) {
        switch (t.kind) {
            case Token::Kind::end: return "end of input";
            case Token::Kind::string: return "a string";
            case Token::Kind::arrow: return "'->'";
            default: return "'" + std::string(t.text) + "'";
        }
    }

    [[noreturn]] static void fail(const std::string& expected, const Token& found) {
        throw ParseError("expected " + expected + ", found " + describe(found), found.line, found.column);
    }
    [[noreturn]] static void error(const std::string& what, const Token& at) {
        throw ParseError(what, at.line, at.column);
    }

    bool peek_punct(char p, size_t ahead = 0) const {
        const Token& t = peek(ahead);
        return t.kind == Token::Kind::punct && t.text[0] == p;  // a punct token is one character
    }
    void expect(char p, const char* context) {
        if (!peek_punct(p)) fail(std::string("'") + p + "' " + context, peek());
        advance();
    }
    bool accept(char p) {
        if (!peek_punct(p)) return false;
        advance();
        return true;
    }
    const Token& take(Token::Kind kind, const char* expected) {
        if (peek().kind != kind) fail(expected, peek());
        return advance();
    }
    const Token& keyword(const char* word, const char* context) {
        if (peek().kind != Token::Kind::identifier || peek().text != word)
            fail(std::string("'") + word + "' " + context, peek());
        return advance();
    }
    std::string identifier(const char* expected) { return std::string(take(Token::Kind::identifier, expected).text); }

    // `[buildInfo = dict<string, string>({{"k", "v"}, ...})]`
    BuildInfo build_info() {
        advance();
        keyword("buildInfo", "in the program attributes");
        expect('=', "after 'buildInfo'");
        keyword("dict", "as the buildInfo value");
        expect('<', "after 'dict'");
        keyword("string", "as the dict key type");
        expect(',', "between the dict key and value types");
        keyword("string", "as the dict value type");
        expect('>', "after the dict value type");
        expect('(', "before the dict entries");
        expect('{', "to open the dict entries");
        BuildInfo info;
        if (!peek_punct('}')) {
            do {
                expect('{', "to open a dict entry");
                std::string key(take(Token::Kind::string, "a string key").text);
                expect(',', "between dict key and value");
                info.emplace_back(std::move(key), take(Token::Kind::string, "a string value").text);
                expect('}', "to close a dict entry");
            } while (accept(','));
        }
        expect('}', "to close the dict entries");
        expect(')', "after the dict entries");
        expect(']', "to close the program attributes");
        return info;
    }

    Function function() {
        Function f;
        advance();  // func
        f.name = identifier("a function name");
        expect('<', "before the function opset");
        f.opset = identifier("an opset name like ios18");
        expect('>', "after the function opset");
        expect('(', "before the function inputs");
        Names variables, op_names;
        if (!peek_punct(')')) {
            do {
                Type type = parse_type();
                const Token& name = take(Token::Kind::identifier, "an input name");
                if (!variables.insert(name.text).second)
                    error("duplicate variable name '" + std::string(name.text) + "'", name);
                f.inputs.push_back({std::string(name.text), type});
            } while (accept(','));
        }
        expect(')', "after the function inputs");
        expect('{', "to open the function body");
        while (!peek_punct('}')) {
            if (f.body.size() == limits::MAX_OPS)
                error("function '" + f.name + "' has more than MAX_OPS (" + std::to_string(limits::MAX_OPS) +
                          ") statements: split the program",
                      peek());
            f.body.push_back(statement(variables, op_names));
        }
        advance();
        take(Token::Kind::arrow, "'->' after the function body");
        expect('(', "before the returned names");
        if (!peek_punct(')')) {
            do f.outputs.push_back(identifier("a returned variable name"));
            while (accept(','));
        }
        expect(')', "after the returned names");
        expect(';', "after the return tuple");
        return f;
    }

    // Rank and element count within orion::limits (dims are already <= MAX_DIM).
    void check_shape_limits(const std::vector<int64_t>& shape, const Token& at) {
        if (shape.size() > limits::MAX_RANK)
            error("a rank-" + std::to_string(shape.size()) + " shape is over MAX_RANK (" + std::to_string(limits::MAX_RANK) +
                      "): merge dimensions",
                  at);
        int64_t count = 1;
        for (int64_t d : shape) {
            if (d == 0) return;
            if (count > limits::MAX_ELEMENTS / d)
                error("a shape of more than MAX_ELEMENTS (" + std::to_string(limits::MAX_ELEMENTS) +
                          ") elements: split the tensor",
                      at);
            count *= d;
        }
    }

    bool peek_type() const {
        const Token& t = peek();
        return t.kind == Token::Kind::identifier && (t.text == "tensor" || dtype_from_name(t.text));
    }

    DType parse_dtype() {
        const Token& t = take(Token::Kind::identifier, "a dtype");
        auto d = dtype_from_name(t.text);
        if (!d) error("unknown dtype '" + std::string(t.text) + "'", t);
        return *d;
    }

    // `fp16` or `tensor<fp16, [1, 768, 1, 32]>`
    Type parse_type() {
        if (peek().kind != Token::Kind::identifier || peek().text != "tensor") {
            if (peek().kind != Token::Kind::identifier) fail("a type", peek());
            return Type::scalar(parse_dtype());
        }
        advance();
        expect('<', "after 'tensor'");
        DType dtype = parse_dtype();
        expect(',', "after the tensor dtype");
        expect('[', "to open the tensor shape");
        std::vector<int64_t> shape;
        const Token& open = peek();
        if (!peek_punct(']')) {
            do {
                const Token& dim = peek();
                int64_t d = 0;
                auto [end, ec] = std::from_chars(dim.text.data(), dim.text.data() + dim.text.size(), d);
                if (dim.kind != Token::Kind::number || ec != std::errc() || end != dim.text.data() + dim.text.size() ||
                    d < 0)
                    fail("a non-negative integer dimension", dim);
                if (d > limits::MAX_DIM)
                    error("dimension " + std::string(dim.text) + " is over MAX_DIM (" +
                              std::to_string(limits::MAX_DIM) + ")",
                          dim);
                shape.push_back(d);
                advance();
            } while (accept(','));
        }
        check_shape_limits(shape, open);
        expect(']', "to close the tensor shape");
        expect('>', "after the tensor shape");
        return Type::tensor(dtype, std::move(shape));
    }

    // `TYPE var = op(args)[name=string("..."), val=VALUE];`
    Operation statement(Names& variables, Names& op_names) {
        Operation op;
        const Token& start = peek();
        op.loc = {start.line, start.column};
        if (!peek_type()) {
            if (start.kind == Token::Kind::identifier && peek(1).kind == Token::Kind::identifier)
                error("unknown dtype '" + std::string(start.text) + "'", start);
            fail("a statement (a type) or '}'", start);
        }
        op.type = parse_type();
        const Token& var = take(Token::Kind::identifier, "a variable name");
        if (!variables.insert(var.text).second) error("duplicate variable name '" + std::string(var.text) + "'", var);
        op.output = var.text;
        expect('=', "after the variable name");
        op.op = identifier("an op name");
        expect('(', "after the op name");
        if (!peek_punct(')')) {
            do op.args.push_back(argument());
            while (accept(','));
        }
        expect(')', "after argument list");
        const Token& attributes = peek();
        expect('[', "before the op attributes");
        bool has_name = false;
        do {
            const Token& key = take(Token::Kind::identifier, "an attribute name");
            expect('=', "after the attribute name");
            if (key.text == "name" && !has_name) {
                keyword("string", "as the type of name=");
                expect('(', "after 'string'");
                const Token& name = take(Token::Kind::string, "a quoted op name");
                if (!op_names.insert(name.text).second)
                    error("duplicate op name \"" + std::string(name.text) + "\"", name);
                op.name = name.text;
                expect(')', "after the op name");
                has_name = true;
            } else if (key.text == "val" && !op.val) {
                const Token& at = peek();
                op.val = value();
                if (op.op == "const" && op.val->type != op.type)
                    error("const '" + op.output + "' is declared " + op.type.str() + " but its value is " +
                              op.val->type.str(),
                          at);
            } else if (is_constexpr_op(op.op) && key.text != "name" && key.text != "val" &&
                       std::none_of(op.attributes.begin(), op.attributes.end(),
                                    [&](const auto& a) { return a.first == key.text; })) {
                op.attributes.emplace_back(key.text, value());  // a compile-time constant op's parameter
            } else {
                error("unexpected or repeated attribute '" + std::string(key.text) + "'" +
                          (key.text != "name" && key.text != "val" && !is_constexpr_op(op.op)
                               ? " (only constexpr_* ops take parameters as attributes; pass it as an argument)"
                               : ""),
                      key);
            }
        } while (accept(','));
        expect(']', "after the op attributes");
        if (!has_name) error("op '" + op.output + "' has no name= attribute", attributes);
        if (op.op == "const" && !op.val) error("const '" + op.output + "' has no val= attribute", attributes);
        expect(';', "after the statement");
        return op;
    }

    bool peek_literal() const {
        const Token& t = peek();
        if (t.kind != Token::Kind::identifier) return false;
        if (t.text == "true" || t.text == "false") return true;
        return (t.text == "tensor" && peek_punct('<', 1)) || (dtype_from_name(t.text) && peek_punct('(', 1));
    }

    // `x=ref`, `values=(a, b)` or an inline literal `transpose_x=false`, `y=fp16(2.0)`
    Argument argument() {
        std::string name = identifier("an argument name");
        expect('=', "after the argument name");
        if (accept('(')) {
            std::vector<std::string> refs;
            if (!peek_punct(')')) {
                do refs.push_back(identifier("a variable name in the tuple"));
                while (accept(','));
            }
            expect(')', "to close the tuple");
            return Argument::tuple(std::move(name), std::move(refs));
        }
        if (peek_literal()) {
            if (peek().text == "true" || peek().text == "false")
                return Argument::inline_literal(std::move(name), Value::number(DType::boolean, advance().text == "true"));
            return Argument::inline_literal(std::move(name), value());
        }
        return Argument::reference(std::move(name), identifier("a variable name, a tuple or a literal"));
    }

    // A number literal of `dtype` (`true`/`false` for bool).
    double number(DType dtype) {
        const Token& t = peek();
        double v = 0;
        if (dtype == DType::boolean) {
            if (t.kind != Token::Kind::identifier || (t.text != "true" && t.text != "false")) fail("true or false", t);
            v = t.text == "true";
        } else {
            if (t.kind != Token::Kind::number) fail(std::string("a ") + dtype_name(dtype) + " number", t);
            v = to_double(t);
            bool fractional = t.text.find_first_of(is_hex(t.text) ? ".pP" : ".eE") != std::string::npos;
            if (!is_valid_number(dtype, v) || (!is_float(dtype) && fractional))
                error(std::string(t.text) + " is not a valid " + dtype_name(dtype) + " literal", t);
        }
        advance();
        return v;
    }

    static bool is_hex(std::string_view number) {
        if (number[0] == '-' || number[0] == '+') number.remove_prefix(1);
        return number.size() > 1 && number[0] == '0' && (number[1] == 'x' || number[1] == 'X');
    }

    static double to_double(const Token& t) {
        std::string_view s = t.text;
        bool negative = s[0] == '-', hex = is_hex(s);
        if (s[0] == '-' || s[0] == '+') s.remove_prefix(1);
        if (hex) s.remove_prefix(2);
        const std::optional<double> v = parse_double(s, hex);  // not std::from_chars: see number_text.h
        if (!v) error("number " + std::string(t.text) + " is out of range", t);
        return negative ? -*v : *v;
    }

    // `fp16(0.5)`, `string("x")`, `tensor<int32, [2]>([0,1])`, `tensor<..>(BLOBFILE(...))`
    Value value() {
        if (!peek_type()) fail("a value like fp16(1.0) or tensor<...>(...)", peek());
        Type type = parse_type();
        expect('(', "after the value type");
        Value v;
        if (!type.is_tensor) {
            v = type.dtype == DType::string
                    ? Value::string(std::string(take(Token::Kind::string, "a quoted string").text))
                    : Value::number(type.dtype, number(type.dtype));
        } else if (peek().kind == Token::Kind::identifier && peek().text == "BLOBFILE") {
            v = blobfile(type);
        } else {
            const Token& at = peek();
            if (type.dtype == DType::string) error("string tensors cannot be literals", at);
            std::vector<double> numbers;
            if (accept('[')) {
                if (!peek_punct(']')) {
                    do numbers.push_back(number(type.dtype));
                    while (accept(','));
                }
                expect(']', "to close the value list");
            } else if (type.shape.empty()) {
                numbers.push_back(number(type.dtype));
            } else {
                fail("'[' to open the value list", at);
            }
            if (!element_count_is(type, numbers.size()))
                error(std::to_string(numbers.size()) + " values for " + type.str(), at);
            v = Value::list(type, std::move(numbers));
        }
        expect(')', "after the value");
        return v;
    }

    static bool element_count_is(const Type& type, size_t n) {
        for (int64_t d : type.shape)
            if (d == 0) return n == 0;
        uint64_t count = 1;
        for (int64_t d : type.shape) {
            count *= static_cast<uint64_t>(d);  // dims are < 2^31: stop before it can overflow
            if (count > n) return false;
        }
        return count == n;
    }

    // `BLOBFILE(path=string("@model_path/weights/wq.bin"), offset=uint64(64))`
    Value blobfile(const Type& type) {
        advance();
        expect('(', "after 'BLOBFILE'");
        keyword("path", "as the first BLOBFILE argument");
        expect('=', "after 'path'");
        keyword("string", "as the type of path=");
        expect('(', "after 'string'");
        std::string path(take(Token::Kind::string, "a quoted path").text);
        expect(')', "after the path");
        expect(',', "between path= and offset=");
        keyword("offset", "as the second BLOBFILE argument");
        expect('=', "after 'offset'");
        keyword("uint64", "as the type of offset=");
        expect('(', "after 'uint64'");
        const Token& t = peek();
        uint64_t offset = 0;
        auto [end, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), offset);
        if (t.kind != Token::Kind::number || ec != std::errc() || end != t.text.data() + t.text.size())
            fail("an unsigned integer offset", t);
        advance();
        expect(')', "after the offset");
        expect(')', "to close BLOBFILE(...)");
        return Value::blob(type, std::move(path), offset);
    }
};

}  // namespace

Program parse(std::string_view text) {
    if (text.size() > limits::MAX_MIL_TEXT_BYTES)
        throw CompileError("the MIL text is " + std::to_string(text.size()) + " bytes, over MAX_MIL_TEXT_BYTES (" +
                           std::to_string(limits::MAX_MIL_TEXT_BYTES) + "): split the program");
    return Parser(text).program();
}

}  // namespace orion::mil
