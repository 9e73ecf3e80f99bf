// The calls that name a communicator without being an operation (destroy, finalize, abort,
// revoke, the application's ncclCommGetAsyncError, and the rest), and what a call NCCL refused
// leaves behind: the records' side of hooks.h for them.
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "watchdog/common/clock.h"
#include "watchdog/common/describe.h"
#include "watchdog/common/in_process_recovery.h"
#include "watchdog/common/libraries.h"
#include "watchdog/common/log.h"
#include "watchdog/common/nccl_api.h"
#include "watchdog/detect/runtime.h"
#include "watchdog/record/call_outcomes.h"
#include "watchdog/record/hooks.h"
#include "watchdog/state/records.h"
#include "watchdog/state/registration.h"
#include "watchdog/state/registry.h"

namespace ncclguard {
namespace record {
namespace {

void LogFailedCall(Api api, const CommState* comm, ncclResult_t result) {
  using GetLastError = decltype(&::ncclGetLastError);
  auto last_error = reinterpret_cast<GetLastError>(
      Real().Function(comm != nullptr ? comm->library.load() : 0, Api::ncclGetLastError));
  const char* text = last_error != nullptr ? last_error(nullptr) : nullptr;
  const std::string on = comm != nullptr ? fmt::format(" on comm {}", comm->id) : std::string();
  // An application that retries in a loop must not flood the log or the job directory: a few
  // lines per process, and one dump per communicator (and one for calls without one).
  static constexpr int kLoggedFailures = 20;
  static std::atomic<int> logged{0};
  const int count = logged.fetch_add(1, std::memory_order_relaxed);
  if (count < kLoggedFailures) {
    log::Warn("{}{} returned {}: {}{}", Describe(api).name, on, ResultName(result),
              text != nullptr && *text != '\0' ? text : "NCCL gave no warning text",
              count + 1 == kLoggedFailures ? " (further failed calls are not logged)" : "");
  }
}

}  // namespace

void NoteFailedCall(Api api, CommState* comm, ncclResult_t result) noexcept {
  try {
    LogFailedCall(api, comm, result);
  } catch (...) {  // out of memory: the dump below still says it
  }
  static std::atomic<bool> dumped_without_comm{false};
  std::atomic<bool>& dumped = comm != nullptr ? comm->failure_dumped : dumped_without_comm;
  if (dumped.exchange(true)) return;
  RequestDump("error_return");
  ReportBeforeReturning();
}
}  // namespace record

namespace {

using record::Launched;
using record::NoteFailedCall;

// The calls that end the communicator's kernels early, their operations unfinished.
bool CutsShort(Api api) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 7)
  if (api == Api::ncclCommRevoke) return true;
#endif
  return api == Api::ncclCommAbort;
}

// Gives every unfinished operation of the communicator its final state: `aborted` after an
// abort; `completed` after a successful ncclCommDestroy or ncclCommFinalize, which wait for all of
// them (the watchdog may not have looked yet: a fast job destroys its communicator within
// milliseconds of its last collective).
void FinishUnfinished(CommState& comm, OpState final_state) {
  const std::uint64_t last = comm.last_enqueued.load(std::memory_order_acquire);
  const std::uint64_t first = last >= comm.ring_size ? last - comm.ring_size + 1 : 1;
  const std::int64_t now = SteadyNowNs();
  for (std::uint64_t seq = first; seq <= last; ++seq) {
    OpRecord& op = comm.Slot(seq);
    OpState state = op.state.load(std::memory_order_acquire);
    if (op.seq.load(std::memory_order_relaxed) != seq || IsFinished(state)) continue;
    if (final_state == OpState::kCompleted) op.end_ns.store(now, std::memory_order_relaxed);
    op.state.compare_exchange_strong(state, final_state, std::memory_order_acq_rel);
  }
  if (final_state == OpState::kCompleted) {
    comm.last_started.store(last, std::memory_order_release);
    comm.last_completed.store(last, std::memory_order_release);
  }
}

}  // namespace

