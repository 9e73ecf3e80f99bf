// How far each communicator's operations have got on the GPU, and when that is a stall. Pure
// functions of the recorded state, the events and the time given: the tests drive them with a
// fake clock and fake events.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "watchdog/report/snapshot.h"
#include "watchdog/state/gpu_events.h"
#include "watchdog/state/records.h"
#include "watchdog/state/registry.h"

namespace ncclguard {

struct Stall {
  enum class Kind { kNotCompleted, kNotStarted, kInit };
  Kind kind = Kind::kNotCompleted;
  std::string comm_id;
  int rank = -1;
  int nranks = 0;
  std::uint64_t seq = 0;  // 0 for kInit
  Api api = Api::ncclAllReduce;
  int datatype = -1;
  std::uint64_t count = 0;
  int reduction = -1;
  int root_or_peer = -1;
  double seconds = 0;
  // The operation was unfinished before this process last resumed from a stop (or starvation):
  // `seconds` counts only from then.
  bool since_resumed = false;
};

std::string_view StallKindName(Stall::Kind kind);  // "not_completed", "not_started", "init"

// Asks the GPU about the communicator's unfinished operations and records what it reached. Only
// the oldest unfinished operation of each stream is asked about: work on a stream completes in
// order. Called on the watchdog thread only.
void AdvanceOperations(CommState& comm, GpuEvents& events, std::int64_t now_ns);

// Whether a watchdog round that begins at `now_ns`, due at `due_ns`, comes much later than
// scheduled: the process was stopped (SIGSTOP, a debugger, a cgroup freezer, a paused VM) or
// starved, and for all it knows its GPU work and its peers were too. "Much": more than two poll
// intervals and more than a quarter of the timeout, or than a second. The scheduler's ordinary
// delays on a busy machine are far below that; a stop is not.
bool LateRound(std::int64_t due_ns, std::int64_t now_ns, std::int64_t poll_interval_ns,
               std::int64_t timeout_ns);

// The communicator's oldest unfinished operation, if it has been unfinished for longer than
// `timeout_ns`: started on the GPU and not completed, or not even started (queued behind earlier
// work on its stream). Captured and untimed operations are never stalls. Time before
// `counted_from_ns` (the last late round: the process did not run) does not count.
std::optional<Stall> FindOperationStall(const CommState& comm, std::int64_t now_ns, std::int64_t timeout_ns,
                                        std::int64_t counted_from_ns = 0);

std::optional<Stall> FindInitStall(const PendingInit& init, std::int64_t now_ns, std::int64_t timeout_ns,
                                   std::int64_t counted_from_ns = 0);

// One line a user can act on, e.g. "rank 2 comm 9f3a…: AllReduce #121 (float32 × 1048576, sum)
// started on the GPU 15.0 s ago and has not completed".
std::string StallMessage(const Stall& stall);

// The stall as status files and dumps carry it.
StallSnapshot ToSnapshot(const Stall& stall, const std::string& message);

}  // namespace ncclguard
