// The per-process compile budget. The ANE fails (silently, or by destabilising the process) after
// about 119 compiles in one process (docs/hardware.md §1); both backends count every compile here and
// refuse loudly once the budget is spent. ORION_COMPILE_BUDGET overrides the limit (tests).
#pragma once

namespace orion::runtime {

int compile_budget();  // the limit in force
int compile_count();   // compiles done in this process
// Counts one compile; throws CompileBudgetExhausted when none is left.
void consume_compile();

}  // namespace orion::runtime
