// Snapshot state names to enums and back (op_states.h).
#include "watchdog/diagnose/op_states.h"

#include <optional>

#include "watchdog/report/snapshot.h"
#include "watchdog/state/records.h"

namespace ncclguard {

std::optional<OpState> StateOf(const OpSnapshot& op) {
  for (auto state = static_cast<int>(OpState::kFree); state <= static_cast<int>(OpState::kUntimed); ++state) {
    if (op.state == OpStateName(static_cast<OpState>(state))) return static_cast<OpState>(state);
  }
  return std::nullopt;
}

void SetState(OpSnapshot& op, OpState state) { op.state = OpStateName(state); }

bool Unfinished(const OpSnapshot& op) {
  const std::optional<OpState> state = StateOf(op);
  return state && (*state == OpState::kEnqueued || *state == OpState::kStarted);
}

std::optional<CommLifecycle> LifecycleOf(const CommSnapshot& comm) {
  for (auto lifecycle = static_cast<int>(CommLifecycle::kInitializing);
       lifecycle <= static_cast<int>(CommLifecycle::kDestroyed); ++lifecycle) {
    if (comm.state == CommLifecycleName(static_cast<CommLifecycle>(lifecycle))) {
      return static_cast<CommLifecycle>(lifecycle);
    }
  }
  return std::nullopt;
}

}  // namespace ncclguard
