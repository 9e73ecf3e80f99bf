// A process that does not run (stopped by SIGSTOP, a debugger, a cgroup freezer or a paused VM,
// or starved) must not find a stall in the time it did not run: with a fake clock, rounds that
// come much later than scheduled re-arm the stall timers, and only a round on time reports.
#include <cstdio>

#include <catch2/catch.hpp>

#include "tests/detect/fakes.h"
#include "watchdog/detect/progress.h"
#include "watchdog/detect/watchdog.h"
#include "watchdog/state/registry.h"

using namespace ncclguard;
using ncclguard::testing::EnqueueAllReduce;
using ncclguard::testing::FakeGpuEvents;
using ncclguard::testing::RecordingEffects;

namespace {

constexpr std::int64_t kSecond = 1'000'000'000;
constexpr std::int64_t kMillisecond = 1'000'000;
constexpr std::int64_t kPoll = 100 * kMillisecond;

Config PauseConfig(Action action) {
  Config config;
  config.timeout = Seconds{10};
  config.init_timeout = Seconds{30};
  config.poll_interval = Seconds{0.1};
  config.action = action;
  return config;
}

struct PauseFixture : ncclguard::testing::WatchdogFixture {
  explicit PauseFixture(Action action = Action::kAbort) : WatchdogFixture(PauseConfig(action), 2) {}

  // An AllReduce handed to NCCL at `enqueued_at`, its events recorded and its start reached.
  OpRecord& EnqueueStarted(std::int64_t enqueued_at) {
    OpRecord& op = EnqueueAllReduce(*comm, events, enqueued_at);
    events.Reach(op.start_event);
    return op;
  }

  // A round that begins `late` after it was due at `due`.
  void Round(std::int64_t due, std::int64_t late = 0) { watchdog.PollOnce(due + late, due); }
};

}  // namespace

TEST_CASE("a round is late when it comes far later than the scheduler's delays", "[watchdog][pause]") {
  const std::int64_t timeout = 10 * kSecond;
  CHECK_FALSE(LateRound(5 * kSecond, 5 * kSecond, kPoll, timeout));
  CHECK_FALSE(LateRound(5 * kSecond, 5 * kSecond + 900 * kMillisecond, kPoll, timeout));  // a loaded machine
  CHECK(LateRound(5 * kSecond, 6 * kSecond + kMillisecond, kPoll, timeout));              // over a second
  CHECK(LateRound(5 * kSecond, 11 * kSecond, kPoll, timeout));                            // a 6 s stop
  // A short timeout: a quarter of it already counts.
  CHECK(LateRound(5 * kSecond, 5 * kSecond + 800 * kMillisecond, kPoll, 3 * kSecond));
  CHECK_FALSE(LateRound(5 * kSecond, 5 * kSecond + 700 * kMillisecond, kPoll, 3 * kSecond));
  // Never less than two poll intervals.
  CHECK_FALSE(LateRound(5 * kSecond, 5 * kSecond + 1500 * kMillisecond, kSecond, 2 * kSecond));
}

TEST_CASE("a stopped process does not report a stall of the time it was stopped", "[watchdog][pause]") {
  PauseFixture f;
  OpRecord& op = f.EnqueueStarted(0);
  f.Round(1 * kSecond);  // sees the operation start at 1 s
  REQUIRE(op.state.load() == OpState::kStarted);
  // Stopped at 1.1 s for 15 s: the first round after it is far past its time, and the operation,
  // whose peers were held up by the stop too, has not completed yet.
  f.Round(1 * kSecond + kPoll, 15 * kSecond);
  CHECK(f.effects.dumps.empty());
  CHECK(f.effects.aborted.empty());

  SECTION("the operation completes once the process runs again: nothing is ever reported") {
    f.events.Reach(op.end_event);
    f.Round(16 * kSecond + 2 * kPoll);
    CHECK(op.state.load() == OpState::kCompleted);
    f.Round(40 * kSecond);
    CHECK(f.effects.dumps.empty());
    CHECK(f.effects.aborted.empty());
    CHECK(f.effects.peer_requests_sent.empty());
  }
  SECTION("a real stall is reported once the timeout has passed in time the process ran") {
    f.Round(16 * kSecond + 2 * kPoll);
    f.Round(26 * kSecond);  // 9.9 s since it resumed
    CHECK(f.effects.dumps.empty());
    f.Round(26 * kSecond + 2 * kPoll);  // 10.1 s
    REQUIRE(f.effects.dumps.size() == 1);
    REQUIRE(f.effects.dumps[0].stall.has_value());
    CHECK(f.effects.dumps[0].stall->message ==
          "rank 2 comm 1111222233334444: AllReduce #1 (float32 × 1024, sum) started on the GPU and has not "
          "completed after 10.1 s since this process last resumed from a stop or starvation");
    CHECK(f.effects.aborted.size() == 1);
  }
}

