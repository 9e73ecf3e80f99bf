// The classifier: from what every process of a job left in its job directory (dumps and status
// files), which rank is at fault and why, in one sentence each. The same code runs in the
// watchdog at the moment of a stall and offline in `ncclguard analyze`.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "watchdog/report/dump.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {

// Everything known about one process of the job: its newest dump (with the flight recorder) and
// its status file, merged; `snapshot.comms[i].ring` holds the whole ring when a dump was found,
// else only the oldest unfinished operation (status files carry just that).
struct ProcessView {
  std::string host;
  int pid = -1;
  std::string status_file;       // "" when none
  std::string dump_file;         // the newest dump, "" when none
  std::string dump_reason;       // its reason
  std::int64_t last_seen_ns = 0; // the newest time of its status or dump (epoch ns)
  // Whether the process exists now: checked with kill(pid, 0) when it ran on this host; unknown
  // on other hosts (then the status file's age decides).
  enum class Liveness { kAlive, kGone, kUnknown };
  Liveness liveness = Liveness::kUnknown;
  bool exited = false;           // it wrote a final status or dump on its way out (a normal exit)
  ProcessSnapshot snapshot;
  ProcessFacts facts;            // from the dump, else the status file (no memory figures)
};

struct JobView {
  std::string directory;
  std::int64_t now_ns = 0;             // when it was read (epoch ns)
  double status_interval_seconds = 2;  // a status older than 3 intervals is stale
  std::vector<ProcessView> processes;
  std::vector<std::string> problems;   // files that could not be read, and why
};

// Whose job directory is read. kNamedByUser (`ncclguard analyze`): a relative path or a symbolic
// link is followed and the directory may belong to another user. kOwn (the watchdog): it must be
// a real directory of this user, as for writing. Either way, its files are read with ReadFileAt's
// rules (dump.h).
enum class JobDirectoryOrigin { kNamedByUser, kOwn };

// Reads every dump and status file of a job directory, within `deadline` as a whole (files not
// reached in time become problems). Never throws; unreadable files become problems.
absl::StatusOr<JobView> ReadJobDirectory(const std::string& directory, std::int64_t now_ns,
                                         double status_interval_seconds,
                                         JobDirectoryOrigin origin = JobDirectoryOrigin::kNamedByUser,
                                         std::chrono::milliseconds deadline = kReadDeadline) noexcept;

struct Verdict {
  // Exactly one of: rank_not_joined, rank_dead, stuck_inside_nccl, stuck_in_init, mismatch,
  // async_error, p2p_suspect, failed_call, unexplained, straggler, healthy, unknown.
  std::string kind;
  std::string comm;             // communicator id, "" for job-wide verdicts
  std::uint64_t seq = 0;        // the operation #N concerned, 0 when none
  std::vector<int> ranks;       // the ranks the verdict is about (the culprits)
  std::string message;          // one sentence a user can act on
  nlohmann::json evidence;      // what the verdict rests on (per-rank facts, texts, ...)
};

// Verdicts, most important first; a single "healthy" verdict when nothing is wrong (never when a
// process recorded a stall, an error or a failed call), a single "unknown" one when the job
// directory held nothing readable.
std::vector<Verdict> Classify(const JobView& job);

// {"verdicts": [{"kind", "comm", "seq", "ranks", "message", "evidence"}...], "directory", "time",
//  "processes", "problems"} — documented in docs/verdicts.md.
nlohmann::json VerdictsToJson(const JobView& job, const std::vector<Verdict>& verdicts);

// Whether NCCLGUARD_TIMEOUT is enough to act on a stall with these verdicts: true for
// stuck_inside_nccl, p2p_suspect, stuck_in_init, rank_dead and unknown (the timeout alone then
// decides, as without a job directory); false while the first verdict is a
// rank_not_joined whose late ranks are alive and busy outside NCCL (then the watchdog warns
// periodically and acts only after NCCLGUARD_HARD_TIMEOUT).
bool ActOnTimeout(const std::vector<Verdict>& verdicts);

}  // namespace ncclguard
