// Probation (NCCLGUARD_RECOVER=inprocess): the GPU side of holding the application's stream after
// one of a communicator's first operations. After the operation, the stream runs a host function
// that opens a gate unless the watchdog took the operation over, then waits at the gate (a
// page-locked word, cuStreamWaitValue32). No thread of the application ever waits: only its
// stream does, and only until the operation is seen complete or has been replayed.
#pragma once

#include <cstddef>
#include <cstdint>

#include "watchdog/state/records.h"

namespace ncclguard {

// Whether the driver has what probation needs (stream memory operations, host functions).
bool ProbationAvailable() noexcept;

// How many bytes of `op`'s input the operation itself may overwrite on this rank (its input and
// its output overlap), so that a replay needs a copy of them: 0 when none (Broadcast, Send, Recv,
// out-of-place operations, and the ranks of a rooted operation that have no output).
std::size_t OverwrittenInputBytes(const ProbationOp& op, int rank, int nranks) noexcept;

// On the calling thread, in its current context, before the operation is handed to NCCL: copies
// `bytes` of its input to memory of ncclguard's on `op.stream`. False when that fails.
bool SaveInput(ProbationOp& op, std::size_t bytes) noexcept;

// After NCCL took the operation: gives `op` a gate word and queues the host function and the wait
// on `op.stream`, then publishes `op.state` as kPending. False (and nothing is left waiting) when
// the driver refuses; the operation is then not on probation.
bool GateStream(ProbationOp& op) noexcept;

// The steps of GateStream, for an operation ncclguard holds: the gate word is taken and the
// application's stream made to wait at it when the application calls (TakeGate, WaitAtGate, in
// the caller's context); the host function is queued on the stream it runs on when ncclguard has
// handed it to NCCL (ArmGate, which publishes kPending).
bool TakeGate(ProbationOp& op) noexcept;
bool WaitAtGate(ProbationOp& op) noexcept;
bool ArmGate(ProbationOp& op, void* exec_stream) noexcept;

// Whether the operation is still ahead of the ones queued behind it: held, in NCCL's hands, or
// being recovered.
bool Unreleased(const ProbationOp& op) noexcept;

// Operation `seq` of `comm` when it is on probation and in NCCL's hands with its gate still
// closed; nullptr otherwise.
ProbationOp* PendingProbationOp(CommState& comm, std::uint64_t seq) noexcept;

// Takes over every pending operation of `comm` (TakeOverGate), so that no gate of it opens again:
// for a process about to exit, whose application stream must not go on past an operation that did
// not complete, to results it would take for right ones. Whether it took any over.
bool KeepGatesClosed(CommState& comm) noexcept;

// A probation operation was released or queued: wakes the thread that issues held operations.
// Async-signal-safe (a futex), so host functions may call it.
void NoteProbationChange() noexcept;
// How many changes were noted so far.
std::uint32_t ProbationChanges() noexcept;
// Waits until a change is noted after ProbationChanges() said `seen`, or `timeout_ms` passed.
void AwaitProbationChange(std::uint32_t seen, int timeout_ms) noexcept;

// Opens the gate: the stream goes on past it.
void OpenGate(ProbationOp& op) noexcept;

// The watchdog's side: takes a pending `op` over from its host function, which then leaves the gate
// closed (only a replay opens it). False when the host function opened it first: the operation
// completed.
bool TakeOverGate(ProbationOp& op) noexcept;

}  // namespace ncclguard
