// Errors: asynchronous NCCL errors (async_error), calls that returned an error to the application
// (failed_call), and what a process recorded that no other verdict explains (unexplained).
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "watchdog/common/describe.h"
#include "watchdog/diagnose/job_view.h"
#include "watchdog/diagnose/known_bad.h"
#include "watchdog/diagnose/op_states.h"
#include "watchdog/diagnose/rules.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/state/records.h"

namespace ncclguard::classifier {
namespace {

// A stall the process got over after it was recorded (a dump keeps the stall it was taken for).
bool StallResolved(const StallSnapshot& stall, const ProcessSnapshot& snapshot) {
  if (stall.kind == "init") {
    return std::none_of(snapshot.pending_inits.begin(), snapshot.pending_inits.end(),
                        [&](const PendingInitSnapshot& init) { return init.comm_id == stall.comm_id; });
  }
  return std::any_of(snapshot.comms.begin(), snapshot.comms.end(), [&](const CommSnapshot& comm) {
    return comm.id == stall.comm_id && comm.last_completed >= stall.seq;
  });
}

std::string DescribeStall(const StallSnapshot& stall) {
  if (stall.kind == "init") return fmt::format("an initialisation of communicator {}", stall.comm_id);
  return fmt::format("#{} on communicator {} ({}, {})", stall.seq, stall.comm_id,
                     stall.kind == "not_started" ? "not started on the GPU" : "not completed",
                     Seconds(stall.seconds));
}

}  // namespace

void ClassifyAsyncErrors(const Communicator& communicator, const std::vector<KnownBadEntry>& known_bad,
                         Buckets& buckets) {
  std::vector<const Member*> reporting;
  for (const Member& member : communicator.members) {
    if (!member.comm->async_error.empty()) reporting.push_back(&member);
  }
  if (reporting.empty()) return;
  const Member* first = reporting.front();
  const auto with_warning = std::find_if(reporting.begin(), reporting.end(), [](const Member* member) {
    return !member->process->snapshot.last_nccl_warning.empty();
  });
  std::string message = fmt::format("{} reported an asynchronous NCCL error on communicator {}: {}",
                                    Ranks(RanksOf(reporting)), communicator.id, first->comm->async_error);
  if (with_warning != reporting.end()) {
    message += fmt::format("; {}NCCL's last warning: \"{}\"",
                           reporting.size() > 1 ? fmt::format("rank {}'s ", (*with_warning)->rank) : "",
                           (*with_warning)->process->snapshot.last_nccl_warning);
  }
  Json per_rank = Json::array();
  for (const Member* member : reporting) {
    per_rank.push_back(Json{{"rank", member->rank},
                            {"host", member->process->host},
                            {"pid", member->process->pid},
                            {"async_error", member->comm->async_error},
                            {"last_nccl_warning", member->process->snapshot.last_nccl_warning}});
  }
  const std::uint64_t seq = OldestUnfinished(*first->comm).value_or(0);
  Add(buckets, kAsyncError, communicator.id, seq, RanksOf(reporting), std::move(message),
      Json{{"ranks", std::move(per_rank)}});
  AddP2pSuspectIfAny(buckets, communicator, known_bad, seq, RanksOf(reporting), "asynchronous NCCL error");
}

void ClassifyFailedCalls(const Communicator& communicator, Buckets& buckets) {
  std::vector<int> ranks;
  std::vector<std::string> clauses;
  Json calls = Json::array();
  for (const Member& member : communicator.members) {
    const auto& ring = member.comm->ring;
    const auto failed = std::find_if(ring.begin(), ring.end(),
                                     [](const OpSnapshot& op) { return StateOf(op) == OpState::kFailed; });
    if (failed == ring.end()) continue;
    const std::string result(ResultName(static_cast<ncclResult_t>(failed->result)));
    ranks.push_back(member.rank);
    clauses.push_back(
        fmt::format("rank {}'s {} returned {}", member.rank, DescribeOp(&*failed, failed->seq), result));
    Json call = OpJson(*failed);
    call["rank"] = member.rank;
    call["result"] = result;
    calls.push_back(std::move(call));
  }
  if (ranks.empty()) return;
  const std::uint64_t first_seq = calls[0]["seq"].get<std::uint64_t>();
  Add(buckets, kFailedCall, communicator.id, first_seq, ranks,
      fmt::format("{} on communicator {}: NCCL refused or failed the call, and the application got the error",
                  JoinClauses(clauses), communicator.id),
      Json{{"calls", std::move(calls)}});
}

// A stall or an error that a process recorded and that no verdict above explains is still named:
// a job in which anything went wrong is never healthy.
void ClassifyUnexplained(const JobView& job, Buckets& buckets) {
  std::set<std::string> explained_comms;
  for (const VerdictKind kind : {kAsyncError, kP2pSuspect, kStuckInInit, kRankDead, kMismatch, kRankNotJoined,
                                 kStuckInsideNccl, kFailedCall}) {
    for (const Verdict& verdict : buckets[kind]) explained_comms.insert(verdict.comm);
  }
  const bool errors_explained = !buckets[kAsyncError].empty() || !buckets[kFailedCall].empty();
  for (const ProcessView& process : job.processes) {
    std::string what;
    const auto& stall = process.snapshot.stall;
    if (stall && !explained_comms.contains(stall->comm_id) && !StallResolved(*stall, process.snapshot)) {
      what = fmt::format("reported a stall of {}", DescribeStall(*stall));
    } else if (!errors_explained &&
               (process.dump_reason == "async_error" || process.dump_reason == "error_return")) {
      what = process.dump_reason == "async_error" ? "dumped after an asynchronous NCCL error"
                                                  : "dumped after an NCCL call returned an error";
    } else {
      continue;
    }
    Add(buckets, kUnexplained, stall ? stall->comm_id : "", stall ? stall->seq : 0, {process.snapshot.rank},
        fmt::format("rank {} (pid {} on host {}) {}, and the records in the job directory do not show why{}",
                    process.snapshot.rank, process.pid, process.host, what,
                    process.dump_file.empty() ? "" : fmt::format(" (its dump: {})", process.dump_file)),
        Json{{"rank", process.snapshot.rank},
             {"host", process.host},
             {"pid", process.pid},
             {"dump_reason", process.dump_reason},
             {"stall", stall ? Json{{"kind", stall->kind},
                                    {"comm_id", stall->comm_id},
                                    {"seq", stall->seq},
                                    {"seconds", stall->seconds}}
                             : Json(nullptr)}});
  }
}

}  // namespace ncclguard::classifier
