// What every process of a job left in its job directory (dumps and status files), read and merged
// per process: the classifier's input, in the watchdog at a stall and in `ncclguard analyze`. The
// view's types and the reading are report/job_read.h's; these read it with the classifier's merge.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "watchdog/common/files.h"
#include "watchdog/report/job_board.h"
#include "watchdog/report/job_read.h"

namespace ncclguard {

// Reads every dump and status file of a job directory within `limits`: the files a bound left
// unread are counted in JobView::not_read and listed among the problems. Never throws;
// unreadable files become problems.
absl::StatusOr<JobView> ReadJobDirectory(const std::string& directory, std::int64_t now_ns,
                                         double status_interval_seconds, JobDirectoryOrigin origin,
                                         const JobReadLimits& limits) noexcept;
// The same for a job on any board: the statuses from the board (a directory board's are its files),
// the dumps from the job's directory. Statuses the deadline left on the board are not read.
absl::StatusOr<JobView> ReadJob(const std::shared_ptr<JobBoard>& board, std::int64_t now_ns,
                                double status_interval_seconds, JobDirectoryOrigin origin,
                                const JobReadLimits& limits) noexcept;
absl::StatusOr<JobView> ReadJobDirectory(const std::string& directory, std::int64_t now_ns,
                                         double status_interval_seconds,
                                         JobDirectoryOrigin origin = JobDirectoryOrigin::kNamedByUser,
                                         std::chrono::milliseconds deadline = kReadDeadline) noexcept;

}  // namespace ncclguard
