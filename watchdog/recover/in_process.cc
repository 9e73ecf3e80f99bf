#include "watchdog/recover/in_process.h"

#include <cuda.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "watchdog/common/clock.h"
#include "watchdog/common/comm_handle.h"
#include "watchdog/common/describe.h"
#include "watchdog/common/libraries.h"
#include "watchdog/common/log.h"
#include "watchdog/common/mutex.h"
#include "watchdog/common/nccl_api.h"
#include "watchdog/recover/held_operations.h"
#include "watchdog/recover/private_instance.h"
#include "watchdog/recover/rendezvous.h"
#include "watchdog/state/cuda_driver.h"
#include "watchdog/state/gpu_events.h"
#include "watchdog/state/handles.h"
#include "watchdog/state/probation.h"
#include "watchdog/state/records.h"
#include "watchdog/state/registry.h"

namespace ncclguard {
namespace {

using Result = RecoveryOutcome::Result;

RecoveryOutcome Outcome(Result result, std::string detail) { return {result, std::move(detail), 0}; }

// The private instance, loaded at the first recovery and kept: the communicators made on it live
// as long as the process.
struct PrivateSlot {
  Mutex mutex;
  std::unique_ptr<PrivateNcclInstance> instance ABSL_GUARDED_BY(mutex);
  int slot ABSL_GUARDED_BY(mutex) = -1;
};

PrivateSlot& Private() {
  static auto* slot = new PrivateSlot;  // never destroyed: its library stays loaded
  return *slot;
}

// The library slot of the private instance of the library in `library`, loading it first.
absl::StatusOr<int> PrivateInstanceSlot(const std::string& job_dir, int library) {
  PrivateSlot& state = Private();
  MutexLock lock(state.mutex);
  if (state.slot >= 0) return state.slot;
  const std::string path = Real().Path(library);
  if (path.empty()) return absl::NotFoundError("the path of the NCCL library in use is not known");
  absl::StatusOr<std::unique_ptr<PrivateNcclInstance>> loaded =
      PrivateNcclInstance::Load(path, absl::StrCat(job_dir, "/", kPrivateInstancesDirectory));
  if (!loaded.ok()) return loaded.status();
  const int slot = Real().AdoptLibrary((*loaded)->Handle(), (*loaded)->CopyPath());
  if (slot < 0) return absl::ResourceExhaustedError("no library slot is left for a private NCCL instance");
  // Loaded, the instance no longer needs its file: the node's last process removes it now.
  (*loaded)->Release();
  state.instance = *std::move(loaded);
  state.slot = slot;
  return slot;
}

// After a fallback, the operation's gate is the host function's again: opened at once if the
// operation got past it meanwhile (its end event precedes the host function on the stream).
void GiveBack(CommState& comm, ProbationOp& op) {
  op.state.store(ProbationState::kPending, std::memory_order_release);
  OpRecord& record = comm.Slot(op.seq);
  const bool passed = record.end_recorded.load(std::memory_order_acquire) &&
                      DriverEvents().Query(comm.context, record.end_event) == EventStatus::kReached;
  if (passed && TakeOverGate(op)) {
    op.state.store(ProbationState::kReleased, std::memory_order_release);
    OpenGate(op);
  }
}

// The operations replayed together: `stalled` and, when it was issued in a group, the others of
// its group on the communicator (probation slots are in issue order).
std::vector<ProbationOp*> ReplayedTogether(CommState& comm, ProbationOp& stalled) {
  if (stalled.group == 0) return {&stalled};
  std::vector<ProbationOp*> ops;
  for (ProbationOp& op : comm.TakenProbation()) {
    // The state first: it publishes the rest of the slot.
    if (op.state.load(std::memory_order_acquire) != ProbationState::kNone && op.group == stalled.group)
      ops.push_back(&op);
  }
  return ops;
}

class Recovery {
 public:
  Recovery(CommState& comm, ProbationOp& stalled, const RecoveryRequest& request)
      : comm_(comm), stalled_(stalled), request_(request), driver_(LoadCudaDriver()) {}

  RecoveryOutcome Run();

 private:
  // Takes over the gates of the operations to replay; "" when all of them, else why not.
  std::string TakeOverAll();
  void GiveBackAll();
  std::string Ready();  // "" when this rank can recover, else why not
  absl::StatusOr<RendezvousOutcome> Meet(const std::string& not_ready);
  absl::Status CreateCommunicator(const ncclUniqueId& id);
  void StartAbort();
  // When the new communicator and the replay must be complete, each (steady clock).
  std::int64_t Deadline() const {
    return SteadyNowNs() +
           std::chrono::duration_cast<std::chrono::nanoseconds>(request_.replay_timeout).count();
  }
  absl::Status Replay();
  absl::Status QueueReplay(CUstream stream);
  void Repoint();

