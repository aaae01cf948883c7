#include "emulator/profile.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

namespace orion::emu::profile {

namespace {

std::atomic<bool>& flag() {
    static std::atomic<bool> on = [] {
        const char* v = std::getenv("ORION_PROFILE");
        return v && *v && std::strcmp(v, "0") != 0;
    }();
    return on;
}

struct Registry {
    std::mutex mutex;
    std::map<std::pair<std::string, std::string>, Row> rows;
};

Registry& registry() {
    static Registry r;
    return r;
}

bool one_of(const std::string& op, std::initializer_list<const char*> names) {
    for (const char* n : names)
        if (op == n) return true;
    return false;
}

double elements(const mil::Type& t) { return t.is_tensor ? static_cast<double>(t.element_count()) : 1.0; }

// The product of all but the last two dimensions (a matmul's batch).
double batch(const mil::Type& t) {
    double n = 1;
    for (size_t i = 0; i + 2 < t.shape.size(); ++i) n *= static_cast<double>(t.shape[i]);
    return n;
}

}  // namespace

Cost op_cost(const mil::Operation& op, const Operands& operands, const mil::Type& result) {
    Cost c;
    auto find = [&](const char* name) -> const mil::Type* {
        for (const auto& [arg, type] : operands)
            if (arg == name) return type;
        return nullptr;
    };
    for (const auto& operand : operands) c.bytes += static_cast<double>(operand.second->byte_size());
    c.bytes += static_cast<double>(result.byte_size());
    const double out = elements(result);
    const mil::Type *x = find("x"), *y = find("y"), *weight = find("weight"), *query = find("query"), *key = find("key");
    if (op.op == "matmul" && x && y) {
        // Per batch, x holds M*K and y K*N elements and the result M*N: K follows, transposed or not.
        const double mk = elements(*x) / batch(*x), kn = elements(*y) / batch(*y), mn = out / batch(result);
        c.flops = 2.0 * out * std::sqrt(mk * kn / mn);
    } else if (op.op == "conv" && weight) {  // weight [Cout, Cin/groups, kH, kW]
        double taps = 1;
        for (size_t i = 1; i < weight->shape.size(); ++i) taps *= static_cast<double>(weight->shape[i]);
        c.flops = 2.0 * out * taps;
    } else if (op.op == "scaled_dot_product_attention" && query && key && query->shape.size() >= 2) {
        const size_t r = query->shape.size();
        const double e = static_cast<double>(query->shape[r - 1]), s = static_cast<double>(key->shape[r - 2]);
        c.flops = 2.0 * (elements(*query) / e) * s * e + 2.0 * out * s;  // scores, then probabilities x value
    } else if (!one_of(op.op, {"reshape", "transpose", "slice_by_size", "slice_by_index", "concat", "cast", "pad",
                               "tile", "split", "squeeze", "expand_dims", "gather", "identity"})) {
        c.flops = out;
    }
    return c;
}

bool enabled() { return flag().load(std::memory_order_relaxed); }
void set_enabled(bool on) { flag().store(on, std::memory_order_relaxed); }

void record(const std::vector<Row>& rows) {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    for (const Row& row : rows) {
        Row& into = r.rows[{row.program, row.op}];
        if (into.op.empty()) into.program = row.program, into.op = row.op;
        into.calls += row.calls;
        into.seconds += row.seconds;
        into.bytes += row.bytes;
        into.flops += row.flops;
    }
}

std::vector<Row> snapshot() {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    std::vector<Row> out;
    for (const auto& [key, row] : r.rows) out.push_back(row);
    return out;
}

void reset() {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.rows.clear();
}

}  // namespace orion::emu::profile
