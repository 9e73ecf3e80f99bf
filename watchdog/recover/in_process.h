// In-process recovery (NCCLGUARD_RECOVER=inprocess): a communicator whose operation on probation
// stalls is re-created, in the running process, on a private instance of NCCL with P2P off, and
// the operation is replayed there; all ranks or none (docs/recovery.md). The watchdog decides
// whether to try (detect/watchdog.cc); this is the doing: the meeting, the abort, the new
// communicator, the replay that opens the application's stream, and the handle re-pointed.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "watchdog/report/job_board.h"
#include "watchdog/state/records.h"

namespace ncclguard {

struct RecoveryRequest {
  std::string job_dir;              // where the private copy of NCCL goes
  std::shared_ptr<JobBoard> board;  // where the ranks meet
  // Why this rank cannot recover; "" when it can. A rank that cannot still takes part in the
  // meeting, so that the others fall back at once instead of at their deadline.
  std::string not_ready_reason;
  // How long to wait for the other ranks' votes, and for the replay to complete.
  std::chrono::milliseconds meeting_timeout{0};
  std::chrono::milliseconds replay_timeout{0};
};

struct RecoveryOutcome {
  enum class Result {
    kRecovered,  // the communicator was re-created and the operation replayed: the stream goes on
    kFellBack,   // nothing was changed: the stall goes on as without recovery
    kBroken,     // it failed after the old communicator was aborted: only an exit is left
  };
  Result result = Result::kFellBack;
  std::string detail;                    // why it fell back or broke; for a recovery, what was done
  std::int64_t replay_completed_ns = 0;  // steady clock, when recovered
};

// On the watchdog thread, for operation `op` of `comm` that stalled on probation; the other ranks
// of the same communicator that this process drives (ncclCommInitAll, one thread per GPU) are
// recovered with it, or none of them are. Blocks for the meeting (at most `meeting_timeout`), the
// new communicators' initialisation and the replay (at most `replay_timeout`). The application's
// calls that name a communicator wait meanwhile.
RecoveryOutcome RecoverCommunicator(CommState& comm, ProbationOp& op,
                                    const RecoveryRequest& request) noexcept;

}  // namespace ncclguard
