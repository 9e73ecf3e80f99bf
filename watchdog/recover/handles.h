// The table of ncclguard's communicator handles (comm_handle.h): made when a communicator is
// created under NCCLGUARD_RECOVER=inprocess (InProcessRecovery::HandOutHandles, door.cc), and
// re-pointed at a new communicator by in-process recovery (in_process.cc).
#pragma once

#include <nccl.h>

#include "watchdog/recover/comm_handle.h"

namespace ncclguard {

// A new handle standing for `real`, served by the library in `slot`. Handles are never freed: a
// call on a destroyed communicator must still be recognised as one of ours, and a handle with its
// targets costs a few dozen bytes per communicator the process ever made. nullptr when out of
// memory (the caller then hands out `real` itself).
CommHandle* NewCommHandle(ncclComm_t real, int slot) noexcept;

// The handle `comm` is, or nullptr when it is not one of ncclguard's.
CommHandle* AsCommHandle(ncclComm_t comm) noexcept;

// The handle that stands for `real` now, or nullptr when none does.
CommHandle* FindCommHandle(ncclComm_t real) noexcept;

// From now on, calls on `handle` go to `new_real` through the library in `new_slot`. Atomic: a
// call made at the same time sees either the old pair or the new one, never a mix. False when out
// of memory (the handle is then unchanged).
bool RepointHandle(CommHandle* handle, ncclComm_t new_real, int new_slot) noexcept;

// The library slot that new communicators made from a unique id (ncclCommInitRank, its Config and
// Scalable forms, ncclCommInitAll) are to be created on from now on, e.g. a private instance after
// in-process recovery; -1 (the default): the library the application called. Splits and shrinks
// always follow their parent's library.
void SendCreationsTo(int slot) noexcept;

// In-process recovery holds the application's calls that name a communicator while it re-points
// handles (g_recoveries_under_way); its own thread, and NCCL's calls made on it, must not wait.
// A scope on the recovering thread: counts the recovery as under way and marks the thread.
class RecoveryUnderWay {
 public:
  RecoveryUnderWay() noexcept;
  ~RecoveryUnderWay();
  RecoveryUnderWay(const RecoveryUnderWay&) = delete;
  RecoveryUnderWay& operator=(const RecoveryUnderWay&) = delete;
};
bool OnRecoveringThread() noexcept;
int CreationSlot() noexcept;

}  // namespace ncclguard
