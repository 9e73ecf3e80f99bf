#include "watchdog/detect/board_thread.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "watchdog/common/clock.h"
#include "watchdog/common/exit_gate.h"
#include "watchdog/common/log.h"
#include "watchdog/common/mutex.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/job_board.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {
namespace {

// Requests are made at stalls and errors, a few per process; more waiting at once means the board
// has not answered for long, and the oldest say nothing the newest do not.
constexpr std::size_t kMaxPendingDumpRequests = 8;

}  // namespace

bool BoardThread::StartLocked() {
  if (started_) return true;
  // With every signal blocked, so the application's signals go to its own threads.
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  try {
    std::thread([this] { Run(); }).detach();
    started_ = true;
  } catch (const std::exception& error) {
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true)) {
      log::Error("cannot start the job board's thread ({}): this process publishes nothing", error.what());
    }
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  return started_;
}

void BoardThread::PostStatus(std::shared_ptr<JobBoard> board, ProcessSnapshot status,
                             const ProcessFacts* facts) {
  {
    MutexLock lock(mutex_);
    if (stopped_ || !StartLocked()) return;
    pending_.board = std::move(board);
    pending_.status = Status{.snapshot = std::move(status), .facts = facts};
    ++posted_;
  }
  changed_.notify_all();
}

void BoardThread::PostDumpRequest(std::shared_ptr<JobBoard> board, std::string why,
                                  std::vector<std::string> comms) {
  {
    MutexLock lock(mutex_);
    if (stopped_ || !StartLocked()) return;
    pending_.board = std::move(board);
    if (pending_.dump_requests.size() == kMaxPendingDumpRequests) {
      pending_.dump_requests.erase(pending_.dump_requests.begin());
    }
    pending_.dump_requests.push_back({std::move(why), std::move(comms)});
    ++posted_;
  }
  changed_.notify_all();
}

bool BoardThread::Flush(std::chrono::milliseconds deadline, std::chrono::milliseconds stuck_after) {
  const std::int64_t give_up_ns = SteadyNowNs() + std::chrono::nanoseconds(deadline).count();
  const std::int64_t stuck_after_ns = std::chrono::nanoseconds(stuck_after).count();
  MutexLock lock(mutex_);
  const std::uint64_t wanted = posted_;
  while (done_ < wanted) {
    if (!started_ || last_failed_) return false;
    const std::int64_t now_ns = SteadyNowNs();
    const std::int64_t call_since_ns = call_since_ns_.load(std::memory_order_acquire);
    if (now_ns >= give_up_ns || (call_since_ns != 0 && now_ns - call_since_ns >= stuck_after_ns))
      return false;
    // Woken when a call ends; the slice only bounds how late a stuck call is noticed.
    changed_.wait_for(mutex_, std::chrono::milliseconds(1));
  }
  return true;
}

void BoardThread::Stop() {
  MutexLock lock(mutex_);
  stopped_ = true;
}

void BoardThread::Run() {
  pthread_setname_np(pthread_self(), "ncclguard-board");
  // Its log lines park it once the application's exit has begun. It holds no ExitPass across a
  // board call: the exit would wait for a board that does not answer. Stop() comes before the exit
  // gate closes, and nothing is taken or formatted after it.
  MarkOwnThread();
  for (;;) {
    Work work;
    std::uint64_t number = 0;
    {
      MutexLock lock(mutex_);
      // Once stopped, the thread waits here until the process is gone. wait_for, not wait: wait's
      // symbol is of GCC 12's libstdc++ (GLIBCXX_3.4.30), newer than the library needs elsewhere.
      while (
          !changed_.wait_for(mutex_, std::chrono::seconds(1), [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
            return !stopped_ && (pending_.status || !pending_.dump_requests.empty());
          })) {
      }
      work = std::exchange(pending_, Work{});
      number = posted_;
    }
    const bool published = Publish(work);
    {
      MutexLock lock(mutex_);
      done_ = number;
      last_failed_ = !published;
    }
    changed_.notify_all();
    {
      MutexLock lock(mutex_);
      if (stopped_) continue;  // the call ended after the exit began: back to waiting for ever
    }
    LookForRequests(*work.board);
  }
}

bool BoardThread::Publish(const Work& work) {
  bool published = true;
  call_since_ns_.store(SteadyNowNs(), std::memory_order_release);
  // A failure was logged by the board where it happened; the next interval tries again.
  if (work.status) published = work.board->PublishStatus(work.status->snapshot, *work.status->facts).ok();
  for (const OwnDumpRequest& request : work.dump_requests)
    published = work.board->RequestDumps(request.why, request.comms).ok() && published;
  call_since_ns_.store(0, std::memory_order_release);
  return published;
}

void BoardThread::LookForRequests(JobBoard& board) {
  call_since_ns_.store(SteadyNowNs(), std::memory_order_release);
  const absl::StatusOr<std::vector<DumpRequest>> requests = board.PollDumpRequests();
  call_since_ns_.store(0, std::memory_order_release);
  if (!requests.ok() || requests->empty()) return;
  MutexLock lock(mutex_);
  found_requests_.insert(found_requests_.end(), requests->begin(), requests->end());
  if (found_requests_.size() > kMaxFoundRequests)
    found_requests_.erase(found_requests_.begin(), found_requests_.end() - kMaxFoundRequests);
}

std::vector<DumpRequest> BoardThread::TakeDumpRequests() {
  MutexLock lock(mutex_);
  return std::exchange(found_requests_, {});
}

}  // namespace ncclguard
