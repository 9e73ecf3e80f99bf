// Where the ranks of a communicator that number their operations differently wait, and for whom.
// Pipeline stages on one communicator send and receive different counts, so #N names a different
// operation on each rank; their operations are matched as NCCL matches them instead: a collective
// by its number among collectives (coll_seq), a Send to a peer with that peer's Recv from the
// sender (NCCL pairs them in order, so a rank inside its Recv from the sender is inside the match).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "watchdog/diagnose/op_states.h"
#include "watchdog/diagnose/rules.h"
#include "watchdog/report/job_read.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard::classifier {
namespace {

// A member inside NCCL on the communicator: its oldest unfinished operation and those launched
// with it (its ncclGroupStart/End block), which progress together.
struct Waiting {
  const OpSnapshot* oldest = nullptr;  // null when its record does not hold it
  std::uint64_t seq = 0;
  std::vector<const OpSnapshot*> inside;
};

std::optional<Waiting> WaitingOf(const Member& member) {
  const CommSnapshot& comm = *member.comm;
  std::optional<std::uint64_t> seq = OldestUnfinished(comm);
  const std::optional<StallSnapshot>& stall = member.process->snapshot.stall;
  if (stall && stall->kind != "init" && stall->comm_id == comm.id && stall->seq > comm.last_completed &&
      stall->seq <= comm.last_enqueued && (!seq || stall->seq < *seq)) {
    seq = stall->seq;
  }
  if (!seq) return std::nullopt;
  Waiting waiting{.oldest = FindOp(comm, *seq), .seq = *seq, .inside = {}};
  if (waiting.oldest == nullptr) return waiting;
  for (const OpSnapshot& op : comm.ring) {
    if (&op == waiting.oldest ||
        (waiting.oldest->group != 0 && op.group == waiting.oldest->group && Unfinished(op))) {
      waiting.inside.push_back(&op);
    }
  }
  return waiting;
}

// "Send #17 to rank 2", "Recv #11 from rank 2", "AllReduce #12 (collective 6)".
std::string WaitName(const OpSnapshot& op) {
  if (IsPointToPoint(op))
    return fmt::format("{} #{} {} rank {}", op.op, op.seq, op.op == "Send" ? "to" : "from", op.peer);
  return fmt::format("{} #{} (collective {})", op.op, op.seq, op.coll_seq);
}

bool InsideMatch(const Waiting& waiting, const OpSnapshot& op, int rank) {
  return std::any_of(waiting.inside.begin(), waiting.inside.end(), [&](const OpSnapshot* mine) {
    if (IsPointToPoint(op)) return IsPointToPoint(*mine) && mine->op != op.op && mine->peer == rank;
    return !IsPointToPoint(*mine) && mine->coll_seq == op.coll_seq;
  });
}

// The communicator's members as the rule sees them, by index of Communicator::members.
struct Waits {
  std::vector<std::optional<Waiting>> of;
  std::vector<bool> late;       // awaited and not inside NCCL on this communicator
  std::vector<bool> matched;    // inside an operation whose every other side is inside it too
  std::vector<int> unreported;  // awaited ranks that left no record of it
  bool unmatched = false;       // a collective without its coll_seq (a file of an earlier version)
  bool stall_reported = false;
  double waited_seconds = 0;
};

const Member* MemberOf(const Communicator& communicator, int rank, std::size_t& index) {
  const auto& members = communicator.members;
  const auto found = std::lower_bound(members.begin(), members.end(), rank,
                                      [](const Member& member, int wanted) { return member.rank < wanted; });
  if (found == members.end() || found->rank != rank) return nullptr;
  index = static_cast<std::size_t>(found - members.begin());
  return &*found;
}

// Whether every rank that `op` of the member `waiter` waits for is inside the matching operation;
// the awaited ranks outside NCCL are marked late. `unreported`: the communicator's ranks no member
// holds, whom a collective waits for too.
bool AllInside(const Communicator& communicator, std::size_t waiter, const OpSnapshot& op,
               const std::vector<int>& unreported, Waits& waits) {
  const int rank = communicator.members[waiter].rank;
  bool all_inside = true;
  auto awaits = [&](std::size_t index) {
    if (index == waiter) return;
    const std::optional<Waiting>& other = waits.of[index];
    if (!other) waits.late[index] = true;
    all_inside = all_inside && other && InsideMatch(*other, op, rank);
  };
  if (IsPointToPoint(op)) {
    std::size_t index = 0;
    if (MemberOf(communicator, op.peer, index) != nullptr) {
      awaits(index);
    } else {
      waits.unreported.push_back(op.peer);
      all_inside = false;
    }
    return all_inside;
  }
  for (std::size_t index = 0; index < communicator.members.size(); ++index) {
    // A rank that issued it and waits in nothing is through it.
    if (communicator.members[index].comm->collectives < op.coll_seq || waits.of[index]) awaits(index);
  }
  waits.unreported.insert(waits.unreported.end(), unreported.begin(), unreported.end());
  return all_inside && unreported.empty();
}

void FindMembersWaiting(const Communicator& communicator, const JobView& job, Waits& waits) {
  const std::size_t members = communicator.members.size();
  waits.of.resize(members);
  waits.late.assign(members, false);
  waits.matched.assign(members, false);
  for (std::size_t index = 0; index < members; ++index) {
    const Member& member = communicator.members[index];
    const ProcessSnapshot& snapshot = member.process->snapshot;
    waits.stall_reported =
        waits.stall_reported || (snapshot.stall && snapshot.stall->comm_id == communicator.id);
    // A stopped process takes part in nothing until it is continued: its peers wait for it.
    if (Locate(*member.process, job) == Whereabouts::kStopped) continue;
    waits.of[index] = WaitingOf(member);
    const OpSnapshot* oldest = waits.of[index] ? waits.of[index]->oldest : nullptr;
    if (oldest != nullptr && oldest->enqueue_ns > 0) {
      waits.waited_seconds =
          std::max(waits.waited_seconds, static_cast<double>(snapshot.time_ns - oldest->enqueue_ns) / 1e9);
    }
  }
}

Waits FindWaits(const Communicator& communicator, const JobView& job) {
  Waits waits;
  FindMembersWaiting(communicator, job, waits);
  const std::vector<int> unreported = UnreportedRanks(communicator);
  // A collective is awaited alike by every rank inside it: each is looked at once.
  std::map<std::uint64_t, bool> collectives;  // coll_seq → every rank inside it
  for (std::size_t index = 0; index < communicator.members.size(); ++index) {
    if (!waits.of[index]) continue;
    for (const OpSnapshot* op : waits.of[index]->inside) {
      if (IsPointToPoint(*op)) {
        if (AllInside(communicator, index, *op, unreported, waits)) waits.matched[index] = true;
        continue;
      }
      if (op->coll_seq == 0) {
        waits.unmatched = true;
        continue;
      }
      auto [known, first] = collectives.try_emplace(op->coll_seq, false);
      if (first) known->second = AllInside(communicator, index, *op, unreported, waits);
      if (known->second) waits.matched[index] = true;
    }
  }
  std::sort(waits.unreported.begin(), waits.unreported.end());
  waits.unreported.erase(std::unique(waits.unreported.begin(), waits.unreported.end()),
                         waits.unreported.end());
  return waits;
}

// The ranks some waiting rank waits for that are outside NCCL, or left no record.
Absentees AbsentRanks(const Communicator& communicator, const JobView& job, const Waits& waits) {
  Absentees absent;
  for (std::size_t index = 0; index < communicator.members.size(); ++index) {
    if (waits.late[index]) {
      AddLateRank(DescribeLateRank(communicator.members[index], communicator, job, 0, "what they wait in"),
                  absent);
    }
  }
  // Ranks with no record while some processes' files were not read may be in those files.
  if (job.not_read.SomeProcessMissing()) {
    absent.not_read_ranks = waits.unreported;
    return absent;
  }
  for (const int rank : waits.unreported) {
    absent.not_joined_ranks.push_back(rank);
    absent.not_joined_clauses.push_back(fmt::format("rank {} left no record of this communicator", rank));
    absent.not_joined_evidence.push_back(
        Json{{"rank", rank}, {"where", WhereaboutsName(Whereabouts::kNoReport)}});
    absent.all_busy_outside_nccl = false;
    absent.all_finished = false;
  }
  return absent;
}

// Every rank waited for is inside NCCL: stuck_inside_nccl for the ranks inside matching
// operations, mismatch when there are none (each waits for a rank waiting elsewhere).
void AddAllInside(Buckets& buckets, const Communicator& communicator, const Waits& waits,
                  const std::vector<int>& waiting_ranks, const std::string& waiting, Json common) {
  std::vector<int> matched_ranks;
  for (std::size_t index = 0; index < communicator.members.size(); ++index) {
    if (waits.matched[index]) matched_ranks.push_back(communicator.members[index].rank);
  }
  if (matched_ranks.empty()) {
    Add(buckets, kMismatch, communicator.id, 0, waiting_ranks,
        fmt::format(
            "{}, and each waits for a rank that waits in another operation — the ranks' calls are out "
            "of step (a desync in the application: their sends, receives and collectives are issued in "
            "orders that wait on each other), not a network fault",
            waiting),
        std::move(common));
    return;
  }
  Add(buckets, kStuckInsideNccl, communicator.id, 0, matched_ranks,
      fmt::format("{}: {} and every rank {} for {} inside the matching operation (waiting {}) — stuck inside "
                  "NCCL, a transport fault (network, P2P or driver), not the application{}",
                  waiting, Ranks(matched_ranks), matched_ranks.size() == 1 ? "it waits" : "they wait",
                  matched_ranks.size() == 1 ? "is" : "are", Seconds(waits.waited_seconds),
                  KernelChannelsNote(communicator)),
      std::move(common));
}

}  // namespace

