// The watchdog's runtime (see runtime.h): its threads, the dump signal, exit and fork.
#include "watchdog/detect/runtime.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "absl/base/thread_annotations.h"
#include "watchdog/common/clock.h"
#include "watchdog/common/config.h"
#include "watchdog/common/exit_gate.h"
#include "watchdog/common/log.h"
#include "watchdog/common/mutex.h"
#include "watchdog/detect/effects.h"
#include "watchdog/detect/progress.h"
#include "watchdog/detect/watchdog.h"
#include "watchdog/report/status_reader.h"
#include "watchdog/report/thread_stacks.h"
#include "watchdog/state/gpu_events.h"
#include "watchdog/state/registry.h"

namespace ncclguard {
namespace {

std::int64_t ToNs(Seconds seconds) { return static_cast<std::int64_t>(seconds.value * 1e9); }

// Counts the watchdog's rounds, so that an application thread that has just met an error can have
// the next round begin at once and wait until it is over: the error is logged and dumped before
// the application can abort() or be killed. Part of the runtime, which a forked child makes anew.
class RoundClock {
 public:
  void BeginRound() {
    MutexLock lock(mutex_);
    ++started_;
    round_wanted_ = false;
  }
  void EndRound() {
    {
      MutexLock lock(mutex_);
      ++finished_;
    }
    changed_.notify_all();
  }
  // The pause between rounds, cut short when a round is wanted.
  void Pause(std::chrono::duration<double> interval) {
    MutexLock lock(mutex_);
    changed_.wait_for(mutex_, interval,
                      [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return round_wanted_; });
  }
  // Has the next round begin at once, without waiting for it.
  void Wake() {
    {
      MutexLock lock(mutex_);
      round_wanted_ = true;
    }
    changed_.notify_all();
  }
  // Waits for a whole round that begins after this call, at most `deadline`.
  void RunRoundAndWait(std::chrono::milliseconds deadline) {
    MutexLock lock(mutex_);
    const std::uint64_t round = started_ + 1;
    round_wanted_ = true;
    changed_.notify_all();
    changed_.wait_for(mutex_, deadline,
                      [this, round]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return finished_ >= round; });
  }

 private:
  Mutex mutex_;
  std::condition_variable_any changed_;  // waits on mutex_ itself
  std::uint64_t started_ ABSL_GUARDED_BY(mutex_) = 0;
  std::uint64_t finished_ ABSL_GUARDED_BY(mutex_) = 0;
  bool round_wanted_ ABSL_GUARDED_BY(mutex_) = false;
};

struct Runtime {
  SystemEffects effects;
  Watchdog watchdog{GetConfig(), GetRegistry(), DriverEvents(), effects};
  RoundClock rounds;
};

std::atomic<Runtime*> g_runtime{nullptr};
// At exit the CUDA driver and NCCL are being torn down: the watchdog stops calling them.
std::atomic<bool> g_exiting{false};
std::atomic<bool> g_in_round{false};
thread_local bool t_watchdog_thread = false;
std::mutex g_start_mutex;
struct sigaction g_previous_dump_action;

void OnDumpSignal(int signal, siginfo_t* info, void* context) {
  // Only an atomic store: the watchdog thread does the work at its next round.
  if (Runtime* runtime = g_runtime.load(std::memory_order_acquire)) runtime->watchdog.RequestSignalDump();
  // The application's own handler of the signal still runs.
  if (g_previous_dump_action.sa_flags & SA_SIGINFO) {
    if (g_previous_dump_action.sa_sigaction != nullptr)
      g_previous_dump_action.sa_sigaction(signal, info, context);
  } else if (g_previous_dump_action.sa_handler != SIG_DFL && g_previous_dump_action.sa_handler != SIG_IGN) {
    g_previous_dump_action.sa_handler(signal);
  }
}

void InstallDumpSignal(int signal) {
  if (signal == 0) return;
  struct sigaction action = {};
  action.sa_sigaction = OnDumpSignal;
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&action.sa_mask);
  if (sigaction(signal, &action, &g_previous_dump_action) != 0) {
    log::Warn("cannot install the dump signal handler: {}", std::strerror(errno));
  }
}

void DumpAtExit() {
  if (Runtime* runtime = g_runtime.load(std::memory_order_acquire)) {
    const std::string path = runtime->watchdog.Dump("exit", std::nullopt, SteadyNowNs());
    log::Info("dumped state at exit: {}", path.empty() ? "not written" : path);
  }
}

