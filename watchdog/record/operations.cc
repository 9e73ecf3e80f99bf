// What each intercepted call means for the records (the entry points of hooks.h that name an
// operation, a group or a creation): an operation claims a slot of its communicator's ring and is
// timed by NCCL's profiler or a pair of GPU events; a group defers launches to its outermost end; a
// creation registers communicators. The other calls on a communicator are comm_calls.cc's; hooks.cc
// starts ncclguard and logs calls. The door's functions for operations and groups are here, with
// what they call, so that each crosses no further call of its own.
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "watchdog/common/clock.h"
#include "watchdog/common/config.h"
#include "watchdog/common/in_process_recovery.h"
#include "watchdog/common/log.h"
#include "watchdog/common/nccl_api.h"
#include "watchdog/common/operation_arguments.h"
#include "watchdog/detect/runtime.h"
#include "watchdog/record/call_outcomes.h"
#include "watchdog/record/hooks.h"
#include "watchdog/record/thread_calls.h"
#include "watchdog/state/gpu_events.h"
#include "watchdog/state/records.h"
#include "watchdog/state/registration.h"
#include "watchdog/state/registry.h"

namespace ncclguard {
namespace {

using record::Creations;
using record::Grouped;
using record::GroupedCreation;
using record::GroupedOperation;
using record::Launched;
using record::NoteFailedCall;
using record::ThisThread;
using record::ThreadCalls;
using record::ThreadId;

std::atomic<std::uint64_t> g_next_group_id{1};

// A slot's profiler counters, before its state publishes the operation.
void ResetProfiled(OpRecord& op, bool profiled) {
  op.profiled.store(profiled, std::memory_order_relaxed);
  op.profile_linked.store(false, std::memory_order_relaxed);
  op.channels_expected.store(0, std::memory_order_relaxed);
  op.channels_started.store(0, std::memory_order_relaxed);
  op.channels_stopped.store(0, std::memory_order_relaxed);
  op.gpu_start_ns.store(0, std::memory_order_relaxed);
  op.gpu_stop_ns.store(0, std::memory_order_relaxed);
}

void RecordStart(OpRecord& op) {
  op.start_recorded.store(
      DriverEvents().Record(op.start_event,
                            reinterpret_cast<GpuStream>(op.stream.load(std::memory_order_relaxed))),
      std::memory_order_release);
}

void RecordEnd(OpRecord& op) {
  op.end_recorded.store(DriverEvents().Record(op.end_event, reinterpret_cast<GpuStream>(
                                                                op.stream.load(std::memory_order_relaxed))),
                        std::memory_order_release);
}

// After NCCL took (or refused) the launch of an operation.
void FinishLaunch(CommState& comm, std::uint64_t seq, ncclResult_t result) {
  OpRecord& op = comm.Slot(seq);
  if (op.seq.load(std::memory_order_relaxed) != seq) return;
  op.result.store(result, std::memory_order_relaxed);
  const OpState state = op.state.load(std::memory_order_acquire);
  if (!Launched(result)) {
    op.state.store(OpState::kFailed, std::memory_order_release);
    NoteFailedCall(op.api.load(std::memory_order_relaxed), &comm, result);
    return;
  }
  // The watchdog may already have seen the GPU reach the start event (kStarted) while NCCL was
  // still returning: the end event is owed in both states. Captured or untimed: nothing to record.
  if (state != OpState::kEnqueued && state != OpState::kStarted) return;
  const bool profiled = op.profiled.load(std::memory_order_relaxed);
  if (result == ncclInProgress) {
    // Until the watchdog hears otherwise from ncclCommGetAsyncError, the launch is in progress.
    RecordAsyncError(comm, ncclInProgress);
    // NCCL's profiler tells when its kernels run, whichever thread launches them.
    if (!profiled) op.launch_pending.store(true, std::memory_order_release);
  } else if (!profiled) {
    RecordEnd(op);
  }
}

// Whether NCCL's profiler times a call's kernels (NCCL 2.28 enqueue.cc): a collective unless it is
// empty (taskAppend drops it); a Send or Recv unless to itself (no proxy operation, hence no
// kernel channel event: scheduleP2pTasksToPlan's selfSend). AllToAll, Gather and Scatter include
// a transfer to the rank itself. A one-rank communicator is timed by CUDA events altogether.
bool NcclProfiles(Api api, const OperationArguments& arguments, int rank) {
  switch (api) {
    case Api::ncclSend:
    case Api::ncclRecv:
      return arguments.root_or_peer != rank;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 3)
    case Api::ncclAlltoAll:
    case Api::ncclGather:
    case Api::ncclScatter:
      return false;
#endif
    default:
      return arguments.count > 0;
  }
}

// The state an operation starts in, its slot's events created on first use where it needs them.
OpState InitialState(OpRecord& op, GpuStream stream, bool profiled) {
  // No driver call with the profiler: NCCL's API event says whether the stream is captured.
  if (profiled) return OpState::kEnqueued;
  GpuEvents& events = DriverEvents();
  if (!events.Available()) return OpState::kUntimed;
  if (events.IsCapturing(stream)) return OpState::kCaptured;  // a record would be captured into the graph
  if (op.start_event == nullptr) op.start_event = events.Create();
  if (op.end_event == nullptr) op.end_event = events.Create();
  return op.start_event != nullptr && op.end_event != nullptr ? OpState::kEnqueued : OpState::kUntimed;
}

// After the call: an operation to be timed by the profiler that NCCL sent no API event for (a
// call NCCL times no kernel of) is never told started or completed; it is left untimed rather
// than reported as a stall.
void UntimedUnlessProfiled(CommState& comm, std::uint64_t seq) {
  OpRecord& op = comm.Slot(seq);
  if (op.seq.load(std::memory_order_relaxed) != seq || !op.profiled.load(std::memory_order_relaxed) ||
      op.profile_linked.load(std::memory_order_acquire)) {
    return;
  }
  OpState enqueued = OpState::kEnqueued;
  op.state.compare_exchange_strong(enqueued, OpState::kUntimed, std::memory_order_acq_rel);
}

// The ring wrapped onto an operation the watchdog has not seen finish yet (it polls only every
// NCCLGUARD_POLL_INTERVAL): ask the GPU directly, so a fast loop of collectives is not limited
// to a ring per poll interval. The watchdog's own transitions are compare-and-swaps too.
// A profiled one needs no driver call: its channels' stops are counted in the record. Once the
// GPU says it has not reached one, it is asked again only kReclaimQueryEvery operations later:
// a burst queued behind a slow or held GPU costs the application's thread one query per that
// many operations, not one each (those find no slot: `dropped` counts them).
constexpr std::uint64_t kReclaimQueryEvery = 64;

void ReclaimIfFinished(CommState& comm, OpRecord& op, std::uint64_t claiming) {
  OpState state = op.state.load(std::memory_order_acquire);
  if (state != OpState::kEnqueued && state != OpState::kStarted) return;
  if (op.profiled.load(std::memory_order_relaxed)) {
    if (!ProfiledCompleted(op) || comm.cut_short.load(std::memory_order_seq_cst)) return;
    op.gpu_ms.store(ProfiledGpuMs(op), std::memory_order_relaxed);
  } else if (!op.end_recorded.load(std::memory_order_acquire) ||
             claiming < comm.reclaim_query_from.load(std::memory_order_relaxed)) {
    return;
  } else if (DriverEvents().Query(comm.context, op.end_event) != EventStatus::kReached) {
    comm.reclaim_query_from.store(claiming + kReclaimQueryEvery, std::memory_order_relaxed);
    return;
  }
  const std::int64_t now = SteadyNowNs();
  if (op.start_ns.load(std::memory_order_relaxed) == 0) op.start_ns.store(now, std::memory_order_relaxed);
  op.end_ns.store(now, std::memory_order_relaxed);
  if (op.state.compare_exchange_strong(state, OpState::kCompleted, std::memory_order_acq_rel)) {
    const std::uint64_t seq = op.seq.load(std::memory_order_relaxed);
    std::uint64_t completed = comm.last_completed.load(std::memory_order_relaxed);
    while (completed < seq &&
           !comm.last_completed.compare_exchange_weak(completed, seq, std::memory_order_release)) {
    }
  }
}

// At the outermost end of a group: the communicators created in it exist now (ncclSuccess), are
// still being made (ncclInProgress, or a simulated end: completed once ncclCommGetAsyncError says
// so), or failed.
void FinishGroupedCreations(ThreadCalls& thread, Api api, ncclResult_t result) {
  if (thread.creations == nullptr || thread.creations->empty()) return;
  bool completed = false;
  for (const GroupedCreation& creation : *thread.creations) {
    GetRegistry().EndInit(creation.init_token);
    creation.comm->awaiting_group_end.store(false, std::memory_order_release);
    if (result == ncclSuccess && api == Api::ncclGroupEnd) {
      completed = CompleteRegistration(*creation.comm, SteadyNowNs()) || completed;
    } else if (!Launched(result)) {
      NoteFailedCall(api, creation.comm, result);
    }
  }
  thread.creations->clear();
  if (completed) WriteStatusAtInit();
}

// The records' side of an operation and a group call, inlined into the door's functions below.
[[gnu::always_inline]] inline Ticket ClaimOperation(Api api, const OperationArguments& arguments) noexcept {
  Ticket ticket;
  ticket.api = api;
  CommState* comm = GetRegistry().Find(arguments.comm);
  if (comm == nullptr) return ticket;
  ticket.comm = comm;
  if (comm->aborted_by_ncclguard.load(std::memory_order_acquire)) {
    ticket.forward = false;
    ticket.result = ncclInvalidUsage;
    log::Debug("{} on comm {} refused: ncclguard aborted the communicator", Describe(api).name, comm->id);
    return ticket;
  }
  // Every operation gets a number, recorded or not, so numbers agree across ranks.
  const std::uint64_t seq = comm->last_enqueued.load(std::memory_order_relaxed) + 1;
  std::uint64_t coll_seq = comm->collectives.load(std::memory_order_relaxed);
  if (Describe(api).kind == ApiKind::kCollective)
    comm->collectives.store(++coll_seq, std::memory_order_relaxed);
  OpRecord& op = comm->Slot(seq);
  if (!IsFinished(op.state.load(std::memory_order_acquire))) ReclaimIfFinished(*comm, op, seq);
  if (!IsFinished(op.state.load(std::memory_order_acquire))) {
    // A whole ring of unfinished operations: the oldest is still being watched, keep it.
    comm->dropped.fetch_add(1, std::memory_order_relaxed);
    comm->last_enqueued.store(seq, std::memory_order_release);
    return ticket;
  }
  op.api.store(api, std::memory_order_relaxed);
  op.coll_seq.store(coll_seq, std::memory_order_relaxed);
  op.datatype.store(arguments.datatype, std::memory_order_relaxed);
  op.reduction.store(arguments.reduction, std::memory_order_relaxed);
  op.root_or_peer.store(arguments.root_or_peer, std::memory_order_relaxed);
  op.count.store(arguments.count, std::memory_order_relaxed);
  op.stream.store(reinterpret_cast<std::uint64_t>(arguments.stream), std::memory_order_relaxed);
  ThreadCalls& thread = ThisThread();
  const bool grouped = thread.group_depth > 0;
  op.group.store(grouped ? thread.group_id : 0, std::memory_order_relaxed);
  op.host_thread.store(ThreadId(thread), std::memory_order_relaxed);
  op.enqueue_ns.store(SteadyNowNs(), std::memory_order_relaxed);
  op.start_ns.store(0, std::memory_order_relaxed);
  op.end_ns.store(0, std::memory_order_relaxed);
  op.gpu_ms.store(-1, std::memory_order_relaxed);
  op.result.store(ncclSuccess, std::memory_order_relaxed);
  op.start_recorded.store(false, std::memory_order_relaxed);
  op.end_recorded.store(false, std::memory_order_relaxed);
  op.launch_pending.store(false, std::memory_order_relaxed);
  const bool profiled = comm->timing.load(std::memory_order_relaxed) == TimingSource::kProfiler &&
                        NcclProfiles(api, arguments, comm->rank.load(std::memory_order_relaxed));
  ResetProfiled(op, profiled);

  const OpState initial = InitialState(op, arguments.stream, profiled);
  bool held = false;
  if (InProcessRecovery* recovery = InProcessRecoveryOn()) {
    const InProcessRecovery::Claim claim = recovery->OnOperation(
        *comm, seq, api, arguments, grouped ? thread.group_id : 0, initial == OpState::kEnqueued);
    ticket.probation = claim.probation;
    held = claim.held;
  }
  // A held operation's events are recorded by the thread that issues it, around the real call.
  if (initial == OpState::kEnqueued && !grouped && !held && !profiled) RecordStart(op);
  op.seq.store(seq, std::memory_order_relaxed);
  op.state.store(initial, std::memory_order_release);
  comm->last_enqueued.store(seq, std::memory_order_release);
  if (grouped && !held) Grouped(thread).push_back({comm, seq});
  ticket.seq = seq;
  ticket.grouped = grouped;
  if (held) {
    // NCCL does not see it now: ncclguard issues it, in order, once the earlier ones have passed.
    ticket.forward = false;
    ticket.result = ncclSuccess;
  }
  return ticket;
}

[[gnu::always_inline]] inline void FinishOperation(const Ticket& ticket, ncclResult_t result) noexcept {
  if (ticket.comm == nullptr || ticket.seq == 0) {
    if (ticket.comm != nullptr && !Launched(result)) NoteFailedCall(ticket.api, ticket.comm, result);
    return;
  }
  if (Launched(result)) UntimedUnlessProfiled(*ticket.comm, ticket.seq);
  if (ticket.grouped && Launched(result)) return;  // launched at the outermost ncclGroupEnd
  FinishLaunch(*ticket.comm, ticket.seq, result);
  // Set only under in-process recovery: the operation is on probation.
  if (ticket.probation != nullptr)
    InProcessRecoveryOn()->AfterLaunch(*ticket.comm, ticket.seq, *ticket.probation, result);
}

[[gnu::always_inline]] inline void EnterGroup(Api api) noexcept {
  ThreadCalls& thread = ThisThread();
  if (api == Api::ncclGroupStart) {
    if (thread.group_depth++ == 0) thread.group_id = g_next_group_id.fetch_add(1, std::memory_order_relaxed);
  } else if (thread.group_depth == 1 && api == Api::ncclGroupEnd) {
    // Events recorded now land before the group's kernels: nothing was launched yet.
    for (const GroupedOperation& grouped : Grouped(thread)) {
      OpRecord& op = grouped.comm->Slot(grouped.seq);
      if (op.seq.load(std::memory_order_relaxed) == grouped.seq &&
          !op.profiled.load(std::memory_order_relaxed) &&
          op.state.load(std::memory_order_acquire) == OpState::kEnqueued) {
        RecordStart(op);
      }
    }
  }
}

[[gnu::always_inline]] inline void LeaveGroup(Api api, ncclResult_t result) noexcept {
  ThreadCalls& thread = ThisThread();
  if (api == Api::ncclGroupStart) {
    if (result != ncclSuccess && thread.group_depth > 0) --thread.group_depth;
    return;
  }
  if (thread.group_depth == 0) return;
  --thread.group_depth;
  if (thread.group_depth > 0) return;  // not the outermost end
  FinishGroupedCreations(thread, api, result);
  std::vector<GroupedOperation>& operations = Grouped(thread);
  for (const GroupedOperation& grouped : operations) {
    if (api == Api::ncclGroupEnd) {
      FinishLaunch(*grouped.comm, grouped.seq, result);
    } else {  // ncclGroupSimulateEnd: the operations are estimated, never run
      OpRecord& op = grouped.comm->Slot(grouped.seq);
      op.state.store(OpState::kUntimed, std::memory_order_release);
    }
  }
  operations.clear();
  // After the end events: a gate queued before them would hold them back.
  if (InProcessRecovery* recovery = InProcessRecoveryOn()) recovery->AtGroupEnd(api, result);
}

}  // namespace

