#include "watchdog/state/registry.h"

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "watchdog/common/fnv1a.h"
#include "watchdog/common/log.h"
#include "watchdog/common/mutex.h"
#include "watchdog/common/nccl_api.h"
#include "watchdog/state/records.h"

namespace ncclguard {
namespace {

std::size_t HashOf(ncclComm_t handle) {
  auto bits = reinterpret_cast<std::uintptr_t>(handle);
  bits ^= bits >> 17;
  bits *= 0x9e3779b97f4a7c15ULL;
  return static_cast<std::size_t>(bits >> 20);
}

}  // namespace

Registry::~Registry() {
  for (CommState* state : all_) delete state;
}

CommState* Registry::Find(ncclComm_t handle) const noexcept {
  // A thread issues its collectives on a few communicators, mostly one after the other: the last
  // answers are kept per thread, good until the table changes. Plain data: no TLS constructor.
  struct LastFound {
    const Registry* registry;
    ncclComm_t handle;
    CommState* state;
    std::uint64_t generation;
  };
  // The last few answers: one process may drive several GPUs from one thread, a communicator
  // each, in turn.
  struct Recent {
    LastFound found[4];
    unsigned next;  // the one to replace
  };
  static thread_local Recent t_recent;
  Recent* recent = &t_recent;
  asm("" : "+r"(recent));  // an opaque pointer: one look-up of the thread's copy (a call into the loader)
  // Read before the table: an answer found after a change is only kept until the next look.
  const std::uint64_t generation = generation_.load(std::memory_order_acquire);
  for (const LastFound& last : recent->found) {
    if (last.handle == handle && last.registry == this && last.generation == generation) return last.state;
  }
  CommState* state = FindInTable(handle);
  recent->found[recent->next++ % 4] = {this, handle, state, generation};
  return state;
}

CommState* Registry::FindInTable(ncclComm_t handle) const noexcept {
  if (handle == nullptr) return nullptr;
  for (std::size_t probe = 0, i = HashOf(handle) % kCapacity; probe < kCapacity;
       ++probe, i = (i + 1) % kCapacity) {
    const ncclComm_t key = keys_[i].load(std::memory_order_acquire);
    if (key == handle) return values_[i].load(std::memory_order_acquire);
    if (key == nullptr) return nullptr;
  }
  return nullptr;
}

std::size_t Registry::SlotForLocked(ncclComm_t handle) const {
  // The handle's own slot when NCCL reused it (the newest wins), else the first free one.
  std::size_t free_slot = kCapacity;
  for (std::size_t probe = 0, i = HashOf(handle) % kCapacity; probe < kCapacity;
       ++probe, i = (i + 1) % kCapacity) {
    const ncclComm_t key = keys_[i].load(std::memory_order_relaxed);
    if (key == handle) return i;
    if (key == Tombstone() && free_slot == kCapacity) free_slot = i;
    if (key == nullptr) return free_slot == kCapacity ? i : free_slot;
  }
  return free_slot;
}

void Registry::PublishLocked(std::size_t slot, ncclComm_t handle, CommState* state) {
  values_[slot].store(state, std::memory_order_release);
  keys_[slot].store(handle, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
}

CommState* Registry::Add(ncclComm_t handle, int library, std::size_t ring_size,
                         const std::function<void(CommState&)>& initialize) {
  auto state = std::make_unique<CommState>(handle, library, ring_size);
  if (initialize) initialize(*state);  // before it is published: its plain fields are then fixed
  MutexLock lock(mutex_);
  const std::size_t slot = SlotForLocked(handle);
  if (slot == kCapacity) {
    static std::atomic<bool> reported{false};
    if (!reported.exchange(true)) {
      log::Warn("more than {} communicators at once: the newest are not watched", kCapacity);
    }
    return nullptr;
  }
  PublishLocked(slot, handle, state.get());
  all_.push_back(state.get());
  return state.release();
}

bool Registry::Rekey(CommState* state, ncclComm_t new_handle, int new_library) noexcept {
  MutexLock lock(mutex_);
  UnlinkLocked(state);
  state->handle.store(new_handle, std::memory_order_release);
  state->library.store(new_library, std::memory_order_release);
  const std::size_t slot = SlotForLocked(new_handle);
  if (slot == kCapacity) return false;
  PublishLocked(slot, new_handle, state);
  return true;
}

std::vector<CommState*> Registry::All() const {
  MutexLock lock(mutex_);
  return all_;
}

bool Registry::AnyOpen() const {
  MutexLock lock(mutex_);
  return std::any_of(all_.begin(), all_.end(), [](const CommState* comm) {
    const CommLifecycle lifecycle = comm->lifecycle.load(std::memory_order_acquire);
    return lifecycle == CommLifecycle::kInitializing || lifecycle == CommLifecycle::kReady;
  });
}

void Registry::Unlink(CommState* state) noexcept {
  MutexLock lock(mutex_);
  UnlinkLocked(state);
}

void Registry::UnlinkLocked(CommState* state) noexcept {
  const ncclComm_t handle = state->handle.load(std::memory_order_relaxed);
  std::size_t i = HashOf(handle) % kCapacity;
  for (std::size_t probe = 0; probe < kCapacity; ++probe, i = (i + 1) % kCapacity) {
    const ncclComm_t key = keys_[i].load(std::memory_order_relaxed);
    if (key == nullptr) return;
    if (key == handle) break;
  }
  if (keys_[i].load(std::memory_order_relaxed) != handle ||
      values_[i].load(std::memory_order_relaxed) != state) {
    return;  // not found, or its handle names a newer communicator now
  }
  keys_[i].store(Tombstone(), std::memory_order_release);
  values_[i].store(nullptr, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  // Tombstones just before an empty slot end no probe sequence: emptying them keeps lookups of
  // unknown handles short. (A key past an empty slot never probed through it.)
  while (keys_[(i + 1) % kCapacity].load(std::memory_order_relaxed) == nullptr &&
         keys_[i].load(std::memory_order_relaxed) == Tombstone()) {
    keys_[i].store(nullptr, std::memory_order_release);
    i = (i + kCapacity - 1) % kCapacity;
  }
}

void Registry::Remove(CommState* state) noexcept {
  Unlink(state);
  {
    MutexLock lock(mutex_);
    std::erase(all_, state);
  }
  delete state;
}

int Registry::BeginInit(PendingInit init) {
  MutexLock lock(mutex_);
  for (std::size_t i = 0; i < kMaxPendingInits; ++i) {
    if (!pending_used_[i]) {
      pending_used_[i] = true;
      pending_[i] = std::move(init);
      return static_cast<int>(i);
    }
  }
  return -1;
}

void Registry::EndInit(int token) noexcept {
  if (token < 0) return;
  MutexLock lock(mutex_);
  pending_used_[token] = false;
}

void Registry::FailInit(int token, int result) noexcept {
  if (token < 0) return;
  MutexLock lock(mutex_);
  pending_[token].result = result;
}

std::vector<PendingInit> Registry::PendingInits() const {
  MutexLock lock(mutex_);
  std::vector<PendingInit> inits;
  for (std::size_t i = 0; i < kMaxPendingInits; ++i) {
    if (pending_used_[i]) inits.push_back(pending_[i]);
  }
  return inits;
}

void Registry::ForgetAfterFork() noexcept {
  new (&mutex_) Mutex();
  for (std::size_t i = 0; i < kCapacity; ++i) {
    keys_[i].store(nullptr, std::memory_order_relaxed);
    values_[i].store(nullptr, std::memory_order_relaxed);
  }
  generation_.fetch_add(1, std::memory_order_relaxed);  // the forking thread's last answer is the parent's
  new (&all_) std::vector<CommState*>();                // the parent's vector is leaked with its states
  for (bool& used : pending_used_) used = false;
}

Registry& GetRegistry() {
  static Registry* registry = new Registry;  // deliberately leaked: used until the very end
  return *registry;
}

std::string CommIdFromUniqueId(const ncclUniqueId& id) {
  return fmt::format("{:016x}", Fnv1a(id.internal, sizeof(id.internal)));
}

std::string ChildCommId(const std::string& parent_id, std::string_view how, std::uint32_t ordinal,
                        int color) {
  std::uint64_t hash = Fnv1a(parent_id.data(), parent_id.size());
  hash = Fnv1a(how.data(), how.size(), hash);
  hash = Fnv1a(&ordinal, sizeof(ordinal), hash);
  hash = Fnv1a(&color, sizeof(color), hash);
  return fmt::format("{:016x}", hash);
}

namespace {
std::atomic<int> g_threads_in_nccl{0};
std::atomic<Api> g_last_api_entered{Api::ncclGetVersion};
}  // namespace

void EnterNccl(Api api) noexcept {
  g_last_api_entered.store(api, std::memory_order_relaxed);
  g_threads_in_nccl.fetch_add(1, std::memory_order_relaxed);
}

void LeaveNccl() noexcept { g_threads_in_nccl.fetch_sub(1, std::memory_order_relaxed); }

std::string CurrentNcclCall() {
  return g_threads_in_nccl.load(std::memory_order_relaxed) > 0
             ? std::string(Describe(g_last_api_entered.load(std::memory_order_relaxed)).name)
             : std::string();
}

}  // namespace ncclguard
