#include "watchdog/verdicts.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>

#include <fmt/format.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "watchdog/config.h"
#include "watchdog/dump.h"
#include "watchdog/log.h"
#include "watchdog/dump_reader.h"
#include "watchdog/job_dir.h"
#include "watchdog/known_bad.h"

namespace ncclguard {
namespace {

using Json = nlohmann::json;

// A status that has not been rewritten for this many intervals belongs to a process that ended
// or hangs outside the watchdog's reach.
constexpr double kStaleIntervals = 3;
// Per-rank clauses in one message; the evidence lists every rank.
constexpr size_t kMaxClauses = 3;

// ---------------------------------------------------------------------------------------------
// Reading the job directory


std::string ProcessKey(const std::string& host, int pid) { return absl::StrCat(host, "/", pid); }

bool Unfinished(const std::string& state) { return state == "enqueued" || state == "started"; }

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
    for (OpSnapshot& op : comm->ring) {
      if (Unfinished(op.state) && op.seq <= fresh.last_completed) op.state = "completed";
      if (op.state == "enqueued" && op.seq <= fresh.last_started) op.state = "started";
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


ProcessView::Liveness CheckLiveness(const std::string& host, int pid, const std::string& own_host) {
  if (own_host.empty() || host != own_host || pid <= 0) return ProcessView::Liveness::kUnknown;
  if (kill(pid, 0) == 0 || errno == EPERM) return ProcessView::Liveness::kAlive;
  return errno == ESRCH ? ProcessView::Liveness::kGone : ProcessView::Liveness::kUnknown;
}

// ---------------------------------------------------------------------------------------------
// Describing operations and ranks

std::string RankList(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t end = i;
    while (end + 1 < ranks.size() && ranks[end + 1] == ranks[end] + 1) ++end;
    // Short runs stay explicit ("0,1,2"); long ones ("0-1023") keep messages of big jobs short.
    if (end - i + 1 >= 4) {
      parts.push_back(absl::StrCat(ranks[i], "-", ranks[end]));
    } else {
      for (size_t k = i; k <= end; ++k) parts.push_back(absl::StrCat(ranks[k]));
    }
    i = end + 1;
  }
  return absl::StrJoin(parts, ",");
}

std::string Ranks(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", RankList(ranks));
}

bool IsPointToPoint(const OpSnapshot& op) { return op.op == "Send" || op.op == "Recv"; }

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
  return Json{{"seq", op.seq},       {"op", op.op},          {"dtype", op.dtype},
              {"count", op.count},   {"bytes", op.bytes},    {"root", op.root},
              {"peer", op.peer},     {"reduction", op.reduction}, {"state", op.state},
              {"enqueue_ns", op.enqueue_ns}, {"start_ns", op.start_ns}};
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

// ---------------------------------------------------------------------------------------------
// Communicators as the classifier sees them

struct Member {
  const ProcessView* process;
  const CommSnapshot* comm;
  int rank;
};

struct Communicator {
  std::string id;
  int nranks = 0;
  std::vector<Member> members;  // by rank, one per rank
};

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
  }
  std::sort(communicators.begin(), communicators.end(),
            [](const Communicator& a, const Communicator& b) { return a.id < b.id; });
  return communicators;
}

std::vector<int> RanksOf(const std::vector<const Member*>& members) {
  std::vector<int> ranks;
  for (const Member* member : members) ranks.push_back(member->rank);
  return ranks;
}

// The lowest seq this rank enqueued and has not completed.
std::optional<std::uint64_t> OldestUnfinished(const CommSnapshot& comm) {
  for (const OpSnapshot& op : comm.ring) {
    if (Unfinished(op.state)) return op.seq;
  }
  if (comm.last_enqueued > comm.last_completed) return comm.last_completed + 1;
  return std::nullopt;
}

double StatusAgeSeconds(const ProcessView& process, const JobView& job) {
  return static_cast<double>(job.now_ns - process.last_seen_ns) / 1e9;
}

bool IsGone(const ProcessView& process, const JobView& job) {
  return process.liveness == ProcessView::Liveness::kGone ||
         (process.liveness == ProcessView::Liveness::kUnknown &&
          StatusAgeSeconds(process, job) > kStaleIntervals * job.status_interval_seconds);
}

enum class Whereabouts { kFinished, kGone, kInsideNccl, kBusyOutsideNccl, kNoReport };

const char* WhereaboutsName(Whereabouts where) {
  switch (where) {
    case Whereabouts::kFinished: return "finished";
    case Whereabouts::kGone: return "gone";
    case Whereabouts::kInsideNccl: return "inside_nccl";
    case Whereabouts::kBusyOutsideNccl: return "busy_outside_nccl";
    case Whereabouts::kNoReport: return "no_report";
  }
  return "unknown";
}

Whereabouts Locate(const ProcessView& process, const JobView& job) {
  if (process.exited) return Whereabouts::kFinished;
  if (IsGone(process, job)) return Whereabouts::kGone;
  if (!process.snapshot.in_nccl_call.empty()) return Whereabouts::kInsideNccl;
  return Whereabouts::kBusyOutsideNccl;
}

// ---------------------------------------------------------------------------------------------
// The verdicts, one function per kind

enum KindOrder { kAsyncError, kP2pSuspect, kStuckInInit, kRankDead, kMismatch, kRankNotJoined,
                 kStuckInsideNccl, kStraggler, kKinds };
