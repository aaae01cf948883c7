#include "frontend/types.h"

#include <algorithm>

#include "errors.h"
#include "frontend/frontend.h"

namespace orion::frontend {

namespace {

// The rule of `op`, or nullptr when no family defines one.
TypeRule find_type_rule(const std::string& op) {
    static const mil::NameIndex<TypeRule> rules{elementwise_types, tensor_types, linear_types, reduction_types,
                                                quantization_types};
    return rules.find(op);
}

}  // namespace

void TypeContext::fail(const std::string& message) const { throw CompileError(where(op_) + ": " + message); }

Operand TypeContext::single(const char* arg) const {
    const mil::Argument* a = op_.arg(arg);
    if (!a) fail(std::string("missing required argument '") + arg + "'");
    if (a->kind == mil::Argument::Kind::tuple) fail(std::string("argument '") + arg + "' must be a single value, not a tuple");
    if (a->kind == mil::Argument::Kind::literal) return Operand{&a->literal.type, &a->literal};  // permissive profile only
    return named(a->refs[0]);
}

std::vector<mil::Type> TypeContext::tuple_types(const char* arg) const {
    const mil::Argument* a = op_.arg(arg);
    if (!a || a->kind != mil::Argument::Kind::tuple) fail(std::string("argument '") + arg + "' must be a tuple like (a, b)");
    std::vector<mil::Type> types;
    for (const auto& r : a->refs) types.push_back(*named(r).type);
    return types;
}

Operand TypeContext::constant(const char* arg) const {
    const Operand v = single(arg);
    if (!v.constant) fail(std::string("argument '") + arg + "' must be a const() value");
    return v;
}

int64_t TypeContext::count(const char* arg) const {
    const Operand v = constant(arg);
    if (v.constant->kind == mil::Value::Kind::blob) return v.type->element_count();  // the front end checked its size
    return static_cast<int64_t>(v.constant->numbers.size());
}

std::vector<int64_t> TypeContext::ints(const char* arg) const {
    const Operand v = constant(arg);
    if (v.constant->kind == mil::Value::Kind::blob || v.type->dtype == mil::DType::string || mil::is_float(v.type->dtype))
        fail(std::string("argument '") + arg + "' must be an integer const, got " + v.type->str());
    std::vector<int64_t> out;
    for (double d : v.constant->numbers) out.push_back(static_cast<int64_t>(d));
    return out;
}

int64_t TypeContext::int_scalar(const char* arg) const {
    auto v = ints(arg);
    if (v.size() != 1) fail(std::string("argument '") + arg + "' must be a single integer");
    return v[0];
}

double TypeContext::number(const char* arg) const {
    const Operand v = constant(arg);
    if (v.constant->kind == mil::Value::Kind::blob || v.constant->numbers.size() != 1)
        fail(std::string("argument '") + arg + "' must be a scalar const");
    return v.constant->numbers[0];
}

bool TypeContext::boolean(const char* arg) const {
    const Operand v = constant(arg);
    if (v.type->dtype != mil::DType::boolean || v.constant->numbers.size() != 1)
        fail(std::string("argument '") + arg + "' must be a bool const, got " + v.type->str());
    return v.constant->numbers[0] != 0.0;
}

std::string TypeContext::text(const char* arg) const {
    const Operand v = constant(arg);
    if (v.type->dtype != mil::DType::string) fail(std::string("argument '") + arg + "' must be a string const");
    return v.constant->text;
}

Shape broadcast_shapes(const TypeContext& ctx, const Shape& a, const Shape& b) {
    const size_t rank = std::max(a.size(), b.size());
    Shape out(rank);
    for (size_t i = 0; i < rank; ++i) {
        const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
        const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
        if (da != db && da != 1 && db != 1)
            ctx.fail("shapes " + mil::shape_str(a) + " and " + mil::shape_str(b) + " do not broadcast (dimension " +
                     std::to_string(i) + ": " + std::to_string(da) + " vs " + std::to_string(db) + ")");
        out[i] = da == 1 ? db : da;
    }
    return out;
}

int64_t normalize_axis(const TypeContext& ctx, int64_t axis, int64_t rank) {
    const int64_t a = axis < 0 ? axis + rank : axis;
    if (a < 0 || a >= rank)
        ctx.fail("axis " + std::to_string(axis) + " is out of range for a rank-" + std::to_string(rank) + " tensor");
    return a;
}

bool has_type_rule(const std::string& op) { return find_type_rule(op) != nullptr; }

std::vector<TypedOp> check_types(const mil::Function& fn) {
    std::unordered_map<std::string, Operand> names;
    for (const auto& p : fn.inputs) names[p.name] = Operand{&p.type, nullptr};
    std::vector<TypedOp> typed;
    typed.reserve(fn.body.size());
    for (const auto& op : fn.body) {
        if (op.op == "const") {
            names[op.output] = Operand{&op.type, &*op.val};
            typed.push_back(TypedOp{op.type, {}});
            continue;
        }
        const TypeRule rule = find_type_rule(op.op);
        if (!rule) throw CompileError(where(op) + ": the front end has no type rule for '" + op.op + "'");
        TypedOp t = rule(TypeContext(op, names));
        if (t.type != op.type)
            throw CompileError(where(op) + " declares " + op.type.str() + " but its inputs give " + t.type.str());
        names[op.output] = Operand{&op.type, nullptr};
        typed.push_back(std::move(t));
    }
    return typed;
}

}  // namespace orion::frontend
