#include "runtime/budget.h"

#include "hardware_limits.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "errors.h"

namespace orion::runtime {

namespace {
std::atomic<int> g_compiles{0};

int read_budget() {
    const char* env = std::getenv("ORION_COMPILE_BUDGET");
    if (!env || !*env) return limits::DEFAULT_COMPILE_BUDGET;
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end != '\0' || v < 0 || v > 1000000000L)
        throw CompileError(std::string("ORION_COMPILE_BUDGET='") + env + "' is not a non-negative integer");
    return static_cast<int>(v);
}
}  // namespace

int compile_budget() {
    static const int budget = read_budget();
    return budget;
}

int compile_count() { return g_compiles.load(); }

void consume_compile() {
    const int limit = compile_budget();
    int used = g_compiles.load();
    do {
        if (used >= limit)
            throw CompileBudgetExhausted(
                std::string(constraints::COMPILE_BUDGET.id) + ": this process has used its compile budget of " +
                std::to_string(limit) +
                " (the ANE fails after ~119 compiles per process). Save state and restart the process "
                "(exec), reuse compiled programs, or update weights with Program.with_weights.");
    } while (!g_compiles.compare_exchange_weak(used, used + 1));
}

}  // namespace orion::runtime
