// Bounded threads: work that may hang on a file system (or anything else the kernel may block for
// ever) runs on a short-lived thread the caller waits for at most a deadline; a bounded number of
// such threads may hang at once.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "watchdog/common/exit_gate.h"

namespace ncclguard {

namespace detail {
// Starts `body` on a detached thread with every signal blocked. False (and nothing started) when
// too many earlier bodies are still running: a hung file system then costs a bounded number of
// threads.
bool StartBoundedThread(std::function<void()> body);
// Threads started by StartBoundedThread that have not finished, abandoned ones included.
int UnfinishedThreads() noexcept;
}  // namespace detail

// Runs `work` on a short-lived thread and waits for it at most `deadline`: a file system that
// hangs costs a thread, never the caller. Past the deadline the work is abandoned (it finishes
// whenever the system lets it) and DeadlineExceeded is returned. The work holds an ExitPass; once
// the exit gate is closed nothing is started and Cancelled is returned.
template <typename T>
absl::StatusOr<T> RunWithDeadline(std::function<absl::StatusOr<T>()> work,
                                  std::chrono::milliseconds deadline) {
  if (ExitGateClosed()) return absl::CancelledError("the process is exiting");
  struct Shared {
    std::mutex mutex;
    std::condition_variable finished;
    std::optional<absl::StatusOr<T>> result;
  };
  auto shared = std::make_shared<Shared>();
  const bool started = detail::StartBoundedThread([shared, work = std::move(work)]() mutable {
    absl::StatusOr<T> result = absl::UnknownError("the work threw an exception");
    try {
      result = work();
    } catch (...) {
    }
    std::lock_guard<std::mutex> lock(shared->mutex);
    shared->result = std::move(result);
    shared->finished.notify_all();
  });
  if (!started) {
    return absl::UnavailableError("earlier file system operations are still hanging; not starting another");
  }
  // In slices: once the exit gate closes, the work may be parked for ever, and the caller stops
  // waiting for it (a thread of ncclguard parks itself; see ExitPass).
  constexpr std::chrono::milliseconds kSlice{20};
  const auto give_up = std::chrono::steady_clock::now() + deadline;
  std::unique_lock<std::mutex> lock(shared->mutex);
  while (!shared->finished.wait_for(lock, std::min<std::chrono::steady_clock::duration>(kSlice, deadline),
                                    [&] { return shared->result.has_value(); })) {
    if (std::chrono::steady_clock::now() >= give_up) {
      return absl::DeadlineExceededError("the file system did not answer in time");
    }
    if (ExitGateClosed()) {
      lock.unlock();
      const ExitPass pass;
      return absl::CancelledError("the process is exiting");
    }
  }
  // NOLINTNEXTLINE(bugprone-unchecked-optional-access): the wait returned with a result
  return std::move(*shared->result);
}

}  // namespace ncclguard
