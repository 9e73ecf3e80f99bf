// The classifier: from what every process of a job left in its job directory (dumps and status
// files), which rank is at fault and why, in one sentence each. The same code runs in the
// watchdog at the moment of a stall and offline in `ncclguard analyze`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "watchdog/diagnose/job_view.h"
#include "watchdog/diagnose/known_bad.h"

namespace ncclguard {

// The kinds of verdict, most important first: Classify lists its verdicts in this order. Named
// only at the edges (JSON, log lines, the P2P record) by VerdictKindName.
enum class VerdictKind {
  kAsyncError,
  kP2pSuspect,
  kStuckInInit,
  kRankDead,
  kMismatch,
  kRankNotJoined,
  kLinkStalled,
  kStuckInsideNccl,
  kFailedCall,
  kUnexplained,
  kStraggler,
  kSlowLink,
  kSlowRank,
  kHealthy,
  kUnknown,
};

// "async_error", "p2p_suspect", ..., as docs/verdicts.md names them.
std::string_view VerdictKindName(VerdictKind kind);
// The kind of that name; nothing for a name that is none.
std::optional<VerdictKind> ParseVerdictKind(std::string_view name);

struct Verdict {
  VerdictKind kind = VerdictKind::kUnknown;
  std::string comm;         // communicator id, "" for job-wide verdicts
  std::uint64_t seq = 0;    // the operation #N concerned, 0 when none
  std::vector<int> ranks;   // the ranks the verdict is about (the culprits)
  std::string message;      // one sentence a user can act on
  nlohmann::json evidence;  // what the verdict rests on (per-rank facts, texts, ...)
  // rank_not_joined: every rank that did not join is alive and busy outside NCCL, or stopped, so it
  // will come back (a checkpoint save, an evaluation; a debugger that lets it go). Not in the JSON:
  // its late_ranks evidence says so.
  bool late_ranks_busy_outside_nccl = false;
};

// How the whole job ended, when every process of it is gone, none exited normally or closed its
// communicators first (ProcessView::closed_nccl), and their last
// records (status files, dumps) end within about one status interval of each other: they were
// killed from outside all at once (a launcher's or scheduler's time limit, a signal to the whole
// job), and no rank vanished while its peers lived. Classify then judges every process as it was
// at that end; the JSON document and `ncclguard analyze` state it beside the verdicts. It is no
// verdict: it names no culprit, and says nothing about what went wrong before.
struct JobEnd {
  int processes = 0;
  double within_seconds = 0;         // from the oldest last record to the newest
  std::int64_t ended_ns = 0;         // the newest last record (epoch ns): when the job ended
  bool killed_from_outside = false;  // two or more processes: one alone may as well have crashed
  std::string message;
};
std::optional<JobEnd> EndedTogether(const JobView& job);

// Verdicts, most important first; a single "healthy" verdict when nothing is wrong (never when a
// process recorded a stall, an error or a failed call), a single "unknown" one when the job
// directory held nothing readable. A rank's facts that match one of `known_bad` are evidence for
// p2p_suspect (the watchdog and `ncclguard analyze` pass ProcessKnownBad().entries).
// Sets job.ended_together_ns (EndedTogether), and nothing else of `job`.
std::vector<Verdict> Classify(JobView& job, const std::vector<KnownBadEntry>& known_bad);

// Only the fail-slow verdicts (slow_link, slow_rank) of a job that runs: what the watchdog that
// judges the job's pace looks for at every interval, at the cost of reading statuses only.
std::vector<Verdict> ClassifyFailSlow(const JobView& job);

// {"verdicts": [{"kind", "comm", "seq", "ranks", "message", "evidence"}...], "job_end", "directory",
//  "time", "processes", "problems"} — documented in docs/verdicts.md.
nlohmann::json VerdictsToJson(const JobView& job, const std::vector<Verdict>& verdicts);

}  // namespace ncclguard
