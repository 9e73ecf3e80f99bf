// Many application threads, each on its own communicators, record operations while the watchdog
// runs its rounds and takes snapshots: the records' publication protocol under ThreadSanitizer.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include "tests/core/fakes.h"
#include "watchdog/operations.h"
#include "watchdog/registry.h"
#include "watchdog/snapshot_builder.h"
#include "watchdog/watchdog.h"

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
