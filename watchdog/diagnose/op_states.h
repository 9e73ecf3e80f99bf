// Operation and communicator states as the classifier compares them. Snapshots carry them as the
// names dumps and status files use (state/records.h: OpStateName, CommLifecycleName); these
// helpers turn the names into the enums at the classifier's edge, and back.
#pragma once

#include <optional>

#include "watchdog/report/snapshot.h"
#include "watchdog/state/records.h"

namespace ncclguard {

// Nothing for a name that no state has (a file of another version): it equals no state.
std::optional<OpState> StateOf(const OpSnapshot& op);
void SetState(OpSnapshot& op, OpState state);
// Enqueued or started: the rank has not completed it.
bool Unfinished(const OpSnapshot& op);

std::optional<CommLifecycle> LifecycleOf(const CommSnapshot& comm);

}  // namespace ncclguard
