// The per-process compile budget. The ANE fails (silently, or by destabilising the process) after
// about 119 compiles in one process (docs/hardware.md §1); both backends count every compile here and
// refuse loudly before the budget is spent. Under the default budget a margin is kept
// (COMPILE_STOP_MARGIN: refused from 115 on, as libane does) and the process is warned once at
// COMPILE_WARN_AT (100) compiles; training restarts itself before either (orion.train.restart).
// ORION_COMPILE_BUDGET overrides the budget: the override is the limit itself, with no margin and
// no warning (tests, and users who measured their machine).
#pragma once

#include <string>

namespace orion::runtime {

int compile_budget();  // the budget in force (119, or ORION_COMPILE_BUDGET)
int compile_limit();   // compiles allowed before refusing: the budget less the margin, or the override
int compile_count();   // compiles done in this process
// Counts one compile; throws CompileBudgetExhausted when none is left.
void consume_compile();
// The warning text, once per process, when the compile count has reached the warning point of the
// default budget; empty otherwise (the bindings raise it as a Python RuntimeWarning).
std::string take_budget_warning();

// The rules above as pure functions (tested directly): the limit and the warning point for a budget.
struct BudgetPolicy {
    int limit;    // refuse the compile that would exceed this count
    int warn_at;  // warn once the count reaches this (0: never)
};
BudgetPolicy budget_policy(int budget, bool overridden);

}  // namespace orion::runtime
