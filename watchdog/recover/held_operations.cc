#include "watchdog/recover/held_operations.h"

#include <cuda.h>
#include <nccl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <span>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "watchdog/common/clock.h"
#include "watchdog/common/describe.h"
#include "watchdog/common/exit_gate.h"
#include "watchdog/common/libraries.h"
#include "watchdog/common/log.h"
#include "watchdog/common/nccl_api.h"
#include "watchdog/recover/probation.h"
#include "watchdog/state/cuda_driver.h"
#include "watchdog/state/gpu_events.h"
#include "watchdog/state/records.h"

namespace ncclguard {
namespace {

// The communicators with held operations, for the issuing thread. A communicator is listed by the
// application's thread after it published a held operation, and taken off by the issuing thread
// once none is held, both under the mutex: an operation held meanwhile is never missed.
struct Issuer {
  std::mutex mutex;
  std::vector<CommState*> comms;
  pid_t pid = 0;  // the process whose thread serves the list: a forked child starts its own
};

Issuer& GetIssuer() {
  static auto* issuer = new Issuer;  // never destroyed: its thread outlives static destructors
  return *issuer;
}

bool IsHeld(const ProbationOp& op) {
  return op.state.load(std::memory_order_acquire) == ProbationState::kHeld;
}

bool AnyHeld(CommState& comm) { return std::ranges::any_of(comm.TakenProbation(), IsHeld); }

// The held operations to issue next on `comm`: the first one not released, when it is held and
// every earlier one has passed, with the rest of its group. Empty when there is none, or when
// the earlier one is still in NCCL's hands or being recovered.
std::vector<ProbationOp*> NextBatch(CommState& comm) {
  const std::span<ProbationOp> slots = comm.TakenProbation();
  auto first = std::ranges::find_if(slots, [](const ProbationOp& op) { return Unreleased(op); });
  if (first == slots.end() || !IsHeld(*first) || !first->issuable.load(std::memory_order_acquire)) return {};
  std::vector<ProbationOp*> batch{&*first};
  // The slots of one group are consecutive: one thread issues a communicator's operations.
  for (auto next = first + 1; first->group != 0 && next != slots.end() && next->group == first->group;
       ++next) {
    if (!IsHeld(*next) || !next->issuable.load(std::memory_order_acquire)) return {};
    batch.push_back(&*next);
  }
  return batch;
}

void RecordOn(GpuEvent event, CUstream stream, std::atomic<bool>& recorded) {
  recorded.store(DriverEvents().Record(event, reinterpret_cast<GpuStream>(stream)),
                 std::memory_order_release);
}

// What one communicator contributes to an issue: its held operations at the head of its queue.
struct Batch {
  CommState* comm;
  std::vector<ProbationOp*> ops;
  CUstream stream = nullptr;
  ncclResult_t result = ncclSuccess;
};

// On the communicator's issuing stream: waits for the application's stream to reach each call,
// and marks their start.
void Prepare(Batch& batch, const CudaDriver& driver) {
  CommState& comm = *batch.comm;
  CudaContextScope context(driver, static_cast<CUcontext>(comm.context));
  if (comm.issue_stream == nullptr) {
    CUstream stream = nullptr;
    // Never destroyed: destroying a stream may wait for the GPU.
    if (driver.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS) comm.issue_stream = stream;
  }
  batch.stream = static_cast<CUstream>(comm.issue_stream);
  if (batch.stream == nullptr) {
    batch.result = ncclUnhandledCudaError;
    return;
  }
  for (const ProbationOp* op : batch.ops) {
    if (driver.cuStreamWaitEvent(batch.stream, static_cast<CUevent>(op->ready_event), 0) != CUDA_SUCCESS) {
      batch.result = ncclUnhandledCudaError;
      return;
    }
  }
  for (const ProbationOp* op : batch.ops) {
    OpRecord& record = comm.Slot(op->seq);
    if (record.seq.load(std::memory_order_relaxed) == op->seq)
      RecordOn(record.start_event, batch.stream, record.start_recorded);
  }
}

// After NCCL took them (or refused): their end marked and their gates armed, as the application's
// own calls would have been, or, refused, dropped with their gates open.
void Finish(Batch& batch, const CudaDriver& driver) {
  CommState& comm = *batch.comm;
  CudaContextScope context(driver, static_cast<CUcontext>(comm.context));
  for (ProbationOp* op : batch.ops) {
    OpRecord& record = comm.Slot(op->seq);
    const bool recorded = record.seq.load(std::memory_order_relaxed) == op->seq;
    if (batch.result != ncclSuccess) {
      if (recorded) {
        record.result.store(batch.result, std::memory_order_relaxed);
        OpState state = OpState::kEnqueued;
        record.state.compare_exchange_strong(state, OpState::kFailed, std::memory_order_acq_rel);
      }
      DropHeld(comm, *op);
      continue;
    }
    if (recorded) RecordOn(record.end_event, batch.stream, record.end_recorded);
    if (!ArmGate(*op, batch.stream)) {  // not held any more: its gate opens now, as without probation
      op->state.store(ProbationState::kReleased, std::memory_order_release);
      OpenGate(*op);
    }
  }
  if (batch.result != ncclSuccess) {
    log::Warn(
        "comm {} #{} {}, held on probation, was refused by NCCL when ncclguard issued it: {}; the "
        "application's stream goes on without it",
        comm.id, batch.ops.front()->seq, OperationName(batch.ops.front()->api), ResultName(batch.result));
  }
}

// Hands `batches` to NCCL, in one group when there are several operations: the application issued
// them in one group (across communicators when one process drives several GPUs, where NCCL needs
// every rank's part in the same group).
void Issue(std::vector<Batch>& batches, const CudaDriver& driver) {
  for (Batch& batch : batches) Prepare(batch, driver);
  const int slot = batches.front().comm->library.load(std::memory_order_acquire);
  const bool grouped =
      batches.size() > 1 || batches.front().ops.size() > 1 || batches.front().ops.front()->group != 0;
  // Each communicator's failure is its own; the group's start and end concern them all.
  const ncclResult_t result = IssueInGroup(slot, grouped, [&] {
    for (Batch& batch : batches) {
      CudaContextScope context(driver, static_cast<CUcontext>(batch.comm->context));
      const ncclComm_t handle = batch.comm->handle.load(std::memory_order_acquire);
      for (const ProbationOp* op : batch.ops) {
        if (batch.result == ncclSuccess) batch.result = IssueOperation(*op, slot, handle, batch.stream);
      }
    }
    return ncclSuccess;
  });
  for (Batch& batch : batches) {
    if (batch.result == ncclSuccess) batch.result = result;
    if (batch.result == ncclInProgress) {
      batch.result =
          AwaitNotInProgress(slot, batch.comm->handle.load(std::memory_order_acquire),
                             SteadyNowNs() + std::chrono::nanoseconds(std::chrono::minutes(10)).count());
    }
    Finish(batch, driver);
  }
}

// The batches to issue together with `first`: every listed communicator's head batch of the same
// group and library. Empty when part of that group is not at the head of its queue yet. Outside
// a group, the heads of the other ranks of the same communicator that this process drives (one
// thread per GPU) with the same operation go with it: one thread driving several ranks of a
// communicator must issue their parts of an operation in one group.
std::vector<Batch> GroupOf(const Batch& first, const std::vector<Batch>& heads,
                           const std::vector<CommState*>& comms) {
  const std::uint64_t group = first.ops.front()->group;
  const int library = first.comm->library.load(std::memory_order_acquire);
  std::vector<Batch> together;
  for (const Batch& head : heads) {
    if (head.comm->library.load(std::memory_order_acquire) != library) continue;
    const bool same = group != 0 ? head.ops.front()->group == group
                                 : &head == &first || (head.ops.front()->group == 0 &&
                                                       std::string_view(head.comm->id) == first.comm->id &&
                                                       head.ops.front()->seq == first.ops.front()->seq);
    if (same) together.push_back(head);
  }
  if (group == 0) return together;
  for (CommState* comm : comms) {
    const bool waiting = std::ranges::any_of(
        comm->TakenProbation(), [group](const ProbationOp& op) { return IsHeld(op) && op.group == group; });
    const bool at_head =
        std::ranges::any_of(together, [comm](const Batch& batch) { return batch.comm == comm; });
    if (waiting && !at_head) return {};
  }
  return together;
}

// One round over the listed communicators; true when it issued anything.
bool IssueRound(const CudaDriver& driver) {
  std::vector<CommState*> comms;
  {
    std::lock_guard<std::mutex> lock(GetIssuer().mutex);
    comms = GetIssuer().comms;
  }
  std::vector<Batch> heads;
  for (CommState* comm : comms) {
    std::vector<ProbationOp*> ops = NextBatch(*comm);
    if (!ops.empty()) heads.push_back({comm, std::move(ops)});
  }
  bool issued = false;
  std::vector<CommState*> done;
  for (const Batch& head : heads) {
    if (std::ranges::find(done, head.comm) != done.end()) continue;
    std::vector<Batch> batches = GroupOf(head, heads, comms);
    if (batches.empty()) continue;
    for (const Batch& batch : batches) done.push_back(batch.comm);
    // Closing waits for this flag; the application's closing call waits for the queue to drain
    // (AwaitHeldIssued) unless it aborts, which drops what is held.
    for (const Batch& batch : batches) batch.comm->issuer_in_call.store(true, std::memory_order_seq_cst);
    const bool closing = std::ranges::any_of(
        batches, [](const Batch& batch) { return batch.comm->closing.load(std::memory_order_seq_cst); });
    if (!closing) {
      Issue(batches, driver);
      issued = true;
    }
    for (const Batch& batch : batches) batch.comm->issuer_in_call.store(false, std::memory_order_seq_cst);
  }
  std::lock_guard<std::mutex> lock(GetIssuer().mutex);
  std::erase_if(GetIssuer().comms, [](CommState* comm) {
    if (AnyHeld(*comm)) return false;
    comm->issuer_listed.store(false, std::memory_order_release);
    return true;
  });
  return issued;
}

void IssuerMain() {
  pthread_setname_np(pthread_self(), "ncclguard-hold");
  MarkOwnThread();
  DriverEvents().PrepareWatchdogThread();  // its event records must not break a graph capture
  const CudaDriver* driver = LoadCudaDriver();
  for (;;) {
    const std::uint32_t seen = ProbationChanges();
    const bool issued = driver != nullptr && IssueRound(*driver);
    // Woken by a gate's host function or a newly held operation; the timeout only bounds a miss.
    if (!issued) AwaitProbationChange(seen, 100);
  }
}

// Under the issuer's mutex.
void StartIssuerLocked(Issuer& issuer) {
  if (issuer.pid == getpid()) return;
  // With every signal blocked, so the application's signals go to its own threads.
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  try {
    std::thread(IssuerMain).detach();
    issuer.pid = getpid();
  } catch (...) {
    log::Error("no thread to issue held operations: in-process recovery cannot hold them");
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

}  // namespace

ncclResult_t IssueOperation(const ProbationOp& op, int slot, ncclComm_t comm, CUstream stream) noexcept {
  const auto type = static_cast<ncclDataType_t>(op.datatype);
  const auto reduction = static_cast<ncclRedOp_t>(op.reduction);
  const int root = op.root_or_peer;
  return CallRealNccl(slot, op.api, [&](void* function) {
#define NCCLGUARD_CALL(name, ...) reinterpret_cast<decltype(&::name)>(function)(__VA_ARGS__)
    switch (op.api) {
      case Api::ncclAllReduce:
        return NCCLGUARD_CALL(ncclAllReduce, op.send, op.recv, op.count, type, reduction, comm, stream);
      case Api::ncclBroadcast:
        return NCCLGUARD_CALL(ncclBroadcast, op.send, op.recv, op.count, type, root, comm, stream);
      case Api::ncclBcast:
        return NCCLGUARD_CALL(ncclBcast, op.recv, op.count, type, root, comm, stream);
      case Api::ncclReduce:
        return NCCLGUARD_CALL(ncclReduce, op.send, op.recv, op.count, type, reduction, root, comm, stream);
      case Api::ncclAllGather:
        return NCCLGUARD_CALL(ncclAllGather, op.send, op.recv, op.count, type, comm, stream);
      case Api::ncclReduceScatter:
        return NCCLGUARD_CALL(ncclReduceScatter, op.send, op.recv, op.count, type, reduction, comm, stream);
      case Api::ncclSend:
        return NCCLGUARD_CALL(ncclSend, op.send, op.count, type, root, comm, stream);
      case Api::ncclRecv:
        return NCCLGUARD_CALL(ncclRecv, op.recv, op.count, type, root, comm, stream);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 3)
      case Api::ncclAlltoAll:
        return NCCLGUARD_CALL(ncclAlltoAll, op.send, op.recv, op.count, type, comm, stream);
      case Api::ncclGather:
        return NCCLGUARD_CALL(ncclGather, op.send, op.recv, op.count, type, root, comm, stream);
      case Api::ncclScatter:
        return NCCLGUARD_CALL(ncclScatter, op.send, op.recv, op.count, type, root, comm, stream);
#endif
      default:
        return ncclInvalidUsage;
    }
#undef NCCLGUARD_CALL
  });
}

ncclResult_t IssueInGroup(int slot, bool grouped, absl::FunctionRef<ncclResult_t()> issue) noexcept {
  auto group_call = [slot](Api api) {
    return CallRealNccl(
        slot, api, [](void* function) { return reinterpret_cast<decltype(&::ncclGroupStart)>(function)(); });
  };
  ncclResult_t result = grouped ? group_call(Api::ncclGroupStart) : ncclSuccess;
  if (result == ncclSuccess) result = issue();
  if (grouped) {
    const ncclResult_t ended = group_call(Api::ncclGroupEnd);
    if (result == ncclSuccess) result = ended;
  }
  return result;
}

ncclResult_t AwaitNotInProgress(int slot, ncclComm_t comm, std::int64_t deadline_ns) noexcept {
  for (;;) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t asked = CallRealNccl(slot, Api::ncclCommGetAsyncError, [&](void* function) {
      return reinterpret_cast<decltype(&::ncclCommGetAsyncError)>(function)(comm, &state);
    });
    if (asked != ncclSuccess) return asked;
    if (state != ncclInProgress || SteadyNowNs() >= deadline_ns) return state;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

bool HoldOperation(CommState& comm, ProbationOp& op, bool grouped) noexcept {
  const CudaDriver* driver = LoadCudaDriver();
  if (driver == nullptr || !driver->probation) return false;
  // Kept with the slot, which is used once: destroying an event may wait for the GPU.
  if (op.ready_event == nullptr) op.ready_event = DriverEvents().Create();
  if (op.ready_event == nullptr || !TakeGate(op) ||
      !DriverEvents().Record(op.ready_event, reinterpret_cast<GpuStream>(op.stream))) {
    return false;
  }
  // Inside a group the stream waits only after the group's end: its other operations, launched
  // then, come before the wait (the ready event, recorded now, lands before them).
  if (!grouped && !WaitAtGate(op)) return false;
  op.issuable.store(!grouped, std::memory_order_release);
  op.state.store(ProbationState::kHeld, std::memory_order_release);
  try {
    Issuer& issuer = GetIssuer();
    std::lock_guard<std::mutex> lock(issuer.mutex);
    StartIssuerLocked(issuer);
    if (!comm.issuer_listed.exchange(true, std::memory_order_acq_rel)) issuer.comms.push_back(&comm);
  } catch (...) {  // out of memory: nothing issues it, so it is not held
    op.state.store(ProbationState::kNone, std::memory_order_release);
    OpenGate(op);  // the stream may wait at it already: it must not wait for ever
    return false;
  }
  NoteProbationChange();
  return true;
}

void ReleaseHeldGroupMember(ProbationOp& op) noexcept {
  if (!WaitAtGate(op)) {
    // The stream cannot be made to wait: the operation is still issued, in order, but nothing
    // holds the application's later work behind it any more.
    log::Warn("#{} {}: the application's stream could not be made to wait for it", op.seq,
              OperationName(op.api));
  }
  op.issuable.store(true, std::memory_order_release);
  NoteProbationChange();
}

void DropHeld(CommState& comm, ProbationOp& op) noexcept {
  ProbationState expected = ProbationState::kHeld;
  if (!op.state.compare_exchange_strong(expected, ProbationState::kReleased, std::memory_order_acq_rel))
    return;
  OpenGate(op);
  OpRecord& record = comm.Slot(op.seq);
  OpState state = record.state.load(std::memory_order_acquire);
  if (record.seq.load(std::memory_order_relaxed) == op.seq && !IsFinished(state))
    record.state.compare_exchange_strong(state, OpState::kAborted, std::memory_order_acq_rel);
  NoteProbationChange();
}

void AwaitHeldIssued(CommState& comm) noexcept {
  while (AnyHeld(comm) || comm.issuer_in_call.load(std::memory_order_seq_cst)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

bool HasHeld(CommState& comm) noexcept {
  return comm.issuer_listed.load(std::memory_order_acquire) || AnyHeld(comm);
}

}  // namespace ncclguard