constexpr std::array<const char*, kKinds> kKindNames{
    "async_error", "p2p_suspect", "stuck_in_init", "rank_dead", "mismatch", "rank_not_joined",
    "stuck_inside_nccl", "straggler"};

using Buckets = std::array<std::vector<Verdict>, kKinds>;

void Add(Buckets& buckets, KindOrder kind, std::string comm, std::uint64_t seq, std::vector<int> ranks,
         std::string message, Json evidence) {
  buckets[kind].push_back(Verdict{.kind = kKindNames[kind],
                                  .comm = std::move(comm),
                                  .seq = seq,
                                  .ranks = std::move(ranks),
                                  .message = std::move(message),
                                  .evidence = std::move(evidence)});
}

bool MentionsP2pTrouble(const std::string& warning) {
  std::string lower = warning;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* needle : {"failed to peer", "peer access", "cudaipc", "p2p"}) {
    if (absl::StrContains(lower, needle)) return true;
  }
  return false;
}

// Evidence that P2P transfers are behind a fault on this communicator; null when there is none.
// Only facts (from dumps and status files) and NCCL's warnings can tell: the known-bad entries
// (known_bad.h) that match a member's facts, and NCCL warnings about P2P.
Json P2pEvidence(const Communicator& communicator) {
  const std::vector<KnownBadEntry>& entries = ProcessKnownBad().entries;
  std::set<std::string> hosts;
  bool shares_a_host = false;
  std::set<std::string> gpus;     // GPU names that a known-bad entry matched
  std::set<std::string> drivers;  // driver versions that a known-bad entry matched
  Json known_bad = Json::array(); // per matching entry, in the data file's order of first match
  std::vector<std::string> warnings;
  for (const Member& member : communicator.members) {
    const ProcessView& process = *member.process;
    // P2P connects GPUs of one node only.
    shares_a_host = shares_a_host || !hosts.insert(process.host).second;
    if (P2pDisabledBy(process.facts.environment)) return nullptr;
    for (const KnownBadMatch& match : MatchKnownBad(entries, process.facts)) {
      for (const MatchedFact& fact : match.facts) {
        if (fact.criterion == "gpu_name") gpus.insert(fact.value);
        if (fact.criterion == "driver_versions") drivers.insert(fact.value);
      }
      auto entry = std::find_if(known_bad.begin(), known_bad.end(),
                                [&](const Json& known) { return known["id"] == match.entry->id; });
      if (entry == known_bad.end()) {
        known_bad.push_back(KnownBadEntryJson(*match.entry));
        known_bad.back()["ranks"] = Json::array();
        entry = known_bad.end() - 1;
      }
      (*entry)["ranks"].push_back(member.rank);
    }
    const std::string& warning = process.snapshot.last_nccl_warning;
    if (MentionsP2pTrouble(warning) && std::find(warnings.begin(), warnings.end(), warning) == warnings.end()) {
      warnings.push_back(warning);
    }
  }
  if (!shares_a_host || (known_bad.empty() && warnings.empty())) return nullptr;
  return Json{{"consumer_gpus", gpus}, {"drivers", drivers}, {"known_bad", known_bad}, {"warnings", warnings}};
}

void AddP2pSuspect(Buckets& buckets, const Communicator& communicator, std::uint64_t seq,
                   std::vector<int> ranks, const std::string& what, const Json& evidence) {
  std::string message = what + " with P2P in use";
  if (!evidence["consumer_gpus"].empty()) {
    message += fmt::format(" on {} GPUs", absl::StrJoin(evidence["consumer_gpus"].get<std::vector<std::string>>(), ", "));
  }
  if (!evidence["drivers"].empty()) {
    message += fmt::format(" with driver {}", absl::StrJoin(evidence["drivers"].get<std::vector<std::string>>(), ", "));
  }
  // Entries that name no GPU or driver (a kernel release, the number of GPUs) are named by their id.
  std::vector<std::string> other_entries;
  for (const Json& matched : evidence["known_bad"]) {
    for (const KnownBadEntry& entry : ProcessKnownBad().entries) {
      if (entry.id == matched["id"] && !entry.match.gpu_name && entry.match.driver_versions.empty()) {
        other_entries.push_back(entry.id);
      }
    }
  }
  if (!other_entries.empty()) message += fmt::format(" on a known-bad configuration ({})", absl::StrJoin(other_entries, ", "));
  if (!evidence["warnings"].empty()) {
    message += fmt::format(" (NCCL warned: \"{}\")", evidence["warnings"][0].get<std::string>());
  }
  message += ": P2P transfers are the likely cause; NCCL_P2P_DISABLE=1 avoids them";
  Add(buckets, kP2pSuspect, communicator.id, seq, std::move(ranks), std::move(message), evidence);
}

void ClassifyAsyncErrors(const Communicator& communicator, Buckets& buckets) {
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
  if (const Json p2p = P2pEvidence(communicator); !p2p.is_null()) {
    AddP2pSuspect(buckets, communicator, seq, RanksOf(reporting), "asynchronous NCCL error", p2p);
  }
}

