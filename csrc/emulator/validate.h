// The ANE's MIL-level rules (FACTS sections 4 and 7), checked before anything is compiled.
#pragma once

#include "mil/program.h"
#include "runtime/program.h"

namespace orion::emu {

// Throws ConstraintError naming the rule, the statement and the fix. Under Profile::permissive
// the op and form bans are lifted; structural rules (dead returns) always hold.
void check_hardware_rules(const mil::Function& fn, runtime::Profile profile);

}  // namespace orion::emu
