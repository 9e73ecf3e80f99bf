// The classifier's entry point: every rule over every communicator, verdicts in order of
// importance; and whether a stall with these verdicts is acted on at NCCLGUARD_TIMEOUT.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "watchdog/diagnose/job_view.h"
#include "watchdog/diagnose/known_bad.h"
#include "watchdog/diagnose/rules.h"
#include "watchdog/diagnose/verdicts.h"

namespace ncclguard {
namespace {

using classifier::Buckets;
using classifier::Communicator;
using classifier::Json;

// Nothing to judge: no process left a file that could be read.
Verdict Unknown(const JobView& job) {
  std::string message = "the job directory holds no readable status file or dump";
  if (!job.problems.empty()) {
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

}  // namespace

std::vector<Verdict> Classify(const JobView& job, const std::vector<KnownBadEntry>& known_bad) {
  if (job.processes.empty()) return {Unknown(job)};
  const std::vector<Communicator> communicators = classifier::GroupByCommunicator(job);
  Buckets buckets;
  for (const Communicator& communicator : communicators) {
    classifier::ClassifyAsyncErrors(communicator, known_bad, buckets);
    classifier::ClassifyFailedCalls(communicator, buckets);
    const std::optional<std::uint64_t> mismatch_seq = classifier::ClassifyMismatch(communicator, buckets);
    classifier::ClassifyStuckOperation(communicator, job, known_bad, mismatch_seq, buckets);
    classifier::ClassifyStraggler(communicator, buckets);
  }
  classifier::ClassifyStuckInits(job, communicators, buckets);
  classifier::ClassifyUnexplained(job, buckets);
  std::vector<Verdict> verdicts = buckets.TakeAll();
  if (verdicts.empty()) {
    verdicts.push_back(
        Verdict{.kind = VerdictKind::kHealthy,
                .comm = "",
                .seq = 0,
                .ranks = {},
                .message = fmt::format("nothing wrong found in {} processes", job.processes.size()),
                .evidence = Json::object()});
  }
  return verdicts;
}

bool ActOnTimeout(const std::vector<Verdict>& verdicts) {
  // Waiting longer is worth it only while every late rank is alive and will come back.
  return verdicts.empty() || verdicts.front().kind != VerdictKind::kRankNotJoined ||
         !verdicts.front().late_ranks_busy_outside_nccl;
}

}  // namespace ncclguard