// Whether two ranks' records of one seq describe the same call. A status file gives only the
// operation and its size: what is unknown on either side is not compared.
bool SameCall(const OpSnapshot& a, const OpSnapshot& b) {
  if (a.op != b.op) return false;
  if (a.bytes > 0 && b.bytes > 0 && a.bytes != b.bytes) return false;
  if (a.dtype.empty() || b.dtype.empty()) return true;
  return a.dtype == b.dtype && a.count == b.count && a.root == b.root && a.reduction == b.reduction;
}

bool DifferOnlyInCount(const OpSnapshot& a, const OpSnapshot& b) {
  return a.op == b.op && !a.dtype.empty() && a.dtype == b.dtype && a.root == b.root &&
         a.reduction == b.reduction && a.count != b.count;
}

struct CallGroup {
  const OpSnapshot* call;  // the most complete description of the group's call
  std::vector<int> ranks;
};

// The first seq at which the ranks' calls differ. Point-to-point operations are left out: a Send
// on one rank legitimately meets a Recv on another under the same seq.
std::optional<std::uint64_t> ClassifyMismatch(const Communicator& communicator, Buckets& buckets) {
  struct Entry {
    std::uint64_t seq;
    int rank;
    const OpSnapshot* op;
  };
  std::vector<Entry> entries;
  for (const Member& member : communicator.members) {
    for (const OpSnapshot& op : member.comm->ring) entries.push_back(Entry{op.seq, member.rank, &op});
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.seq != b.seq ? a.seq < b.seq : a.rank < b.rank; });
  for (size_t begin = 0; begin < entries.size();) {
    size_t end = begin;
    bool point_to_point = false;
    while (end < entries.size() && entries[end].seq == entries[begin].seq) {
      point_to_point = point_to_point || IsPointToPoint(*entries[end].op);
      ++end;
    }
    std::vector<CallGroup> groups;
    for (size_t i = begin; i < end && !point_to_point; ++i) {
      const OpSnapshot& op = *entries[i].op;
      auto group = std::find_if(groups.begin(), groups.end(),
                                [&](const CallGroup& known) { return SameCall(*known.call, op); });
      if (group == groups.end()) {
        groups.push_back(CallGroup{&op, {entries[i].rank}});
      } else {
        group->ranks.push_back(entries[i].rank);
        if (group->call->dtype.empty()) group->call = &op;
      }
    }
    const std::uint64_t seq = entries[begin].seq;
    begin = end;
    if (groups.size() < 2) continue;
    // The largest group is taken as what the application meant (on a tie, the one of the lowest rank).
    std::stable_sort(groups.begin(), groups.end(),
                     [](const CallGroup& a, const CallGroup& b) { return a.ranks.size() > b.ranks.size(); });
    const CallGroup& majority = groups.front();
    bool counts_only = true;
    std::vector<std::string> clauses;
    std::vector<int> culprits;
    Json sides = Json::array({Json{{"ranks", majority.ranks}, {"call", OpJson(*majority.call)}}});
    for (size_t i = 1; i < groups.size(); ++i) {
      const CallGroup& other = groups[i];
      const bool count_only = DifferOnlyInCount(*other.call, *majority.call);
      counts_only = counts_only && count_only;
      clauses.push_back(count_only ? fmt::format("{} issued {} with {} {} elements", Ranks(other.ranks),
                                                 OpName(other.call, seq), other.call->count, other.call->dtype)
                                   : fmt::format("{} issued {}", Ranks(other.ranks), DescribeOp(other.call, seq)));
      culprits.insert(culprits.end(), other.ranks.begin(), other.ranks.end());
      sides.push_back(Json{{"ranks", other.ranks}, {"call", OpJson(*other.call)}});
    }
    const std::string majority_call =
        counts_only ? absl::StrCat(majority.call->count) : DescribeOp(majority.call, seq);
    std::sort(culprits.begin(), culprits.end());
    Add(buckets, kMismatch, communicator.id, seq, culprits,
        fmt::format("{} while {} issued {} — the ranks' calls are out of step (a desync in the "
                    "application), not a network fault",
                    absl::StrJoin(clauses, " and "), Ranks(majority.ranks), majority_call),
        Json{{"sides", std::move(sides)}});
    return seq;
  }
  return std::nullopt;
}

Json LateRankJson(const Member& member, Whereabouts where, const JobView& job) {
  return Json{{"rank", member.rank},
              {"host", member.process->host},
              {"pid", member.process->pid},
              {"last_enqueued", member.comm->last_enqueued},
              {"last_completed", member.comm->last_completed},
              {"where", WhereaboutsName(where)},
              {"in_nccl_call", member.process->snapshot.in_nccl_call},
              {"status_age_seconds", StatusAgeSeconds(*member.process, job)}};
}

// An operation whose result on every rank needs every rank's data: once one rank completed it,
// every rank took part in it. (The root of a Broadcast can finish before a receiver has.)
bool Symmetric(const OpSnapshot* op) {
  return op != nullptr && (op->op == "AllReduce" || op->op == "AllGather" || op->op == "ReduceScatter" ||
                           op->op == "AlltoAll");
}

// Once any rank completed a symmetric collective #N, every rank went through it and everything
// before it: a rank's own record may lag (its last status was written while #N was in flight, or
// its watchdog had not looked yet), so nothing at or below that #N counts as unfinished.
std::uint64_t HighestCompleted(const Communicator& communicator);

const OpSnapshot* FindOpInCommunicator(const Communicator& communicator, std::uint64_t seq);

