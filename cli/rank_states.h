// Where each rank of a job stands: its process (alive, exited, gone, ...) and, for the operation a
// verdict is about, whether it entered it, waits in it or completed it. What analyze's rank table
// and its report page show.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/job_read.h"

namespace ncclguard {

// "alive", "exited", "gone", "stopped" or "stale" (on another host, its status file too old).
std::string ProcessState(const JobView& job, const ProcessView& process);

// A rank's state at one operation, as the report page colours it.
enum class RankState {
  kWaiting,   // entered the operation and has not completed it
  kLate,      // alive, and has not entered it
  kDead,      // its process is gone (or stale) without having exited
  kFinished,  // completed the operation
  kExited,    // exited normally before entering it
  kStopped,   // its process is stopped (SIGSTOP, a debugger)
  kUnknown,   // nothing read of it
};
inline constexpr int kRankStates = 7;

const char* RankStateName(RankState state);

struct RankStates {
  std::string comm;                // the operation's communicator; "" when the states are the processes'
  std::uint64_t seq = 0;           // the operation; 0 when none
  std::vector<RankState> by_rank;  // index: rank
};

// The state of every rank at the operation the first verdict naming one is about; without such
// a verdict, the state of each rank's process. Ranks range over the communicator's size, or up to
// the highest rank read.
RankStates RankStatesAt(const JobView& job, const std::vector<Verdict>& verdicts);

// Where a late or dead rank was when its dump took its stacks: the thread that issued its NCCL
// operations, in one sentence, then its frames (Python first, then native), as the verdicts'
// evidence carries them (late_ranks, dead_ranks).
struct LateRankStack {
  int rank = -1;
  int pid = -1;
  std::int64_t tid = 0;
  std::string thread_name;
  std::string sentence;
  std::vector<std::string> frames;
};
std::vector<LateRankStack> LateRankStacks(const nlohmann::json& evidence);

}  // namespace ncclguard
