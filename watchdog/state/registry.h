// Every communicator ncclguard knows of, and the initialisations under way.
//
// Thread contract: the application's threads find states lock-free (Find) and add them under the
// lock; only the watchdog thread unlinks and frees them, once the application has closed their
// communicator (see Watchdog::ReleaseClosedCommunicators), under the watchdog's status lock. A
// state is therefore valid for the watchdog thread from All() to the end of its round, for a
// thread holding that lock while it holds it, and for an application thread for as long as it
// uses the communicator (using one after closing it is undefined in NCCL too).
#pragma once

#include <nccl.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "watchdog/common/mutex.h"
#include "watchdog/state/records.h"

namespace ncclguard {

// A communicator initialisation in progress on some thread.
struct PendingInit {
  Api api;
  std::string comm_id;
  int rank = -1;
  int nranks = 0;
  std::int64_t start_ns = 0;  // steady clock
  std::int64_t thread = 0;
  int result = 0;  // ncclSuccess, or the error it returned (said while it is still pending)
};

class Registry {
 public:
  Registry() = default;
  // Frees every state it registered. The process's own registry is never destroyed (dumps at
  // exit and the watchdog may read it to the very end); tests make and destroy their own.
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The state of `handle`, or nullptr when ncclguard does not know it. Lock-free; no lookup in the
  // table while the thread asks about the communicator it asked about last and nothing changed.
  CommState* Find(ncclComm_t handle) const noexcept;

  // Registers a communicator (a handle may be reused by NCCL after a destroy: the newest wins).
  // Allocates its ring; `initialize` fills in the rest before anyone else can see it. Returns
  // nullptr when the table is full (logged once).
  CommState* Add(ncclComm_t handle, int library, std::size_t ring_size,
                 const std::function<void(CommState&)>& initialize = {});

  // In-process recovery: from now on `state` stands for `new_handle`, served by the library in
  // `new_library` (Find(old handle) no longer returns it). False when the table is full; Find then
  // knows it by no handle.
  bool Rekey(CommState* state, ncclComm_t new_handle, int new_library) noexcept;

  // Every communicator registered and not yet removed, oldest first (a copy: safe to walk while
  // others register).
  std::vector<CommState*> All() const;
  // Whether one of them is open: initialising or ready, not closed by the application.
  bool AnyOpen() const;

  // Watchdog thread only. Unlink: Find() no longer returns `state` (its handle may already name a
  // newer communicator, which stays). Remove: also gone from All(), and freed.
  void Unlink(CommState* state) noexcept;
  void Remove(CommState* state) noexcept;

  int BeginInit(PendingInit init);  // returns a token for EndInit; -1 when none is free
  void EndInit(int token) noexcept;
  // The initialisation returned `result`, an error: its dump, taken before EndInit, says which.
  void FailInit(int token, int result) noexcept;
  std::vector<PendingInit> PendingInits() const;

  // In a forked child: the parent's communicators are not the child's. Their memory is leaked on
  // purpose (a lock may have been held by a thread that does not exist in the child).
  void ForgetAfterFork() noexcept ABSL_NO_THREAD_SAFETY_ANALYSIS;

 private:
  static constexpr std::size_t kCapacity = 8192;
  // A slot whose communicator was unlinked: probing goes on past it, Add reuses it.
  static ncclComm_t Tombstone() noexcept { return reinterpret_cast<ncclComm_t>(~std::uintptr_t{0}); }

  CommState* FindInTable(ncclComm_t handle) const noexcept;
  // Where `handle` is, or would go; kCapacity when the table is full.
  std::size_t SlotForLocked(ncclComm_t handle) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void PublishLocked(std::size_t slot, ncclComm_t handle, CommState* state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void UnlinkLocked(CommState* state) noexcept ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  static constexpr std::size_t kMaxPendingInits = 64;
  std::atomic<ncclComm_t> keys_[kCapacity] = {};
  std::atomic<CommState*> values_[kCapacity] = {};
  // Changed with every key published or unlinked: a thread's last answer of Find is still right
  // while it is unchanged.
  std::atomic<std::uint64_t> generation_{1};
  // Writers of keys_ and values_ hold it too; readers (Find) do not.
  mutable Mutex mutex_;
  std::vector<CommState*> all_ ABSL_GUARDED_BY(mutex_);
  PendingInit pending_[kMaxPendingInits] ABSL_GUARDED_BY(mutex_);
  bool pending_used_[kMaxPendingInits] ABSL_GUARDED_BY(mutex_) = {};
};

Registry& GetRegistry();

// 16 hex digits naming a communicator the same way on every rank.
std::string CommIdFromUniqueId(const ncclUniqueId& id);
// For a communicator made from `parent` (split or shrink): every rank makes the same calls on the
// parent in the same order, so (parent id, how, how many before, color) is the same everywhere.
std::string ChildCommId(const std::string& parent_id, std::string_view how, std::uint32_t ordinal, int color);

// How many threads of the process are inside an NCCL call now, and the last one entered; for
// status files ("is this rank blocked in NCCL?").
void EnterNccl(Api api) noexcept;
void LeaveNccl() noexcept;
std::string CurrentNcclCall();  // "" when no thread is inside NCCL

}  // namespace ncclguard
