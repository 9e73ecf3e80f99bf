// ncclguard's communicator handles: made and re-pointed on cold paths (creation, recovery) under a
// lock; read under in-process recovery on every call through comm_handle.h without one.
#include "watchdog/recover/handles.h"

#include <nccl.h>

#include <atomic>
#include <new>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "watchdog/common/mutex.h"
#include "watchdog/recover/comm_handle.h"

namespace ncclguard {
namespace {

struct HandleTable {
  Mutex mutex;
  // Every handle ever made, in order: few (one per communicator), and never freed.
  std::vector<CommHandle*> handles ABSL_GUARDED_BY(mutex);
};

std::atomic<int> g_creation_slot{-1};

HandleTable& Table() {
  static auto* table = new HandleTable;  // never destroyed: handles outlive static destructors
  return *table;
}

}  // namespace

CommHandle* NewCommHandle(ncclComm_t real, int slot) noexcept {
  try {
    auto* handle = new CommHandle;
    // Leaked on purpose, like the handle: a reader may still hold it.
    handle->target.store(new CommTarget{real, slot}, std::memory_order_release);
    HandleTable& table = Table();
    {
      MutexLock lock(table.mutex);
      table.handles.push_back(handle);
    }
    g_comm_handles_made.store(true, std::memory_order_release);
    return handle;
  } catch (...) {
    return nullptr;
  }
}

CommHandle* AsCommHandle(ncclComm_t comm) noexcept {
  int slot = 0;
  if (comm == nullptr || ResolveComm(comm, &slot) == comm) {
    // A handle standing for itself cannot exist: its target is always NCCL's communicator.
    return nullptr;
  }
  return reinterpret_cast<CommHandle*>(comm);
}

CommHandle* FindCommHandle(ncclComm_t real) noexcept {
  if (real == nullptr) return nullptr;
  HandleTable& table = Table();
  MutexLock lock(table.mutex);
  for (CommHandle* handle : table.handles) {
    if (handle->target.load(std::memory_order_acquire)->real == real) return handle;
  }
  return nullptr;
}

bool RepointHandle(CommHandle* handle, ncclComm_t new_real, int new_slot) noexcept {
  if (handle == nullptr) return false;
  auto* target = new (std::nothrow) CommTarget{new_real, new_slot};
  if (target == nullptr) return false;
  // The old target stays allocated: a call on another thread may be reading it.
  handle->target.store(target, std::memory_order_release);
  return true;
}

namespace {
thread_local bool t_recovering = false;  // plain data: no TLS constructor
}  // namespace

RecoveryUnderWay::RecoveryUnderWay() noexcept {
  t_recovering = true;
  g_recoveries_under_way.fetch_add(1, std::memory_order_seq_cst);
}

RecoveryUnderWay::~RecoveryUnderWay() {
  g_recoveries_under_way.fetch_sub(1, std::memory_order_seq_cst);
  t_recovering = false;
}

bool OnRecoveringThread() noexcept { return t_recovering; }

void SendCreationsTo(int slot) noexcept { g_creation_slot.store(slot, std::memory_order_release); }

int CreationSlot() noexcept { return g_creation_slot.load(std::memory_order_acquire); }

}  // namespace ncclguard
