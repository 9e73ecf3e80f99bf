#include "watchdog/diagnose/verdicts.h"

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
#include "watchdog/common/clock.h"
#include "watchdog/common/config.h"
#include "watchdog/common/describe.h"
#include "watchdog/report/dump.h"
#include "watchdog/common/log.h"
#include "watchdog/report/dump_reader.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/diagnose/known_bad.h"
#include "watchdog/report/op_signature.h"

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
    comm->signatures_first_seq = fresh.signatures_first_seq;
    comm->signatures = fresh.signatures;
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
                 kStuckInsideNccl, kFailedCall, kUnexplained, kStraggler, kKinds };
constexpr std::array<const char*, kKinds> kKindNames{
    "async_error", "p2p_suspect", "stuck_in_init", "rank_dead", "mismatch", "rank_not_joined",
    "stuck_inside_nccl", "failed_call", "unexplained", "straggler"};

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

// What one rank is known to have issued as #N: its ring's record (a dump's, or the operations a
// status file names), else only the signature its status file carries (kNoSignature when none).
struct KnownCall {
  std::uint64_t seq;
  int rank;
  const OpSnapshot* op;
  std::uint32_t signature;
};

std::uint32_t StatusSignature(const CommSnapshot& comm, std::uint64_t seq) {
  if (seq < comm.signatures_first_seq || seq - comm.signatures_first_seq >= comm.signatures.size()) {
    return kNoSignature;
  }
  return comm.signatures[seq - comm.signatures_first_seq];
}

std::vector<KnownCall> KnownCalls(const Communicator& communicator) {
  std::vector<KnownCall> calls;
  for (const Member& member : communicator.members) {
    const CommSnapshot& comm = *member.comm;
    for (const OpSnapshot& op : comm.ring) {
      const std::uint32_t signature = OperationSignature(op);
      calls.push_back(KnownCall{op.seq, member.rank, &op,
                                signature != kNoSignature ? signature : StatusSignature(comm, op.seq)});
    }
    for (size_t i = 0; i < comm.signatures.size(); ++i) {
      const std::uint64_t seq = comm.signatures_first_seq + i;
      if (comm.signatures[i] != kNoSignature && FindOp(comm, seq) == nullptr) {
        calls.push_back(KnownCall{seq, member.rank, nullptr, comm.signatures[i]});
      }
    }
  }
  std::sort(calls.begin(), calls.end(),
            [](const KnownCall& a, const KnownCall& b) { return a.seq != b.seq ? a.seq < b.seq : a.rank < b.rank; });
  return calls;
}

// What is unknown on either side is not compared.
bool SameKnownCall(const KnownCall& a, const KnownCall& b) {
  if (a.op != nullptr && b.op != nullptr && !SameCall(*a.op, *b.op)) return false;
  return a.signature == kNoSignature || b.signature == kNoSignature || a.signature == b.signature;
}

// How much a known call says: a full record, a status file's size only, a signature only.
int Detail(const KnownCall& call) {
  if (call.op == nullptr) return 0;
  return call.op->dtype.empty() ? 1 : 2;
}

struct CallGroup {
  KnownCall call;  // the most complete description of the group's call
  std::vector<int> ranks;
};

std::string SignatureText(std::uint32_t signature) { return SignaturesToHex({signature}); }

Json SideJson(const CallGroup& group) {
  return Json{{"ranks", group.ranks},
              {"call", group.call.op != nullptr ? OpJson(*group.call.op) : Json(nullptr)},
              {"signature", group.call.signature != kNoSignature ? SignatureText(group.call.signature) : ""}};
}

// "AllReduce #26 (float32 × 1024, sum)", or "#26 with signature 5e0c1f3a" when only a status
// file's signature tells.
std::string DescribeCall(const CallGroup& group, std::uint64_t seq) {
  if (group.call.op != nullptr) return DescribeOp(group.call.op, seq);
  return fmt::format("#{} with signature {}", seq, SignatureText(group.call.signature));
}