void RunWatchdog(Runtime* runtime) {
  pthread_setname_np(pthread_self(), "ncclguard-wd");
  t_watchdog_thread = true;
  MarkOwnThread();
  DriverEvents().PrepareWatchdogThread();
  const auto interval = std::chrono::duration<double>(GetConfig().poll_interval.value);
  bool facts_collected = false;
  std::optional<std::int64_t> due_ns;  // the last round's start plus the poll interval
  for (;;) {
    g_in_round.store(true, std::memory_order_seq_cst);
    if (g_exiting.load(std::memory_order_seq_cst)) {
      g_in_round.store(false, std::memory_order_seq_cst);
      return;
    }
    runtime->rounds.BeginRound();
    try {
      // Parks here once the exit gate is closed: the exit hook waits for the round it holds.
      const ExitPass pass;
      // Within a round: the exit hook waits for it before the driver goes away.
      if (!std::exchange(facts_collected, true)) runtime->effects.CollectFacts();
      const std::int64_t start_ns = SteadyNowNs();
      runtime->watchdog.PollOnce(start_ns, std::exchange(due_ns, start_ns + ToNs(GetConfig().poll_interval)));
    } catch (const std::exception& error) {
      log::Error("watchdog round failed: {}", error.what());
    }
    g_in_round.store(false, std::memory_order_seq_cst);
    runtime->rounds.EndRound();
    // From the round's start: a stop that lands inside a round makes the next one late too. So
    // does a round that took long (a dump), which only delays the finding of a new stall.
    runtime->rounds.Pause(interval);
  }
}

