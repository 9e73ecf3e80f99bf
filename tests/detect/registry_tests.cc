// The registry's lookup of a communicator's state by its handle: right after every change of the
// table, on the thread that changed it and on others, although each thread keeps its last answer.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <thread>

#include "watchdog/state/registry.h"

using namespace ncclguard;

namespace {
ncclComm_t Handle(std::uintptr_t value) { return reinterpret_cast<ncclComm_t>(value); }
}  // namespace

TEST_CASE("a handle's state is found again after every change of the table", "[registry]") {
  Registry registry;
  const ncclComm_t first = Handle(0x1000);
  const ncclComm_t second = Handle(0x2000);
  CHECK(registry.Find(first) == nullptr);
  CommState* state = registry.Add(first, 0, 8);
  REQUIRE(state != nullptr);
  CHECK(registry.Find(first) == state);  // an unknown answer kept before the Add is not reused
  CHECK(registry.Find(first) == state);

  REQUIRE(registry.Rekey(state, second, 1));
  CHECK(registry.Find(first) == nullptr);
  CHECK(registry.Find(second) == state);

  // NCCL reuses a freed communicator's address: the newest state wins.
  registry.Remove(state);
  CHECK(registry.Find(second) == nullptr);
  CommState* reused = registry.Add(second, 0, 8);
  CHECK(registry.Find(second) == reused);
  registry.Unlink(reused);
  CHECK(registry.Find(second) == nullptr);
  registry.Remove(reused);
}

TEST_CASE("a thread's last answer does not outlive a change made by another thread", "[registry]") {
  Registry registry;
  const ncclComm_t old_handle = Handle(0x3000);
  const ncclComm_t new_handle = Handle(0x4000);
  CommState* state = registry.Add(old_handle, 0, 8);
  REQUIRE(state != nullptr);
  std::atomic<int> step{0};
  std::thread asker([&] {
    CHECK(registry.Find(old_handle) == state);  // kept as this thread's last answer
    step.store(1);
    while (step.load() != 2) std::this_thread::yield();
    CHECK(registry.Find(old_handle) == nullptr);
    CHECK(registry.Find(new_handle) == state);
  });
  while (step.load() != 1) std::this_thread::yield();
  REQUIRE(registry.Rekey(state, new_handle, 0));
  step.store(2);
  asker.join();
}
