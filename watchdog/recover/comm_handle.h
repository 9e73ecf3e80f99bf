// ncclguard's own communicator handles (NCCLGUARD_RECOVER=inprocess): what the application holds
// instead of NCCL's ncclComm_t, so that in-process recovery can put a new communicator, on another
// library instance, behind it. Only the layout and how a handle is read are here, so that the
// translation (InProcessRecovery::Resolve, recover/door.cc) inlines; making and re-pointing handles
// is handles.h's.
#pragma once

#include <nccl.h>

#include <atomic>
#include <cstdint>

namespace ncclguard {

// What a handle stands for. Never changed once published: re-pointing publishes a new one, so a
// reader always sees a communicator together with the library instance that made it.
struct CommTarget {
  ncclComm_t real = nullptr;
  int slot = 0;  // the library slot whose functions serve `real`
};

// The first 8 bytes of every handle. A real NCCL communicator starts with a magic number of its
// own (the emulator's with a mutex), never this one.
inline constexpr std::uint64_t kCommHandleMagic = 0x4e43434c47524448ULL;  // "NCCLGRDH"

struct CommHandle {
  std::uint64_t magic = kCommHandleMagic;
  std::atomic<const CommTarget*> target{nullptr};
};

// Set once the first handle is made: until then no pointer is looked into, so a process whose
// application made no communicator yet passes every communicator to NCCL exactly as before.
inline std::atomic<bool> g_comm_handles_made{false};

// How many in-process recoveries are re-creating communicators now: application calls that name a
// communicator wait (InProcessRecovery::Resolve) rather than reach one being replaced.
inline std::atomic<int> g_recoveries_under_way{0};

// The communicator `comm` stands for: for one of ncclguard's handles, its current real
// communicator, with `*slot` set to the library slot that serves it; anything else (NCCL's own
// communicator, a foreign pointer, null) is returned unchanged and `*slot` left alone. No lock,
// no allocation: under in-process recovery it runs on every call that names a communicator.
inline ncclComm_t ResolveComm(ncclComm_t comm, int* slot) noexcept {
  if (comm == nullptr || !g_comm_handles_made.load(std::memory_order_relaxed)) return comm;
  // An atomic read: the first word of NCCL's own object may be a lock another thread takes.
  const std::uint64_t first = __atomic_load_n(reinterpret_cast<const std::uint64_t*>(comm), __ATOMIC_RELAXED);
  if (first != kCommHandleMagic) return comm;
  const CommTarget* target =
      reinterpret_cast<const CommHandle*>(comm)->target.load(std::memory_order_acquire);
  *slot = target->slot;
  return target->real;
}

}  // namespace ncclguard
