// Shared-memory building blocks: futex waits, a process-shared barrier, and named segments.
// Everything that crosses processes is a lock-free atomic, so a rank killed at any point never
// leaves a lock held: its peers just wait, as they would for a dead GPU.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace ncclemu {

static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free);

// Sleeps while *word == expected, at most timeout_ms; shared (not process-private) futex.
void futexWait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms);
void futexWaitFor(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout);
void futexWakeAll(std::atomic<uint32_t>* word);

struct alignas(64) SharedBarrier {
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> generation;
};

// Returns false when interrupted() became true first. The barrier is then unusable (this rank's
// arrival counted), which is fine: an interrupted communicator is never used again.
template <class Interrupted>
bool barrierWait(SharedBarrier& barrier, int participants, Interrupted interrupted) {
  // Read the generation before arriving: it cannot advance until this rank has arrived.
  const uint32_t generation = barrier.generation.load(std::memory_order_acquire);
  if (barrier.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(participants)) {
    barrier.arrived.store(0, std::memory_order_relaxed);
    barrier.generation.fetch_add(1, std::memory_order_release);
    futexWakeAll(&barrier.generation);
    return true;
  }
  while (barrier.generation.load(std::memory_order_acquire) == generation) {
    if (interrupted()) return false;
    // Abort wakes the futex; the timeout only bounds a missed wake.
    futexWait(&barrier.generation, generation, 1000);
  }
  return true;
}

// A mapped POSIX shared-memory segment, unmapped on destruction.
class SharedSegment {
 public:
  enum class Open { Existing, Create, CreateExclusive };

  SharedSegment() = default;
  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;
  SharedSegment& operator=(SharedSegment&& other) noexcept {
    std::swap(base_, other.base_);
    std::swap(size_, other.size_);
    return *this;
  }

  // Returns 0 or an errno value. A new segment reads as zeros.
  int map(const std::string& name, size_t size, Open mode);
  void* base() const { return base_; }
  size_t size() const { return size_; }

 private:
  void* base_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ncclemu
