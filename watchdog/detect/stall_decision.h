// What the watchdog does about a stall it found or looks at again: one pure function, facts in,
// decision out. The watchdog gathers the facts (the stall, the verdicts, the settings, whether the
// operation is on probation) and carries the decision out (Watchdog::DecideOnStall).
//
// In order:
// 1. Settle the verdict. Under NCCLGUARD_RECOVER=inprocess, for an operation on probation whose
//    verdict a communicator with P2P off would not mend: look again every half status interval,
//    silently, until two status intervals past the timeout (a peer's status may predate the stall,
//    and one rank that votes not ready makes every rank fall back).
// 2. Act now when there is nothing to wait for: no communicator (an initialisation), no verdict
//    (no job directory), a verdict other than a late rank busy outside NCCL (or stopped), or
//    NCCLGUARD_HARD_TIMEOUT reached. Under NCCLGUARD_RECOVER=inprocess an operation on probation is
//    recovered in-process first (also by a rank that cannot mend it: it votes not ready).
// 3. Else wait for the late rank: look again once its dump can be on disk, then every timeout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "watchdog/diagnose/verdicts.h"

namespace ncclguard {

struct StallFacts {
  bool has_comm = true;           // false: an initialisation, which has no communicator to wait on yet
  std::vector<Verdict> verdicts;  // the current verdicts, most important first; none: no job view
  VerdictKind verdict_about_comm = VerdictKind::kUnknown;  // the one naming this communicator
  std::int64_t stall_ns = 0;                               // how long it has been stalled
  std::int64_t now_ns = 0;
  bool first_look = true;            // found in this round (not a look again)
  bool in_process_recovery = false;  // NCCLGUARD_RECOVER=inprocess
  bool on_probation = false;         // the stalled operation is on probation, in NCCL's hands
  std::int64_t timeout_ns = 0;
  std::int64_t hard_timeout_ns = 0;
  std::int64_t status_interval_ns = 0;
  std::int64_t poll_interval_ns = 0;
};

struct StallDecision {
  enum class Step {
    kSettleVerdict,     // look again at `look_again_ns`, saying nothing
    kRecoverInProcess,  // recover in-process; on fallback, act
    kAct,               // what NCCLGUARD_ACTION says
    kWaitForLateRank,   // look again at `look_again_ns`
  };
  Step step = Step::kAct;
  std::int64_t look_again_ns = 0;
  // kRecoverInProcess: why this rank cannot mend the stall ("" when it can).
  std::string not_mendable;
};

StallDecision DecideOnStall(const StallFacts& facts);

// Whether NCCLGUARD_TIMEOUT is enough to act on a stall with these verdicts: true for
// stuck_inside_nccl, p2p_suspect, stuck_in_init, rank_dead and unknown (the timeout alone then
// decides, as without a job directory); false while the first verdict is a rank_not_joined whose
// late ranks are alive and busy outside NCCL or stopped: waiting is worth it while they will come
// back (the watchdog warns periodically and acts only after NCCLGUARD_HARD_TIMEOUT).
bool ActOnTimeout(const std::vector<Verdict>& verdicts);

// What a communicator re-created with P2P off can mend.
bool Mendable(VerdictKind verdict);

}  // namespace ncclguard
