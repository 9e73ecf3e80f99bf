// A persistent straggler slower than NCCLGUARD_TIMEOUT stalls the same collective at every step:
// with a fake clock, the stalls of one operation are dumped at most once per timeout, the spacing
// doubling while it goes on, and the skipped ones are counted in the log line and the next dump.
#include <cstdio>

#include <catch2/catch.hpp>

#include "tests/detect/fakes.h"
#include "watchdog/detect/dump_spacing.h"
#include "watchdog/detect/watchdog.h"
#include "watchdog/state/registry.h"

using namespace ncclguard;
using ncclguard::testing::EnqueueAllReduce;
using ncclguard::testing::FakeGpuEvents;
using ncclguard::testing::RecordingEffects;

namespace {

constexpr std::int64_t kSecond = 1'000'000'000;
constexpr std::int64_t kMillisecond = 1'000'000;

Stall AllReduceStall(std::uint64_t seq, std::uint64_t count = 1024) {
  Stall stall;
  stall.comm_id = "1111222233334444";
  stall.seq = seq;
  stall.api = Api::ncclAllReduce;
  stall.datatype = ncclFloat32;
  stall.count = count;
  stall.reduction = ncclSum;
  return stall;
}

Config StragglerConfig() {
  Config config;
  config.timeout = Seconds{2};
  config.hard_timeout = Seconds{1800};
  config.status_interval = Seconds{1};
  return config;
}

struct StragglerFixture : ncclguard::testing::WatchdogFixture {
  StragglerFixture() : WatchdogFixture(StragglerConfig(), 0) {}

  // One step of the job: this rank's AllReduce starts at `start` and waits `wait` for the
  // straggler; the watchdog polls every 100 ms.
  void Step(std::int64_t start, std::int64_t wait) {
    OpRecord& op = EnqueueAllReduce(*comm, events, start);
    events.Reach(op.start_event);
    for (std::int64_t now = start; now < start + wait; now += 100 * kMillisecond) watchdog.PollOnce(now, now);
    events.Reach(op.end_event);
    watchdog.PollOnce(start + wait, start + wait);
  }
};

}  // namespace

TEST_CASE("the stalls of one operation are dumped at most once per timeout, the spacing doubling",
          "[watchdog][dumps]") {
  StallDumpSpacing spacing;
  const std::int64_t timeout = 2 * kSecond;
  const std::int64_t most = 1800 * kSecond;
  CHECK(spacing.Decide(AllReduceStall(5), 0, timeout, most).dump);
  const StallDumpSpacing::Decision skipped = spacing.Decide(AllReduceStall(6), 1 * kSecond, timeout, most);
  CHECK_FALSE(skipped.dump);
  CHECK(skipped.skipped == 1);
  CHECK(skipped.next_dump_ns == 2 * kSecond);
  const StallDumpSpacing::Decision second = spacing.Decide(AllReduceStall(7), 2 * kSecond, timeout, most);
  CHECK(second.dump);
  CHECK(second.skipped == 1);
  CHECK(second.next_dump_ns == 6 * kSecond);  // 4 s now
  CHECK_FALSE(spacing.Decide(AllReduceStall(8), 5 * kSecond, timeout, most).dump);
  CHECK(spacing.Decide(AllReduceStall(9), 6 * kSecond, timeout, most).dump);
  // Another operation starts afresh; so does the first one after it.
  CHECK(spacing.Decide(AllReduceStall(10, 2048), 6 * kSecond + 1, timeout, most).dump);
  CHECK(spacing.Decide(AllReduceStall(11), 6 * kSecond + 2, timeout, most).dump);
  CHECK_FALSE(spacing.Decide(AllReduceStall(12), 7 * kSecond, timeout, most).dump);
}

TEST_CASE("the spacing stops growing at its bound", "[watchdog][dumps]") {
  StallDumpSpacing spacing;
  std::int64_t now = 0;
  int dumps = 0;
  for (int stall = 0; stall < 200; ++stall, now += 3 * kSecond) {
    if (spacing.Decide(AllReduceStall(stall + 1), now, 2 * kSecond, 16 * kSecond).dump) ++dumps;
  }
  // 0, 3, 9, 18 (spacings 2, 4, 8, 16), then every 16 s at most: about 600 s / 18 s.
  CHECK(dumps >= 30);
  CHECK(dumps <= 40);
}

TEST_CASE("a persistent straggler does not make a waiting rank dump at every step", "[watchdog][dumps]") {
  StragglerFixture f;
  // Ten steps of 3 s each, every one stalled 1 s past the 2 s timeout.
  for (int step = 0; step < 10; ++step) f.Step(step * 3 * kSecond, 3 * kSecond);
  std::vector<int> skipped;
  for (const ProcessSnapshot& dump : f.effects.dumps) {
    REQUIRE(dump.stall.has_value());
    skipped.push_back(dump.stall->skipped_dumps);
  }
  // Stalls at 2, 5, 8, 11, 14, 17, 20, 23, 26, 29 s; spacings 2, 4, 8, 16 s: dumped at 2, 5, 11, 20 s.
  CHECK(skipped == std::vector<int>{0, 0, 1, 2});
  // The peers are asked for their dumps only with a dump of our own.
  CHECK(f.effects.peer_requests_sent.size() == 4);
}