Ticket BeforeCommCall(Api api, ncclComm_t handle) noexcept {
  Ticket ticket;
  CommState* comm = GetRegistry().Find(handle);
  if (comm == nullptr) return ticket;
  ticket.comm = comm;
  if (comm->aborted_by_ncclguard.load(std::memory_order_acquire)) {
    // ncclguard aborted it, so NCCL has freed it: nothing may reach NCCL with this handle. The
    // application's own clean-up succeeds; anything else is told the communicator is unusable.
    ticket.forward = false;
    ticket.result =
        (api == Api::ncclCommDestroy || api == Api::ncclCommAbort) ? ncclSuccess : ncclInvalidUsage;
    log::Debug("{} on comm {} answered {} without NCCL: ncclguard aborted it", Describe(api).name, comm->id,
               ResultName(ticket.result));
    return ticket;
  }
  if (CutsShort(api)) comm->cut_short.store(true, std::memory_order_seq_cst);
  if (api == Api::ncclCommDestroy || api == Api::ncclCommAbort || api == Api::ncclCommFinalize) {
    // Destroy and finalize wait for the communicator's work, what in-process recovery holds
    // included; an abort drops what is held.
    InProcessRecovery* recovery = InProcessRecoveryOn();
    if (recovery != nullptr) recovery->BeforeClosing(*comm, api);
    comm->closing.store(true, std::memory_order_seq_cst);
    while (comm->watchdog_in_call.load(std::memory_order_seq_cst)) std::this_thread::yield();
    if (recovery != nullptr) recovery->Closing(*comm, api);
  }
  return ticket;
}

void AfterCommCall(Api api, ncclComm_t handle, ncclResult_t result) noexcept {
  CommState* comm = GetRegistry().Find(handle);
  if (!Launched(result)) {
    if (comm != nullptr && CutsShort(api)) comm->cut_short.store(false, std::memory_order_seq_cst);
    NoteFailedCall(api, comm, result);
    return;
  }
  if (comm == nullptr) return;
  switch (api) {
    case Api::ncclCommAbort:
      FinishUnfinished(*comm, OpState::kAborted);
      comm->lifecycle.store(CommLifecycle::kAborted, std::memory_order_release);
      break;
    case Api::ncclCommDestroy:
      FinishUnfinished(*comm, OpState::kCompleted);
      comm->lifecycle.store(CommLifecycle::kDestroyed, std::memory_order_release);
      break;
    case Api::ncclCommFinalize:
      if (result == ncclSuccess) FinishUnfinished(*comm, OpState::kCompleted);  // not when in progress
      comm->lifecycle.store(CommLifecycle::kFinalized, std::memory_order_release);
      break;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 7)
    case Api::ncclCommRevoke:
      FinishUnfinished(*comm, OpState::kAborted);
      comm->lifecycle.store(CommLifecycle::kRevoked, std::memory_order_release);
      break;
#endif
    default:
      return;
  }
  WriteStatusAfterClosing(!GetRegistry().AnyOpen());
}

void AfterAsyncErrorQuery(ncclComm_t handle, const ncclResult_t* async_error, ncclResult_t result) noexcept {
  AfterCommCall(Api::ncclCommGetAsyncError, handle, result);
  if (result != ncclSuccess || async_error == nullptr) return;
  CommState* comm = GetRegistry().Find(handle);
  if (comm == nullptr) return;
  if (RecordAsyncError(*comm, *async_error)) ReportBeforeReturning();
  // NCCL just told the application that a non-blocking initialisation is complete: asking NCCL
  // about the communicator is safe now, and it is described before the application can close it.
  if (*async_error == ncclSuccess && !comm->awaiting_group_end.load(std::memory_order_acquire) &&
      comm->lifecycle.load(std::memory_order_acquire) == CommLifecycle::kInitializing &&
      CompleteRegistration(*comm, SteadyNowNs())) {
    WriteStatusAtInit();
  }
}
}  // namespace ncclguard