Ticket BeforeOperation(Api api, int library, const OperationArguments& arguments) noexcept {
  (void)library;
  return ClaimOperation(api, arguments);
}

void AfterOperation(const Ticket& ticket, ncclResult_t result) noexcept { FinishOperation(ticket, result); }

void BeforeGroupCall(Api api) noexcept { EnterGroup(api); }

void AfterGroupCall(Api api, ncclResult_t result) noexcept { LeaveGroup(api, result); }

Ticket BeforeCreation(Api api, const CreationArguments& arguments) noexcept {
  Ticket ticket;
  try {
    EnsureWatchdogStarted();
    PendingInit init;
    init.api = api;
    init.rank = arguments.rank;
    init.nranks = arguments.nranks;
    init.start_ns = SteadyNowNs();
    init.thread = ThreadId(ThisThread());
    if (arguments.unique_id != nullptr) {
      init.comm_id = CommIdFromUniqueId(*arguments.unique_id);
    } else if (CommState* parent = GetRegistry().Find(arguments.parent)) {
      // NCCL's calls on one communicator must not overlap: the held ones go first.
      if (InProcessRecovery* recovery = InProcessRecoveryOn()) recovery->BeforeClosing(*parent, api);
      ticket.comm = parent;
      const std::uint32_t ordinal = parent->children.fetch_add(1, std::memory_order_relaxed);
      init.comm_id =
          ChildCommId(parent->id, api == Api::ncclCommSplit ? "split" : "shrink", ordinal, arguments.color);
    } else {  // ncclCommInitAll: one process holds every rank
      static std::atomic<std::uint32_t> init_all_calls{0};
      init.comm_id = ChildCommId(std::to_string(getpid()), "initall",
                                 init_all_calls.fetch_add(1, std::memory_order_relaxed), 0);
    }
    // A split or shrink follows its parent's library.
    if (arguments.unique_id != nullptr || api == Api::ncclCommInitAll) {
      InProcessRecovery* recovery = InProcessRecoveryOn();
      ticket.slot = recovery != nullptr ? recovery->CreationSlot() : -1;
    }
    std::snprintf(ticket.comm_id, sizeof(ticket.comm_id), "%s", init.comm_id.c_str());
    ticket.start_ns = init.start_ns;
    ticket.config = arguments.config;
    ticket.init_token = GetRegistry().BeginInit(std::move(init));
  } catch (...) {
  }
  return ticket;
}

