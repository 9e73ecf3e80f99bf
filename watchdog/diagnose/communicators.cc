// Communicators as the classifier sees them (every rank that left a record of one), where each
// process is, and how verdict messages describe operations and ranks.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "watchdog/common/ranks.h"
#include "watchdog/diagnose/op_states.h"
#include "watchdog/diagnose/rules.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/fields_json.h"
#include "watchdog/report/job_read.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/report/snapshot_fields.h"

namespace ncclguard::classifier {
namespace {

// "float32 × 1024, sum, root 0", as in the watchdog's stall lines; bytes when only a status file
// described the operation.
std::string OpDetails(const OpSnapshot& op) {
  if (op.dtype.empty()) return op.bytes > 0 ? absl::StrCat(op.bytes, " bytes") : "";
  std::string details = fmt::format("{} × {}", op.dtype, op.count);
  if (!op.reduction.empty()) details += ", " + op.reduction;
  if (IsPointToPoint(op) && op.peer >= 0) details += fmt::format(", peer {}", op.peer);
  if (!IsPointToPoint(op) && op.root >= 0) details += fmt::format(", root {}", op.root);
  return details;
}

// Whether the members number the communicator's operations differently: one #N a collective on
// one rank and a Send or Recv on another, or one collective under different #N.
bool NumbersDiffer(const std::vector<Member>& members) {
  std::unordered_map<std::uint64_t, bool> point_to_point_at;  // by seq
  std::unordered_map<std::uint64_t, std::uint64_t> seq_of;    // by coll_seq
  for (const Member& member : members) {
    for (const OpSnapshot& op : member.comm->ring) {
      const bool point_to_point = IsPointToPoint(op);
      const auto [kind, new_seq] = point_to_point_at.try_emplace(op.seq, point_to_point);
      if (!new_seq && kind->second != point_to_point) return true;
      if (point_to_point || op.coll_seq == 0) continue;
      const auto [seq, new_collective] = seq_of.try_emplace(op.coll_seq, op.seq);
      if (!new_collective && seq->second != op.seq) return true;
    }
  }
  return false;
}

}  // namespace

std::string Ranks(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", FormatRanks(ranks, kRanksInMessages));
}

std::string RanksBriefly(const std::vector<int>& ranks) {
  constexpr RankListStyle kBriefly{.separator = ",", .min_range = 4, .max_parts = 8};
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", FormatRanks(ranks, kBriefly));
}

std::string PartOfJob(const JobView& job) {
  const NotRead& not_read = job.not_read;
  if (not_read.files == 0 && !not_read.listing_cut_short) return "";
  if (!not_read.SomeProcessMissing()) {
    return fmt::format("this rests on every process but not every file: {} {} not read ({})", not_read.files,
                       not_read.files == 1 ? "file was" : "files were", not_read.why);
  }
  if (not_read.listing_cut_short) {
    return fmt::format(
        "this rests on the {} processes read: the directory held more files than are read ({})",
        job.processes.size(), not_read.why);
  }
  return fmt::format("this rests on {} of {} processes: the files of {} were not read ({})",
                     job.processes.size(), job.processes.size() + not_read.processes, not_read.processes,
                     not_read.why);
}

bool IsPointToPoint(const OpSnapshot& op) { return op.op == "Send" || op.op == "Recv"; }

std::string OpName(const OpSnapshot* op, std::uint64_t seq) {
  return op != nullptr && !op->op.empty() ? fmt::format("{} #{}", op->op, seq) : fmt::format("#{}", seq);
}

std::string DescribeOp(const OpSnapshot* op, std::uint64_t seq) {
  std::string text = OpName(op, seq);
  if (op != nullptr) {
    if (const std::string details = OpDetails(*op); !details.empty()) text += " (" + details + ")";
  }
  return text;
}

Json OpJson(const OpSnapshot& op) {
  // What a status shows of an outstanding operation: what was asked, its state and times.
  return Written<Json>(op, kOpFields, kInOutstanding);
}

const OpSnapshot* FindOp(const CommSnapshot& comm, std::uint64_t seq) {
  // Rings are oldest first and usually contiguous: look where the seq should be, then search.
  const auto& ring = comm.ring;
  if (!ring.empty() && seq >= ring.front().seq && seq - ring.front().seq < ring.size() &&
      ring[seq - ring.front().seq].seq == seq) {
    return &ring[seq - ring.front().seq];
  }
  for (const OpSnapshot& op : ring) {
    if (op.seq == seq) return &op;
  }
  return nullptr;
}

std::string Seconds(double seconds) { return fmt::format("{:.1f} s", seconds); }

std::vector<Communicator> GroupByCommunicator(const JobView& job) {
  std::unordered_map<std::string, size_t> index;
  std::vector<Communicator> communicators;
  for (const ProcessView& process : job.processes) {
    for (const CommSnapshot& comm : process.snapshot.comms) {
      auto [found, inserted] = index.try_emplace(comm.id, communicators.size());
      if (inserted) communicators.push_back(Communicator{.id = comm.id, .nranks = 0, .members = {}});
      Communicator& communicator = communicators[found->second];
      communicator.nranks = std::max(communicator.nranks, comm.nranks);
      communicator.members.push_back(Member{&process, &comm, comm.rank});
    }
  }
  for (Communicator& communicator : communicators) {
    auto& members = communicator.members;
    // A rank seen twice (a pid of an earlier launch under the same job id): the newest wins.
    std::sort(members.begin(), members.end(), [](const Member& a, const Member& b) {
      return a.rank != b.rank ? a.rank < b.rank : a.process->last_seen_ns > b.process->last_seen_ns;
    });
    members.erase(std::unique(members.begin(), members.end(),
                              [](const Member& a, const Member& b) { return a.rank == b.rank; }),
                  members.end());
    communicator.numbers_differ = NumbersDiffer(members);
  }
  std::sort(communicators.begin(), communicators.end(),
            [](const Communicator& a, const Communicator& b) { return a.id < b.id; });
  return communicators;
}

std::vector<int> UnreportedRanks(const Communicator& communicator) {
  std::vector<int> unreported;
  for (int rank = 0, next = 0; rank < communicator.nranks; ++rank) {
    while (next < static_cast<int>(communicator.members.size()) && communicator.members[next].rank < rank)
      ++next;
    if (next >= static_cast<int>(communicator.members.size()) || communicator.members[next].rank != rank) {
      unreported.push_back(rank);
    }
  }
  return unreported;
}

std::vector<int> RanksOf(const std::vector<const Member*>& members) {
  std::vector<int> ranks;
  ranks.reserve(members.size());
  for (const Member* member : members) ranks.push_back(member->rank);
  return ranks;
}

// The lowest seq this rank enqueued and has not completed.
std::optional<std::uint64_t> OldestUnfinished(const CommSnapshot& comm) {
  for (const OpSnapshot& op : comm.ring) {
    if (Unfinished(op)) return op.seq;
  }
  if (comm.last_enqueued > comm.last_completed) return comm.last_completed + 1;
  return std::nullopt;
}

double StatusAgeSeconds(const ProcessView& process, const JobView& job) {
  return static_cast<double>(job.ended_together_ns.value_or(job.now_ns) - process.last_seen_ns) / 1e9;
}

bool GoneWhenRead(const ProcessView& process, const JobView& job) {
  return process.liveness == ProcessView::Liveness::kGone ||
         (process.liveness == ProcessView::Liveness::kUnknown &&
          static_cast<double>(job.now_ns - process.last_seen_ns) / 1e9 >
              kStaleIntervals * job.status_interval_seconds);
}

bool IsGone(const ProcessView& process, const JobView& job) {
  return !job.ended_together_ns && GoneWhenRead(process, job);
}

const char* WhereaboutsName(Whereabouts where) {
  switch (where) {
    case Whereabouts::kFinished:
      return "finished";
    case Whereabouts::kGone:
      return "gone";
    case Whereabouts::kInsideNccl:
      return "inside_nccl";
    case Whereabouts::kBusyOutsideNccl:
      return "busy_outside_nccl";
    case Whereabouts::kStopped:
      return "stopped";
    case Whereabouts::kNoReport:
      return "no_report";
  }
  return "unknown";
}

Whereabouts Locate(const ProcessView& process, const JobView& job) {
  if (process.exited) return Whereabouts::kFinished;
  // Gone after the application closed every communicator of it: it finished, by an exit that ran
  // no exit handler (os._exit in a forked worker) or a signal once its work was done.
  if (IsGone(process, job)) return process.closed_nccl ? Whereabouts::kFinished : Whereabouts::kGone;
  // Whatever its status says it was doing, it is doing nothing now. So it is for a process alive on
  // this host whose watchdog has not written its status for several intervals: it was stopped (and
  // may have just been continued) or starved, and its status is no news of where it is.
  if (!job.ended_together_ns &&
      (process.liveness == ProcessView::Liveness::kStopped ||
       (process.liveness == ProcessView::Liveness::kAlive &&
        StatusAgeSeconds(process, job) > kStaleIntervals * job.status_interval_seconds))) {
    return Whereabouts::kStopped;
  }
  if (!process.snapshot.in_nccl_call.empty()) return Whereabouts::kInsideNccl;
  return Whereabouts::kBusyOutsideNccl;
}

std::vector<Verdict> Buckets::TakeAll() {
  std::vector<Verdict> verdicts;
  for (std::vector<Verdict>& bucket : by_kind_)
    std::move(bucket.begin(), bucket.end(), std::back_inserter(verdicts));
  return verdicts;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

Verdict& Add(Buckets& buckets, VerdictKind kind, std::string comm, std::uint64_t seq, std::vector<int> ranks,
             std::string message, Json evidence) {
  return buckets[kind].emplace_back(Verdict{.kind = kind,
                                            .comm = std::move(comm),
                                            .seq = seq,
                                            .ranks = std::move(ranks),
                                            .message = std::move(message),
                                            .evidence = std::move(evidence)});
}

std::string GoneHow(const ProcessView& process, const JobView& job) {
  if (process.liveness == ProcessView::Liveness::kGone) return "is gone";
  return fmt::format("stopped updating its status {} ago (presumed gone)",
                     Seconds(StatusAgeSeconds(process, job)));
}

std::string JoinClauses(const std::vector<std::string>& clauses) {
  std::vector<std::string> shown(clauses.begin(), clauses.begin() + std::min(clauses.size(), kMaxClauses));
  if (clauses.size() > kMaxClauses) shown.push_back(fmt::format("and {} more", clauses.size() - kMaxClauses));
  return absl::StrJoin(shown, "; ");
}

}  // namespace ncclguard::classifier