void ClassifyWaits(const Communicator& communicator, const JobView& job, bool mismatch_found,
                   Buckets& buckets) {
  const Waits waits = FindWaits(communicator, job);
  if (!waits.stall_reported && waits.waited_seconds < kStaleIntervals * job.status_interval_seconds) return;
  std::vector<int> waiting_ranks;
  std::vector<std::string> wait_clauses;
  Json waits_json = Json::array();
  for (std::size_t index = 0; index < communicator.members.size(); ++index) {
    const std::optional<Waiting>& waiting = waits.of[index];
    if (!waiting) continue;
    const int rank = communicator.members[index].rank;
    waiting_ranks.push_back(rank);
    wait_clauses.push_back(fmt::format(
        "rank {} waits in {}", rank,
        waiting->oldest != nullptr ? WaitName(*waiting->oldest) : fmt::format("#{}", waiting->seq)));
    waits_json.push_back(
        Json{{"rank", rank}, {"op", waiting->oldest != nullptr ? OpJson(*waiting->oldest) : Json(nullptr)}});
  }
  if (waiting_ranks.empty()) return;
  const std::string waiting = JoinClauses(wait_clauses);
  Json common{{"waits", std::move(waits_json)}, {"waiting_ranks", waiting_ranks}};
  // A desync explains the hang better than the transport.
  if (AddAbsentVerdicts(buckets, communicator.id, 0, AbsentRanks(communicator, job, waits), waiting, waiting,
                        common) ||
      mismatch_found) {
    return;
  }
  if (waits.unmatched) {
    Add(buckets, kUnknown, communicator.id, 0, {},
        fmt::format("{}; the ranks number their operations differently and some files do not say which "
                    "collective an operation is (written by an earlier version), so which rank they wait for "
                    "is not known",
                    waiting),
        std::move(common));
    return;
  }
  AddAllInside(buckets, communicator, waits, waiting_ranks, waiting, std::move(common));
}

}  // namespace ncclguard::classifier
