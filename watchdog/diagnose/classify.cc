// The classifier's entry point: every rule over every communicator, verdicts in order of
// importance, judged at the job's end when it was killed as a whole; and whether a stall with
// these verdicts is acted on at NCCLGUARD_TIMEOUT.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "watchdog/common/clock.h"
#include "watchdog/diagnose/known_bad.h"
#include "watchdog/diagnose/rules.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/job_read.h"

namespace ncclguard {
namespace {

using classifier::Buckets;
using classifier::Communicator;
using classifier::Json;

// Nothing to judge: no process left a file that could be read (in time).
Verdict Unknown(const JobView& job) {
  std::string message = "the job directory holds no readable status file or dump";
  if (job.not_read.files > 0 || job.not_read.listing_cut_short) {
    message = fmt::format("no status file or dump of the job directory was read: {} files were not read ({})",
                          job.not_read.files, job.not_read.why);
  } else if (!job.problems.empty()) {
    message += fmt::format(
        " ({} could not be read; first: {})",
        job.problems.size() == 1 ? std::string("1 file") : fmt::format("{} files", job.problems.size()),
        job.problems.front());
  } else {
    message += ": no process of the job wrote there, or its files could not be written";
  }
  return Verdict{.kind = VerdictKind::kUnknown,
                 .comm = "",
                 .seq = 0,
                 .ranks = {},
                 .message = std::move(message),
                 .evidence = Json{{"problems", job.problems.size()}}};
}

// A live process rewrites its status every interval, at the watchdog's first poll after it is due
// (NCCLGUARD_POLL_INTERVAL, 0.1 s by default), so processes killed at one moment left their last
// records at most an interval and a poll apart, plus the time a write takes and the time a launcher
// takes to signal each process (milliseconds). A second covers the poll, the write and the
// signalling with room to spare; a rank that crashed while its peers lived on until a timeout
// ended them leaves a gap of the timeout's order (tens of seconds, minutes), far beyond it.
constexpr double kEndedTogetherSlackSeconds = 1;

std::vector<Verdict> ClassifyAsIs(const JobView& job, const std::vector<KnownBadEntry>& known_bad) {
  const std::vector<Communicator> communicators = classifier::GroupByCommunicator(job);
  Buckets buckets;
  for (const Communicator& communicator : communicators) {
    classifier::ClassifyAsyncErrors(communicator, known_bad, buckets);
    classifier::ClassifyFailedCalls(communicator, buckets);
    const std::optional<std::uint64_t> mismatch_seq = classifier::ClassifyMismatch(communicator, buckets);
    classifier::ClassifyStuckOperation(communicator, job, known_bad, mismatch_seq, buckets);
    classifier::ClassifyStraggler(communicator, buckets);
    classifier::ClassifyPace(communicator, buckets);
  }
  classifier::ClassifyStuckInits(job, communicators, buckets);
  classifier::ClassifyFailedInits(job, buckets);
  classifier::ClassifyUnexplained(job, buckets);
  std::vector<Verdict> verdicts = buckets.TakeAll();
  // A job of which some processes were not read may be anything but healthy.
  if (verdicts.empty() && job.not_read.SomeProcessMissing()) {
    verdicts.push_back(Verdict{
        .kind = VerdictKind::kUnknown,
        .comm = "",
        .seq = 0,
        .ranks = {},
        .message = fmt::format("nothing wrong found in the {} processes read, but not every process was read",
                               job.processes.size()),
        .evidence = Json::object()});
  } else if (verdicts.empty()) {
    verdicts.push_back(
        Verdict{.kind = VerdictKind::kHealthy,
                .comm = "",
                .seq = 0,
                .ranks = {},
                .message = fmt::format("nothing wrong found in {} processes", job.processes.size()),
                .evidence = Json::object()});
  }
  if (const std::string part = classifier::PartOfJob(job); !part.empty()) {
    for (Verdict& verdict : verdicts) verdict.message += fmt::format(" [{}]", part);
  }
  return verdicts;
}

}  // namespace

std::optional<JobEnd> EndedTogether(const JobView& job) {
  if (job.processes.empty()) return std::nullopt;
  std::int64_t oldest_ns = job.processes.front().last_seen_ns;
  std::int64_t newest_ns = oldest_ns;
  for (const ProcessView& process : job.processes) {
    if (process.exited || process.closed_nccl || !classifier::GoneWhenRead(process, job) ||
        process.last_seen_ns <= 0)
      return std::nullopt;
    oldest_ns = std::min(oldest_ns, process.last_seen_ns);
    newest_ns = std::max(newest_ns, process.last_seen_ns);
  }
  const double within_seconds = static_cast<double>(newest_ns - oldest_ns) / 1e9;
  if (within_seconds > job.status_interval_seconds + kEndedTogetherSlackSeconds) return std::nullopt;
  JobEnd end{.processes = static_cast<int>(job.processes.size()),
             .within_seconds = within_seconds,
             .ended_ns = newest_ns,
             .killed_from_outside = job.processes.size() > 1,
             .message = ""};
  if (end.killed_from_outside) {
    end.message = fmt::format(
        "all {} processes{} ended within {} of each other (at {}) and none exited normally: the job was "
        "killed "
        "from outside (a launcher's or scheduler's time limit, or a signal to the whole job) after what the "
        "verdicts say, which judge each rank as it was then",
        end.processes, job.not_read.SomeProcessMissing() ? " read" : "", classifier::Seconds(within_seconds),
        IsoTime(newest_ns));
  } else {
    const ProcessView& process = job.processes.front();
    end.message = fmt::format(
        "the job's only process (pid {} on host {}) ended at {} without exiting normally: killed from "
        "outside "
        "or crashed (one process alone cannot tell which); the verdicts judge its ranks as they were then",
        process.pid, process.host, IsoTime(newest_ns));
  }
  return end;
}

std::vector<Verdict> ClassifyFailSlow(const JobView& job) {
  classifier::Buckets buckets;
  for (const classifier::Communicator& communicator : classifier::GroupByCommunicator(job))
    classifier::ClassifyPace(communicator, buckets);
  return buckets.TakeAll();
}

std::vector<Verdict> Classify(JobView& job, const std::vector<KnownBadEntry>& known_bad) {
  if (job.processes.empty()) return {Unknown(job)};
  // Nobody vanished while its peers lived: judged as gone, every late rank would look dead. Said in
  // the view, not by a copy of it: a job's worth of processes is hundreds of megabytes.
  const std::optional<JobEnd> end = EndedTogether(job);
  job.ended_together_ns = end ? std::optional(end->ended_ns) : std::nullopt;
  return ClassifyAsIs(job, known_bad);
}

}  // namespace ncclguard
