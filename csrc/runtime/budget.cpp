#include "runtime/budget.h"

#include "hardware_limits.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

#include "errors.h"

namespace orion::runtime {

namespace {
std::atomic<int> g_compiles{0};
std::atomic<bool> g_warned{false};

bool overridden() {
    const char* env = std::getenv("ORION_COMPILE_BUDGET");
    return env && *env;
}

int read_budget() {
    if (!overridden()) return limits::DEFAULT_COMPILE_BUDGET;
    const char* env = std::getenv("ORION_COMPILE_BUDGET");
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end != '\0' || v < 0 || v > 1000000000L)
        throw CompileError(std::string("ORION_COMPILE_BUDGET='") + env + "' is not a non-negative integer");
    return static_cast<int>(v);
}

const BudgetPolicy& policy() {
    static const BudgetPolicy p = budget_policy(compile_budget(), overridden());
    return p;
}
}  // namespace

BudgetPolicy budget_policy(int budget, bool overridden) {
    if (overridden) return {budget, 0};
    return {std::max(0, budget - limits::COMPILE_STOP_MARGIN), std::min(limits::COMPILE_WARN_AT, budget)};
}

int compile_budget() {
    static const int budget = read_budget();
    return budget;
}

int compile_limit() { return policy().limit; }

int compile_count() { return g_compiles.load(); }

void consume_compile() {
    const int limit = compile_limit();
    int used = g_compiles.load();
    do {
        if (used >= limit)
            throw CompileBudgetExhausted(
                std::string(constraints::COMPILE_BUDGET.id) + ": this process has used " + std::to_string(used) +
                " compiles, its limit (" +
                (limit == compile_budget() ? "ORION_COMPILE_BUDGET" : "the ~" + std::to_string(compile_budget()) +
                                                                        "-compile budget less a margin of " +
                                                                        std::to_string(compile_budget() - limit)) +
                "; the ANE fails after ~119 compiles per process). Save state and restart the process "
                "(exec), reuse compiled programs, or update weights with Program.with_weights.");
    } while (!g_compiles.compare_exchange_weak(used, used + 1));
}

std::string take_budget_warning() {
    const BudgetPolicy& p = policy();
    if (p.warn_at <= 0 || compile_count() < p.warn_at || g_warned.exchange(true)) return "";
    return std::string(constraints::COMPILE_BUDGET.id) + ": this process has done " + std::to_string(compile_count()) +
           " compiles; the ANE fails after ~" + std::to_string(compile_budget()) + " and Orion refuses from " +
           std::to_string(p.limit) + ". Plan a restart (exec) or reuse programs (Program.with_weights).";
}

}  // namespace orion::runtime
