#pragma once

#include <optional>
#include <string>

#include "watchdog/report/snapshot.h"
#include "watchdog/state/registry.h"

namespace ncclguard {

// Copies the registry's communicators (with their rings when `with_rings`) into a snapshot. Steady
// clock times are converted to wall clock with the offset between the two `now`s. Safe on any
// thread holding the watchdog's status lock (see registry.h): it reads atomics only.
ProcessSnapshot BuildSnapshot(Registry& registry, const std::string& reason, bool with_rings,
                              std::int64_t steady_now_ns, std::int64_t wall_now_ns);

// The operations of a communicator about to lose its ring, all of them, and their signatures: kept
// as its `closed_status` until its state goes (a status interval). Cheap: no library queries, on
// the watchdog thread.
CommSnapshot ClosedStatusOf(const CommState& comm, std::int64_t to_wall);

}  // namespace ncclguard