TEST_CASE("a stall must be seen by a round on time, not only by a late one", "[watchdog][pause]") {
  PauseFixture f;
  f.EnqueueStarted(0);
  f.Round(1 * kSecond);
  // Rounds each over a second late (a starved process): none reports, whatever the operation's age.
  for (std::int64_t due = 2 * kSecond; due < 30 * kSecond; due += 3 * kSecond) f.Round(due, 2 * kSecond);
  CHECK(f.effects.dumps.empty());
  // Then rounds on time again: the stall is found a timeout after the last late round (at 31 s).
  f.Round(38 * kSecond);
  CHECK(f.effects.dumps.empty());
  f.Round(41 * kSecond + 500 * kMillisecond);
  CHECK(f.effects.dumps.size() == 1);
}

TEST_CASE("rounds on time still report a stall at the timeout", "[watchdog][pause]") {
  PauseFixture f;
  f.EnqueueStarted(0);
  for (std::int64_t due = 1 * kSecond; due <= 11 * kSecond + 500 * kMillisecond; due += kPoll) {
    f.Round(due, 50 * kMillisecond);  // the scheduler's ordinary delay
  }
  REQUIRE(f.effects.dumps.size() == 1);
  CHECK(f.effects.dumps[0].stall->message.find("started on the GPU 10.1 s ago and has not completed") !=
        std::string::npos);
}

TEST_CASE("an initialisation is not a stall for the time the process was stopped", "[watchdog][pause]") {
  PauseFixture f;
  PendingInit init;
  init.api = Api::ncclCommInitRank;
  init.comm_id = "5555666677778888";
  init.rank = 1;
  init.nranks = 4;
  init.start_ns = 0;
  f.registry.BeginInit(init);
  f.Round(1 * kSecond);
  f.Round(1 * kSecond + kPoll, 40 * kSecond);  // stopped 40 s, past the 30 s init timeout
  CHECK(f.effects.dumps.empty());
  f.Round(60 * kSecond);
  CHECK(f.effects.dumps.empty());
  f.Round(72 * kSecond);
  REQUIRE(f.effects.dumps.size() == 1);
  CHECK(f.effects.dumps[0].stall->kind == "init");
}

TEST_CASE("a stall already reported keeps its age across a late round", "[watchdog][pause]") {
  PauseFixture f;
  f.config.hard_timeout = Seconds{30};
  // The late rank is busy outside NCCL: the action waits for the hard timeout.
  Verdict late;
  late.kind = VerdictKind::kRankNotJoined;
  late.late_ranks_busy_outside_nccl = true;
  f.effects.verdicts = {late};
  f.EnqueueStarted(0);
  f.Round(1 * kSecond);
  f.Round(11 * kSecond + kPoll);  // reported, 10.1 s
  REQUIRE(f.effects.dumps.size() == 1);
  REQUIRE(f.effects.aborted.empty());
  // A late round (a long dump, or a stop) must not put off NCCLGUARD_HARD_TIMEOUT.
  f.Round(12 * kSecond, 8 * kSecond);
  // Looked at again every timeout: at 30 s (29 s old, waiting), at 40 s (over 30 s: acting).
  for (std::int64_t due = 20 * kSecond + kPoll; due <= 41 * kSecond; due += kPoll) f.Round(due);
  CHECK(f.effects.aborted.size() == 1);
  CHECK(f.effects.dumps.size() == 1);
}