namespace {

// What a re-creation needs of the application's configuration: its ncclConfig_t (as much of it as
// the application's NCCL defines, read only when it carries NCCL's magic), or, for a split without
// one, its parent's, as NCCL does; and whether calls on it may answer ncclInProgress.
void KeepConfig(CommState& state, const ncclConfig_t* config, const CommState* parent) {
  constexpr unsigned kConfigMagic = 0xcafebeef;  // NCCL_CONFIG_INITIALIZER's
  if (config != nullptr && config->magic == kConfigMagic &&
      config->size >= offsetof(ncclConfig_t, blocking)) {
    state.config.present = true;
    std::memcpy(&state.config.config, config, std::min(config->size, sizeof(ncclConfig_t)));
    state.config.config.size = sizeof(ncclConfig_t);
    // Strings are the application's: copied, and pointed at again when the copy is used.
    if (config->size > offsetof(ncclConfig_t, netName) && config->netName != nullptr)
      state.config.net_name = config->netName;
    if (config->size > offsetof(ncclConfig_t, commName) && config->commName != nullptr)
      state.config.comm_name = config->commName;
    state.config.config.netName = nullptr;
    state.config.config.commName = nullptr;
  } else if (config == nullptr && parent != nullptr) {
    state.config = parent->config;
  }
  const char* blocking = std::getenv("NCCL_COMM_BLOCKING");
  const int configured = state.config.present ? state.config.config.blocking : NCCL_CONFIG_UNDEF_INT;
  state.nonblocking = configured != NCCL_CONFIG_UNDEF_INT
                          ? configured == 0
                          : blocking != nullptr && std::strcmp(blocking, "0") == 0;
}

void RegisterCreated(const Ticket& ticket, Api api, int library, ncclResult_t result, const ncclComm_t* comms,
                     int count) noexcept {
  try {
    Registry& registry = GetRegistry();
    // Inside a group NCCL only records the initialisation: it runs at the outermost ncclGroupEnd.
    const bool grouped = ThisThread().group_depth > 0 && Launched(result) && comms != nullptr;
    int init_token = ticket.init_token;  // ended with the first communicator registered
    if (!Launched(result) || comms == nullptr) {
      // Reported while the initialisation is still pending: the dump then names it (the job
      // directory itself is known from it when it was the process's first), and says that it
      // had not returned yet: the application has not been told.
      registry.FailInit(init_token, result);
      NoteFailedCall(api, ticket.comm, result);
      registry.EndInit(init_token);
      return;
    }
    // Ended below, once the communicator is registered: NCCL's profiler plugin, initialised by
    // NCCL's own thread for a non-blocking one, finds it as one or the other (profiler_plugin.cc).
    const std::int64_t now = SteadyNowNs();
    bool completed = false;
    for (int i = 0; i < count; ++i) {
      if (comms[i] == nullptr) continue;  // e.g. ncclCommSplit with NCCL_SPLIT_NOCOLOR
      CommState* comm = registry.Add(
          comms[i], library, static_cast<std::size_t>(GetConfig().ring_size.value), [&](CommState& state) {
            std::memcpy(state.id, ticket.comm_id, sizeof(state.id));
            if (ticket.comm != nullptr)
              std::memcpy(state.parent_id, ticket.comm->id, sizeof(state.parent_id));
            state.created_by = api;
            state.init_start_ns = ticket.start_ns;
            state.context = DriverEvents().CurrentContext();
            state.awaiting_group_end.store(grouped, std::memory_order_relaxed);
            KeepConfig(state, ticket.config, ticket.comm);
            if (InProcessRecovery* recovery = InProcessRecoveryOn())
              state.probation_limit = recovery->ProbationLimit(library);
            if (result == ncclSuccess && !grouped) state.init_end_ns.store(now, std::memory_order_relaxed);
          });
      if (grouped && comm != nullptr) {
        Creations(ThisThread()).push_back({comm, std::exchange(init_token, -1)});
        continue;
      }
      // A non-blocking initialisation (ncclInProgress) is completed by the watchdog, once
      // ncclCommGetAsyncError says it is done.
      if (comm != nullptr && result == ncclSuccess) {
        completed = CompleteRegistration(*comm, SteadyNowNs()) || completed;
      }
    }
    registry.EndInit(init_token);  // not grouped, or none registered for it
    if (completed) WriteStatusAtInit();
  } catch (...) {
  }
}

}  // namespace

