#include "watchdog/recover/in_process.h"

#include <cuda.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "watchdog/common/clock.h"
#include "watchdog/common/describe.h"
#include "watchdog/common/exit_gate.h"
#include "watchdog/common/libraries.h"
#include "watchdog/common/log.h"
#include "watchdog/common/mutex.h"
#include "watchdog/common/nccl_api.h"
#include "watchdog/recover/comm_handle.h"
#include "watchdog/recover/handles.h"
#include "watchdog/recover/held_operations.h"
#include "watchdog/recover/private_instance.h"
#include "watchdog/recover/probation.h"
#include "watchdog/recover/rendezvous.h"
#include "watchdog/state/cuda_driver.h"
#include "watchdog/state/gpu_events.h"
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

// The library slot of the private instance of the library in `library`, loading it first within
// `deadline`.
absl::StatusOr<int> PrivateInstanceSlot(const std::string& job_dir, int library,
                                        std::chrono::milliseconds deadline) {
  PrivateSlot& state = Private();
  MutexLock lock(state.mutex);
  if (state.slot >= 0) return state.slot;
  const std::string path = Real().Path(library);
  if (path.empty()) return absl::NotFoundError("the path of the NCCL library in use is not known");
  absl::StatusOr<std::unique_ptr<PrivateNcclInstance>> loaded =
      PrivateNcclInstance::Load(path, absl::StrCat(job_dir, "/", kPrivateInstancesDirectory), 1, deadline);
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

// One rank of the communicator that this process drives, and what its recovery takes.
struct Member {
  Member(CommState* comm, ProbationOp* stalled) : comm(comm), stalled(stalled) {}

  CommState* comm = nullptr;
  ProbationOp* stalled = nullptr;   // its operation of the stalled number; nullptr if not pending
  std::vector<ProbationOp*> ops;    // replayed together, in issue order
  std::vector<ProbationOp*> taken;  // those whose gates this recovery took over
  ncclComm_t old_comm = nullptr;
  ncclComm_t new_comm = nullptr;
  CUstream stream = nullptr;  // the replay's
  CUevent done = nullptr;     // recorded after the replay and its gates
};

// One rank's communicator on the private instance at `slot`, made as the application made it:
// with its configuration (blocking or not, CTA counts, network, name...) where it gave one.
ncclResult_t InitOnPrivateInstance(int slot, bool config_known, ncclComm_t* comm, int nranks,
                                   const ncclUniqueId& id, int rank, KeptConfig& kept) {
  if (kept.present && config_known) {
    return CallRealNccl(slot, Api::ncclCommInitRankConfig, [&](void* function) {
      return reinterpret_cast<decltype(&::ncclCommInitRankConfig)>(function)(comm, nranks, id, rank,
                                                                             &kept.config);
    });
  }
  return CallRealNccl(slot, Api::ncclCommInitRank, [&](void* function) {
    return reinterpret_cast<decltype(&::ncclCommInitRank)>(function)(comm, nranks, id, rank);
  });
}

// The ranks of `comm`'s communicator in this process: `comm`, then the others with its id (made by
// ncclCommInitAll, by a group of ncclCommInitRank, by one thread per GPU). One thread that drives
// several ranks must create and launch them in one group, so they are recovered together or not
// at all; each has the same operation numbers.
std::vector<Member> LocalRanks(CommState& comm, ProbationOp& stalled) {
  std::vector<Member> members{Member(&comm, &stalled)};
  for (CommState* other : GetRegistry().All()) {
    if (other == &comm || std::string_view(other->id) != std::string_view(comm.id) ||
        other->lifecycle.load(std::memory_order_acquire) != CommLifecycle::kReady)
      continue;
    members.emplace_back(other, PendingProbationOp(*other, stalled.seq));
  }
  return members;
}

class Recovery {
 public:
  Recovery(CommState& comm, ProbationOp& stalled, const RecoveryRequest& request)
      : members_(LocalRanks(comm, stalled)),
        stalled_(stalled),
        request_(request),
        driver_(LoadCudaDriver()),
        meeting_deadline_(std::chrono::steady_clock::now() + request.meeting_timeout) {}

  RecoveryOutcome Run();

 private:
  // Takes over the gates of the operations to replay; "" when all of them, else why not.
  std::string TakeOverAll();
  void GiveBackAll();
  std::string Ready();  // "" when this rank can recover, else why not
  absl::StatusOr<RendezvousOutcome> Meet(const std::string& not_ready);
  absl::Status CreateCommunicators(const ncclUniqueId& id);
  void StartAbort(const Member& member);
  // What is left of the meeting's deadline. The other ranks give up on this one when theirs passes,
  // so every wait before the meeting (the private copy's lock held by a process that is stopped, a
  // copy on a file system that stopped answering) and the meeting itself share it.
  std::chrono::milliseconds MeetingTimeLeft() const {
    return std::max(std::chrono::milliseconds(0), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      meeting_deadline_ - std::chrono::steady_clock::now()));
  }
  // When the new communicator and the replay must be complete, each (steady clock).
  std::int64_t Deadline() const {
    return SteadyNowNs() +
           std::chrono::duration_cast<std::chrono::nanoseconds>(request_.replay_timeout).count();
  }
  absl::Status Replay();
  absl::Status QueueRestores(Member& member);
  absl::Status QueueGates(Member& member);
  absl::Status AwaitReplays();
  void Repoint(Member& member);

  std::vector<Member> members_;
  ProbationOp& stalled_;
  const RecoveryRequest& request_;
  const CudaDriver* driver_;
  int slot_ = -1;
  std::int64_t replayed_ns_ = 0;
  const std::chrono::steady_clock::time_point meeting_deadline_;
};

