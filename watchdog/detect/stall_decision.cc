#include "watchdog/detect/stall_decision.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "watchdog/diagnose/verdicts.h"

namespace ncclguard {

bool ActOnTimeout(const std::vector<Verdict>& verdicts) {
  return verdicts.empty() || verdicts.front().kind != VerdictKind::kRankNotJoined ||
         !verdicts.front().late_ranks_busy_outside_nccl;
}

bool Mendable(VerdictKind verdict) {
  return verdict == VerdictKind::kStuckInsideNccl || verdict == VerdictKind::kP2pSuspect;
}

StallDecision DecideOnStall(const StallFacts& facts) {
  StallDecision decision;
  const bool recoverable = facts.has_comm && facts.in_process_recovery && facts.on_probation;
  const bool mendable = Mendable(facts.verdict_about_comm);
  if (recoverable && !mendable && facts.stall_ns < facts.timeout_ns + 2 * facts.status_interval_ns) {
    decision.step = StallDecision::Step::kSettleVerdict;
    decision.look_again_ns = facts.now_ns + facts.status_interval_ns / 2;
    return decision;
  }
  const bool act_now =
      !facts.has_comm || ActOnTimeout(facts.verdicts) || facts.stall_ns >= facts.hard_timeout_ns;
  if (act_now && recoverable) {
    decision.step = StallDecision::Step::kRecoverInProcess;
    if (!mendable) {
      decision.not_mendable =
          fmt::format("its verdict is {}, which a communicator with P2P off does not mend",
                      VerdictKindName(facts.verdict_about_comm));
    }
    return decision;
  }
  if (act_now) return decision;  // kAct
  // The late ranks answer this stall's dump request at their next status round, with their stacks:
  // the first look again comes once those dumps can be on disk, the later ones every timeout.
  decision.step = StallDecision::Step::kWaitForLateRank;
  const std::int64_t first_look_ns =
      std::min(facts.status_interval_ns + 2 * facts.poll_interval_ns, facts.timeout_ns);
  decision.look_again_ns = facts.now_ns + (facts.first_look ? first_look_ns : facts.timeout_ns);
  return decision;
}

}  // namespace ncclguard
