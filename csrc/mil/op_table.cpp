#include "mil/op_table.h"

#include <map>

namespace orion::mil {

namespace {
constexpr const constraints::Constraint* NONE = nullptr;

// A row's constraint as a pointer: a catalog entry, or NONE for an allowed op.
const constraints::Constraint* constraint_ptr(const constraints::Constraint& c) { return &c; }
const constraints::Constraint* constraint_ptr(const constraints::Constraint* c) { return c; }

}  // namespace

const std::vector<OpSpec>& op_table() {
    using namespace constraints;
#define ORION_OP_ROW(name, required, optional, status, constraint, fix) \
    OpSpec{#name, required, optional, OpStatus::status, constraint_ptr(constraint), fix},
    static const std::vector<OpSpec> table = {ORION_OPS(ORION_OP_ROW)};
#undef ORION_OP_ROW
    return table;
}

const OpSpec* find_op_spec(const std::string& name) {
    static const std::map<std::string, const OpSpec*> by_name = [] {
        std::map<std::string, const OpSpec*> m;
        for (const OpSpec& s : op_table()) m[s.name] = &s;
        return m;
    }();
    auto it = by_name.find(name);
    return it == by_name.end() ? nullptr : it->second;
}

const char* op_status_name(OpStatus status) {
    switch (status) {
        case OpStatus::allowed: return "allowed";
        case OpStatus::banned: return "banned";
        case OpStatus::disputed: return "disputed";
    }
    return "";
}

}  // namespace orion::mil