std::uint64_t HighestCompleted(const Communicator& communicator) {
  std::uint64_t highest = 0;
  for (const Member& member : communicator.members) {
    const std::uint64_t completed = member.comm->last_completed;
    if (completed > highest && Symmetric(FindOpInCommunicator(communicator, completed))) highest = completed;
  }
  return highest;
}

std::uint64_t CompletedUpTo(const CommSnapshot& comm, std::uint64_t done_everywhere) {
  return std::max(comm.last_completed, std::min(comm.last_enqueued, done_everywhere));
}

std::optional<std::uint64_t> OldestUnfinishedAbove(const CommSnapshot& comm, std::uint64_t done_everywhere) {
  for (const OpSnapshot& op : comm.ring) {
    if (Unfinished(op.state) && op.seq > done_everywhere) return op.seq;
  }
  const std::uint64_t completed = CompletedUpTo(comm, done_everywhere);
  if (comm.last_enqueued > completed) return completed + 1;
  return std::nullopt;
}

// The operation #seq as any rank recorded it: every rank numbers the communicator's operations alike.
const OpSnapshot* FindOpInCommunicator(const Communicator& communicator, std::uint64_t seq) {
  const OpSnapshot* found = nullptr;
  for (const Member& member : communicator.members) {
    const OpSnapshot* op = FindOp(*member.comm, seq);
    if (op != nullptr && (found == nullptr || (found->dtype.empty() && !op->dtype.empty()))) found = op;
  }
  return found;
}

std::string LastCompleted(const Member& member, const Communicator& communicator, std::uint64_t done_everywhere) {
  const std::uint64_t last = CompletedUpTo(*member.comm, done_everywhere);
  if (last == 0) return "issued nothing on this communicator";
  return fmt::format("completed {} and issued nothing after", OpName(FindOpInCommunicator(communicator, last), last));
}

std::string JoinClauses(const std::vector<std::string>& clauses) {
  std::vector<std::string> shown(clauses.begin(), clauses.begin() + std::min(clauses.size(), kMaxClauses));
  if (clauses.size() > kMaxClauses) shown.push_back(fmt::format("and {} more", clauses.size() - kMaxClauses));
  return absl::StrJoin(shown, "; ");
}

