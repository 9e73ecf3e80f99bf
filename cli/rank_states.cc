#include "cli/rank_states.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/job_read.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {

std::string ProcessState(const JobView& job, const ProcessView& process) {
  // Gone once its communicators were closed: it ended its work, whatever ended the process.
  if (process.exited || (process.closed_nccl && process.liveness == ProcessView::Liveness::kGone))
    return "exited";
  switch (process.liveness) {
    case ProcessView::Liveness::kAlive:
      return "alive";
    case ProcessView::Liveness::kGone:
      return "gone";
    case ProcessView::Liveness::kStopped:
      return "stopped";
    case ProcessView::Liveness::kUnknown:
      break;
  }
  // On another host: only the status file's age tells.
  const double age_seconds = static_cast<double>(job.now_ns - process.last_seen_ns) / 1e9;
  return age_seconds <= kStaleIntervals * job.status_interval_seconds ? "alive" : "stale";
}

const char* RankStateName(RankState state) {
  switch (state) {
    case RankState::kWaiting:
      return "waiting";
    case RankState::kLate:
      return "late";
    case RankState::kDead:
      return "dead";
    case RankState::kFinished:
      return "finished";
    case RankState::kExited:
      return "exited";
    case RankState::kStopped:
      return "stopped";
    case RankState::kUnknown:
      break;
  }
  return "unknown";
}

namespace {

// Ranks beyond any real job's (NCCL's rank is an int, but no job has more GPUs than this): a
// corrupt file's rank must not size the picture.
constexpr int kMaxRanks = 1 << 22;

RankState ProcessOnly(const std::string& state) {
  if (state == "exited") return RankState::kExited;
  if (state == "gone" || state == "stale") return RankState::kDead;
  if (state == "stopped") return RankState::kStopped;
  return RankState::kFinished;  // alive, and no operation in question: nothing wrong with it
}

RankState AtOperation(const std::string& process_state, const CommSnapshot* comm, std::uint64_t seq) {
  if (comm != nullptr && comm->last_completed >= seq) return RankState::kFinished;
  if (process_state == "gone" || process_state == "stale") return RankState::kDead;
  if (process_state == "stopped") return RankState::kStopped;
  if (comm != nullptr && comm->last_enqueued >= seq) return RankState::kWaiting;
  if (process_state == "exited") return RankState::kExited;
  return RankState::kLate;
}

}  // namespace

RankStates RankStatesAt(const JobView& job, const std::vector<Verdict>& verdicts) {
  RankStates states;
  const auto about = std::find_if(verdicts.begin(), verdicts.end(), [](const Verdict& verdict) {
    return !verdict.comm.empty() && verdict.seq != 0;
  });
  if (about != verdicts.end()) {
    states.comm = about->comm;
    states.seq = about->seq;
  }
  int size = 0;
  for (const ProcessView& process : job.processes) {
    size = std::max(size, process.snapshot.rank + 1);
    for (const CommSnapshot& comm : process.snapshot.comms) {
      if (comm.id == states.comm) size = std::max(size, comm.nranks);
    }
  }
  states.by_rank.assign(static_cast<std::size_t>(std::clamp(size, 0, kMaxRanks)), RankState::kUnknown);
  for (const ProcessView& process : job.processes) {
    const std::string process_state = ProcessState(job, process);
    if (states.seq == 0) {
      const int rank = process.snapshot.rank;
      if (rank >= 0 && rank < static_cast<int>(states.by_rank.size()))
        states.by_rank[static_cast<std::size_t>(rank)] = ProcessOnly(process_state);
      continue;
    }
    const auto comm = std::find_if(process.snapshot.comms.begin(), process.snapshot.comms.end(),
                                   [&states](const CommSnapshot& c) { return c.id == states.comm; });
    const bool member = comm != process.snapshot.comms.end();
    // A process without the communicator is placed by its own rank (it may have died before it).
    const int rank = member ? comm->rank : process.snapshot.rank;
    if (rank < 0 || rank >= static_cast<int>(states.by_rank.size())) continue;
    states.by_rank[static_cast<std::size_t>(rank)] =
        AtOperation(process_state, member ? &*comm : nullptr, states.seq);
  }
  return states;
}

std::vector<LateRankStack> LateRankStacks(const nlohmann::json& evidence) {
  std::vector<LateRankStack> stacks;
  if (!evidence.is_object()) return stacks;
  for (const char* key : {"late_ranks", "dead_ranks"}) {
    const auto ranks = evidence.find(key);
    if (ranks == evidence.end() || !ranks->is_array()) continue;
    for (const nlohmann::json& rank : *ranks) {
      const auto location = rank.find("location");
      if (location == rank.end() || !location->is_object()) continue;
      LateRankStack& stack = stacks.emplace_back();
      stack.rank = rank.value("rank", -1);
      stack.pid = rank.value("pid", -1);
      stack.tid = location->value("tid", std::int64_t{0});
      stack.thread_name = location->value("thread_name", "");
      stack.sentence = location->value("sentence", "");
      if (const auto frames = location->find("stack"); frames != location->end() && frames->is_array()) {
        for (const nlohmann::json& frame : *frames) {
          if (frame.is_string()) stack.frames.push_back(frame.get<std::string>());
        }
      }
    }
  }
  return stacks;
}

}  // namespace ncclguard