// Runs before the exit dump (atexit handlers run in reverse order) and before libraries' own
// clean-up: waits, a bounded time, for a round in flight to finish.
void StopWatchdogAtExit() {
  g_exiting.store(true, std::memory_order_seq_cst);
  const std::int64_t give_up = SteadyNowNs() + 2'000'000'000;
  while (g_in_round.load(std::memory_order_seq_cst) && SteadyNowNs() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // A last status that says the process ended normally: its peers' verdicts then say "finished"
  // rather than "gone". (A killed process writes none.)
  // Our handlers were registered after the CUDA driver's (at the first communicator), so they run
  // before the driver's own clean-up: asking about events is still fine here.
  if (Runtime* runtime = g_runtime.load(std::memory_order_acquire)) {
    if (!g_in_round.load(std::memory_order_seq_cst)) {
      // An error the application met just before it exits is on disk before the process is gone.
      runtime->watchdog.FlushAtExit(SteadyNowNs());
      runtime->effects.WriteStatus(runtime->watchdog.FinalStatus(SteadyNowNs()));
      runtime->watchdog.PublishMetrics(false);
    }
    runtime->effects.FinishBoardAtExit();
  }
}

// Registered first, so it runs last of ncclguard's exit hooks, after the last status and the dump
// at exit and before the clean-up of every library whose statics were made before the hooks were
// registered: from here on no thread of ncclguard uses them. Bounded: a thread stuck in a file
// system with a pass held is not waited for past the bound, and parks at its next pass. (Nothing
// is logged: the log is one of those libraries.)
void CloseExitGateAtExit() { (void)CloseExitGate(std::chrono::seconds(2)); }

// Watches the watchdog's heartbeat: when a round takes far longer than it should, the watchdog is
// stuck inside a CUDA or NCCL call (or a file system), and that is worth saying.
void RunMonitor(Runtime* runtime) {
  pthread_setname_np(pthread_self(), "ncclguard-mon");
  MarkOwnThread();
  const std::int64_t stuck_after_ns =
      std::max<std::int64_t>(10'000'000'000, 20 * ToNs(GetConfig().poll_interval));
  constexpr std::int64_t kCheckIntervalNs = 1'000'000'000;
  HeartbeatMonitor monitor(stuck_after_ns);
  for (;;) {
    const std::int64_t due_ns = SteadyNowNs() + kCheckIntervalNs;
    std::this_thread::sleep_for(std::chrono::nanoseconds(kCheckIntervalNs));
    // Woken from a stop, the watchdog has had no chance to beat yet: the time stopped is not its.
    if (LateRound(due_ns, SteadyNowNs(), kCheckIntervalNs, stuck_after_ns))
      monitor = HeartbeatMonitor(stuck_after_ns);
    if (const auto message =
            monitor.Check(runtime->watchdog.heartbeat(), runtime->watchdog.activity(), SteadyNowNs())) {
      log::Error("{}", *message);
    }
  }
}

void StartThread(void (*body)(Runtime*), Runtime* runtime) {
  // With every signal blocked, so the application's signals go to its own threads.
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  std::thread(body, runtime).detach();
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

}  // namespace

std::optional<std::string> HeartbeatMonitor::Check(std::uint64_t heartbeat, const char* activity,
                                                   std::int64_t now_ns) {
  if (last_change_ns_ < 0 || heartbeat != last_heartbeat_) {
    last_heartbeat_ = heartbeat;
    last_change_ns_ = now_ns;
    reported_ = false;
    return std::nullopt;
  }
  if (reported_ || now_ns - last_change_ns_ <= stuck_after_ns_) return std::nullopt;
  reported_ = true;
  return fmt::format("the watchdog has been stuck for {:.0f} s in {}: stalls are not being detected",
                     static_cast<double>(now_ns - last_change_ns_) / 1e9,
                     activity != nullptr ? activity : "its round");
}

void EnsureWatchdogStarted() noexcept {
  if (g_runtime.load(std::memory_order_acquire) != nullptr) return;
  try {
    std::lock_guard<std::mutex> lock(g_start_mutex);
    if (g_runtime.load(std::memory_order_acquire) != nullptr) return;
    static std::atomic<bool> fork_handlers{false};
    if (!fork_handlers.exchange(true)) {
      pthread_atfork([] { g_start_mutex.lock(); }, [] { g_start_mutex.unlock(); },
                     [] {
                       // The child has none of the parent's threads: it starts its own watchdog
                       // if it uses NCCL itself, and never reports the parent's communicators.
                       g_start_mutex.unlock();
                       g_runtime.store(nullptr, std::memory_order_release);  // the parent's is leaked
                       g_in_round.store(false, std::memory_order_relaxed);
                       ResetExitGateAfterFork();
                       GetRegistry().ForgetAfterFork();
                     });
    }
    auto* runtime = new Runtime;  // lives until the process ends
    g_runtime.store(runtime, std::memory_order_release);
    InstallDumpSignal(GetConfig().dump_signal.number);
    if (const int stack_signal = GetConfig().stack_signal.number;
        stack_signal == GetConfig().dump_signal.number) {
      if (stack_signal != 0)
        log::Warn(
            "NCCLGUARD_STACK_SIGNAL is NCCLGUARD_DUMP_SIGNAL: native stacks are off; choose another signal");
    } else {
      InstallStackSignal(stack_signal);
    }
    static std::atomic<bool> exit_hooks{false};
    if (!exit_hooks.exchange(true)) {
      // Statics made after the hooks' registration are destroyed before the hooks run: simdjson's
      // are made now, the log's were at its start.
      ChooseStatusParser();
      std::atexit(CloseExitGateAtExit);
      if (GetConfig().dump_on_exit) std::atexit(DumpAtExit);
      std::atexit(StopWatchdogAtExit);
    }
    StartThread(RunWatchdog, runtime);
    StartThread(RunMonitor, runtime);
    log::Info("watchdog started (timeout {} s, init timeout {} s, action {})", GetConfig().timeout.value,
              GetConfig().init_timeout.value, ActionName(GetConfig().action));
  } catch (const std::exception& error) {
    log::Error("cannot start the watchdog ({}): NCCL calls are forwarded unwatched", error.what());
  }
}

void WaitForExit() noexcept {
  while (ApplicationCallsHeld()) pause();
}

void RequestDump(const char* reason) noexcept {
  if (Runtime* runtime = g_runtime.load(std::memory_order_acquire)) runtime->watchdog.RequestDump(reason);
}

void ReportBeforeReturning() noexcept {
  Runtime* runtime = g_runtime.load(std::memory_order_acquire);
  if (runtime == nullptr || t_watchdog_thread || g_exiting.load(std::memory_order_seq_cst)) return;
  // Bounded: a watchdog stuck in a CUDA call must not hold the application.
  constexpr std::chrono::milliseconds kDeadline{5000};
  try {
    runtime->rounds.RunRoundAndWait(kDeadline);
  } catch (const std::exception& error) {
    log::Error("cannot wait for the watchdog to report an error: {}", error.what());
  }
}

void WriteStatusAtInit() noexcept {
  try {
    // The watchdog writes it at once: a board that does not answer must hold only the watchdog,
    // never the thread that created the communicator.
    if (Runtime* runtime = g_runtime.load(std::memory_order_acquire)) {
      runtime->watchdog.RequestStatus();
      runtime->rounds.Wake();
    }
  } catch (const std::exception& error) {
    log::Error("cannot ask for the status at communicator creation: {}", error.what());
  }
}

void WriteStatusAfterClosing(bool last) noexcept {
  Runtime* runtime = g_runtime.load(std::memory_order_acquire);
  if (runtime == nullptr || t_watchdog_thread || g_exiting.load(std::memory_order_seq_cst)) return;
  constexpr std::int64_t kWaitsApartNs = 1'000'000'000;
  constexpr std::chrono::milliseconds kRoundDeadline{1000};
  static std::atomic<std::int64_t> last_wait_ns{-kWaitsApartNs};
  try {
    runtime->watchdog.RequestStatus();
    const std::int64_t now_ns = SteadyNowNs();
    std::int64_t previous_ns = last_wait_ns.load(std::memory_order_relaxed);
    if (!last || now_ns - previous_ns < kWaitsApartNs ||
        !last_wait_ns.compare_exchange_strong(previous_ns, now_ns, std::memory_order_relaxed)) {
      runtime->rounds.Wake();
      return;
    }
    runtime->rounds.RunRoundAndWait(kRoundDeadline);  // the round hands the status to the board
    runtime->effects.FlushBoard();
  } catch (const std::exception& error) {
    log::Error("cannot write the status after a communicator closed: {}", error.what());
  }
}

}  // namespace ncclguard