// Where the communicator stands on the oldest operation some rank has not completed.
void ClassifyStuckOperation(const Communicator& communicator, const JobView& job,
                            std::optional<std::uint64_t> mismatch_seq, Buckets& buckets) {
  const std::uint64_t done_everywhere = HighestCompleted(communicator);
  std::uint64_t stuck_seq = std::numeric_limits<std::uint64_t>::max();
  for (const Member& member : communicator.members) {
    if (const auto oldest = OldestUnfinishedAbove(*member.comm, done_everywhere)) stuck_seq = std::min(stuck_seq, *oldest);
  }
  if (stuck_seq == std::numeric_limits<std::uint64_t>::max()) return;

  std::vector<const Member*> waiting;
  std::vector<const Member*> finished;
  std::vector<const Member*> late;
  const OpSnapshot* stuck_op = nullptr;
  bool stall_reported = false;
  double waited_seconds = 0;
  for (const Member& member : communicator.members) {
    const ProcessSnapshot& snapshot = member.process->snapshot;
    stall_reported = stall_reported || (snapshot.stall && snapshot.stall->comm_id == communicator.id);
    if (member.comm->last_enqueued < stuck_seq) {
      late.push_back(&member);
      continue;
    }
    if (OldestUnfinishedAbove(*member.comm, done_everywhere) != stuck_seq) {
      finished.push_back(&member);
      continue;
    }
    waiting.push_back(&member);
    const OpSnapshot* op = FindOp(*member.comm, stuck_seq);
    if (op == nullptr) continue;
    if (stuck_op == nullptr || (stuck_op->dtype.empty() && !op->dtype.empty())) stuck_op = op;
    if (op->enqueue_ns > 0) {
      waited_seconds = std::max(waited_seconds, static_cast<double>(snapshot.time_ns - op->enqueue_ns) / 1e9);
    }
  }
  // An operation in flight for less than a few status intervals is just the job running.
  if (!stall_reported && waited_seconds < kStaleIntervals * job.status_interval_seconds) return;
  const std::string stuck = DescribeOp(stuck_op, stuck_seq);

  std::vector<int> unreported;
  for (int rank = 0, next = 0; rank < communicator.nranks; ++rank) {
    while (next < static_cast<int>(communicator.members.size()) && communicator.members[next].rank < rank) ++next;
    if (next >= static_cast<int>(communicator.members.size()) || communicator.members[next].rank != rank) {
      unreported.push_back(rank);
    }
  }

  std::vector<int> dead_ranks;
  std::vector<std::string> dead_clauses;
  Json dead_evidence = Json::array();
  std::vector<int> not_joined_ranks;
  std::vector<std::string> not_joined_clauses;
  Json not_joined_evidence = Json::array();
  bool all_finished = true;
  for (const Member* member : late) {
    const ProcessView& process = *member->process;
    const Whereabouts where = Locate(process, job);
    if (where == Whereabouts::kGone) {
      dead_ranks.push_back(member->rank);
      const std::string how =
          process.liveness == ProcessView::Liveness::kGone
              ? "is gone"
              : fmt::format("stopped updating its status {} ago (presumed gone)", Seconds(StatusAgeSeconds(process, job)));
      const std::uint64_t last = CompletedUpTo(*member->comm, done_everywhere);
      dead_clauses.push_back(fmt::format(
          "rank {} (pid {} on host {}) {}: it {} and never entered #{}", member->rank, process.pid, process.host, how,
          last == 0 ? std::string("issued nothing on this communicator")
                    : fmt::format("completed {}", OpName(FindOpInCommunicator(communicator, last), last)),
          stuck_seq));
      dead_evidence.push_back(LateRankJson(*member, where, job));
      continue;
    }
    all_finished = all_finished && where == Whereabouts::kFinished;
    std::string clause = fmt::format("rank {} {}; ", member->rank, LastCompleted(*member, communicator, done_everywhere));
    switch (where) {
      case Whereabouts::kFinished: clause += "it finished its loop (exited normally)"; break;
      case Whereabouts::kInsideNccl:
        clause += fmt::format("it is inside {} (not in this operation)", process.snapshot.in_nccl_call);
        break;
      default: clause += "it is alive and busy outside NCCL (e.g. saving a checkpoint or evaluating)"; break;
    }
    not_joined_ranks.push_back(member->rank);
    not_joined_clauses.push_back(std::move(clause));
    not_joined_evidence.push_back(LateRankJson(*member, where, job));
  }
  for (const int rank : unreported) {
    all_finished = false;
    not_joined_ranks.push_back(rank);
    not_joined_clauses.push_back(fmt::format("rank {} left no status file or dump", rank));
    not_joined_evidence.push_back(Json{{"rank", rank}, {"where", WhereaboutsName(Whereabouts::kNoReport)}});
  }

  const std::vector<int> waiting_ranks = RanksOf(waiting);
  const std::vector<int> finished_ranks = RanksOf(finished);
  Json common{{"op", stuck_op != nullptr ? OpJson(*stuck_op) : Json(nullptr)},
              {"waiting_ranks", waiting_ranks},
              {"completed_ranks", finished_ranks},
              {"waited_seconds", waited_seconds}};
  if (!dead_ranks.empty()) {
    Json evidence = common;
    evidence["dead_ranks"] = std::move(dead_evidence);
    Add(buckets, kRankDead, communicator.id, stuck_seq, dead_ranks,
        fmt::format("{}; the others wait in {} — {} killed or crashed (e.g. out of memory), not a network fault",
                    JoinClauses(dead_clauses), stuck, dead_ranks.size() == 1 ? "it was" : "they were"),
        std::move(evidence));
  }
  if (!not_joined_ranks.empty()) {
    Json evidence = common;
    evidence["late_ranks"] = std::move(not_joined_evidence);
    std::string others = fmt::format("{} wait in {}", Ranks(waiting_ranks), stuck);
    if (!finished_ranks.empty()) others += fmt::format(" ({} completed it)", Ranks(finished_ranks));
    Add(buckets, kRankNotJoined, communicator.id, stuck_seq, not_joined_ranks,
        fmt::format("{} while {} — {}not a network fault", JoinClauses(not_joined_clauses), others,
                    all_finished ? "uneven data across ranks, " : ""),
        std::move(evidence));
  }
  // A desync explains the hang better than the transport.
  if (!late.empty() || !unreported.empty() || (mismatch_seq && *mismatch_seq <= stuck_seq)) return;

  const std::string how_long = fmt::format("waiting {}", Seconds(waited_seconds));
  const std::string where =
      finished.empty()
          ? fmt::format("all {} ranks entered {} and none has completed it ({})", waiting.size(), stuck, how_long)
          : fmt::format("{} — {} completed it, {} {} not ({})", stuck, Ranks(finished_ranks), Ranks(waiting_ranks),
                        waiting.size() == 1 ? "has" : "have", how_long);
  Add(buckets, kStuckInsideNccl, communicator.id, stuck_seq, waiting_ranks,
      where + ": stuck inside NCCL, a transport fault (network, P2P or driver), not the application", common);
  if (const Json p2p = P2pEvidence(communicator); !p2p.is_null()) {
    AddP2pSuspect(buckets, communicator, stuck_seq, waiting_ranks, "stuck inside NCCL", p2p);
  }
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

// One rank consistently last into the collectives that every rank's ring holds. Enqueue times
// only: GPU start times are seen at the watchdog's poll interval, too coarse for this.
void ClassifyStraggler(const Communicator& communicator, Buckets& buckets) {
  constexpr size_t kMinCommonOps = 10;
  constexpr double kLatestShare = 0.8;
  constexpr double kMinLatenessMs = 50;
  constexpr double kMinRatio = 5;
  const size_t nranks = communicator.members.size();
  if (nranks < 2 || static_cast<int>(nranks) != communicator.nranks) return;
  struct Arrival {
    std::uint64_t seq;
    size_t member;
    std::int64_t enqueue_ns;
  };
  std::vector<Arrival> arrivals;
  for (size_t i = 0; i < nranks; ++i) {
    for (const OpSnapshot& op : communicator.members[i].comm->ring) {
      if (op.enqueue_ns > 0 && !IsPointToPoint(op)) arrivals.push_back(Arrival{op.seq, i, op.enqueue_ns});
    }
  }
  std::sort(arrivals.begin(), arrivals.end(),
            [](const Arrival& a, const Arrival& b) { return a.seq != b.seq ? a.seq < b.seq : a.member < b.member; });
  std::vector<std::pair<size_t, size_t>> common;  // [begin, end) of each seq every rank holds
  std::vector<size_t> latest_count(nranks, 0);
  for (size_t begin = 0; begin < arrivals.size();) {
    size_t end = begin;
    while (end < arrivals.size() && arrivals[end].seq == arrivals[begin].seq) ++end;
    if (end - begin == nranks) {
      common.emplace_back(begin, end);
      const auto latest = std::max_element(arrivals.begin() + begin, arrivals.begin() + end,
                                           [](const Arrival& a, const Arrival& b) { return a.enqueue_ns < b.enqueue_ns; });
      ++latest_count[latest->member];
    }
    begin = end;
  }
  if (common.size() < kMinCommonOps) return;
  const size_t candidate = static_cast<size_t>(
      std::max_element(latest_count.begin(), latest_count.end()) - latest_count.begin());
  if (latest_count[candidate] < kLatestShare * static_cast<double>(common.size())) return;
  std::vector<double> candidate_lateness_ms;
  std::vector<double> others_median_ms;
  for (const auto& [begin, end] : common) {
    std::int64_t earliest = std::numeric_limits<std::int64_t>::max();
    for (size_t i = begin; i < end; ++i) earliest = std::min(earliest, arrivals[i].enqueue_ns);
    std::vector<double> others;
    for (size_t i = begin; i < end; ++i) {
      const double lateness_ms = static_cast<double>(arrivals[i].enqueue_ns - earliest) / 1e6;
      if (arrivals[i].member == candidate) {
        candidate_lateness_ms.push_back(lateness_ms);
      } else {
        others.push_back(lateness_ms);
      }
    }
    others_median_ms.push_back(Median(std::move(others)));
  }
  const double median_ms = Median(candidate_lateness_ms);
  const double others_ms = Median(others_median_ms);
  if (median_ms < kMinLatenessMs || median_ms < kMinRatio * others_ms) return;
  const int rank = communicator.members[candidate].rank;
  Add(buckets, kStraggler, communicator.id, 0, {rank},
      fmt::format("rank {} enters collectives a median {:.0f} ms after the others (latest in {} of {}): it is "
                  "slow outside NCCL (data loading, compute)",
                  rank, median_ms, latest_count[candidate], common.size()),
      Json{{"median_lateness_ms", median_ms},
           {"others_median_lateness_ms", others_ms},
           {"latest_in", latest_count[candidate]},
           {"common_ops", common.size()}});
}

void ClassifyStuckInits(const JobView& job, const std::vector<Communicator>& communicators, Buckets& buckets) {
  struct Init {
    std::string api;
    int nranks = 0;
    std::set<int> pending;
    double waited_seconds = 0;
    bool stall_reported = false;
  };
  std::map<std::string, Init> inits;
  for (const ProcessView& process : job.processes) {
    for (const PendingInitSnapshot& pending : process.snapshot.pending_inits) {
      const double waited = static_cast<double>(process.snapshot.time_ns - pending.start_ns) / 1e9;
      if (waited <= job.status_interval_seconds) continue;
      Init& init = inits[pending.comm_id];
      init.api = pending.api;
      init.nranks = std::max(init.nranks, pending.nranks);
      init.pending.insert(pending.rank);
      init.waited_seconds = std::max(init.waited_seconds, waited);
      const auto& stall = process.snapshot.stall;
      init.stall_reported = init.stall_reported || (stall && stall->kind == "init" && stall->comm_id == pending.comm_id);
    }
  }
  for (const auto& [comm_id, init] : inits) {
    std::set<int> arrived = init.pending;
    const auto communicator = std::lower_bound(communicators.begin(), communicators.end(), comm_id,
                                               [](const Communicator& c, const std::string& id) { return c.id < id; });
    if (communicator != communicators.end() && communicator->id == comm_id) {
      for (const Member& member : communicator->members) arrived.insert(member.rank);
    }
    std::vector<int> missing;
    for (int rank = 0; rank < init.nranks; ++rank) {
      if (!arrived.contains(rank)) missing.push_back(rank);
    }
    if (missing.empty() && !init.stall_reported) continue;
    const std::vector<int> arrived_ranks(arrived.begin(), arrived.end());
    const std::string what = fmt::format("the initialisation of communicator {} ({}, {} ranks) has waited {}",
                                         comm_id, init.api, init.nranks, Seconds(init.waited_seconds));
    std::string message =
        missing.empty()
            ? fmt::format("{} although all {} ranks arrived: stuck inside NCCL's bootstrap or transport setup "
                          "(network interfaces, firewall, NCCL_SOCKET_IFNAME)",
                          what, init.nranks)
            : fmt::format("{}: {} arrived, {} did not — {} never called {} for it (not started, crashed "
                          "before, or given another unique id)",
                          what, Ranks(arrived_ranks), Ranks(missing), missing.size() == 1 ? "that rank" : "those ranks",
                          init.api);
    Add(buckets, kStuckInInit, comm_id, 0, missing.empty() ? arrived_ranks : missing, std::move(message),
        Json{{"api", init.api},
             {"nranks", init.nranks},
             {"arrived_ranks", arrived_ranks},
             {"pending_ranks", init.pending},
             {"missing_ranks", missing},
             {"waited_seconds", init.waited_seconds}});
  }
}

const char* LivenessName(ProcessView::Liveness liveness) {
  switch (liveness) {
    case ProcessView::Liveness::kAlive: return "alive";
    case ProcessView::Liveness::kGone: return "gone";
    case ProcessView::Liveness::kUnknown: return "unknown";
  }
  return "unknown";
}

// The user names the directory to analyse: a relative path or a symbolic link is theirs to
// give, and its owner may be another user (root analysing a user's job). The process's own job
// directory must be what it writes into: a real directory of this user.
absl::StatusOr<int> OpenJobDirectory(const std::string& directory, JobDirectoryOrigin origin) {
  if (origin == JobDirectoryOrigin::kOwn) return OpenPrivateDirectory(directory, /*create=*/false);
  const int fd = open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open ", directory, ": ", std::strerror(errno)));
  return fd;
}

// The classifier walks every rank of every communicator, and its evidence names each rank that
// left nothing (a few hundred bytes each): the communicators' claimed sizes, each within
// kMaxRanks, must also stay within kMaxRankSlots together (a 16,384-rank job with 16
// communicators spanning it).
class RankSlots {
 public:
  static constexpr std::int64_t kMaxRankSlots = 1 << 18;

  absl::Status Admit(const ProcessSnapshot& snapshot) {
    std::int64_t added = 0;
    std::vector<std::pair<const std::string*, int>> grown;
    auto claim = [&](const std::string& id, int nranks) {
      const auto known = nranks_.find(id);
      const int before = known == nranks_.end() ? 0 : known->second;
      if (nranks > before) {
        added += nranks - before;
        grown.emplace_back(&id, nranks);
      }
    };
    for (const CommSnapshot& comm : snapshot.comms) claim(comm.id, comm.nranks);
    for (const PendingInitSnapshot& init : snapshot.pending_inits) claim(init.comm_id, init.nranks);
    if (total_ + added > kMaxRankSlots) {
      return absl::OutOfRangeError(absl::StrCat("its communicators would take the job past ", kMaxRankSlots,
                                                " ranks in all; not read"));
    }
    total_ += added;
    for (const auto& [id, nranks] : grown) nranks_[*id] = std::max(nranks_[*id], nranks);
    return absl::OkStatus();
  }

 private:
  std::unordered_map<std::string, int> nranks_;
  std::int64_t total_ = 0;
};

// Every dump and status file of the directory open as `directory_fd` that can be read before
// `stop_reading`; the others become problems.
JobView ReadOpenJobDirectory(int directory_fd, const std::string& directory,
                             std::chrono::steady_clock::time_point stop_reading) {
  JobView job;
  job.directory = directory;
  std::unordered_map<std::string, size_t> by_process;
  auto view_of = [&](const std::string& host, int pid) -> ProcessView& {
    auto [found, inserted] = by_process.try_emplace(ProcessKey(host, pid), job.processes.size());
    if (inserted) {
      job.processes.emplace_back();
      job.processes.back().host = host;
      job.processes.back().pid = pid;
    }
    return job.processes[found->second];
  };
  absl::StatusOr<std::vector<std::string>> dump_names = ListNamesAt(directory_fd, "dump-", ".json");
  if (!dump_names.ok()) job.problems.push_back(absl::StrCat("dumps: ", dump_names.status().message()));
  // Dumps written with the default ring are read in full whatever this process's ring.
  const std::size_t max_dump_bytes = MaxDumpBytes(std::max(GetConfig().ring_size.value, Config{}.ring_size.value));
  RankSlots slots;
  // A process keeps its dump with the latest time.
  for (const std::string& name : dump_names.ok() ? *dump_names : std::vector<std::string>()) {
    if (std::chrono::steady_clock::now() > stop_reading) {
      job.problems.push_back(absl::StrCat(name, " and later dumps: not read, the deadline passed"));
      break;
    }
    absl::StatusOr<std::string> content = ReadFileAt(directory_fd, name, max_dump_bytes);
    absl::StatusOr<ParsedDump> dump = content.ok() ? ParseDump(*content) : absl::StatusOr<ParsedDump>(content.status());
    if (absl::Status admitted = dump.ok() ? slots.Admit(dump->snapshot) : absl::OkStatus(); !admitted.ok()) {
      dump = admitted;
    }
    if (!dump.ok()) {
      job.problems.push_back(absl::StrCat(name, ": ", dump.status().message()));
      continue;
    }
    ProcessView& view = view_of(dump->facts.host, dump->facts.pid);
    if (!view.dump_file.empty() && view.snapshot.time_ns >= dump->snapshot.time_ns) continue;
    view.dump_file = absl::StrCat(directory, "/", name);
    view.dump_reason = dump->snapshot.reason;
    view.snapshot = std::move(dump->snapshot);
    view.facts = std::move(dump->facts);
  }

  StatusScan statuses = ReadStatusesAt(directory_fd, stop_reading);
  job.problems.insert(job.problems.end(), statuses.problems.begin(), statuses.problems.end());
  for (PeerStatus& status : statuses.statuses) {
    if (absl::Status admitted = slots.Admit(status.snapshot); !admitted.ok()) {
      job.problems.push_back(absl::StrCat(status.file, ": ", admitted.message()));
      continue;
    }
    ProcessView& view = view_of(status.host, status.pid);
    view.status_file = absl::StrCat(directory, "/", status.file);
    if (view.dump_file.empty()) {
      view.snapshot = std::move(status.snapshot);
      // A dump's facts are the fuller ones; without a dump, the status file's are what there is.
      view.facts = std::move(status.facts);
    } else if (status.snapshot.time_ns > view.snapshot.time_ns) {
      MergeNewerStatus(view.snapshot, status.snapshot);
    }
  }

  const std::string own_host = log::HostName();
  for (ProcessView& view : job.processes) {
    view.last_seen_ns = view.snapshot.time_ns;
    view.liveness = CheckLiveness(view.host, view.pid, own_host);
    view.exited = view.snapshot.exiting || view.dump_reason == "exit";
  }
  std::sort(job.processes.begin(), job.processes.end(), [](const ProcessView& a, const ProcessView& b) {
    return std::tie(a.snapshot.rank, a.host, a.pid) < std::tie(b.snapshot.rank, b.host, b.pid);
  });
  return job;
}

}  // namespace

