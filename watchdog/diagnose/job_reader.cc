// The classifier's view of a job: how what the job reader (report/job_read.h) read is merged per
// process (a status newer than the dump brings its progress forward, the initialisations a failed
// call left set apart), and the reads of a job directory and a board with it.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "watchdog/diagnose/job_view.h"
#include "watchdog/diagnose/op_states.h"
#include "watchdog/report/job_board.h"
#include "watchdog/report/job_read.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/state/records.h"

namespace ncclguard {
namespace {

// The status file is newer than the dump: its progress counters and oldest unfinished operation
// update the dump's communicators (the ring stays the dump's, with states brought forward).
void MergeNewerStatus(ProcessSnapshot& snapshot, const ProcessSnapshot& status) {
  snapshot.time_ns = status.time_ns;
  snapshot.in_nccl_call = status.in_nccl_call;
  snapshot.stall = status.stall;
  snapshot.pending_inits = status.pending_inits;
  snapshot.exiting = snapshot.exiting || status.exiting;
  if (snapshot.rank < 0) snapshot.rank = status.rank;
  for (const CommSnapshot& fresh : status.comms) {
    auto comm = std::find_if(snapshot.comms.begin(), snapshot.comms.end(),
                             [&](const CommSnapshot& known) { return known.id == fresh.id; });
    if (comm == snapshot.comms.end()) {
      snapshot.comms.push_back(fresh);
      continue;
    }
    comm->state = fresh.state;
    comm->last_enqueued = fresh.last_enqueued;
    comm->last_started = fresh.last_started;
    comm->last_completed = fresh.last_completed;
    comm->async_error = fresh.async_error;
    comm->signatures_first_seq = fresh.signatures_first_seq;
    comm->signatures = fresh.signatures;
    for (OpSnapshot& op : comm->ring) {
      if (Unfinished(op) && op.seq <= fresh.last_completed) SetState(op, OpState::kCompleted);
      if (StateOf(op) == OpState::kEnqueued && op.seq <= fresh.last_started) SetState(op, OpState::kStarted);
    }
    for (const OpSnapshot& oldest : fresh.ring) {
      auto known = std::find_if(comm->ring.begin(), comm->ring.end(),
                                [&](const OpSnapshot& op) { return op.seq == oldest.seq; });
      if (known != comm->ring.end()) {
        known->state = oldest.state;
        known->start_ns = oldest.start_ns;
      } else if (comm->ring.empty() || comm->ring.back().seq < oldest.seq) {
        comm->ring.push_back(oldest);
      }
    }
  }
}

// The initialisations that a dump taken for a failed call shows pending, that are not pending
// in the process's newest record and made no communicator of it: the call that failed was theirs.
void SeparateFailedInits(ProcessView& view, const ProcessSnapshot& dump) {
  if (view.dump_reason != "error_return") return;
  std::vector<PendingInitSnapshot>& pending = view.snapshot.pending_inits;
  const bool status_newer = view.snapshot.time_ns > dump.time_ns;
  for (const PendingInitSnapshot& init : dump.pending_inits) {
    const bool made = std::any_of(view.snapshot.comms.begin(), view.snapshot.comms.end(),
                                  [&](const CommSnapshot& comm) { return comm.id == init.comm_id; });
    const auto still = std::find_if(pending.begin(), pending.end(), [&](const PendingInitSnapshot& other) {
      return other.comm_id == init.comm_id && other.rank == init.rank && other.start_ns == init.start_ns;
    });
    if (made) continue;
    // Pending in a newer status too: still waiting, whatever failed.
    if (still != pending.end() && status_newer) continue;
    view.failed_inits.push_back(init);
    if (still != pending.end()) pending.erase(still);
  }
}

constexpr ViewBuilding kViewBuilding{.merge_newer_status = MergeNewerStatus,
                                     .separate_failed_inits = SeparateFailedInits};

}  // namespace

absl::StatusOr<JobView> ReadJobDirectory(const std::string& directory, std::int64_t now_ns,
                                         double status_interval_seconds, JobDirectoryOrigin origin,
                                         const JobReadLimits& limits) noexcept {
  try {
    return ReadJobFiles(directory, directory, nullptr, now_ns, status_interval_seconds, origin, limits,
                        kViewBuilding);
  } catch (...) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot read ", directory));
  }
}

absl::StatusOr<JobView> ReadJob(const std::shared_ptr<JobBoard>& board, std::int64_t now_ns,
                                double status_interval_seconds, JobDirectoryOrigin origin,
                                const JobReadLimits& limits) noexcept {
  try {
    const bool files = board->StatusesAreFiles();
    return ReadJobFiles(files ? board->Directory() : board->Where(), board->Directory(),
                        files ? nullptr : board, now_ns, status_interval_seconds, origin, limits,
                        kViewBuilding);
  } catch (...) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot read ", board->Where()));
  }
}

absl::StatusOr<JobView> ReadJobDirectory(const std::string& directory, std::int64_t now_ns,
                                         double status_interval_seconds, JobDirectoryOrigin origin,
                                         std::chrono::milliseconds deadline) noexcept {
  JobReadLimits limits;
  limits.deadline = deadline;
  return ReadJobDirectory(directory, now_ns, status_interval_seconds, origin, limits);
}

}  // namespace ncclguard
