// In-process recovery (NCCLGUARD_RECOVER=inprocess) as the recording path sees it: one interface,
// implemented in recover/ (recover/door.h), reached from record/ through one pointer that stays
// null unless the setting asks for it (the shim resolves handles through the door's
// hooks::ResolveCommunicator, which loads it). Without the setting an intercepted call pays a load
// of that pointer and touches nothing else of recovery: no probation, no held operations, no
// handles. The pointer is set once, when ncclguard starts at the first NCCL call, before any
// communicator exists, and never changes afterwards.
#pragma once

#include <nccl.h>

#include <atomic>
#include <cstdint>

#include "watchdog/common/nccl_api.h"
#include "watchdog/common/operation_arguments.h"

namespace ncclguard {

struct CommState;
struct ProbationOp;

class InProcessRecovery {
 public:
  // What probation made of an operation: its probation slot (nullptr when it is not on
  // probation), and whether ncclguard holds it: NCCL does not see it now, ncclguard issues it.
  struct Claim {
    ProbationOp* probation = nullptr;
    bool held = false;
  };

  // In the shim, first thing for each communicator argument of a call: waits out a recovery that
  // is re-pointing handles (unless this thread is the one recovering), then gives the real
  // communicator behind one of ncclguard's handles, with `*slot` set to the library slot that
  // serves it; anything else is returned unchanged.
  virtual ncclComm_t Resolve(ncclComm_t comm, int* slot) noexcept = 0;

  // Operation `seq` of `comm`, its ring record filled but not published, on the application's
  // thread: puts it on probation (and holds it) or not. `group` is its ncclGroupStart/End (0:
  // none); `holdable` is false for an operation that cannot be gated (captured, untimed). Every
  // operation of a group is remembered until the group's outermost end (AtGroupEnd).
  virtual Claim OnOperation(CommState& comm, std::uint64_t seq, Api api, const OperationArguments& arguments,
                            std::uint64_t group, bool holdable) noexcept = 0;
  // After NCCL took (or refused) an operation outside a group that OnOperation put on probation
  // without holding it: gates its stream once it is queued.
  virtual void AfterLaunch(const CommState& comm, std::uint64_t seq, ProbationOp& probation,
                           ncclResult_t result) noexcept = 0;
  // At the outermost end of a group (ncclGroupEnd or ncclGroupSimulateEnd) that returned
  // `result`, after the group's end events were recorded: its held operations are issued (or
  // dropped), the others on probation gated.
  virtual void AtGroupEnd(Api api, ncclResult_t result) noexcept = 0;

  // Before the application closes `comm` (ncclCommDestroy, ncclCommAbort, ncclCommFinalize) or
  // splits or shrinks it: its held operations are handed to NCCL first (an abort drops them
  // instead, in Closing), so that ncclguard and the application never call NCCL on it at once.
  virtual void BeforeClosing(CommState& comm, Api api) noexcept = 0;
  // Once `comm` is marked closing: waits until ncclguard's issuing thread is out of NCCL on it; an
  // abort drops what is held (NCCL never saw it) and the application's stream goes on.
  virtual void Closing(CommState& comm, Api api) noexcept = 0;

  // At a creation: the library slot new communicators made from a unique id go to (-1: the one
  // the application called); how many of a new communicator's first operations go on probation;
  // and, once NCCL returned them, `comms` replaced in place by ncclguard's handles.
  virtual int CreationSlot() noexcept = 0;
  virtual int ProbationLimit(int library) noexcept = 0;
  virtual void HandOutHandles(int library, ncclComm_t* comms, int count) noexcept = 0;

 protected:
  ~InProcessRecovery() = default;
};

// Null unless NCCLGUARD_RECOVER=inprocess; set by record/ when ncclguard starts.
inline std::atomic<InProcessRecovery*> g_in_process_recovery{nullptr};

inline InProcessRecovery* InProcessRecoveryOn() noexcept {
  return g_in_process_recovery.load(std::memory_order_acquire);
}

}  // namespace ncclguard