absl::StatusOr<JobView> ReadJobDirectory(const std::string& directory, std::int64_t now_ns,
                                         double status_interval_seconds, JobDirectoryOrigin origin,
                                         std::chrono::milliseconds deadline) noexcept {
  try {
    // The reading thread stops a little before the caller gives up on it, so that what was read
    // in time is still used.
    const auto stop_reading = std::chrono::steady_clock::now() + deadline * 4 / 5;
    absl::StatusOr<JobView> job = RunWithDeadline<JobView>(
        [=]() -> absl::StatusOr<JobView> {
          absl::StatusOr<int> directory_fd = OpenJobDirectory(directory, origin);
          if (!directory_fd.ok()) return directory_fd.status();
          JobView job = ReadOpenJobDirectory(*directory_fd, directory, stop_reading);
          close(*directory_fd);
          job.now_ns = now_ns;
          job.status_interval_seconds = status_interval_seconds;
          return job;
        },
        deadline);
    if (absl::IsDeadlineExceeded(job.status())) {
      return absl::DeadlineExceededError(
          absl::StrCat("reading ", directory, " took longer than ", deadline.count(), " ms; given up"));
    }
    return job;
  } catch (...) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot read ", directory));
  }
}

std::vector<Verdict> Classify(const JobView& job) {
  const std::vector<Communicator> communicators = GroupByCommunicator(job);
  Buckets buckets;
  for (const Communicator& communicator : communicators) {
    ClassifyAsyncErrors(communicator, buckets);
    const std::optional<std::uint64_t> mismatch_seq = ClassifyMismatch(communicator, buckets);
    ClassifyStuckOperation(communicator, job, mismatch_seq, buckets);
    ClassifyStraggler(communicator, buckets);
  }
  ClassifyStuckInits(job, communicators, buckets);
  std::vector<Verdict> verdicts;
  for (std::vector<Verdict>& bucket : buckets) {
    std::move(bucket.begin(), bucket.end(), std::back_inserter(verdicts));
  }
  if (verdicts.empty()) {
    verdicts.push_back(Verdict{.kind = "healthy",
                               .comm = "",
                               .seq = 0,
                               .ranks = {},
                               .message = fmt::format("nothing wrong found in {} processes", job.processes.size()),
                               .evidence = Json::object()});
  }
  return verdicts;
}

