// The ideal machine: a disk and a network card that are always ready and cost nothing.
// ghostfs runs on it without --profile (the read path is the same code, nothing is
// injected), and tests use it when they need a machine but no power model.
//
// Thread-safety: a plain function.
#ifndef GHOST_COMMON_POWER_IDEAL_MACHINE_H_
#define GHOST_COMMON_POWER_IDEAL_MACHINE_H_

#include "common/power/profile.h"

namespace ghost {

MachineProfile IdealMachineProfile();

}  // namespace ghost

#endif  // GHOST_COMMON_POWER_IDEAL_MACHINE_H_
