// The ANE's MIL-level rules (docs/hardware.md §4, §7), checked before anything is compiled.
#pragma once

#include "mil/program.h"
#include "runtime/program.h"

namespace orion::frontend {

// Throws ConstraintError naming the rule, the statement and the fix. Banned ops (op table) are
// refused, and disputed ones unless options.relaxed_ops names them. Under Profile::permissive the
// op and form bans are lifted; structural rules (dead returns) always hold.
void check_hardware_rules(const mil::Function& fn, const runtime::CompileOptions& options);

}  // namespace orion::frontend
