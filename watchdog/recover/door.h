// In-process recovery's side of every intercepted call (common/in_process_recovery.h): probation
// taken and held operations queued on the application's thread, streams gated after their
// launch, handles handed out at a creation and resolved on each call. Installed by record/ when
// ncclguard starts with NCCLGUARD_RECOVER=inprocess; never reached otherwise.
#pragma once

#include "watchdog/common/in_process_recovery.h"

namespace ncclguard {

// The process's one implementation; `g_in_process_recovery` points at it once installed.
InProcessRecovery& InProcessDoor() noexcept;

}  // namespace ncclguard