// The ranks' calls at one seq, grouped by what they issued; empty when a point-to-point operation
// is among them (a Send on one rank legitimately meets a Recv on another under the same seq).
std::vector<CallGroup> GroupCalls(std::vector<KnownCall>::const_iterator begin,
                                  std::vector<KnownCall>::const_iterator end) {
  std::vector<CallGroup> groups;
  for (auto call = begin; call != end; ++call) {
    if (call->op != nullptr && IsPointToPoint(*call->op)) return {};
    auto group = std::find_if(groups.begin(), groups.end(),
                              [&](const CallGroup& known) { return SameKnownCall(known.call, *call); });
    if (group == groups.end()) {
      groups.push_back(CallGroup{*call, {call->rank}});
      continue;
    }
    if (group->ranks.back() != call->rank) group->ranks.push_back(call->rank);
    if (Detail(*call) > Detail(group->call)) group->call = *call;
  }
  return groups;
}

// The first seq at which the ranks' calls differ, from their rings and, where a rank left no
// ring, from the operation signatures of its status file.
std::optional<std::uint64_t> ClassifyMismatch(const Communicator& communicator, Buckets& buckets) {
  const std::vector<KnownCall> calls = KnownCalls(communicator);
  for (auto begin = calls.begin(); begin != calls.end();) {
    auto end = std::find_if(begin, calls.end(), [&](const KnownCall& call) { return call.seq != begin->seq; });
    std::vector<CallGroup> groups = GroupCalls(begin, end);
    const std::uint64_t seq = begin->seq;
    begin = end;
    if (groups.size() < 2) continue;
    // The largest group is taken as what the application meant (on a tie, the one of the lowest rank).
    std::stable_sort(groups.begin(), groups.end(),
                     [](const CallGroup& a, const CallGroup& b) { return a.ranks.size() > b.ranks.size(); });
    const CallGroup& majority = groups.front();
    bool counts_only = true;
    std::vector<std::string> clauses;
    std::vector<int> culprits;
    Json sides = Json::array({SideJson(majority)});
    for (size_t i = 1; i < groups.size(); ++i) {
      const CallGroup& other = groups[i];
      const bool count_only = other.call.op != nullptr && majority.call.op != nullptr &&
                              DifferOnlyInCount(*other.call.op, *majority.call.op);
      counts_only = counts_only && count_only;
      clauses.push_back(count_only ? fmt::format("{} issued {} with {} {} elements", Ranks(other.ranks),
                                                 OpName(other.call.op, seq), other.call.op->count,
                                                 other.call.op->dtype)
                                   : fmt::format("{} issued {}", Ranks(other.ranks), DescribeCall(other, seq)));
      culprits.insert(culprits.end(), other.ranks.begin(), other.ranks.end());
      sides.push_back(SideJson(other));
    }
    const std::string majority_call =
        counts_only ? absl::StrCat(majority.call.op->count) : DescribeCall(majority, seq);
    const bool signatures_only = std::any_of(groups.begin(), groups.end(),
                                             [](const CallGroup& group) { return group.call.op == nullptr; });
    std::sort(culprits.begin(), culprits.end());
    Add(buckets, kMismatch, communicator.id, seq, culprits,
        fmt::format("{} while {} issued {}{} — the ranks' calls are out of step (a desync in the "
                    "application), not a network fault",
                    absl::StrJoin(clauses, " and "), Ranks(majority.ranks), majority_call,
                    signatures_only ? " (operation signatures from status files: no record of the call itself)"
                                    : ""),
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

std::string GoneHow(const ProcessView& process, const JobView& job) {
  if (process.liveness == ProcessView::Liveness::kGone) return "is gone";
  return fmt::format("stopped updating its status {} ago (presumed gone)", Seconds(StatusAgeSeconds(process, job)));
}

// The process whose initialisation of this communicator as `rank` had not returned when it last
// wrote its status: the rank is not a member yet, but it is not unaccounted for either.
const ProcessView* InitialisingProcess(const JobView& job, const std::string& comm_id, int rank,
                                       const PendingInitSnapshot** init) {
  for (const ProcessView& process : job.processes) {
    for (const PendingInitSnapshot& pending : process.snapshot.pending_inits) {
      if (pending.comm_id == comm_id && pending.rank == rank) {
        *init = &pending;
        return &process;
      }
    }
  }
  return nullptr;
}

Json InitialisingJson(const ProcessView& process, const PendingInitSnapshot& init, Whereabouts where,
                      const JobView& job) {
  return Json{{"rank", init.rank},
              {"host", process.host},
              {"pid", process.pid},
              {"in_init", init.api},
              {"where", WhereaboutsName(where)},
              {"status_age_seconds", StatusAgeSeconds(process, job)}};
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

// The #N this member's own watchdog reported stalled on this communicator, when the member has
// not completed it since. Authoritative for that rank, whatever its peers completed: a rank can
// wait in a collective its peers finished when their calls went out of step.
std::optional<std::uint64_t> ReportedStall(const Member& member, const Communicator& communicator) {
  const std::optional<StallSnapshot>& stall = member.process->snapshot.stall;
  if (!stall || stall->kind == "init" || stall->comm_id != communicator.id) return std::nullopt;
  if (stall->seq <= member.comm->last_completed || stall->seq > member.comm->last_enqueued) return std::nullopt;
  return stall->seq;
}

// The oldest operation this member has not completed.
std::optional<std::uint64_t> WaitingIn(const Member& member, const Communicator& communicator,
                                       std::uint64_t done_everywhere) {
  const std::optional<std::uint64_t> stalled = ReportedStall(member, communicator);
  const std::optional<std::uint64_t> oldest = OldestUnfinishedAbove(*member.comm, done_everywhere);
  if (stalled && (!oldest || *stalled < *oldest)) return stalled;
  return oldest;
}

std::string JoinClauses(const std::vector<std::string>& clauses) {
  std::vector<std::string> shown(clauses.begin(), clauses.begin() + std::min(clauses.size(), kMaxClauses));
  if (clauses.size() > kMaxClauses) shown.push_back(fmt::format("and {} more", clauses.size() - kMaxClauses));
  return absl::StrJoin(shown, "; ");
}

// What the ranks that completed the stuck operation did next: "ranks 0,1,3 completed it and
// exited", "rank 1 completed it and went on to AllReduce #43", ...
std::string CompletedClause(const std::vector<const Member*>& finished, const Communicator& communicator,
                            const JobView& job, std::uint64_t done_everywhere) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;  // what next, by whom; in rank order
  for (const Member* member : finished) {
    std::string next;
    switch (Locate(*member->process, job)) {
      case Whereabouts::kFinished: next = "exited"; break;
      case Whereabouts::kGone: next = "then vanished (presumed killed)"; break;
      default:
        if (const auto seq = WaitingIn(*member, communicator, done_everywhere)) {
          next = fmt::format("went on to {}", OpName(FindOpInCommunicator(communicator, *seq), *seq));
        } else if (!member->process->snapshot.in_nccl_call.empty()) {
          next = fmt::format("went on to {}", member->process->snapshot.in_nccl_call);
        } else {
          next = "went on outside NCCL";
        }
    }
    auto group = std::find_if(groups.begin(), groups.end(), [&](const auto& known) { return known.first == next; });
    if (group == groups.end()) {
      groups.emplace_back(next, std::vector<int>{member->rank});
    } else {
      group->second.push_back(member->rank);
    }
  }
  std::vector<std::string> clauses;
  for (const auto& [next, ranks] : groups) clauses.push_back(fmt::format("{} completed it and {}", Ranks(ranks), next));
  return absl::StrJoin(clauses, ", ");
}

// A mismatch at an earlier #N explains a stall: its verdict says where the ranks are now.
void NoteLaterStall(Buckets& buckets, const std::string& comm_id, const std::vector<int>& waiting_ranks,
                    const std::string& stuck, const std::string& completed) {
  for (Verdict& verdict : buckets[kMismatch]) {
    if (verdict.comm != comm_id || waiting_ranks.empty()) continue;
    verdict.message += fmt::format("; since then {} {} in {}{}", Ranks(waiting_ranks),
                                   waiting_ranks.size() == 1 ? "waits" : "wait", stuck,
                                   completed.empty() ? "" : fmt::format(": {}", completed));
    verdict.evidence["stalled_ranks"] = waiting_ranks;
  }
}

// Ranks that never entered the stuck operation, sorted into the dead and those that did not join.
struct Absentees {
  std::vector<int> dead_ranks;
  std::vector<std::string> dead_clauses;
  Json dead_evidence = Json::array();
  std::vector<int> not_joined_ranks;
  std::vector<std::string> not_joined_clauses;
  Json not_joined_evidence = Json::array();
  bool all_finished = true;  // every one that did not join finished its loop
};

void AddLateMember(const Member& member, const Communicator& communicator, const JobView& job,
                   std::uint64_t done_everywhere, std::uint64_t stuck_seq, Absentees& absent) {
  const ProcessView& process = *member.process;
  const Whereabouts where = Locate(process, job);
  if (where == Whereabouts::kGone) {
    absent.dead_ranks.push_back(member.rank);
    // Its last status may predate its death by a whole interval (or be the one written when its
    // communicator was created): its peers' completed symmetric collectives say how far it got.
    const std::uint64_t last = std::max(CompletedUpTo(*member.comm, done_everywhere), done_everywhere);
    absent.dead_clauses.push_back(fmt::format(
        "rank {} (pid {} on host {}) {}: it {} and never entered #{}", member.rank, process.pid, process.host,
        GoneHow(process, job),
        last == 0 ? std::string("issued nothing on this communicator")
                  : fmt::format("completed {}", OpName(FindOpInCommunicator(communicator, last), last)),
        stuck_seq));
    absent.dead_evidence.push_back(LateRankJson(member, where, job));
    return;
  }
  absent.all_finished = absent.all_finished && where == Whereabouts::kFinished;
  std::string clause = fmt::format("rank {} {}; ", member.rank, LastCompleted(member, communicator, done_everywhere));
  // Its peers wait in a communicator that it closed: it will never issue #N there.
  const std::string& state = member.comm->state;
  if (state == "destroyed" || state == "aborted" || state == "finalized" || state == "revoked") {
    clause += fmt::format("its communicator is {} (the application closed it); ", state);
  }
  switch (where) {
    case Whereabouts::kFinished: clause += "it finished its loop (exited normally)"; break;
    case Whereabouts::kInsideNccl:
      clause += fmt::format("it is inside {} (not in this operation)", process.snapshot.in_nccl_call);
      break;
    default: clause += "it is alive and busy outside NCCL (e.g. saving a checkpoint or evaluating)"; break;
  }
  absent.not_joined_ranks.push_back(member.rank);
  absent.not_joined_clauses.push_back(std::move(clause));
  absent.not_joined_evidence.push_back(LateRankJson(member, where, job));
}

// A rank with no record on the communicator: still initialising it (alive or dead), or silent.
void AddUnreportedRank(int rank, const Communicator& communicator, const JobView& job, std::uint64_t stuck_seq,
                       Absentees& absent) {
  absent.all_finished = false;
  const PendingInitSnapshot* init = nullptr;
  const ProcessView* initialising = InitialisingProcess(job, communicator.id, rank, &init);
  if (initialising != nullptr && IsGone(*initialising, job)) {
    absent.dead_ranks.push_back(rank);
    absent.dead_clauses.push_back(fmt::format("rank {} (pid {} on host {}) {}: it was still in {} for this "
                                              "communicator and never entered #{}",
                                              rank, initialising->pid, initialising->host,
                                              GoneHow(*initialising, job), init->api, stuck_seq));
    absent.dead_evidence.push_back(InitialisingJson(*initialising, *init, Whereabouts::kGone, job));
    return;
  }
  absent.not_joined_ranks.push_back(rank);
  if (initialising != nullptr) {
    absent.not_joined_clauses.push_back(fmt::format("rank {} is still in {} for this communicator", rank, init->api));
    absent.not_joined_evidence.push_back(InitialisingJson(*initialising, *init, Locate(*initialising, job), job));
    return;
  }
  // A closed communicator leaves its process's status file after one interval: the process may well
  // be alive, so "no status file" would be false.
  absent.not_joined_clauses.push_back(fmt::format(
      "rank {} left no record of this communicator (no status file or dump names it: its process left no "
      "trace, never created the communicator, or closed it)",
      rank));
  absent.not_joined_evidence.push_back(Json{{"rank", rank}, {"where", WhereaboutsName(Whereabouts::kNoReport)}});
}

void AddStuckInsideNccl(Buckets& buckets, const Communicator& communicator, std::uint64_t stuck_seq,
                        const OpSnapshot* stuck_op, const std::vector<int>& waiting_ranks, bool some_completed,
                        std::string where, Json evidence) {
  where += ": stuck inside NCCL, a transport fault (network, P2P or driver), not the application";
  // A collective that needs every rank's data completed on some ranks only: their transport
  // failed the others, or the ranks' calls went out of step before anything recorded shows.
  if (some_completed && Symmetric(stuck_op)) {
    where += fmt::format(", unless the ranks' calls went out of step (a desync) before the oldest operation "
                         "recorded: {} cannot complete on some ranks only",
                         stuck_op->op);
  }
  Add(buckets, kStuckInsideNccl, communicator.id, stuck_seq, waiting_ranks, std::move(where), std::move(evidence));
  if (const Json p2p = P2pEvidence(communicator); !p2p.is_null()) {
    AddP2pSuspect(buckets, communicator, stuck_seq, waiting_ranks, "stuck inside NCCL", p2p);
  }
}

// Where the communicator stands on the oldest operation some rank has not completed.
void ClassifyStuckOperation(const Communicator& communicator, const JobView& job,
                            std::optional<std::uint64_t> mismatch_seq, Buckets& buckets) {
  const std::uint64_t done_everywhere = HighestCompleted(communicator);
  std::uint64_t stuck_seq = std::numeric_limits<std::uint64_t>::max();
  for (const Member& member : communicator.members) {
    if (const auto oldest = WaitingIn(member, communicator, done_everywhere)) stuck_seq = std::min(stuck_seq, *oldest);
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
    if (WaitingIn(member, communicator, done_everywhere) != stuck_seq) {
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

  Absentees absent;
  for (const Member* member : late) AddLateMember(*member, communicator, job, done_everywhere, stuck_seq, absent);
  for (const int rank : unreported) AddUnreportedRank(rank, communicator, job, stuck_seq, absent);

  const std::vector<int> waiting_ranks = RanksOf(waiting);
  const std::vector<int> finished_ranks = RanksOf(finished);
  const std::string completed = CompletedClause(finished, communicator, job, done_everywhere);
  Json common{{"op", stuck_op != nullptr ? OpJson(*stuck_op) : Json(nullptr)},
              {"waiting_ranks", waiting_ranks},
              {"completed_ranks", finished_ranks},
              {"waited_seconds", waited_seconds}};
  if (!absent.dead_ranks.empty()) {
    Json evidence = common;
    evidence["dead_ranks"] = std::move(absent.dead_evidence);
    Add(buckets, kRankDead, communicator.id, stuck_seq, absent.dead_ranks,
        fmt::format("{}; the others wait in {} — {} killed or crashed (e.g. out of memory), not a network fault",
                    JoinClauses(absent.dead_clauses), stuck, absent.dead_ranks.size() == 1 ? "it was" : "they were"),
        std::move(evidence));
  }
  if (!absent.not_joined_ranks.empty()) {
    Json evidence = common;
    evidence["late_ranks"] = std::move(absent.not_joined_evidence);
    std::string others =
        fmt::format("{} {} in {}", Ranks(waiting_ranks), waiting_ranks.size() == 1 ? "waits" : "wait", stuck);
    if (!finished_ranks.empty()) others += fmt::format(" ({})", completed);
    Add(buckets, kRankNotJoined, communicator.id, stuck_seq, absent.not_joined_ranks,
        fmt::format("{} while {} — {}not a network fault", JoinClauses(absent.not_joined_clauses), others,
                    absent.all_finished ? "uneven data across ranks, " : ""),
        std::move(evidence));
  }
  // A desync explains the hang better than the transport.
  if (mismatch_seq && *mismatch_seq <= stuck_seq) {
    if (*mismatch_seq < stuck_seq) NoteLaterStall(buckets, communicator.id, waiting_ranks, stuck, completed);
    return;
  }
  if (!late.empty() || !unreported.empty()) return;
  const std::string where =
      finished.empty()
          ? fmt::format("all {} ranks entered {} and none has completed it", waiting.size(), stuck)
          : fmt::format("{} — {}, {} {} not", stuck, completed, Ranks(waiting_ranks), waiting.size() == 1 ? "has" : "have");
  AddStuckInsideNccl(buckets, communicator, stuck_seq, stuck_op, waiting_ranks, !finished.empty(),
                     fmt::format("{} (waiting {})", where, Seconds(waited_seconds)), std::move(common));
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

// Ranks whose process died inside a communicator initialisation (its last status still shows it
// there): dead, whoever else waits for that initialisation.
void AddDeadInInit(Buckets& buckets, const JobView& job, const std::string& comm_id, const std::string& api,
                   int nranks, const std::vector<std::pair<const ProcessView*, int>>& gone,
                   const std::set<int>& arrived) {
  std::vector<int> dead_ranks;
  std::vector<std::string> clauses;
  Json dead = Json::array();
  for (const auto& [process, rank] : gone) {
    dead_ranks.push_back(rank);
    clauses.push_back(fmt::format("rank {} (pid {} on host {}) {}: it died in {} for communicator {} ({} ranks)",
                                  rank, process->pid, process->host, GoneHow(*process, job), api, comm_id, nranks));
    dead.push_back(Json{{"rank", rank},
                        {"host", process->host},
                        {"pid", process->pid},
                        {"in_init", api},
                        {"where", WhereaboutsName(Whereabouts::kGone)},
                        {"status_age_seconds", StatusAgeSeconds(*process, job)}});
  }
  std::vector<int> waiting;
  for (const int rank : arrived) {
    if (std::find(dead_ranks.begin(), dead_ranks.end(), rank) == dead_ranks.end()) waiting.push_back(rank);
  }
  const std::string others =
      waiting.empty() ? std::string() : fmt::format("; {} wait for it", Ranks(waiting));
  Add(buckets, kRankDead, comm_id, 0, dead_ranks,
      fmt::format("{}{} — {} killed or crashed (e.g. out of memory), not a network fault", JoinClauses(clauses),
                  others, dead_ranks.size() == 1 ? "it was" : "they were"),
      Json{{"api", api}, {"nranks", nranks}, {"dead_ranks", std::move(dead)}, {"waiting_ranks", waiting}});
}

// The processes that died inside an initialisation while another process of it lived on (alive,
// or writing its status for several intervals more). When all of them stopped together, a
// launcher ended the whole job: that is no rank's death.
std::vector<std::pair<const ProcessView*, int>> DiedInInit(const JobView& job,
                                                           const std::vector<std::pair<const ProcessView*, int>>& pending,
                                                           const std::vector<const ProcessView*>& involved) {
  const auto stale_window_ns = static_cast<std::int64_t>(kStaleIntervals * job.status_interval_seconds * 1e9);
  std::vector<std::pair<const ProcessView*, int>> dead;
  for (const auto& [process, rank] : pending) {
    if (process->exited || !IsGone(*process, job)) continue;
    const bool outlived = std::any_of(involved.begin(), involved.end(), [&](const ProcessView* other) {
      return other != process && !other->exited &&
             (!IsGone(*other, job) || other->last_seen_ns > process->last_seen_ns + stale_window_ns);
    });
    if (outlived) dead.emplace_back(process, rank);
  }
  return dead;
}

void ClassifyStuckInits(const JobView& job, const std::vector<Communicator>& communicators, Buckets& buckets) {
  struct Init {
    std::string api;
    int nranks = 0;
    std::set<int> pending;
    double waited_seconds = 0;
    bool stall_reported = false;
    std::vector<std::pair<const ProcessView*, int>> processes;  // every process in it, and its rank
  };
  std::map<std::string, Init> inits;
  for (const ProcessView& process : job.processes) {
    for (const PendingInitSnapshot& pending : process.snapshot.pending_inits) {
      Init& init = inits[pending.comm_id];
      init.processes.emplace_back(&process, pending.rank);
      init.api = pending.api;
      init.nranks = std::max(init.nranks, pending.nranks);
      const double waited = static_cast<double>(process.snapshot.time_ns - pending.start_ns) / 1e9;
      if (waited <= job.status_interval_seconds) continue;
      init.pending.insert(pending.rank);
      init.waited_seconds = std::max(init.waited_seconds, waited);
      const auto& stall = process.snapshot.stall;
      init.stall_reported = init.stall_reported || (stall && stall->kind == "init" && stall->comm_id == pending.comm_id);
    }
  }
  for (const auto& [comm_id, init] : inits) {
    std::set<int> arrived = init.pending;
    std::vector<const ProcessView*> involved;
    for (const auto& [process, rank] : init.processes) involved.push_back(process);
    const auto communicator = std::lower_bound(communicators.begin(), communicators.end(), comm_id,
                                               [](const Communicator& c, const std::string& id) { return c.id < id; });
    if (communicator != communicators.end() && communicator->id == comm_id) {
      for (const Member& member : communicator->members) {
        arrived.insert(member.rank);
        involved.push_back(member.process);
      }
    }
    if (const auto dead = DiedInInit(job, init.processes, involved); !dead.empty()) {
      // The communicator's stuck operation may have named these ranks already.
      const bool named = std::any_of(buckets[kRankDead].begin(), buckets[kRankDead].end(),
                                     [&](const Verdict& verdict) { return verdict.comm == comm_id; });
      std::set<int> waiting = arrived;
      for (const auto& [process, rank] : init.processes) waiting.insert(rank);
      if (!named) AddDeadInInit(buckets, job, comm_id, init.api, init.nranks, dead, waiting);
      continue;
    }
    if (init.pending.empty()) continue;
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

// Calls that returned an error to the application: the first of each rank.
void ClassifyFailedCalls(const Communicator& communicator, Buckets& buckets) {
  std::vector<int> ranks;
  std::vector<std::string> clauses;
  Json calls = Json::array();
  for (const Member& member : communicator.members) {
    const auto& ring = member.comm->ring;
    const auto failed = std::find_if(ring.begin(), ring.end(), [](const OpSnapshot& op) { return op.state == "failed"; });
    if (failed == ring.end()) continue;
    const std::string result(ResultName(static_cast<ncclResult_t>(failed->result)));
    ranks.push_back(member.rank);
    clauses.push_back(fmt::format("rank {}'s {} returned {}", member.rank, DescribeOp(&*failed, failed->seq), result));
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
                     stall.kind == "not_started" ? "not started on the GPU" : "not completed", Seconds(stall.seconds));
}

// A stall or an error that a process recorded and that no verdict above explains is still named:
// a job in which anything went wrong is never healthy.
void ClassifyUnexplained(const JobView& job, Buckets& buckets) {
  std::set<std::string> explained_comms;
  for (size_t kind = 0; kind < kUnexplained; ++kind) {
    for (const Verdict& verdict : buckets[kind]) explained_comms.insert(verdict.comm);
  }
  const bool errors_explained = !buckets[kAsyncError].empty() || !buckets[kFailedCall].empty();
  for (const ProcessView& process : job.processes) {
    std::string what;
    const auto& stall = process.snapshot.stall;
    if (stall && !explained_comms.contains(stall->comm_id) && !StallResolved(*stall, process.snapshot)) {
      what = fmt::format("reported a stall of {}", DescribeStall(*stall));
    } else if (!errors_explained && (process.dump_reason == "async_error" || process.dump_reason == "error_return")) {
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
             {"stall", stall ? Json{{"kind", stall->kind}, {"comm_id", stall->comm_id}, {"seq", stall->seq},
                                    {"seconds", stall->seconds}}
                             : Json(nullptr)}});
  }
}

// Nothing to judge: no process left a file that could be read.
Verdict Unknown(const JobView& job) {
  std::string message = "the job directory holds no readable status file or dump";
  if (!job.problems.empty()) {
    message += fmt::format(" ({} could not be read; first: {})",
                           job.problems.size() == 1 ? std::string("1 file") : fmt::format("{} files", job.problems.size()),
                           job.problems.front());
  } else {
    message += ": no process of the job wrote there, or its files could not be written";
  }
  return Verdict{.kind = "unknown",
                 .comm = "",
                 .seq = 0,
                 .ranks = {},
                 .message = std::move(message),
                 .evidence = Json{{"problems", job.problems.size()}}};
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
  if (job.processes.empty()) return {Unknown(job)};
  const std::vector<Communicator> communicators = GroupByCommunicator(job);
  Buckets buckets;
  for (const Communicator& communicator : communicators) {
    ClassifyAsyncErrors(communicator, buckets);
    ClassifyFailedCalls(communicator, buckets);
    const std::optional<std::uint64_t> mismatch_seq = ClassifyMismatch(communicator, buckets);
    ClassifyStuckOperation(communicator, job, mismatch_seq, buckets);
    ClassifyStraggler(communicator, buckets);
  }
  ClassifyStuckInits(job, communicators, buckets);
  ClassifyUnexplained(job, buckets);
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