nlohmann::json VerdictsToJson(const JobView& job, const std::vector<Verdict>& verdicts) {
  Json list = Json::array();
  for (const Verdict& verdict : verdicts) {
    list.push_back(Json{{"kind", verdict.kind},
                        {"comm", verdict.comm},
                        {"seq", verdict.seq},
                        {"ranks", verdict.ranks},
                        {"message", verdict.message},
                        {"evidence", verdict.evidence}});
  }
  Json processes = Json::array();
  for (const ProcessView& process : job.processes) {
    processes.push_back(Json{{"host", process.host},
                             {"pid", process.pid},
                             {"rank", process.snapshot.rank},
                             {"liveness", LivenessName(process.liveness)},
                             {"exited", process.exited},
                             {"last_seen_ns", process.last_seen_ns},
                             {"in_nccl_call", process.snapshot.in_nccl_call},
                             {"status_file", process.status_file},
                             {"dump_file", process.dump_file},
                             {"dump_reason", process.dump_reason}});
  }
  return Json{{"verdicts", std::move(list)},
              {"healthy", verdicts.size() == 1 && verdicts.front().kind == "healthy"},
              {"directory", job.directory},
              {"time", IsoTime(job.now_ns)},
              {"time_ns", job.now_ns},
              {"status_interval_seconds", job.status_interval_seconds},
              {"processes", std::move(processes)},
              {"problems", job.problems}};
}

bool ActOnTimeout(const std::vector<Verdict>& verdicts) {
  if (verdicts.empty() || verdicts.front().kind != "rank_not_joined") return true;
  // Waiting longer is worth it only while every late rank is alive and will come back.
  const Json& late = verdicts.front().evidence.value("late_ranks", Json::array());
  return late.empty() || !std::all_of(late.begin(), late.end(), [](const Json& rank) {
    return rank.value("where", "") == WhereaboutsName(Whereabouts::kBusyOutsideNccl);
  });
}

}  // namespace ncclguard
