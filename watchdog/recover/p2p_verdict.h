// The record that an attempt of a job found P2P at fault. Under NCCLGUARD_ACTION=reinit, a process
// whose stall is classified p2p_suspect writes it on the job board before the job exits with the
// restart code; at the next attempt, NCCLGUARD_P2P=auto reads it before the first communicator
// exists and turns P2P off. One small JSON record (in the job directory, a file replaced atomically).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "watchdog/report/job_board.h"

namespace ncclguard {

inline constexpr char kP2pVerdictFile[] = "p2p-verdict.json";
inline constexpr int kP2pVerdictFormatVersion = 1;

struct P2pVerdictRecord {
  std::string job_id;  // the job directory's name: a record of another job is foreign
  // The writer's LaunchId: a job that shares the job id but not this is another job. "" in a
  // record written before it was kept.
  std::string launch;
  std::string message;  // the verdict's sentence
  std::string comm;     // the communicator and operation it was about
  std::uint64_t seq = 0;
  std::vector<int> ranks;
  std::string host;  // who wrote it
  int pid = -1;
  int rank = -1;
  std::int64_t time_ns = 0;  // when (epoch ns)
};

// Writes the record p2p-verdict.json on the job's board (a file of the job directory, replaced
// atomically; or a Redis record): several processes may write it at once, and any one of their
// records is fine.
absl::Status WriteP2pVerdict(const std::shared_ptr<JobBoard>& board, const P2pVerdictRecord& record) noexcept;

// NotFound when the board has no record. InvalidArgument, with a message that names the
// file and says what is wrong with it, when the file is not a record in this format (corrupt,
// truncated, another program's, another format version) or is the record of another job.
// Unavailable when the board did not answer within kWriteDeadline. Never blocks longer.
absl::StatusOr<P2pVerdictRecord> ReadP2pVerdict(const std::shared_ptr<JobBoard>& board,
                                                const std::string& job_id) noexcept;

// The same answers as ReadP2pVerdict, from the calling thread, for as long as the board takes: for
// a caller that bounds the wait itself.
absl::StatusOr<P2pVerdictRecord> ReadP2pVerdictUnbounded(const std::shared_ptr<JobBoard>& board,
                                                         const std::string& job_id) noexcept;

}  // namespace ncclguard