  CommState& comm_;
  ProbationOp& stalled_;
  std::vector<ProbationOp*> ops_;    // replayed together, in issue order
  std::vector<ProbationOp*> taken_;  // those whose gates this recovery took over
  const RecoveryRequest& request_;
  const CudaDriver* driver_;
  int slot_ = -1;
  ncclComm_t old_comm_ = nullptr;
  ncclComm_t new_comm_ = nullptr;
  std::int64_t replayed_ns_ = 0;
};

std::string Recovery::TakeOverAll() {
  ops_ = ReplayedTogether(comm_, stalled_);
  for (ProbationOp* op : ops_) {
    if (!TakeOverGate(*op))
      return op == &stalled_ ? "its operation completed meanwhile" : "part of its group completed";
    taken_.push_back(op);
  }
  return "";
}

void Recovery::GiveBackAll() {
  for (ProbationOp* op : taken_) GiveBack(comm_, *op);
}

std::string Recovery::Ready() {
  if (!request_.not_ready_reason.empty()) return request_.not_ready_reason;
  if (driver_ == nullptr || !driver_->probation)
    return "the CUDA driver cannot replay on a stream of its own";
  if (comm_.closing.load(std::memory_order_acquire)) return "the application is closing the communicator";
  for (const ProbationOp* op : ops_) {
    if (const char* unsafe = op->unsafe.load(std::memory_order_acquire)) return unsafe;
  }
  absl::StatusOr<int> slot = PrivateInstanceSlot(request_.job_dir, comm_.library.load());
  if (!slot.ok()) return absl::StrCat("no private NCCL instance: ", slot.status().message());
  slot_ = *slot;
  return "";
}

absl::StatusOr<RendezvousOutcome> Recovery::Meet(const std::string& not_ready) {
  RendezvousRequest request{.job_dir = request_.job_dir,
                            .comm_id = comm_.id,
                            // Ranks that stalled in different operations never meet: each number
                            // has a meeting of its own.
                            .epoch = static_cast<int>(stalled_.seq),
                            .nranks = comm_.nranks.load(),
                            .rank = comm_.rank.load(),
                            .ready = not_ready.empty(),
                            .not_ready_reason = not_ready,
                            .timeout = request_.meeting_timeout};
  const int slot = slot_;
  return MeetToRecover(request, [slot]() -> absl::StatusOr<ncclUniqueId> {
    ncclUniqueId id{};
    const ncclResult_t made = CallRealNccl(slot, Api::ncclGetUniqueId, [&id](void* function) {
      return reinterpret_cast<decltype(&::ncclGetUniqueId)>(function)(&id);
    });
    if (made != ncclSuccess) {
      return absl::InternalError(
          absl::StrCat("ncclGetUniqueId of the private instance returned ", std::string(ResultName(made))));
    }
    return id;
  });
}

// Made on a thread of its own, so that a rank that never joins (it fell back on its own, or died)
// costs this one the deadline and not for ever: the watchdog, whose init timeout would otherwise
// notice, is the thread waiting here. With the application's own configuration (blocking or not,
// CTA counts, network, name...); a non-blocking one is awaited here. Past the deadline the
// process exits (kBroken), so the thread left waiting in NCCL does no harm.
absl::Status Recovery::CreateCommunicator(const ncclUniqueId& id) {
  struct Creation {
    std::atomic<bool> done{false};
    ncclComm_t comm = nullptr;
    ncclResult_t result = ncclInternalError;
  };
  auto creation = std::make_shared<Creation>();
  const std::int64_t give_up = Deadline();
  auto config = std::make_shared<KeptConfig>(comm_.config);
  if (config->present) {
    config->config.netName = config->net_name.empty() ? nullptr : config->net_name.c_str();
    config->config.commName = config->comm_name.empty() ? nullptr : config->comm_name.c_str();
  }
  const bool with_config = config->present && Real().Function(slot_, Api::ncclCommInitRankConfig) != nullptr;
  const ncclResult_t result = PrivateNcclInstance::WithP2pDisabled([&] {
    try {
      std::thread([creation, config, with_config, give_up, driver = driver_,
                   context = static_cast<CUcontext>(comm_.context), slot = slot_,
                   nranks = comm_.nranks.load(), rank = comm_.rank.load(), id] {
        RecoveryUnderWay recovering;  // NCCL's calls of its own functions on this thread must not wait
        CudaContextScope scope(*driver, context);
        ncclResult_t made = ncclInternalError;
        if (with_config) {
          made = CallRealNccl(slot, Api::ncclCommInitRankConfig, [&](void* function) {
            return reinterpret_cast<decltype(&::ncclCommInitRankConfig)>(function)(&creation->comm, nranks,
                                                                                   id, rank, &config->config);
          });
        } else {
          made = CallRealNccl(slot, Api::ncclCommInitRank, [&](void* function) {
            return reinterpret_cast<decltype(&::ncclCommInitRank)>(function)(&creation->comm, nranks, id,
                                                                             rank);
          });
        }
        if (made == ncclInProgress) made = AwaitNotInProgress(slot, creation->comm, give_up);
        creation->result = made;
        creation->done.store(true, std::memory_order_release);
      }).detach();
    } catch (...) {  // no thread to be had
      return ncclSystemError;
    }
    // NCCL reads NCCL_P2P_DISABLE during the initialisation: the environment stays as it is
    // until it is over.
    while (!creation->done.load(std::memory_order_acquire) && SteadyNowNs() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return creation->done.load(std::memory_order_acquire) ? creation->result : ncclInProgress;
  });
  if (result == ncclInProgress)
    return absl::DeadlineExceededError("the new communicator was not complete in time");
  if (result != ncclSuccess) {
    return absl::InternalError(absl::StrCat(with_config ? "ncclCommInitRankConfig" : "ncclCommInitRank",
                                            " on the private instance returned ",
                                            std::string(ResultName(result))));
  }
  new_comm_ = creation->comm;
  return absl::OkStatus();
}

// Aborts the stuck communicator on a thread of its own, without waiting for it to return: freeing
// its memory may wait for every stream of the device (cudaFree does), the application's among
// them, which waits at the gate only the replay opens. The replay waits, on the GPU, for the
// aborted operations to leave their streams, which the abort flag makes them do at once.
void Recovery::StartAbort() {
  const int library = comm_.library.load();
  std::string id = comm_.id;
  const ncclComm_t old_comm = old_comm_;
  auto abort = [library, old_comm, id, driver = driver_, context = static_cast<CUcontext>(comm_.context)] {
    // Not counted as a recovery under way: the application's calls must not wait for this one.
    CudaContextScope scope(*driver, context);
    const std::int64_t start = SteadyNowNs();
    const ncclResult_t aborted = CallRealNccl(library, Api::ncclCommAbort, [old_comm](void* function) {
      return reinterpret_cast<decltype(&::ncclCommAbort)>(function)(old_comm);
    });
    if (aborted != ncclSuccess) log::Warn("ncclCommAbort of comm {} returned {}", id, ResultName(aborted));
    log::Debug("ncclCommAbort of comm {} returned after {} ms", id, (SteadyNowNs() - start) / 1'000'000);
  };
  try {
    std::thread(abort).detach();
  } catch (...) {  // no thread to be had: abort here, and hope its frees do not wait
    abort();
  }
}

// Queues, on `stream`: a wait for each aborted operation to leave its stream (it no longer
// writes), the in-place inputs restored, the operations again (a group as a group), and the gates
// opened once they completed.
absl::Status Recovery::QueueReplay(CUstream stream) {
  for (const ProbationOp* op : ops_) {
    const OpRecord& record = comm_.Slot(op->seq);
    if (record.end_recorded.load(std::memory_order_acquire) &&
        driver_->cuStreamWaitEvent(stream, static_cast<CUevent>(record.end_event), 0) != CUDA_SUCCESS) {
      return absl::InternalError("the replay cannot wait for the aborted operation");
    }
    if (op->saved_input != 0 &&
        driver_->cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(op->send), op->saved_input, op->saved_bytes,
                                   stream) != CUDA_SUCCESS) {
      return absl::InternalError("the operation's input cannot be restored");
    }
  }
  ncclResult_t replayed = IssueInGroup(slot_, ops_.size() > 1 || stalled_.group != 0, [&] {
    ncclResult_t issued = ncclSuccess;
    for (const ProbationOp* op : ops_) {
      if (issued == ncclSuccess) issued = IssueOperation(*op, slot_, new_comm_, stream);
    }
    return issued;
  });
  if (replayed == ncclInProgress) replayed = AwaitNotInProgress(slot_, new_comm_, Deadline());
  if (replayed != ncclSuccess) {
    return absl::InternalError(absl::StrCat("the replay returned ", std::string(ResultName(replayed))));
  }
  for (const ProbationOp* op : ops_) {
    if (driver_->cuStreamWriteValue32(stream, op->gate_device, 1, CU_STREAM_WRITE_VALUE_DEFAULT) !=
        CUDA_SUCCESS)
      return absl::InternalError("the gate cannot be queued after the replay");
  }
  return absl::OkStatus();
}

absl::Status Recovery::Replay() {
  // A stream of ncclguard's: the application's waits at the gate, behind the aborted operation.
  CUstream stream = nullptr;
  if (driver_->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
    return absl::InternalError("no stream to replay on");
  if (absl::Status queued = QueueReplay(stream); !queued.ok()) return queued;
  CUevent done = nullptr;
  if (driver_->cuEventCreate(&done, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS ||
      driver_->cuEventRecord(done, stream) != CUDA_SUCCESS) {
    return absl::InternalError("the replay's completion cannot be watched");
  }
  const std::int64_t give_up = Deadline();
  CUresult state = CUDA_ERROR_NOT_READY;
  while ((state = driver_->cuEventQuery(done)) == CUDA_ERROR_NOT_READY && SteadyNowNs() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // The event and the stream are left to the process: destroying either may wait for the GPU.
  if (state == CUDA_ERROR_NOT_READY)
    return absl::DeadlineExceededError("the replay did not complete in time");
  if (state != CUDA_SUCCESS) return absl::InternalError("the replay failed on the GPU");
  replayed_ns_ = SteadyNowNs();
  return absl::OkStatus();
}

// The application's handle, and ncclguard's records, follow the new communicator; so do the
// communicators the application creates from now on. The replayed operations count as completed.
void Recovery::Repoint() {
  if (CommHandle* handle = FindCommHandle(old_comm_)) {
    if (!RepointHandle(handle, new_comm_, slot_))
      log::Error("comm {}: its handle could not be re-pointed", comm_.id);
  }
  if (!GetRegistry().Rekey(&comm_, new_comm_, slot_)) {
    log::Warn("comm {}: more communicators than ncclguard can watch; the new one is not watched", comm_.id);
  }
  SendCreationsTo(slot_);
  // Nothing more goes on probation: P2P is off on the private instance.
  comm_.probation_closed.store(true, std::memory_order_release);
  for (ProbationOp* op : ops_) {
    OpRecord& record = comm_.Slot(op->seq);
    OpState state = record.state.load(std::memory_order_acquire);
    if (record.seq.load(std::memory_order_relaxed) == op->seq && !IsFinished(state)) {
      if (record.start_ns.load(std::memory_order_relaxed) == 0)
        record.start_ns.store(replayed_ns_, std::memory_order_relaxed);
      record.end_ns.store(replayed_ns_, std::memory_order_relaxed);
      record.state.compare_exchange_strong(state, OpState::kCompleted, std::memory_order_acq_rel);
    }
    op->state.store(ProbationState::kReleased, std::memory_order_release);
  }
  const std::uint64_t last = ops_.back()->seq;
  for (std::atomic<std::uint64_t>* counter : {&comm_.last_started, &comm_.last_completed}) {
    std::uint64_t value = counter->load(std::memory_order_relaxed);
    while (value < last && !counter->compare_exchange_weak(value, last, std::memory_order_release)) {
    }
  }
  comm_.recovered.store(true, std::memory_order_release);
  NoteProbationChange();  // what was held behind the replayed operations goes to the new communicator
}

RecoveryOutcome Recovery::Run() {
  std::string not_ready = TakeOverAll();
  if (not_ready.empty()) not_ready = Ready();
  absl::StatusOr<RendezvousOutcome> met = Meet(not_ready);
  if (!met.ok() || !met->recover || !not_ready.empty()) {
    GiveBackAll();
    if (!met.ok()) return Outcome(Result::kFellBack, std::string(met.status().message()));
    return Outcome(Result::kFellBack, met->recover ? not_ready : met->reason);
  }
  CudaContextScope context(*driver_, static_cast<CUcontext>(comm_.context));
  old_comm_ = comm_.handle.load();
  StartAbort();
  if (absl::Status created = CreateCommunicator(met->unique_id); !created.ok()) {
    return Outcome(Result::kBroken, std::string(created.message()));
  }
  if (absl::Status replayed = Replay(); !replayed.ok()) {
    return Outcome(Result::kBroken, std::string(replayed.message()));
  }
  Repoint();
  RecoveryOutcome outcome = Outcome(Result::kRecovered, met->reason);
  outcome.replay_completed_ns = replayed_ns_;
  return outcome;
}

}  // namespace

RecoveryOutcome RecoverCommunicator(CommState& comm, ProbationOp& op,
                                    const RecoveryRequest& request) noexcept {
  try {
    RecoveryUnderWay hold;
    Recovery recovery(comm, op, request);
    return recovery.Run();
  } catch (const std::exception& error) {
    return Outcome(Result::kFellBack, absl::StrCat("the recovery failed: ", error.what()));
  } catch (...) {
    return Outcome(Result::kFellBack, "the recovery failed");
  }
}

}  // namespace ncclguard
