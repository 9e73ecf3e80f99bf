// The classifier's own parts, shared by its files and by nothing outside diagnose/: communicators
// as the classifier sees them, how verdict messages describe operations and ranks, and the rules
// that Classify (classify.cc) runs, one family of verdict kinds per file:
//   rules_errors.cc    async_error, failed_call (also of initialisations), unexplained
//   rules_p2p.cc       p2p_suspect (evidence against P2P, from facts and known-bad entries)
//   rules_mismatch.cc  mismatch
//   rules_stuck.cc     rank_dead, rank_not_joined, stuck_inside_nccl (the oldest unfinished operation)
//   rules_link.cc      link_stalled (which link inside it, from NCCL's profiler)
//   rules_init.cc      stuck_in_init, rank_dead in an initialisation
//   rules_straggler.cc straggler
//   rules_pace.cc      slow_link, slow_rank (fail-slow, from the ranks' pace blocks)
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "watchdog/diagnose/verdicts.h"

namespace ncclguard::classifier {

using Json = nlohmann::json;

// Per-rank clauses in one message; the evidence lists every rank.
inline constexpr size_t kMaxClauses = 3;

// ---------------------------------------------------------------------------------------------
// Communicators as the classifier sees them (communicators.cc)

struct Member {
  const ProcessView* process;
  const CommSnapshot* comm;
  int rank;
};

struct Communicator {
  std::string id;
  int nranks = 0;
  std::vector<Member> members;  // by rank, one per rank
  // The ranks number its operations differently (pipeline stages send and receive different
  // counts): an #N names a different operation on each rank, so operations are matched as NCCL
  // matches them, a collective by its coll_seq and a Send to a peer with that peer's Recv.
  bool numbers_differ = false;
};

// Sorted by id; a rank seen twice (a pid of an earlier launch under the same job id) is its newest.
std::vector<Communicator> GroupByCommunicator(const JobView& job);
std::vector<int> RanksOf(const std::vector<const Member*>& members);
// The ranks below the communicator's size that no member holds.
std::vector<int> UnreportedRanks(const Communicator& communicator);

bool IsPointToPoint(const OpSnapshot& op);
const OpSnapshot* FindOp(const CommSnapshot& comm, std::uint64_t seq);
// The lowest seq this rank enqueued and has not completed.
std::optional<std::uint64_t> OldestUnfinished(const CommSnapshot& comm);

// As the rules judge the job: as it was at its end when every process ended together
// (JobView::ended_together_ns), else as it was read.
double StatusAgeSeconds(const ProcessView& process, const JobView& job);
bool IsGone(const ProcessView& process, const JobView& job);
// Whether the process was gone when the job was read: kill(pid, 0) said so on this host, or its
// status stopped changing more than a few intervals before.
bool GoneWhenRead(const ProcessView& process, const JobView& job);
// "is gone", or "stopped updating its status 12.0 s ago (presumed gone)".
std::string GoneHow(const ProcessView& process, const JobView& job);

enum class Whereabouts { kFinished, kGone, kInsideNccl, kBusyOutsideNccl, kStopped, kNoReport };
const char* WhereaboutsName(Whereabouts where);
Whereabouts Locate(const ProcessView& process, const JobView& job);

// ---------------------------------------------------------------------------------------------
// Describing operations and ranks (communicators.cc)

// "rank 3", "ranks 0,1,2", "ranks 0-1023".
std::string Ranks(const std::vector<int>& ranks);
// The same, cut short after a few ranges: "ranks 0-15,32-47,... (4096 ranks)".
std::string RanksBriefly(const std::vector<int>& ranks);
// What the verdicts rest on when some files of the job were not read: "this rests on 66380 of
// 131072 processes: the files of 64692 were not read (the deadline passed)"; "" when all were.
std::string PartOfJob(const JobView& job);
// The middle value of `values` (the upper middle of an even count); 0 when there is none.
double Median(std::vector<double> values);
// "AllReduce #42", or "#42" when the operation is unknown.
std::string OpName(const OpSnapshot* op, std::uint64_t seq);
// "AllReduce #42 (float32 × 1024, sum)".
std::string DescribeOp(const OpSnapshot* op, std::uint64_t seq);
Json OpJson(const OpSnapshot& op);
std::string Seconds(double seconds);
// The first kMaxClauses clauses, then "and N more".
std::string JoinClauses(const std::vector<std::string>& clauses);

// ---------------------------------------------------------------------------------------------
// The verdicts found so far, by kind, in the order Classify lists them

// The rules name the kinds they find, kAsyncError to kSlowRank.
using enum VerdictKind;

class Buckets {
 public:
  std::vector<Verdict>& operator[](VerdictKind kind) { return by_kind_[static_cast<size_t>(kind)]; }
  // Every verdict, in the order of their kinds.
  std::vector<Verdict> TakeAll();