std::string Recovery::TakeOverAll() {
  for (Member& member : members_) {
    const int rank = member.comm->rank.load();
    if (member.stalled == nullptr) {
      return absl::StrCat("its rank ", rank, " in this process has no operation #", stalled_.seq,
                          " waiting on probation");
    }
    member.ops = ReplayedTogether(*member.comm, *member.stalled);
    for (ProbationOp* op : member.ops) {
      if (!TakeOverGate(*op)) {
        if (op == &stalled_) return "its operation completed meanwhile";
        return members_.size() == 1 ? "part of its group completed"
                                    : absl::StrCat("part of its group completed on its rank ", rank);
      }
      member.taken.push_back(op);
    }
  }
  return "";
}

void Recovery::GiveBackAll() {
  for (Member& member : members_) {
    for (ProbationOp* op : member.taken) GiveBack(*member.comm, *op);
  }
}

std::string Recovery::Ready() {
  if (!request_.not_ready_reason.empty()) return request_.not_ready_reason;
  if (driver_ == nullptr || !driver_->probation)
    return "the CUDA driver cannot replay on a stream of its own";
  for (const Member& member : members_) {
    if (member.comm->closing.load(std::memory_order_acquire))
      return "the application is closing the communicator";
    for (const ProbationOp* op : member.ops) {
      if (const char* unsafe = op->unsafe.load(std::memory_order_acquire)) return unsafe;
    }
  }
  absl::StatusOr<int> slot =
      PrivateInstanceSlot(request_.job_dir, members_.front().comm->library.load(), MeetingTimeLeft());
  if (!slot.ok()) return absl::StrCat("no private NCCL instance: ", slot.status().message());
  slot_ = *slot;
  return "";
}