void AfterCreation(const Ticket& ticket, Api api, int library, ncclResult_t result, ncclComm_t* comms,
                   int count) noexcept {
  RegisterCreated(ticket, api, library, result, comms, count);
  // Under in-process recovery the application holds ncclguard's handles, not NCCL's communicators.
  InProcessRecovery* recovery = InProcessRecoveryOn();
  if (recovery != nullptr && Launched(result) && comms != nullptr)
    recovery->HandOutHandles(library, comms, count);
}

namespace hooks {

Ticket EnterOperation(Api api, int library, const OperationArguments& arguments) noexcept {
  (void)library;
  ::ncclguard::WaitIfExiting();
  Ticket ticket = ClaimOperation(api, arguments);
  if (ticket.forward) ::ncclguard::EnterNccl(api);
  return ticket;
}

void LeaveOperation(const Ticket& ticket, ncclResult_t result) noexcept {
  ::ncclguard::LeaveNccl();
  FinishOperation(ticket, result);
}

void EnterGroupCall(Api api) noexcept {
  ::ncclguard::WaitIfExiting();
  EnterGroup(api);
  ::ncclguard::EnterNccl(api);
}

void LeaveGroupCall(Api api, ncclResult_t result) noexcept {
  ::ncclguard::LeaveNccl();
  LeaveGroup(api, result);
}

}  // namespace hooks
}  // namespace ncclguard