 private:
  // healthy is no rule's: Classify gives it when the rules find nothing. unknown is a rule's only
  // where what it would name may be in the files that were not read.
  std::array<std::vector<Verdict>, static_cast<size_t>(kUnknown) + 1> by_kind_;
};

Verdict& Add(Buckets& buckets, VerdictKind kind, std::string comm, std::uint64_t seq, std::vector<int> ranks,
             std::string message, Json evidence);

// ---------------------------------------------------------------------------------------------
// The rules

void ClassifyAsyncErrors(const Communicator& communicator, const std::vector<KnownBadEntry>& known_bad,
                         Buckets& buckets);
// Calls that returned an error to the application: the first of each rank.
void ClassifyFailedCalls(const Communicator& communicator, Buckets& buckets);
// Communicator initialisations that returned an error (ProcessView::failed_inits), one verdict per
// communicator; every rank's alike when NCCL refused it everywhere.
void ClassifyFailedInits(const JobView& job, Buckets& buckets);
// A stall or an error that a process recorded and that no verdict above explains.
void ClassifyUnexplained(const JobView& job, Buckets& buckets);

// A p2p_suspect verdict on `what` ("stuck inside NCCL") when the communicator's ranks share a host
// and their facts match `known_bad` or NCCL warned about P2P.
void AddP2pSuspectIfAny(Buckets& buckets, const Communicator& communicator,
                        const std::vector<KnownBadEntry>& known_bad, std::uint64_t seq,
                        const std::vector<int>& ranks, const std::string& what);

// The first seq at which the ranks' calls differ, when they do.
std::optional<std::uint64_t> ClassifyMismatch(const Communicator& communicator, Buckets& buckets);

// Where the communicator stands on the oldest operation some rank has not completed.
void ClassifyStuckOperation(const Communicator& communicator, const JobView& job,
                            const std::vector<KnownBadEntry>& known_bad,
                            std::optional<std::uint64_t> mismatch_seq, Buckets& buckets);

// Every rank inside `stuck_seq`: a link_stalled verdict when NCCL's profiler shows the link that
// stopped (true), else nothing. `evidence` is the stuck operation's.
bool ClassifyStoppedLink(Buckets& buckets, const Communicator& communicator, std::uint64_t stuck_seq,
                         const OpSnapshot* stuck_op, const std::vector<int>& waiting_ranks, Json evidence);
// What NCCL's profiler shows without a link to name: the kernel channels that never stopped, as
// a clause for stuck_inside_nccl's message ("" when it shows nothing).
std::string KernelChannelsNote(const Communicator& communicator);

// Ranks that never entered the operation others wait in (or are stopped in it), sorted into the
// dead and those that did not join (rules_stuck.cc).
struct Absentees {
  std::vector<int> dead_ranks;
  std::vector<std::string> dead_clauses;
  Json dead_evidence = Json::array();
  std::vector<int> not_joined_ranks;
  std::vector<std::string> not_joined_clauses;
  Json not_joined_evidence = Json::array();
  bool all_finished = true;  // every one that did not join finished its loop
  // Every one that did not join is alive and busy outside NCCL, or stopped: each comes back to NCCL
  // by itself (once continued), so waiting for it is worth more than acting.
  bool all_busy_outside_nccl = true;
  // Ranks with no record among the processes read while some processes' files were not read:
  // neither present nor absent, never named as missing.
  std::vector<int> not_read_ranks;
};

// One rank that others wait for: where it is, a clause saying so and its evidence.
struct LateRank {
  const Member* member;
  Whereabouts where;
  std::string clause;
  Json evidence;
};
// `missed` names what it never entered ("#12"); `done_everywhere` is the highest seq every rank
// went through (0 when not known).
LateRank DescribeLateRank(const Member& member, const Communicator& communicator, const JobView& job,
                          std::uint64_t done_everywhere, std::string_view missed);
void AddLateRank(LateRank late, Absentees& absent);
// rank_dead and rank_not_joined for the absent ranks and, when only ranks not read may be absent,
// unknown; false when it adds none. `others` says who waits in what ("ranks 0,2 wait in AllReduce
// #8 (...)"), `dead_others` the same for the dead ("the others wait in AllReduce #8 (...)").
bool AddAbsentVerdicts(Buckets& buckets, const std::string& comm_id, std::uint64_t seq, Absentees absent,
                       const std::string& others, const std::string& dead_others, Json common);

// Where the ranks of a communicator whose numbers differ wait, and for whom (rules_waits.cc):
// rank_dead or rank_not_joined for the ranks outside NCCL they wait for, stuck_inside_nccl when
// both sides of every awaited operation are inside it, mismatch when they wait for each other.
void ClassifyWaits(const Communicator& communicator, const JobView& job, bool mismatch_found,
                   Buckets& buckets);

void ClassifyStuckInits(const JobView& job, const std::vector<Communicator>& communicators, Buckets& buckets);

void ClassifyStraggler(const Communicator& communicator, Buckets& buckets);

// slow_link and slow_rank, from the ranks' pace blocks.
void ClassifyPace(const Communicator& communicator, Buckets& buckets);

}  // namespace ncclguard::classifier
