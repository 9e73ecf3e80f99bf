// What every process of a job left in its job directory (dumps and status files), read and merged
// per process: the classifier's input, in the watchdog at a stall and in `ncclguard analyze`.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "watchdog/common/files.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {

// Everything known about one process of the job: its newest dump (with the flight recorder) and
// its status file, merged; `snapshot.comms[i].ring` holds the whole ring when a dump was found,
// else only the oldest unfinished operation (status files carry just that).
struct ProcessView {
  std::string host;
  int pid = -1;
  std::string status_file;        // "" when none
  std::string dump_file;          // the newest dump, "" when none
  std::string dump_reason;        // its reason
  std::int64_t last_seen_ns = 0;  // the newest time of its status or dump (epoch ns)
  // Whether the process exists now: checked with kill(pid, 0) when it ran on this host; unknown
  // on other hosts (then the status file's age decides).
  enum class Liveness { kAlive, kGone, kUnknown };
  Liveness liveness = Liveness::kUnknown;
  bool exited = false;  // it wrote a final status or dump on its way out (a normal exit)
  // Communicator initialisations that returned an error: a failure is dumped (reason
  // error_return) before the call returns, so the dump shows the initialisation pending; one that
  // is neither pending since nor a communicator of the process failed. Not in pending_inits.
  std::vector<PendingInitSnapshot> failed_inits;
  ProcessSnapshot snapshot;
  ProcessFacts facts;  // from the dump, else the status file (no memory figures)
};

struct JobView {
  std::string directory;
  std::int64_t now_ns = 0;             // when it was read (epoch ns)
  double status_interval_seconds = 2;  // a status older than 3 intervals is stale
  std::vector<ProcessView> processes;
  std::vector<std::string> problems;  // files that could not be read, and why
};

// Whose job directory is read. kNamedByUser (`ncclguard analyze`): a relative path or a symbolic
// link is followed and the directory may belong to another user. kOwn (the watchdog): it must be
// a real directory of this user, as for writing. Either way, its files are read with ReadFileAt's
// rules (files.h).
enum class JobDirectoryOrigin { kNamedByUser, kOwn };

// Reads every dump and status file of a job directory, within `deadline` as a whole (files not
// reached in time become problems). Never throws; unreadable files become problems.
absl::StatusOr<JobView> ReadJobDirectory(const std::string& directory, std::int64_t now_ns,
                                         double status_interval_seconds,
                                         JobDirectoryOrigin origin = JobDirectoryOrigin::kNamedByUser,
                                         std::chrono::milliseconds deadline = kReadDeadline) noexcept;

}  // namespace ncclguard
