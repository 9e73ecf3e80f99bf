// Errors: asynchronous NCCL errors (async_error), calls that returned an error to the application
// (failed_call), and what a process recorded that no other verdict explains (unexplained).
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
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

namespace {

// One communicator's initialisation that failed on some ranks (`comm` "" when only the processes'
// dumps say that something failed before they had a communicator).
struct FailedInit {
  std::string comm;
  std::string api;
  int nranks = 0;
  std::vector<const ProcessView*> processes;
  std::vector<int> ranks;
  std::set<std::string> results;  // the errors the ranks' calls returned, where their dumps say
};

// "every rank's ncclCommInitRank for communicator 00000000000000aa (4 ranks) failed", ...
std::string WhoFailed(const FailedInit& init, bool every_rank) {
  if (init.comm.empty()) {
    return every_rank ? fmt::format("every rank's initialisation failed ({})", Ranks(init.ranks))
                      : fmt::format("the initialisation of {} failed", Ranks(init.ranks));
  }
  const std::string what = fmt::format("{} for communicator {} ({} ranks)", init.api, init.comm, init.nranks);
  return every_rank ? fmt::format("every rank's {} failed ({})", what, Ranks(init.ranks))
                    : fmt::format("{} failed on {}", what, Ranks(init.ranks));
}

// NCCL's warnings, each with the ranks that last saw it: NCCL's own reason.
std::string WhyFailed(const FailedInit& init) {
  std::vector<std::pair<std::string, std::vector<int>>> warnings;  // in order of their first rank
  for (size_t i = 0; i < init.processes.size(); ++i) {
    const std::string& warning = init.processes[i]->snapshot.last_nccl_warning;
    auto known = std::find_if(warnings.begin(), warnings.end(),
                              [&](const auto& seen) { return seen.first == warning; });
    if (known == warnings.end()) {
      warnings.emplace_back(warning, std::vector<int>{init.ranks[i]});
    } else {
      known->second.push_back(init.ranks[i]);
    }
  }
  if (warnings.size() == 1) {
    return warnings.front().first.empty() ? std::string("NCCL gave no warning text")
                                          : fmt::format("NCCL's warning: \"{}\"", warnings.front().first);
  }
  std::vector<std::string> clauses;
  clauses.reserve(warnings.size());
  for (const auto& [warning, by] : warnings) {
    clauses.push_back(
        fmt::format("{}: {}", Ranks(by),
                    warning.empty() ? std::string("no warning text") : fmt::format("\"{}\"", warning)));
  }
  return fmt::format("NCCL's warnings: {}", JoinClauses(clauses));
}

// The job's size as its launcher gave it (torchrun, Slurm, Open MPI, PMI, Paddle), 0 when unknown.
int WorldSize(const ProcessView& process) {
  for (const auto& [name, value] : process.facts.launcher) {
    if (name != "WORLD_SIZE" && name != "SLURM_NTASKS" && name != "OMPI_COMM_WORLD_SIZE" &&
        name != "PMI_SIZE" && name != "PADDLE_TRAINERS_NUM") {
      continue;
    }
    int size = 0;
    if (absl::SimpleAtoi(value, &size) && size > 0) return size;
  }
  return 0;
}

}  // namespace

// Initialisations that returned an error (ProcessView::failed_inits), by communicator; and, from
// dumps of builds that did not name them, processes that dumped for a failed call before they had
// any communicator. The error's name is in the pending initialisation's `result`; NCCL's own
// warning says why.
void ClassifyFailedInits(const JobView& job, Buckets& buckets) {
  std::vector<FailedInit> inits;
  auto add = [&](const std::string& comm, const std::string& api, int nranks, const ProcessView& process,
                 int rank, const std::string& result) {
    auto found =
        std::find_if(inits.begin(), inits.end(), [&](const FailedInit& init) { return init.comm == comm; });
    if (found == inits.end()) {
      inits.push_back(
          FailedInit{.comm = comm, .api = api, .nranks = 0, .processes = {}, .ranks = {}, .results = {}});
      found = std::prev(inits.end());
    }
    found->nranks = std::max(found->nranks, nranks);
    found->processes.push_back(&process);
    found->ranks.push_back(rank);
    if (!result.empty()) found->results.insert(result);
  };
  for (const ProcessView& process : job.processes) {
    for (const PendingInitSnapshot& init : process.failed_inits)
      add(init.comm_id, init.api, init.nranks, process, init.rank, init.result);
    const ProcessSnapshot& snapshot = process.snapshot;
    if (process.failed_inits.empty() && process.dump_reason == "error_return" && snapshot.comms.empty() &&
        snapshot.pending_inits.empty()) {
      add("", "", WorldSize(process), process, snapshot.rank, "");
    }
  }
  for (const FailedInit& init : inits) {
    const bool every_rank = init.nranks > 0 ? static_cast<int>(init.ranks.size()) >= init.nranks
                                            : init.ranks.size() == job.processes.size() &&
                                                  init.ranks.size() > 1 && !job.not_read.SomeProcessMissing();
    Json per_rank = Json::array();
    for (size_t i = 0; i < init.processes.size(); ++i) {
      per_rank.push_back(Json{{"rank", init.ranks[i]},
                              {"host", init.processes[i]->host},
                              {"pid", init.processes[i]->pid},
                              {"last_nccl_warning", init.processes[i]->snapshot.last_nccl_warning},
                              {"dump_file", init.processes[i]->dump_file}});
    }
    // Dumps of earlier builds do not name the error: then each rank's log line does.
    const std::string error =
        init.results.empty()
            ? std::string("the error (its name is in each rank's log line, not in the job directory)")
            : absl::StrJoin(init.results, " / ");
    Add(buckets, kFailedCall, init.comm, 0, init.ranks,
        fmt::format("{}{}; {} — NCCL refused the initialisation and the application got {}",
                    WhoFailed(init, every_rank),
                    init.comm.empty()
                        ? fmt::format(": an NCCL call returned an error before {} had a communicator",
                                      init.ranks.size() == 1 ? "it" : "any of them")
                        : "",
                    WhyFailed(init), error),
        Json{{"api", init.api},
             {"results", init.results},
             {"nranks", init.nranks},
             {"every_rank", every_rank},
             {"inits", std::move(per_rank)}});
  }
}

// A stall or an error that a process recorded and that no verdict above explains is still named:
// a job in which anything went wrong is never healthy.
void ClassifyUnexplained(const JobView& job, Buckets& buckets) {
  std::set<std::string> explained_comms;
  // An unknown verdict on a communicator describes its stall: what it lacks is in files not read.
  for (const VerdictKind kind : {kAsyncError, kP2pSuspect, kStuckInInit, kRankDead, kMismatch, kRankNotJoined,
                                 kLinkStalled, kStuckInsideNccl, kFailedCall, kUnknown}) {
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
