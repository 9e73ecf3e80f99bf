// Job boards for tests: the directory board of a job directory, and a Redis board.
#pragma once

#include <memory>
#include <string>

#include "tests/support/redis_server.h"
#include "watchdog/report/job_board.h"

namespace ncclguard::testing {

// The job directory `job_dir` as a board (what NCCLGUARD_STORE's default opens).
inline std::shared_ptr<JobBoard> DirectoryBoard(const std::string& job_dir, const std::string& job_id = "") {
  return *OpenJobBoard("", job_dir, job_id, BoardIdentity{.host = "test-host", .pid = 1});
}

// The board of the job `job_id` (directory `job_dir`) that the programs a test starts use: the
// job directory, or the Redis of NCCLGUARD_TEST_BOARD=redis (TestStore()).
inline std::shared_ptr<JobBoard> TestBoard(const std::string& job_dir, const std::string& job_id) {
  return *OpenJobBoard(TestStore(job_dir.substr(0, job_dir.find_last_of('/'))), job_dir, job_id,
                       BoardIdentity{.host = "test-host", .pid = 1});
}

}  // namespace ncclguard::testing
