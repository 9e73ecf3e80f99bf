// Where a communicator stands on the oldest operation some rank has not completed: ranks that
// never entered it (rank_dead, rank_not_joined), or every rank inside it (stuck_inside_nccl).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "absl/strings/str_join.h"
#include "watchdog/diagnose/known_bad.h"
#include "watchdog/diagnose/op_states.h"
#include "watchdog/diagnose/rules.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/job_read.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/report/whereabouts.h"
#include "watchdog/state/records.h"

namespace ncclguard::classifier {
namespace {

// Frames of a late rank's stack shown in a verdict's evidence, per kind (Python, native).
constexpr std::size_t kEvidenceFrames = 24;

Json LocationJson(const ThreadLocation& location) {
  const ThreadSnapshot& thread = *location.thread;
  Json stack = Json::array();
  for (const auto& [frames, python] : {std::pair{&thread.python, true}, std::pair{&thread.native, false}}) {
    for (std::size_t i = 0; i < frames->size() && i < kEvidenceFrames; ++i)
      stack.push_back(fmt::format("{}{}", python ? "py " : "", FrameText((*frames)[i], python)));
  }
  Json json{{"sentence", location.sentence},
            {"tid", thread.tid},
            {"thread_name", thread.name},
            {"waiting", location.waiting},
            {"syscall", thread.syscall},
            {"fd_target", thread.fd_target},
            {"blocked_seconds", thread.blocked_seconds},
            {"stack", std::move(stack)}};
  if (location.frame != nullptr) {
    json["function"] = location.frame->function;
    json["file"] = location.frame->file;
    json["line"] = location.frame->line;
    json["python"] = location.python;
  }
  return json;
}

// Where a rank that did not join is, from the stacks of its newest dump: only stacks taken after
// it left its last operation on this communicator say where it is now (its peers' dump requests
// make it write them); older ones say nothing of it.
std::optional<ThreadLocation> WhereIsLate(const Member& member, const JobView& job) {
  const ProcessSnapshot& snapshot = member.process->snapshot;
  if (!snapshot.threads) return std::nullopt;
  const OpSnapshot* last = FindOp(*member.comm, member.comm->last_enqueued);
  const std::int64_t left_nccl_ns = last != nullptr ? std::max(last->end_ns, last->enqueue_ns) : 0;
  if (snapshot.threads->time_ns < left_nccl_ns) return std::nullopt;
  return LocateProcess(*snapshot.threads, last != nullptr ? last->host_thread : 0, member.process->pid,
                       job.ended_together_ns.value_or(job.now_ns));
}

Json LateRankJson(const Member& member, Whereabouts where, const JobView& job) {
  Json late{{"rank", member.rank},
            {"host", member.process->host},
            {"pid", member.process->pid},
            {"last_enqueued", member.comm->last_enqueued},
            {"last_completed", member.comm->last_completed},
            {"where", WhereaboutsName(where)},
            {"in_nccl_call", member.process->snapshot.in_nccl_call},
            {"status_age_seconds", StatusAgeSeconds(*member.process, job)}};
  if (const std::optional<ThreadLocation> location = WhereIsLate(member, job))
    late["location"] = LocationJson(*location);
  return late;
}

// A process whose initialisation of a communicator had not returned when it last wrote its
// status: its rank is not a member yet, but it is not unaccounted for either.
struct Initialising {
  const ProcessView* process;
  const PendingInitSnapshot* init;
};

// The processes initialising `comm_id`, by rank; the first of each rank.
std::unordered_map<int, Initialising> InitialisingProcesses(const JobView& job, const std::string& comm_id) {
  std::unordered_map<int, Initialising> by_rank;
  for (const ProcessView& process : job.processes) {
    for (const PendingInitSnapshot& pending : process.snapshot.pending_inits) {
      if (pending.comm_id == comm_id) by_rank.try_emplace(pending.rank, Initialising{&process, &pending});
    }
  }
  return by_rank;
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

// The operation #seq as any rank recorded it: every rank numbers the communicator's operations alike.
const OpSnapshot* FindOpInCommunicator(const Communicator& communicator, std::uint64_t seq) {
  const OpSnapshot* found = nullptr;
  for (const Member& member : communicator.members) {
    const OpSnapshot* op = FindOp(*member.comm, seq);
    if (op != nullptr && (found == nullptr || (found->dtype.empty() && !op->dtype.empty()))) found = op;
  }
  return found;
}

// Once any rank completed a symmetric collective #N, every rank went through it and everything
// before it: a rank's own record may lag (its last status was written while #N was in flight, or
// its watchdog had not looked yet), so nothing at or below that #N counts as unfinished.
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
    if (Unfinished(op) && op.seq > done_everywhere) return op.seq;
  }
  const std::uint64_t completed = CompletedUpTo(comm, done_everywhere);
  if (comm.last_enqueued > completed) return completed + 1;
  return std::nullopt;
}

// The member's own record of its #seq, else any rank's when their numbers agree.
const OpSnapshot* OwnOrPeersOp(const Member& member, const Communicator& communicator, std::uint64_t seq) {
  const OpSnapshot* own = FindOp(*member.comm, seq);
  if (own != nullptr || communicator.numbers_differ) return own;
  return FindOpInCommunicator(communicator, seq);
}

std::string LastCompleted(const Member& member, const Communicator& communicator,
                          std::uint64_t done_everywhere) {
  const std::uint64_t last = CompletedUpTo(*member.comm, done_everywhere);
  if (last == 0) return "issued nothing on this communicator";
  return fmt::format("completed {} and issued nothing after",
                     OpName(OwnOrPeersOp(member, communicator, last), last));
}

// The #N this member's own watchdog reported stalled on this communicator, when the member has
// not completed it since. Authoritative for that rank, whatever its peers completed: a rank can
// wait in a collective its peers finished when their calls went out of step.
std::optional<std::uint64_t> ReportedStall(const Member& member, const Communicator& communicator) {
  const std::optional<StallSnapshot>& stall = member.process->snapshot.stall;
  if (!stall || stall->kind == "init" || stall->comm_id != communicator.id) return std::nullopt;
  if (stall->seq <= member.comm->last_completed || stall->seq > member.comm->last_enqueued)
    return std::nullopt;
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

// What the ranks that completed the stuck operation did next: "ranks 0,1,3 completed it and
// exited", "rank 1 completed it and went on to AllReduce #43", ...
std::string CompletedClause(const std::vector<const Member*>& finished, const Communicator& communicator,
                            const JobView& job, std::uint64_t done_everywhere) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;  // what next, by whom; in rank order
  for (const Member* member : finished) {
    std::string next;
    switch (Locate(*member->process, job)) {
      case Whereabouts::kFinished:
        next = member->process->exited ? "exited" : "closed its communicators and ended";
        break;
      case Whereabouts::kGone:
        next = "then vanished (presumed killed)";
        break;
      default:
        if (const auto seq = WaitingIn(*member, communicator, done_everywhere)) {
          next = fmt::format("went on to {}", OpName(FindOpInCommunicator(communicator, *seq), *seq));
        } else if (!member->process->snapshot.in_nccl_call.empty()) {
          next = fmt::format("went on to {}", member->process->snapshot.in_nccl_call);
        } else {
          next = "went on outside NCCL";
        }
    }
    auto group =
        std::find_if(groups.begin(), groups.end(), [&](const auto& known) { return known.first == next; });
    if (group == groups.end()) {
      groups.emplace_back(next, std::vector<int>{member->rank});
    } else {
      group->second.push_back(member->rank);
    }
  }
  std::vector<std::string> clauses;
  clauses.reserve(groups.size());
  for (const auto& [next, ranks] : groups)
    clauses.push_back(fmt::format("{} completed it and {}", Ranks(ranks), next));
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

bool ComesBack(Whereabouts where) {
  return where == Whereabouts::kBusyOutsideNccl || where == Whereabouts::kStopped;
}

// A late rank whose process is stopped: its last status is as old as the stop, so what it says the
// rank did is where the rank stopped, not what it is busy with.
std::string StoppedClause(const Member& member, const Communicator& communicator, const JobView& job,
                          std::uint64_t done_everywhere) {
  const ProcessView& process = *member.process;
  std::string was;
  if (const std::optional<std::uint64_t> seq = WaitingIn(member, communicator, done_everywhere)) {
    was = fmt::format("was in {}", OpName(OwnOrPeersOp(member, communicator, *seq), *seq));
  } else if (!process.snapshot.in_nccl_call.empty()) {
    was = fmt::format("was inside {}", process.snapshot.in_nccl_call);
  } else {
    was = LastCompleted(member, communicator, done_everywhere);
  }
  const char* how = process.liveness == ProcessView::Liveness::kStopped
                        ? "is stopped (SIGSTOP, a debugger or a cgroup freezer: it runs nothing until it is "
                          "continued)"
                        : "has not run its watchdog for a while (stopped until just now, or starved)";
  return fmt::format("rank {} (pid {}) {}; its last status, {} old, says it {}", member.rank, process.pid,
                     how, Seconds(StatusAgeSeconds(process, job)), was);
}

}  // namespace

LateRank DescribeLateRank(const Member& member, const Communicator& communicator, const JobView& job,
                          std::uint64_t done_everywhere, std::string_view missed) {
  const ProcessView& process = *member.process;
  LateRank late{.member = &member, .where = Locate(process, job), .clause = {}, .evidence = {}};
  late.evidence = LateRankJson(member, late.where, job);
  if (late.where == Whereabouts::kGone) {
    // Its last status may predate its death by a whole interval (or be the one written when its
    // communicator was created): its peers' completed symmetric collectives say how far it got.
    const std::uint64_t last = std::max(CompletedUpTo(*member.comm, done_everywhere), done_everywhere);
    late.clause = fmt::format(
        "rank {} (pid {} on host {}) {}: it {} and never entered {}", member.rank, process.pid, process.host,
        GoneHow(process, job),
        last == 0 ? std::string("issued nothing on this communicator")
                  : fmt::format("completed {}", OpName(OwnOrPeersOp(member, communicator, last), last)),
        missed);
    if (const std::optional<ThreadLocation> location = WhereIsLate(member, job)) {
      late.clause += fmt::format(" (its last dump showed it {})", location->sentence);
    }
    return late;
  }
  if (late.where == Whereabouts::kStopped) {
    late.clause = StoppedClause(member, communicator, job, done_everywhere);
    return late;
  }
  late.clause =
      fmt::format("rank {} {}; ", member.rank, LastCompleted(member, communicator, done_everywhere));
  // Its peers wait in a communicator that it closed: it will never issue #N there.
  const std::optional<CommLifecycle> lifecycle = LifecycleOf(*member.comm);
  if (lifecycle == CommLifecycle::kDestroyed || lifecycle == CommLifecycle::kAborted ||
      lifecycle == CommLifecycle::kFinalized || lifecycle == CommLifecycle::kRevoked) {
    late.clause +=
        fmt::format("its communicator is {} (the application closed it); ", CommLifecycleName(*lifecycle));
  }
  switch (late.where) {
    case Whereabouts::kFinished:
      late.clause += process.exited
                         ? "it finished its loop (exited normally)"
                         : "it finished its loop (closed its communicators, then its process ended)";
      break;
    case Whereabouts::kInsideNccl:
      late.clause += fmt::format("it is inside {} (not in this operation)", process.snapshot.in_nccl_call);
      if (const std::optional<ThreadLocation> location = WhereIsLate(member, job))
        late.clause += fmt::format(": {}", location->sentence);
      break;
    default:
      if (const std::optional<ThreadLocation> location = WhereIsLate(member, job)) {
        late.clause += fmt::format("it is alive and busy outside NCCL: {}", location->sentence);
      } else {
        late.clause += "it is alive and busy outside NCCL (e.g. saving a checkpoint or evaluating)";
      }
      break;
  }
  return late;
}

void AddLateRank(LateRank late, Absentees& absent) {
  if (late.where == Whereabouts::kGone) {
    absent.dead_ranks.push_back(late.member->rank);
    absent.dead_clauses.push_back(std::move(late.clause));
    absent.dead_evidence.push_back(std::move(late.evidence));
    return;
  }
  absent.all_finished = absent.all_finished && late.where == Whereabouts::kFinished;
  absent.all_busy_outside_nccl = absent.all_busy_outside_nccl && ComesBack(late.where);
  absent.not_joined_ranks.push_back(late.member->rank);
  absent.not_joined_clauses.push_back(std::move(late.clause));
  absent.not_joined_evidence.push_back(std::move(late.evidence));
}

bool AddAbsentVerdicts(Buckets& buckets, const std::string& comm_id, std::uint64_t seq, Absentees absent,
                       const std::string& others, const std::string& dead_others, Json common) {
  const std::vector<int>& not_read = absent.not_read_ranks;
  const std::string not_read_ranks = fmt::format("{} {} not among the processes read", RanksBriefly(not_read),
                                                 not_read.size() == 1 ? "is" : "are");
  if (!not_read.empty()) common["not_read_ranks"] = not_read;
  if (!absent.dead_ranks.empty()) {
    Json evidence = common;
    evidence["dead_ranks"] = std::move(absent.dead_evidence);
    Add(buckets, kRankDead, comm_id, seq, absent.dead_ranks,
        fmt::format("{}; {} — {} killed or crashed (e.g. out of memory), not a network fault{}",
                    JoinClauses(absent.dead_clauses), dead_others,
                    absent.dead_ranks.size() == 1 ? "it was" : "they were",
                    not_read.empty() ? "" : fmt::format("; {} and may have ended too", not_read_ranks)),
        std::move(evidence));
  }
  if (!absent.not_joined_ranks.empty()) {
    Json evidence = common;
    evidence["late_ranks"] = std::move(absent.not_joined_evidence);
    Verdict& verdict =
        Add(buckets, kRankNotJoined, comm_id, seq, absent.not_joined_ranks,
            fmt::format("{} while {} — {}not a network fault{}", JoinClauses(absent.not_joined_clauses),
                        others, absent.all_finished && not_read.empty() ? "uneven data across ranks, " : "",
                        not_read.empty() ? "" : fmt::format("; {} and may be late too", not_read_ranks)),
            std::move(evidence));
    // Whether the ranks not read are alive is not known: waiting for them to come back is no safer.
    verdict.late_ranks_busy_outside_nccl = absent.all_busy_outside_nccl && not_read.empty();
  }
  if (!absent.dead_ranks.empty() || !absent.not_joined_ranks.empty()) return true;
  if (not_read.empty()) return false;
  Add(buckets, kUnknown, comm_id, seq, {},
      fmt::format("{}; {}, so which rank the others wait for is not known (read the job directory again "
                  "with more time: ncclguard analyze --deadline SECONDS)",
                  others, not_read_ranks),
      std::move(common));
  return true;
}

namespace {

// A rank with no record on the communicator: still initialising it (alive or dead), silent, or in
// the files that were not read.
void AddUnreportedRank(int rank, const std::unordered_map<int, Initialising>& initialising_ranks,
                       const JobView& job, std::uint64_t stuck_seq, Absentees& absent) {
  const auto found = initialising_ranks.find(rank);
  const ProcessView* initialising = found != initialising_ranks.end() ? found->second.process : nullptr;
  const PendingInitSnapshot* init = initialising != nullptr ? found->second.init : nullptr;
  if (initialising == nullptr && job.not_read.SomeProcessMissing()) {
    absent.not_read_ranks.push_back(rank);
    return;
  }
  absent.all_finished = false;
  if (initialising != nullptr && IsGone(*initialising, job)) {
    absent.dead_ranks.push_back(rank);
    absent.dead_clauses.push_back(fmt::format(
        "rank {} (pid {} on host {}) {}: it was still in {} for this "
        "communicator and never entered #{}",
        rank, initialising->pid, initialising->host, GoneHow(*initialising, job), init->api, stuck_seq));
    absent.dead_evidence.push_back(InitialisingJson(*initialising, *init, Whereabouts::kGone, job));
    return;
  }
  absent.not_joined_ranks.push_back(rank);
  if (initialising != nullptr) {
    absent.not_joined_clauses.push_back(
        fmt::format("rank {} is still in {} for this communicator", rank, init->api));
    const Whereabouts where = Locate(*initialising, job);
    absent.all_busy_outside_nccl = absent.all_busy_outside_nccl && ComesBack(where);
    absent.not_joined_evidence.push_back(InitialisingJson(*initialising, *init, where, job));
    return;
  }
  // A closed communicator leaves its process's status file after one interval: the process may well
  // be alive, so "no status file" would be false.
  absent.not_joined_clauses.push_back(fmt::format(
      "rank {} left no record of this communicator (no status file or dump names it: its process left no "
      "trace, never created the communicator, or closed it)",
      rank));
  absent.all_busy_outside_nccl = false;
  absent.not_joined_evidence.push_back(
      Json{{"rank", rank}, {"where", WhereaboutsName(Whereabouts::kNoReport)}});
}

void AddStuckInsideNccl(Buckets& buckets, const Communicator& communicator,
                        const std::vector<KnownBadEntry>& known_bad, std::uint64_t stuck_seq,
                        const OpSnapshot* stuck_op, const std::vector<int>& waiting_ranks,
                        bool some_completed, std::string where, Json evidence) {
  if (!some_completed &&
      ClassifyStoppedLink(buckets, communicator, stuck_seq, stuck_op, waiting_ranks, evidence)) {
    AddP2pSuspectIfAny(buckets, communicator, known_bad, stuck_seq, waiting_ranks, "stuck inside NCCL");
    return;
  }
  where += ": stuck inside NCCL, a transport fault (network, P2P or driver), not the application";
  where += KernelChannelsNote(communicator);
  // A collective that needs every rank's data completed on some ranks only: their transport
  // failed the others, or the ranks' calls went out of step before anything recorded shows.
  if (some_completed && Symmetric(stuck_op)) {
    where += fmt::format(
        ", unless the ranks' calls went out of step (a desync) before the oldest operation "
        "recorded: {} cannot complete on some ranks only",
        stuck_op->op);
  }
  Add(buckets, kStuckInsideNccl, communicator.id, stuck_seq, waiting_ranks, std::move(where),
      std::move(evidence));
  AddP2pSuspectIfAny(buckets, communicator, known_bad, stuck_seq, waiting_ranks, "stuck inside NCCL");
}

// The members of a communicator sorted by where they stand on its oldest operation that some
// rank has not completed.
struct StuckOperation {
  std::uint64_t seq = 0;
  const OpSnapshot* op = nullptr;       // the most complete record of it, null when none
  std::vector<const Member*> waiting;   // entered it and have not completed it
  std::vector<const Member*> finished;  // completed it
  std::vector<const Member*> late;      // never entered it, or stopped in it
  bool stall_reported = false;          // some member's watchdog reported a stall on the communicator
  double waited_seconds = 0;            // the longest any waiting member has waited in it
};

// Nothing when every member completed everything it issued.
std::optional<StuckOperation> FindStuckOperation(const Communicator& communicator, const JobView& job,
                                                 std::uint64_t done_everywhere) {
  StuckOperation stuck;
  stuck.seq = std::numeric_limits<std::uint64_t>::max();
  // Kept for the second pass: at 100,000 members, looking again costs as much as the pass.
  std::vector<std::optional<std::uint64_t>> waiting_in;
  waiting_in.reserve(communicator.members.size());
  for (const Member& member : communicator.members) {
    const std::optional<std::uint64_t> oldest =
        waiting_in.emplace_back(WaitingIn(member, communicator, done_everywhere));
    if (oldest) stuck.seq = std::min(stuck.seq, *oldest);
  }
  if (stuck.seq == std::numeric_limits<std::uint64_t>::max()) return std::nullopt;

  for (std::size_t index = 0; index < communicator.members.size(); ++index) {
    const Member& member = communicator.members[index];
    const ProcessSnapshot& snapshot = member.process->snapshot;
    stuck.stall_reported =
        stuck.stall_reported || (snapshot.stall && snapshot.stall->comm_id == communicator.id);
    if (member.comm->last_enqueued < stuck.seq) {
      stuck.late.push_back(&member);
      continue;
    }
    if (waiting_in[index] != stuck.seq) {
      stuck.finished.push_back(&member);
      continue;
    }
    // A stopped process takes part in nothing until it is continued: its peers wait for it, not
    // for the transport, whatever operation its status shows it in.
    if (Locate(*member.process, job) == Whereabouts::kStopped) {
      stuck.late.push_back(&member);
      continue;
    }
    stuck.waiting.push_back(&member);
    const OpSnapshot* op = FindOp(*member.comm, stuck.seq);
    if (op == nullptr) continue;
    if (stuck.op == nullptr || (stuck.op->dtype.empty() && !op->dtype.empty())) stuck.op = op;
    if (op->enqueue_ns > 0) {
      stuck.waited_seconds =
          std::max(stuck.waited_seconds, static_cast<double>(snapshot.time_ns - op->enqueue_ns) / 1e9);
    }
  }
  return stuck;
}

// rank_dead and rank_not_joined for the ranks that never entered the stuck operation.
// rank_dead and rank_not_joined for the ranks that never entered the stuck operation; when some
// ranks may be in files that were not read, they are said but not named, and without a rank to
// name the verdict is unknown.
void AddAbsentees(Buckets& buckets, const Communicator& communicator, const StuckOperation& stuck,
                  Absentees absent, const std::string& completed, Json common) {
  const std::string described = DescribeOp(stuck.op, stuck.seq);
  const std::vector<int> waiting_ranks = RanksOf(stuck.waiting);
  std::string others = fmt::format("{} {} in {}", Ranks(waiting_ranks),
                                   waiting_ranks.size() == 1 ? "waits" : "wait", described);
  if (!stuck.finished.empty()) others += fmt::format(" ({})", completed);
  AddAbsentVerdicts(buckets, communicator.id, stuck.seq, std::move(absent), others,
                    fmt::format("the others wait in {}", described), std::move(common));
}

}  // namespace

void ClassifyStuckOperation(const Communicator& communicator, const JobView& job,
                            const std::vector<KnownBadEntry>& known_bad,
                            std::optional<std::uint64_t> mismatch_seq, Buckets& buckets) {
  if (communicator.numbers_differ) {
    ClassifyWaits(communicator, job, mismatch_seq.has_value(), buckets);
    return;
  }
  const std::uint64_t done_everywhere = HighestCompleted(communicator);
  const std::optional<StuckOperation> found = FindStuckOperation(communicator, job, done_everywhere);
  if (!found) return;
  const StuckOperation& stuck = *found;
  // An operation in flight for less than a few status intervals is just the job running.
  if (!stuck.stall_reported && stuck.waited_seconds < kStaleIntervals * job.status_interval_seconds) return;
  const std::string described = DescribeOp(stuck.op, stuck.seq);
  const std::vector<int> unreported = UnreportedRanks(communicator);

  Absentees absent;
  for (const Member* member : stuck.late) {
    AddLateRank(DescribeLateRank(*member, communicator, job, done_everywhere, fmt::format("#{}", stuck.seq)),
                absent);
  }
  const std::unordered_map<int, Initialising> initialising =
      unreported.empty() ? std::unordered_map<int, Initialising>()
                         : InitialisingProcesses(job, communicator.id);
  for (const int rank : unreported) AddUnreportedRank(rank, initialising, job, stuck.seq, absent);

  const std::vector<int> waiting_ranks = RanksOf(stuck.waiting);
  const std::string completed = CompletedClause(stuck.finished, communicator, job, done_everywhere);
  Json common{{"op", stuck.op != nullptr ? OpJson(*stuck.op) : Json(nullptr)},
              {"waiting_ranks", waiting_ranks},
              {"completed_ranks", RanksOf(stuck.finished)},
              {"waited_seconds", stuck.waited_seconds}};
  AddAbsentees(buckets, communicator, stuck, std::move(absent), completed, common);
  // A desync explains the hang better than the transport.
  if (mismatch_seq && *mismatch_seq <= stuck.seq) {
    if (*mismatch_seq < stuck.seq)
      NoteLaterStall(buckets, communicator.id, waiting_ranks, described, completed);
    return;
  }
  if (!stuck.late.empty() || !unreported.empty()) return;
  const std::string where =
      stuck.finished.empty()
          ? fmt::format("all {} ranks entered {} and none has completed it", stuck.waiting.size(), described)
          : fmt::format("{} — {}, {} {} not", described, completed, Ranks(waiting_ranks),
                        stuck.waiting.size() == 1 ? "has" : "have");
  AddStuckInsideNccl(buckets, communicator, known_bad, stuck.seq, stuck.op, waiting_ranks,
                     !stuck.finished.empty(),
                     fmt::format("{} (waiting {})", where, Seconds(stuck.waited_seconds)), std::move(common));
}

}  // namespace ncclguard::classifier
