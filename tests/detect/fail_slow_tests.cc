// The fail-slow watch: which process judges the job's pace, and what it says, holds in its status
// and counts in its metrics as the verdicts appear, change and end.
#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/detect/fakes.h"
#include "watchdog/detect/fail_slow.h"
#include "watchdog/detect/watchdog.h"

namespace ncclguard {
namespace {

using testing::WatchdogFixture;

constexpr std::int64_t kSecond = 1'000'000'000;

Verdict SlowLink(double ratio) {
  return Verdict{.kind = VerdictKind::kSlowLink,
                 .comm = "1111222233334444",
                 .seq = 64,
                 .ranks = {2, 3},
                 .message = "the link from rank 2 to rank 3 on channel 1 is slower",
                 .evidence = {{"channels", {1}}, {"ratio_to_median", ratio}}};
}

Verdict SlowRank() {
  return Verdict{.kind = VerdictKind::kSlowRank,
                 .comm = "1111222233334444",
                 .seq = 64,
                 .ranks = {1},
                 .message = "rank 1 is late into the collectives",
                 .evidence = {{"waited_ms_per_block", 800.0}}};
}

TEST_CASE("a fail-slow verdict is said when it appears, changes and ends, and held meanwhile",
          "[fail_slow]") {
  FailSlowReport report;
  // Found once, then not: nothing said (a look that caught the ranks at different moments).
  CHECK(report.Update({SlowLink(3.0)}).empty());
  CHECK(report.Update({}).empty());
  CHECK(report.Current().empty());
  CHECK(report.Update({SlowLink(3.0), SlowRank()}).empty());
  std::vector<FailSlowReport::Line> lines = report.Update({SlowLink(3.0), SlowRank()});
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].text == "slow_link: the link from rank 2 to rank 3 on channel 1 is slower");
  CHECK(lines[1].text == "slow_rank: rank 1 is late into the collectives");
  CHECK(report.Current().size() == 2);
  // The same again, its figure within a quarter: nothing to say.
  CHECK(report.Update({SlowLink(3.5), SlowRank()}).empty());
  // Twice as slow now: said again, and counted once.
  lines = report.Update({SlowLink(6.0), SlowRank()});
  REQUIRE(lines.size() == 1);
  CHECK_FALSE(lines[0].ended);
  CHECK(report.ReportedByKind().at("slow_link") == 1);
  // The link recovered: its end is said once a second look confirms it.
  CHECK(report.Update({SlowRank()}).empty());
  CHECK(report.HeldByKind().at("slow_link") == 1);
  lines = report.Update({SlowRank()});
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].ended);
  CHECK(lines[0].text.starts_with("slow_link ended: no longer so in the latest operations of communicator"));
  CHECK(report.HeldByKind() == std::map<std::string, std::uint64_t>{{"slow_rank", 1}});
  const std::vector<FailSlowSnapshot> held = report.Current();
  REQUIRE(held.size() == 1);
  CHECK(held[0].kind == "slow_rank");
  CHECK(held[0].ranks == std::vector<int>{1});
}

TEST_CASE(
    "rank 0 of the largest communicator judges the pace, at the interval; it goes in its status and metrics",
    "[fail_slow]") {
  Config config;
  config.slow_interval = Seconds{10};
  WatchdogFixture judge(config, 0);
  judge.effects.fail_slow = {SlowLink(3.0)};
  judge.watchdog.PollOnce(1 * kSecond);  // no block is complete yet: the first look is an interval on
  CHECK(judge.effects.fail_slow_looks == 0);
  judge.watchdog.PollOnce(11 * kSecond);
  CHECK(judge.effects.fail_slow_looks == 1);
  judge.watchdog.PollOnce(15 * kSecond);  // not due yet
  CHECK(judge.effects.fail_slow_looks == 1);
  CHECK(judge.effects.statuses.back().fail_slow.empty());  // seen once: not yet said
  judge.watchdog.PollOnce(21 * kSecond);
  CHECK(judge.effects.fail_slow_looks == 2);
  judge.watchdog.PollOnce(22 * kSecond);
  REQUIRE_FALSE(judge.effects.statuses.empty());
  REQUIRE(judge.effects.statuses.back().fail_slow.size() == 1);
  CHECK(judge.effects.statuses.back().fail_slow[0].kind == "slow_link");
  REQUIRE_FALSE(judge.effects.metrics.empty());
  CHECK(judge.effects.metrics.back().fail_slow_held.at("slow_link") == 1);
  CHECK(judge.effects.metrics.back().fail_slow_reported.at("slow_link") == 1);
  judge.effects.fail_slow.clear();
  judge.watchdog.PollOnce(31 * kSecond);
  CHECK(judge.effects.fail_slow_looks == 3);
  CHECK(judge.effects.statuses.back().fail_slow.size() == 1);  // one look without it is not its end
  judge.watchdog.PollOnce(41 * kSecond);
  CHECK(judge.effects.fail_slow_looks == 4);
  judge.watchdog.PollOnce(42 * kSecond);
  CHECK(judge.effects.statuses.back().fail_slow.empty());
  CHECK(judge.effects.metrics.back().fail_slow_held.empty());

  // Rank 1 never looks; nor does anyone with NCCLGUARD_SLOW_INTERVAL=0.
  WatchdogFixture other(config, 1);
  other.watchdog.PollOnce(1 * kSecond);
  other.watchdog.PollOnce(30 * kSecond);
  CHECK(other.effects.fail_slow_looks == 0);
  config.slow_interval = Seconds{0};
  WatchdogFixture off(config, 0);
  off.watchdog.PollOnce(1 * kSecond);
  off.watchdog.PollOnce(30 * kSecond);
  CHECK(off.effects.fail_slow_looks == 0);
}

TEST_CASE("the judge is rank 0 of the largest communicator the process is in", "[fail_slow]") {
  Registry registry;
  CommState* world = registry.Add(reinterpret_cast<ncclComm_t>(0x10), 0, 16);
  world->rank = 5;
  world->nranks = 16;
  world->lifecycle = CommLifecycle::kReady;
  CommState* tensor = registry.Add(reinterpret_cast<ncclComm_t>(0x20), 0, 16);
  tensor->rank = 0;
  tensor->nranks = 4;
  tensor->lifecycle = CommLifecycle::kReady;
  CHECK_FALSE(JudgesPace(registry));  // rank 0 of a small one only
  world->rank = 0;
  CHECK(JudgesPace(registry));
  world->lifecycle =
      CommLifecycle::kDestroyed;  // gone: its rank 0 judges no more; the tensor one is the largest
  CHECK(JudgesPace(registry));
}

}  // namespace
}  // namespace ncclguard
