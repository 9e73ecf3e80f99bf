// Bounded threads: see bounded_threads.h.
#include "watchdog/common/bounded_threads.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <utility>

#include "watchdog/common/exit_gate.h"

namespace ncclguard {
namespace {

// Threads of RunWithDeadline still running, abandoned ones included.
std::atomic<int> g_unfinished_threads{0};
constexpr int kMaxUnfinishedThreads = 4;

}  // namespace

namespace detail {

bool StartBoundedThread(std::function<void()> body) {
  // A thread that has handed over its result is counted until it has ended, a moment later: on a
  // busy machine calls in quick succession would find the count full of those. A refusal
  // therefore waits up to 20 ms for them; threads that hang keep it full, and the call fails.
  constexpr int kWaits = 20;
  for (int wait = 0; g_unfinished_threads.fetch_add(1) >= kMaxUnfinishedThreads; ++wait) {
    g_unfinished_threads.fetch_sub(1);
    if (wait == kWaits) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // The thread inherits the creator's signal mask: block everything around its creation so an
  // application's signal handler never runs on it.
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  bool started = true;
  try {
    std::thread([body = std::move(body)] {
      MarkOwnThread();
      {
        // Parks here, or at a pass inside the work, once the application's exit has begun.
        const ExitPass pass;
        body();
      }
      g_unfinished_threads.fetch_sub(1);
    }).detach();
  } catch (...) {
    g_unfinished_threads.fetch_sub(1);
    started = false;
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  return started;
}

int UnfinishedThreads() noexcept { return g_unfinished_threads.load(); }

}  // namespace detail

}  // namespace ncclguard
