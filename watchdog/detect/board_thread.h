// The job board's steady traffic, on a thread of its own ("ncclguard-board"): this process's status
// every interval, and after each the look for the other processes' dump requests. A board that
// stops answering (a frozen Redis holds each call for its command timeout, a hung file system for
// kWriteDeadline) then holds only this thread: neither the watchdog's rounds nor the application's
// threads, its exit included, wait for it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "watchdog/common/mutex.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/job_board.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {

// Lives as long as the process (its thread is never joined): the runtime that holds it is never freed.
class BoardThread {
 public:
  // Hands over a status to publish on `board` (a newer one replaces one not yet written), then a
  // look for dump requests. Never waits for the board; starts the thread at the first call.
  // `facts` outlives the process's use of the board.
  void PostStatus(std::shared_ptr<JobBoard> board, ProcessSnapshot status, const ProcessFacts* facts);
  // Hands over a request that every process of the job dump, sent after the status posted before;
  // `comms`: this process's communicators, by which the others tell a request of their own job.
  void PostDumpRequest(std::shared_ptr<JobBoard> board, std::string why, std::vector<std::string> comms);

  // The other processes' dump requests found since the previous call, at most kMaxFoundRequests
  // (the newest). Which of them concern this process is the watchdog's to say: only its thread may
  // look at the communicators.
  std::vector<DumpRequest> TakeDumpRequests();

  // Waits until every status posted before is published (or failed), at most `deadline`; gives up
  // sooner once the board's call in flight has lasted `stuck_after`, and does not wait at all when
  // its last call failed: a board that does not answer is not waited for. True when published.
  bool Flush(std::chrono::milliseconds deadline, std::chrono::milliseconds stuck_after);

  // From now on nothing more is taken: the process is exiting, and the libraries a status is
  // formatted with may soon be gone. A call in flight ends as the board lets it.
  void Stop();

 private:
  struct Status {
    ProcessSnapshot snapshot;
    const ProcessFacts* facts = nullptr;
  };
  struct OwnDumpRequest {
    std::string why;
    std::vector<std::string> comms;
  };
  struct Work {
    std::shared_ptr<JobBoard> board;
    std::optional<Status> status;
    std::vector<OwnDumpRequest> dump_requests;
  };
  static constexpr std::size_t kMaxFoundRequests = 64;

  // Starts the thread if needed; false when it cannot run (the work is then dropped).
  bool StartLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void Run();
  // True when every call succeeded.
  bool Publish(const Work& work);
  void LookForRequests(JobBoard& board);

  Mutex mutex_;
  std::condition_variable_any changed_;  // waits on mutex_ itself
  Work pending_ ABSL_GUARDED_BY(mutex_);
  std::uint64_t posted_ ABSL_GUARDED_BY(mutex_) = 0;
  std::uint64_t done_ ABSL_GUARDED_BY(mutex_) = 0;
  bool started_ ABSL_GUARDED_BY(mutex_) = false;
  bool stopped_ ABSL_GUARDED_BY(mutex_) = false;
  bool last_failed_ ABSL_GUARDED_BY(mutex_) = false;
  // When the call in flight began (steady ns); 0 when the thread is not calling the board.
  std::atomic<std::int64_t> call_since_ns_{0};
  std::vector<DumpRequest> found_requests_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace ncclguard
