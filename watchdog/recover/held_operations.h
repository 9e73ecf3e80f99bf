// Operations that probation holds (NCCLGUARD_RECOVER=inprocess): one issued while an earlier
// operation of its communicator is still on probation is not handed to NCCL at once. Were the
// earlier one replayed on a new communicator, this one would otherwise be in NCCL's hands on the
// old one. The application's call returns ncclSuccess at once; its stream waits at the
// operation's gate. ncclguard's issuing thread hands the operation to NCCL itself, on a stream of
// its own that first waits for the application's stream to reach the call, as soon as every
// earlier operation has passed (docs/recovery.md, "Queued operations").
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "watchdog/state/records.h"

namespace ncclguard {

// `op` again, as the application called it, on `comm` and `stream`, through the library in `slot`.
ncclResult_t IssueOperation(const ProbationOp& op, int slot, ncclComm_t comm, CUstream stream) noexcept;

// Runs `issue` (which returns its first failure) between ncclGroupStart and ncclGroupEnd of the
// library in `slot` when `grouped`, else alone: the first failure of the three, or ncclSuccess.
ncclResult_t IssueInGroup(int slot, bool grouped, absl::FunctionRef<ncclResult_t()> issue) noexcept;

// After a call on a non-blocking communicator answered ncclInProgress: polls
// ncclCommGetAsyncError until it no longer does, or `deadline_ns` (steady clock) passes
// (ncclInProgress then).
ncclResult_t AwaitNotInProgress(int slot, ncclComm_t comm, std::int64_t deadline_ns) noexcept;

// On the application's thread, for operation `op` (its probation slot filled, its state still
// kNone) of `comm`: records where the application's stream is, and, unless it was issued inside a
// group (then at the group's end, ReleaseHeldGroup), makes the stream wait at its gate. Publishes
// it as held. False, with nothing left waiting, when the driver refuses.
bool HoldOperation(CommState& comm, ProbationOp& op, bool grouped) noexcept;
// At the outermost ncclGroupEnd: the held operation may be issued, and the stream waits for it.
void ReleaseHeldGroupMember(ProbationOp& op) noexcept;
// A held operation that will never be issued (its communicator aborted, its group failed): the
// application's stream goes on past its gate.
void DropHeld(CommState& comm, ProbationOp& op) noexcept;

// Before the application closes or splits `comm`: waits until its held operations have been
// handed to NCCL, so that the issuing thread and the application never call NCCL on it at once.
void AwaitHeldIssued(CommState& comm) noexcept;

// Whether `comm` still has operations that are held, or on the issuing thread's list.
bool HasHeld(CommState& comm) noexcept;

}  // namespace ncclguard
