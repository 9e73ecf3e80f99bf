// The stall decision as a table: facts in, the step and when to look again out.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "watchdog/detect/stall_decision.h"

using namespace ncclguard;

namespace {

constexpr std::int64_t kSecond = 1'000'000'000;
using Step = StallDecision::Step;

Verdict Of(VerdictKind kind, bool late_busy = false) {
  Verdict verdict;
  verdict.kind = kind;
  verdict.late_ranks_busy_outside_nccl = late_busy;
  return verdict;
}

// NCCLGUARD_TIMEOUT 10 s, hard timeout 60 s, status interval 4 s, poll 0.1 s; found now, at 100 s.
StallFacts Facts(std::vector<Verdict> verdicts, std::int64_t stall_s) {
  StallFacts facts;
  facts.verdicts = std::move(verdicts);
  facts.verdict_about_comm = facts.verdicts.empty() ? VerdictKind::kUnknown : facts.verdicts[0].kind;
  facts.stall_ns = stall_s * kSecond;
  facts.now_ns = 100 * kSecond;
  facts.timeout_ns = 10 * kSecond;
  facts.hard_timeout_ns = 60 * kSecond;
  facts.status_interval_ns = 4 * kSecond;
  facts.poll_interval_ns = kSecond / 10;
  return facts;
}

StallFacts OnProbation(StallFacts facts) {
  facts.in_process_recovery = true;
  facts.on_probation = true;
  return facts;
}

StallFacts LookingAgain(StallFacts facts) {
  facts.first_look = false;
  return facts;
}

StallFacts Initialisation(StallFacts facts) {
  facts.has_comm = false;
  return facts;
}

}  // namespace

TEST_CASE("the stall decision, as a table", "[stall_decision]") {
  const Verdict busy_late_rank = Of(VerdictKind::kRankNotJoined, true);
  const Verdict dead_late_rank = Of(VerdictKind::kRankNotJoined, false);
  const Verdict stuck = Of(VerdictKind::kStuckInsideNccl);
  const Verdict p2p = Of(VerdictKind::kP2pSuspect);
  const Verdict dead = Of(VerdictKind::kRankDead);
  struct Row {
    const char* what;
    StallFacts facts;
    Step step;
    std::int64_t look_again_ns;  // 0: none
    bool mendable;               // kRecoverInProcess: this rank can mend it
  };
  const std::vector<Row> table = {
      {"no verdict (no job directory): the timeout decides", Facts({}, 11), Step::kAct, 0, true},
      {"an initialisation acts at the timeout", Initialisation(Facts({busy_late_rank}, 11)), Step::kAct, 0, true},
      {"stuck inside NCCL", Facts({stuck}, 11), Step::kAct, 0, true},
      {"a rank not joined that is not busy (dead or gone)", Facts({dead_late_rank}, 11), Step::kAct, 0, true},
      {"a late rank busy outside NCCL: first look again once its dump is on disk",
       Facts({busy_late_rank}, 11), Step::kWaitForLateRank, 100 * kSecond + 4 * kSecond + 2 * kSecond / 10, true},
      {"a late rank busy outside NCCL: later looks every timeout", LookingAgain(Facts({busy_late_rank}, 30)),
       Step::kWaitForLateRank, 110 * kSecond, true},
      {"a late rank busy outside NCCL past the hard timeout", LookingAgain(Facts({busy_late_rank}, 60)), Step::kAct,
       0, true},
      {"on probation, p2p_suspect: recovered at once", OnProbation(Facts({p2p}, 11)), Step::kRecoverInProcess, 0,
       true},
      {"on probation, stuck inside NCCL: recovered at once", OnProbation(Facts({stuck}, 11)),
       Step::kRecoverInProcess, 0, true},
      {"on probation, not mendable: the verdict settles first, every half interval",
       OnProbation(Facts({dead}, 11)), Step::kSettleVerdict, 102 * kSecond, true},
      {"on probation, not mendable, two intervals past the timeout: recovered, voting not ready",
       OnProbation(Facts({dead}, 18)), Step::kRecoverInProcess, 0, false},
      {"on probation, a busy late rank: settles, then waits like any stall",
       OnProbation(Facts({busy_late_rank}, 18)), Step::kWaitForLateRank, 100 * kSecond + 4 * kSecond + 2 * kSecond / 10,
       true},
      {"in-process recovery on, not on probation: as without it", [&] {
         StallFacts facts = Facts({stuck}, 11);
         facts.in_process_recovery = true;
         return facts;
       }(), Step::kAct, 0, true},
  };
  for (const Row& row : table) {
    INFO(row.what);
    const StallDecision decision = DecideOnStall(row.facts);
    CHECK(decision.step == row.step);
    if (row.look_again_ns != 0) CHECK(decision.look_again_ns == row.look_again_ns);
    if (row.step == Step::kRecoverInProcess) CHECK(decision.not_mendable.empty() == row.mendable);
  }
}

TEST_CASE("a short timeout bounds the first look again", "[stall_decision]") {
  StallFacts facts = Facts({Of(VerdictKind::kRankNotJoined, true)}, 3);
  facts.timeout_ns = 2 * kSecond;
  const StallDecision decision = DecideOnStall(facts);
  CHECK(decision.step == Step::kWaitForLateRank);
  CHECK(decision.look_again_ns == 102 * kSecond);
}
