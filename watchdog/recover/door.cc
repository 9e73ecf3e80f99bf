#include "watchdog/recover/door.h"

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <thread>
#include <vector>

#include "watchdog/common/clock.h"
#include "watchdog/common/config.h"
#include "watchdog/common/in_process_recovery.h"
#include "watchdog/common/log.h"
#include "watchdog/common/nccl_api.h"
#include "watchdog/common/operation_arguments.h"
#include "watchdog/recover/comm_handle.h"
#include "watchdog/recover/handles.h"
#include "watchdog/recover/held_operations.h"
#include "watchdog/recover/probation.h"
#include "watchdog/report/facts.h"
#include "watchdog/state/records.h"

namespace ncclguard {
namespace {

// Every operation of the group under way on this thread, with what probation made of it: at the
// outermost end its held ones are issued together and the others on probation gated.
struct GroupedOperation {
  CommState* comm;
  std::uint64_t seq;
  ProbationOp* probation;  // on probation: gated at the outermost end
  bool held;               // held by ncclguard: NCCL has not seen it
};
// Touched only by grouped calls; freed when the thread ends.
thread_local std::vector<GroupedOperation> t_grouped;
// An operation of the group under way was held: the group's later ones are held too, so that
// ncclguard issues them together (NCCL needs a process's ranks of one clique in one group).
thread_local bool t_group_holds = false;

bool Launched(ncclResult_t result) { return result == ncclSuccess || result == ncclInProgress; }

// An operation that cannot be held (captured into a graph, untimed) but is issued while an earlier
// one is on probation goes to NCCL behind it on the same communicator: were that one replayed on a
// new communicator, this one would still run on the old one.
void MarkProbationUnsafe(CommState& comm) {
  for (ProbationOp& earlier : comm.TakenProbation()) {
    if (Unreleased(earlier)) {
      earlier.unsafe.store("an operation that cannot be held (captured into a graph) was queued behind it",
                           std::memory_order_release);
    }
  }
}

// Whether an earlier operation of `comm` is still on probation (held, in NCCL's hands, or being
// recovered): a new one then queues behind it.
bool BehindProbation(CommState& comm) {
  return std::ranges::any_of(comm.TakenProbation(), [](const ProbationOp& op) { return Unreleased(op); });
}

// Fills probation slot `op` with what a replay of the operation needs; an in-place input is copied
// now, on the stream, before the operation.
void DescribeForReplay(ProbationOp& op, const CommState& comm, std::uint64_t seq, Api api,
                       const OperationArguments& arguments, std::uint64_t group) {
  op.seq = seq;
  op.api = api;
  op.send = arguments.send;
  op.recv = arguments.recv;
  op.count = arguments.count;
  op.datatype = arguments.datatype;
  op.reduction = arguments.reduction;
  op.root_or_peer = arguments.root_or_peer;
  op.stream = arguments.stream;
  op.group = group;
  const std::size_t overwritten = OverwrittenInputBytes(op, comm.rank.load(std::memory_order_relaxed),
                                                        comm.nranks.load(std::memory_order_relaxed));
  if (overwritten > static_cast<std::size_t>(GetConfig().probation_max_bytes.value)) {
    op.unsafe.store("its input is its output, and larger than NCCLGUARD_PROBATION_MAX_BYTES",
                    std::memory_order_release);
  } else if (overwritten > 0 && !SaveInput(op, overwritten)) {
    op.unsafe.store("its input is its output, and could not be copied", std::memory_order_release);
  }
}

// The probation slot of operation `seq`, and whether it is held. Probation covers the first
// NCCLGUARD_PROBATION_OPS operations and every operation issued while an earlier one is still on
// probation; those are held (a non-blocking communicator's are always held: its call may answer
// ncclInProgress, before the operation is on the stream, and the issuing thread waits that out).
// Operations that cannot be held (captured into a graph, untimed) are never on probation.
InProcessRecovery::Claim TakeProbation(CommState& comm, std::uint64_t seq, Api api,
                                       const OperationArguments& arguments, std::uint64_t group,
                                       bool holdable) {
  if (comm.probation_limit == 0) return {};
  const bool behind = BehindProbation(comm);
  int taken = comm.probation_taken.load(std::memory_order_relaxed);
  const bool first_ops =
      taken < comm.probation_limit && !comm.probation_closed.load(std::memory_order_acquire);
  if (!holdable) {
    if (behind) MarkProbationUnsafe(comm);
    // Counted among the first operations all the same.
    if (first_ops) comm.probation_taken.store(taken + 1, std::memory_order_release);
    return {};
  }
  if (!first_ops && !behind) return {};
  if (taken >= kProbationSlots) {
    // Every slot is used and some are still queued: this one waits until they have drained, then
    // goes to NCCL as without probation.
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true))
      log::Warn("comm {}: more than {} operations queued on probation; the application waits", comm.id,
                kProbationSlots);
    while (BehindProbation(comm)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return {};
  }
  comm.probation_taken.store(taken + 1, std::memory_order_release);
  ProbationOp& op = comm.probation[taken];
  DescribeForReplay(op, comm, seq, api, arguments, group);
  const bool held = behind || comm.nonblocking || (group != 0 && t_group_holds);
  if (held && group != 0) t_group_holds = true;
  return {&op, held};
}

// At the outermost end of a group that NCCL launched: its operations on probation are gated, after
// every kernel of the group. A replay re-creates one communicator, with all of its ranks that this
// process drives: a group that also holds operations of another cannot be replayed whole.
void HoldGroupOnProbation(Api api, ncclResult_t result) {
  const bool launched = api == Api::ncclGroupEnd && result == ncclSuccess;
  const std::string_view first_id = t_grouped.empty() ? std::string_view() : t_grouped.front().comm->id;
  const bool one_comm =
      std::all_of(t_grouped.begin(), t_grouped.end(),
                  [first_id](const GroupedOperation& grouped) { return grouped.comm->id == first_id; });
  for (const GroupedOperation& grouped : t_grouped) {
    if (grouped.probation == nullptr || grouped.held || !launched) continue;
    if (!one_comm) {
      grouped.probation->unsafe.store("its group also holds operations of another communicator",
                                      std::memory_order_release);
    }
    if (!GateStream(*grouped.probation)) {
      log::Debug("comm {} #{} is not on probation: its stream could not be gated", grouped.comm->id,
                 grouped.seq);
    }
  }
}

// Waits, a bounded time, until no in-process recovery is under way (g_recoveries_under_way), unless
// this thread is the one recovering.
void WaitForRecoveries() noexcept {
  if (OnRecoveringThread()) return;
  // A recovery ends within its deadlines (the meeting, the new communicator, the replay); this
  // bound only keeps a thread from waiting for ever on one that went wrong.
  constexpr std::int64_t kLongestWaitNs = 600'000'000'000;
  const std::int64_t give_up = SteadyNowNs() + kLongestWaitNs;
  while (g_recoveries_under_way.load(std::memory_order_seq_cst) > 0 && SteadyNowNs() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

class Door final : public InProcessRecovery {
 public:
  ncclComm_t Resolve(ncclComm_t comm, int* slot) noexcept override {
    // While a recovery re-points handles, calls that name a communicator wait for it.
    if (g_recoveries_under_way.load(std::memory_order_relaxed) > 0) WaitForRecoveries();
    return ResolveComm(comm, slot);
  }

  Claim OnOperation(CommState& comm, std::uint64_t seq, Api api, const OperationArguments& arguments,
                    std::uint64_t group, bool holdable) noexcept override {
    Claim claim = TakeProbation(comm, seq, api, arguments, group, holdable);
    const bool grouped = group != 0;
    if (claim.held && !HoldOperation(comm, *claim.probation, grouped)) {
      // The driver refused to hold it: it goes to NCCL once what is queued before it has, or,
      // inside a group whose earlier operations are held until its end, now, and those cannot be
      // replayed.
      if (grouped) {
        MarkProbationUnsafe(comm);
      } else {
        AwaitHeldIssued(comm);
      }
      claim.held = false;
    }
    if (grouped) t_grouped.push_back({&comm, seq, claim.probation, claim.held});
    return claim;
  }

  void AfterLaunch(const CommState& comm, std::uint64_t seq, ProbationOp& probation,
                   ncclResult_t result) noexcept override {
    // Queued on the stream (ncclInProgress: not yet, so the gate could come before it): gated.
    if (result == ncclSuccess && !GateStream(probation))
      log::Debug("comm {} #{} is not on probation: its stream could not be gated", comm.id, seq);
  }

  void AtGroupEnd(Api api, ncclResult_t result) noexcept override {
    t_group_holds = false;
    for (const GroupedOperation& grouped : t_grouped) {
      if (!grouped.held) continue;
      // Issued by ncclguard, as one group, once the group has ended; never when it did not run.
      if (api == Api::ncclGroupEnd && Launched(result)) {
        ReleaseHeldGroupMember(*grouped.probation);
      } else {
        DropHeld(*grouped.comm, *grouped.probation);
      }
    }
    // After the end events: a gate queued before them would hold them back, and a replay waits
    // for them to be reached.
    HoldGroupOnProbation(api, result);
    t_grouped.clear();
  }

  void BeforeClosing(CommState& comm, Api api) noexcept override {
    // Destroy, finalize, split and shrink wait for what ncclguard holds; an abort drops it.
    if (api != Api::ncclCommAbort) AwaitHeldIssued(comm);
  }

  void Closing(CommState& comm, Api api) noexcept override {
    while (comm.issuer_in_call.load(std::memory_order_seq_cst)) std::this_thread::yield();
    if (api == Api::ncclCommAbort) {
      for (ProbationOp& op : comm.TakenProbation()) DropHeld(comm, op);
    }
  }

  int CreationSlot() noexcept override { return ::ncclguard::CreationSlot(); }

  // None of the first operations go on probation unless in-process recovery could help them: a
  // driver that can hold a stream, P2P left to NCCL (a recovery turns it off; a user's own setting
  // wins) and not already a communicator of the private instance, whose P2P is off.
  int ProbationLimit(int library) noexcept override {
    if (library == ::ncclguard::CreationSlot() || !ProbationAvailable()) return 0;
    for (const char* name : kNcclP2pVariables) {
      if (std::getenv(name) != nullptr) return 0;
    }
    return static_cast<int>(std::min<long>(GetConfig().probation_ops.value, kMaxProbationOps));
  }

  // NCCL wrote the communicators at call time, even inside a group or for a creation still in
  // progress, so they are replaced before the call returns.
  void HandOutHandles(int library, ncclComm_t* comms, int count) noexcept override {
    for (int i = 0; i < count; ++i) {
      if (comms[i] == nullptr) continue;  // e.g. ncclCommSplit with NCCL_SPLIT_NOCOLOR
      if (CommHandle* handle = NewCommHandle(comms[i], library))
        comms[i] = reinterpret_cast<ncclComm_t>(handle);
    }
  }
};

constinit Door g_door;

}  // namespace

InProcessRecovery& InProcessDoor() noexcept { return g_door; }

}  // namespace ncclguard
