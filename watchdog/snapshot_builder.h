#pragma once

#include <optional>
#include <string>

#include "watchdog/progress.h"
#include "watchdog/registry.h"
#include "watchdog/snapshot.h"

namespace ncclguard {

// Copies the registry's communicators (with their rings when `with_rings`) into a snapshot. Steady
// clock times are converted to wall clock with the offset between the two `now`s. Safe on any
// thread: it reads atomics only.
ProcessSnapshot BuildSnapshot(Registry& registry, const std::string& reason, bool with_rings,
                              std::int64_t steady_now_ns, std::int64_t wall_now_ns);

// One communicator as BuildSnapshot copies it; `sign`: with the signatures of its latest
// operations (status files). A closed communicator whose ring was freed shows its `closed_status`.
CommSnapshot SnapshotOfCommunicator(const CommState& comm, bool with_rings, bool sign, std::int64_t to_wall);

StallSnapshot ToSnapshot(const Stall& stall, const std::string& message);

}  // namespace ncclguard
