// Many application threads, each on its own communicators, record operations while the watchdog
// runs its rounds and takes snapshots: the records' publication protocol under ThreadSanitizer.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "tests/detect/fakes.h"
#include "watchdog/record/hooks.h"
#include "watchdog/state/registry.h"
#include "watchdog/report/snapshot_builder.h"
#include "watchdog/detect/watchdog.h"

using namespace ncclguard;

TEST_CASE("threads record operations on several communicators while the watchdog polls",
          "[concurrency]") {
  ncclguard::testing::FakeGpuEvents events;
  events.ReachEverything();
  ReplaceGpuEventsForTesting(&events);
  ncclguard::testing::RecordingEffects effects;
  Config config;
  config.timeout = Seconds{60};
  Watchdog watchdog(config, GetRegistry(), events, effects);

  constexpr int kThreads = 4;
  constexpr int kCommsPerThread = 2;
  constexpr int kOperations = 3000;
  std::vector<CommState*> comms;
  for (int i = 0; i < kThreads * kCommsPerThread; ++i) {
    CommState* comm = GetRegistry().Add(reinterpret_cast<ncclComm_t>(0x900000 + 0x100 * i), 0, 64);
    REQUIRE(comm != nullptr);
    comm->lifecycle = CommLifecycle::kReady;
    comms.push_back(comm);
  }

  std::atomic<bool> done{false};
  std::atomic<int> short_snapshots{0};  // Catch2's assertions are for the test's own thread
  std::thread watchdog_thread([&] {
    while (!done.load()) {
      watchdog.PollOnce(SteadyNowNs());
      const ProcessSnapshot snapshot = BuildSnapshot(GetRegistry(), "test", true, SteadyNowNs(), 0);
      if (snapshot.comms.size() < comms.size()) short_snapshots.fetch_add(1);
    }
  });
  std::vector<std::thread> application;
  for (int t = 0; t < kThreads; ++t) {
    application.emplace_back([&, t] {
      for (int i = 0; i < kOperations; ++i) {
        const bool grouped = i % 10 == 0;
        if (grouped) {
          BeforeGroupCall(Api::ncclGroupStart);
          AfterGroupCall(Api::ncclGroupStart, ncclSuccess);
        }
        for (int c = 0; c < kCommsPerThread; ++c) {
          OperationArguments arguments;
          arguments.comm = comms[t * kCommsPerThread + c]->handle;
          arguments.stream = reinterpret_cast<void*>(0x50 + t);
          arguments.count = 16;
          arguments.datatype = ncclFloat32;
          const Ticket ticket = BeforeOperation(Api::ncclAllReduce, 0, arguments);
          AfterOperation(ticket, ncclSuccess);
        }
        if (grouped) {
          BeforeGroupCall(Api::ncclGroupEnd);
          AfterGroupCall(Api::ncclGroupEnd, ncclSuccess);
        }
      }
    });
  }
  for (std::thread& thread : application) thread.join();
  // Let the watchdog see the last operations complete.
  for (int round = 0; round < 1000; ++round) {
    bool all_completed = true;
    for (CommState* comm : comms) all_completed &= comm->last_completed.load() == kOperations;
    if (all_completed) break;
    std::this_thread::yield();
  }
  done = true;
  watchdog_thread.join();
  ReplaceGpuEventsForTesting(nullptr);
  for (CommState* comm : comms) {
    CHECK(comm->last_enqueued.load() == kOperations);
    CHECK(comm->last_completed.load() + comm->dropped.load() >= kOperations - comm->ring_size);
  }
  CHECK(effects.dumps.empty());
  CHECK(short_snapshots.load() == 0);
}

TEST_CASE("communicators created and destroyed while the watchdog polls are freed by the watchdog",
          "[concurrency]") {
  ncclguard::testing::FakeGpuEvents events;
  events.ReachEverything();
  ReplaceGpuEventsForTesting(&events);
  ncclguard::testing::RecordingEffects effects;
  Config config;
  config.status_interval = Seconds{0.001};
  Watchdog watchdog(config, GetRegistry(), events, effects);

  constexpr int kThreads = 4;
  constexpr int kCycles = 500;
  constexpr std::uintptr_t kFirstHandle = 0xa0000000;
  // Only the watchdog thread may read a state it could free: the test compares addresses only.
  std::mutex created_mutex;
  std::set<CommState*> created;
  auto ours = [&] {
    std::lock_guard<std::mutex> lock(created_mutex);
    int count = 0;
    for (CommState* comm : GetRegistry().All()) count += created.count(comm) != 0;
    return count;
  };
  std::atomic<bool> done{false};
  std::thread watchdog_thread([&] {
    while (!done.load()) watchdog.PollOnce(SteadyNowNs());
  });
  std::vector<std::thread> application;
  std::atomic<int> not_registered{0};
  for (int t = 0; t < kThreads; ++t) {
    application.emplace_back([&, t] {
      for (int i = 0; i < kCycles; ++i) {
        const auto handle = reinterpret_cast<ncclComm_t>(kFirstHandle + (t * kCycles + i) * 0x40);
        CommState* comm = GetRegistry().Add(handle, 0, 16, [](CommState& state) { state.lifecycle = CommLifecycle::kReady; });
        if (comm == nullptr) {
          not_registered.fetch_add(1);
          continue;
        }
        {
          std::lock_guard<std::mutex> lock(created_mutex);
          created.insert(comm);
        }
        for (int op = 0; op < 3; ++op) {
          OperationArguments arguments;
          arguments.comm = handle;
          arguments.count = 16;
          arguments.datatype = ncclFloat32;
          AfterOperation(BeforeOperation(Api::ncclAllReduce, 0, arguments), ncclSuccess);
        }
        (void)BeforeCommCall(Api::ncclCommDestroy, handle);
        AfterCommCall(Api::ncclCommDestroy, handle, ncclSuccess);
      }
    });
  }
  for (std::thread& thread : application) thread.join();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (ours() != 0 && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  done = true;
  watchdog_thread.join();
  ReplaceGpuEventsForTesting(nullptr);
  CHECK(not_registered.load() == 0);
  CHECK(ours() == 0);
  CHECK(events.Destroyed().size() == 2 * 3 * kThreads * kCycles);
}