absl::StatusOr<RendezvousOutcome> Recovery::Meet(const std::string& not_ready) {
  const int slot = slot_;
  std::vector<int> other_local_ranks;
  for (std::size_t i = 1; i < members_.size(); ++i)
    other_local_ranks.push_back(members_[i].comm->rank.load());
  const CommState& comm = *members_.front().comm;
  RendezvousRequest request{.board = request_.board,
                            .comm_id = comm.id,
                            // Ranks that stalled in different operations never meet: each number
                            // has a meeting of its own.
                            .epoch = static_cast<int>(stalled_.seq),
                            .nranks = comm.nranks.load(),
                            .rank = comm.rank.load(),
                            .other_local_ranks = std::move(other_local_ranks),
                            .ready = not_ready.empty(),
                            .not_ready_reason = not_ready,
                            .timeout = MeetingTimeLeft()};
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
// CTA counts, network, name...); a non-blocking one is awaited here. Several local ranks are
// created in one group, each in its own context, as the application made them. Past the deadline
// the process exits (kBroken), so the thread left waiting in NCCL does no harm.
absl::Status Recovery::CreateCommunicators(const ncclUniqueId& id) {
  struct Rank {
    CUcontext context = nullptr;
    int rank = -1;
    int nranks = 0;
    KeptConfig config;
    ncclComm_t comm = nullptr;
  };
  struct Creation {
    std::atomic<bool> done{false};
    std::vector<Rank> ranks;
    ncclResult_t result = ncclInternalError;
  };
  auto creation = std::make_shared<Creation>();
  for (const Member& member : members_) {
    creation->ranks.push_back(Rank{.context = static_cast<CUcontext>(member.comm->context),
                                   .rank = member.comm->rank.load(),
                                   .nranks = member.comm->nranks.load(),
                                   .config = member.comm->config});
  }
  for (Rank& rank : creation->ranks) {
    KeptConfig& kept = rank.config;
    if (kept.present) {
      kept.config.netName = kept.net_name.empty() ? nullptr : kept.net_name.c_str();
      kept.config.commName = kept.comm_name.empty() ? nullptr : kept.comm_name.c_str();
    }
  }
  const std::int64_t give_up = Deadline();
  const bool config_known = Real().Function(slot_, Api::ncclCommInitRankConfig) != nullptr;
  const ncclResult_t result = PrivateNcclInstance::WithP2pDisabled([&] {
    try {
      std::thread([creation, config_known, give_up, driver = driver_, slot = slot_, id] {
        MarkOwnThread();
        RecoveryUnderWay recovering;  // NCCL's calls of its own functions on this thread must not wait
        std::vector<Rank>& ranks = creation->ranks;
        ncclResult_t made = IssueInGroup(slot, ranks.size() > 1, [&] {
          for (Rank& rank : ranks) {
            // NCCL takes the device of the calling thread's context at the call.
            CudaContextScope scope(*driver, rank.context);
            const ncclResult_t called = InitOnPrivateInstance(slot, config_known, &rank.comm, rank.nranks, id,
                                                              rank.rank, rank.config);
            if (called != ncclSuccess && called != ncclInProgress) return called;
          }
          return ncclSuccess;
        });
        // A non-blocking one answers ncclInProgress, at its call or at the group's end.
        for (Rank& rank : ranks) {
          if (made == ncclSuccess || made == ncclInProgress)
            made = AwaitNotInProgress(slot, rank.comm, give_up);
        }
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
    return absl::InternalError(absl::StrCat(config_known ? "ncclCommInitRankConfig" : "ncclCommInitRank",
                                            " on the private instance returned ",
                                            std::string(ResultName(result))));
  }
  for (std::size_t i = 0; i < members_.size(); ++i) members_[i].new_comm = creation->ranks[i].comm;
  return absl::OkStatus();
}

// Aborts the stuck communicator on a thread of its own, without waiting for it to return: freeing
// its memory may wait for every stream of the device (cudaFree does), the application's among
// them, which waits at the gate only the replay opens. The replay waits, on the GPU, for the
// aborted operations to leave their streams, which the abort flag makes them do at once.
void Recovery::StartAbort(const Member& member) {
  const int library = member.comm->library.load();
  std::string id = member.comm->id;
  const ncclComm_t old_comm = member.old_comm;
  auto abort = [library, old_comm, id, driver = driver_,
                context = static_cast<CUcontext>(member.comm->context)] {
    // Not counted as a recovery under way: the application's calls must not wait for this one.
    MarkOwnThread();
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

// Queues, on the member's replay stream (in its context): a wait for each aborted operation to
// leave its stream (it no longer writes), and the in-place inputs restored.
absl::Status Recovery::QueueRestores(Member& member) {
  if (driver_->cuStreamCreate(&member.stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
    return absl::InternalError("no stream to replay on");
  for (const ProbationOp* op : member.ops) {
    const OpRecord& record = member.comm->Slot(op->seq);
    if (record.end_recorded.load(std::memory_order_acquire) &&
        driver_->cuStreamWaitEvent(member.stream, static_cast<CUevent>(record.end_event), 0) !=
            CUDA_SUCCESS) {
      return absl::InternalError("the replay cannot wait for the aborted operation");
    }
    if (op->saved_input != 0 &&
        driver_->cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(op->send), op->saved_input, op->saved_bytes,
                                   member.stream) != CUDA_SUCCESS) {
      return absl::InternalError("the operation's input cannot be restored");
    }
  }
  return absl::OkStatus();
}

// Queues, after the member's replayed operations: their gates opened, and the event that says so.
absl::Status Recovery::QueueGates(Member& member) {
  for (const ProbationOp* op : member.ops) {
    if (driver_->cuStreamWriteValue32(member.stream, op->gate_device, 1, CU_STREAM_WRITE_VALUE_DEFAULT) !=
        CUDA_SUCCESS)
      return absl::InternalError("the gate cannot be queued after the replay");
  }
  if (driver_->cuEventCreate(&member.done, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS ||
      driver_->cuEventRecord(member.done, member.stream) != CUDA_SUCCESS) {
    return absl::InternalError("the replay's completion cannot be watched");
  }
  return absl::OkStatus();
}

// The operations again, on streams of ncclguard's (the application's wait at their gates, behind
// the aborted operations): every local rank's in one group, as a thread driving several ranks
// must issue them, and so is a group the application issued.
absl::Status Recovery::Replay() {
  for (Member& member : members_) {
    CudaContextScope context(*driver_, static_cast<CUcontext>(member.comm->context));
    if (absl::Status queued = QueueRestores(member); !queued.ok()) return queued;
  }
  const bool grouped = members_.size() > 1 || members_.front().ops.size() > 1 || stalled_.group != 0;
  ncclResult_t replayed = IssueInGroup(slot_, grouped, [&] {
    for (const Member& member : members_) {
      CudaContextScope context(*driver_, static_cast<CUcontext>(member.comm->context));
      for (const ProbationOp* op : member.ops) {
        if (const ncclResult_t issued = IssueOperation(*op, slot_, member.new_comm, member.stream);
            issued != ncclSuccess && issued != ncclInProgress)
          return issued;
      }
    }
    return ncclSuccess;
  });
  for (const Member& member : members_) {
    if (replayed == ncclSuccess || replayed == ncclInProgress)
      replayed = AwaitNotInProgress(slot_, member.new_comm, Deadline());
  }
  if (replayed != ncclSuccess) {
    return absl::InternalError(absl::StrCat("the replay returned ", std::string(ResultName(replayed))));
  }
  for (Member& member : members_) {
    CudaContextScope context(*driver_, static_cast<CUcontext>(member.comm->context));
    if (absl::Status queued = QueueGates(member); !queued.ok()) return queued;
  }
  return AwaitReplays();
}

// The events and the streams are left to the process: destroying either may wait for the GPU.
absl::Status Recovery::AwaitReplays() {
  const std::int64_t give_up = Deadline();
  for (const Member& member : members_) {
    CUresult state = CUDA_ERROR_NOT_READY;
    while ((state = driver_->cuEventQuery(member.done)) == CUDA_ERROR_NOT_READY && SteadyNowNs() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (state == CUDA_ERROR_NOT_READY)
      return absl::DeadlineExceededError("the replay did not complete in time");
    if (state != CUDA_SUCCESS) return absl::InternalError("the replay failed on the GPU");
  }
  replayed_ns_ = SteadyNowNs();
  return absl::OkStatus();
}

// The application's handle, and ncclguard's records, follow the new communicator; so do the
// communicators the application creates from now on. The replayed operations count as completed.
void Recovery::Repoint(Member& member) {
  CommState& comm = *member.comm;
  if (CommHandle* handle = FindCommHandle(member.old_comm)) {
    if (!RepointHandle(handle, member.new_comm, slot_))
      log::Error("comm {}: its handle could not be re-pointed", comm.id);
  }
  if (!GetRegistry().Rekey(&comm, member.new_comm, slot_)) {
    log::Warn("comm {}: more communicators than ncclguard can watch; the new one is not watched", comm.id);
  }
  // Nothing more goes on probation: P2P is off on the private instance.
  comm.probation_closed.store(true, std::memory_order_release);
  for (ProbationOp* op : member.ops) {
    OpRecord& record = comm.Slot(op->seq);
    OpState state = record.state.load(std::memory_order_acquire);
    if (record.seq.load(std::memory_order_relaxed) == op->seq && !IsFinished(state)) {
      if (record.start_ns.load(std::memory_order_relaxed) == 0)
        record.start_ns.store(replayed_ns_, std::memory_order_relaxed);
      record.end_ns.store(replayed_ns_, std::memory_order_relaxed);
      record.state.compare_exchange_strong(state, OpState::kCompleted, std::memory_order_acq_rel);
    }
    op->state.store(ProbationState::kReleased, std::memory_order_release);
  }
  const std::uint64_t last = member.ops.back()->seq;
  for (std::atomic<std::uint64_t>* counter : {&comm.last_started, &comm.last_completed}) {
    std::uint64_t value = counter->load(std::memory_order_relaxed);
    while (value < last && !counter->compare_exchange_weak(value, last, std::memory_order_release)) {
    }
  }
  comm.recovered_ns.store(replayed_ns_, std::memory_order_release);
  comm.recovered.store(true, std::memory_order_release);
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
  for (Member& member : members_) {
    member.old_comm = member.comm->handle.load();
    StartAbort(member);
  }
  if (absl::Status created = CreateCommunicators(met->unique_id); !created.ok()) {
    return Outcome(Result::kBroken, std::string(created.message()));
  }
  if (absl::Status replayed = Replay(); !replayed.ok()) {
    return Outcome(Result::kBroken, std::string(replayed.message()));
  }
  for (Member& member : members_) Repoint(member);
  SendCreationsTo(slot_);
  NoteProbationChange();  // what was held behind the replayed operations goes to the new communicators
  std::string detail = met->reason;
  if (members_.size() > 1)
    absl::StrAppend(&detail, "; this process's ", members_.size(), " ranks of it together");
  RecoveryOutcome outcome = Outcome(Result::kRecovered, std::move(detail));
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
