// Synthetic job directories: what N ranks of a data-parallel job would leave in their job
// directory (a status file and a dump each, one communicator spanning every rank), written with
// the same WriteStatus and WriteDump that the library uses, so the files are the real format.
// For the scale benchmark and the command's tests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "watchdog/report/job_board.h"

namespace ncclguard {

struct SyntheticJob {
  enum class Scenario {
    kHealthy,        // every rank completed every operation
    kRankNotJoined,  // every rank but `late_rank` waits inside the last operation
    kAllStuck,       // every rank entered the last operation and none completed it
    // Runs, nothing stalled, and every rank carries its latest pace blocks (common/pace.h): its
    // send link to the next rank of the ring on 2 to 4 channels, each within ±10 % of the others
    // per byte, but `slow_link_rank`'s link on `slow_link_channel`, slow_link_factor times slower.
    kSlowLink,
  };
  // Where the late rank of kRankNotJoined is.
  enum class LateRank {
    kBusy,    // alive and outside NCCL (fresh status file)
    kExited,  // finished its loop and exited normally
    kGone,    // died: its status file went stale and it left no dump
  };

  int ranks = 4;
  int operations = 8;    // AllReduce #1..#operations; in the faulty scenarios the last one hangs
  int ring_entries = 4;  // operations kept in each dump's ring, newest last
  Scenario scenario = Scenario::kHealthy;
  int late_rank = 0;
  LateRank late_rank_state = LateRank::kBusy;
  int ranks_per_host = 8;       // ranks r run on host "node<r / ranks_per_host>"
  std::int64_t now_ns = 0;      // when the job is looked at (epoch ns); 0: the current time
  double stalled_seconds = 30;  // how long the last operation has been hanging at now_ns
  std::string comm_id = "5eed0c0ffee0cafe";
  // kSlowLink: the link from slow_link_rank to the next rank, on that channel (each rank's links
  // have 2 + rank % 3 channels, so channel 0 and 1 always exist). At least kPaceBlocks blocks of
  // operations run: `operations` is raised to that.
  int slow_link_rank = 0;
  int slow_link_channel = 1;
  double slow_link_factor = 3;
};

// Writes the job into `job_dir` (created if missing). Host names never match this machine's, so a
// reader judges liveness from the age of the status files rather than from process ids.
absl::Status WriteSyntheticJob(const std::string& job_dir, const SyntheticJob& job);
// The same on any board: the statuses on it, the dumps in its job directory.
absl::Status WriteSyntheticJob(const std::shared_ptr<JobBoard>& board, const SyntheticJob& job);

}  // namespace ncclguard
