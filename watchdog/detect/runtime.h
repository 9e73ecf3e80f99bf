// The watchdog's runtime: the watchdog thread that runs its rounds, the monitor thread that
// watches its heartbeat, the dump signal, the exit hooks and fork handling, started lazily at
// the first communicator. Apart from the decisions (detect/watchdog.h) and their effects
// (detect/effects.h), which the tests drive without any thread. record/ reaches the runtime only
// through the few calls below; nothing here calls record/ back.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

namespace ncclguard {

// Decides, from the watchdog's heartbeat, when the watchdog itself is stuck: once per episode,
// after `stuck_after_ns` without a new round.
class HeartbeatMonitor {
 public:
  explicit HeartbeatMonitor(std::int64_t stuck_after_ns) : stuck_after_ns_(stuck_after_ns) {}
  // The message to log now, if any.
  std::optional<std::string> Check(std::uint64_t heartbeat, const char* activity, std::int64_t now_ns);

 private:
  std::int64_t stuck_after_ns_;
  std::uint64_t last_heartbeat_ = 0;
  std::int64_t last_change_ns_ = -1;
  bool reported_ = false;
};

// Starts the watchdog and monitor threads (once per process, and once per forked child that uses
// NCCL itself). Called at the first communicator initialisation.
void EnsureWatchdogStarted() noexcept;

// Asks the watchdog for a dump at its next round (`reason`: a string literal); nothing when it
// has not started.
void RequestDump(const char* reason) noexcept;

// For an application thread that has just been told of an error: the watchdog's next round begins
// at once, and the thread waits for it (5 s at most), so that the error is logged and dumped before
// the application can act on it (abort(), a fatal signal). Nothing on the watchdog's own thread.
void ReportBeforeReturning() noexcept;

namespace internal {
// Set by NCCLGUARD_ACTION=exit just before it aborts (SystemEffects::HoldApplicationCalls).
extern std::atomic<bool> g_holding_application_calls;
}  // namespace internal

// True once the watchdog is exiting the process (NCCLGUARD_ACTION=exit): application threads
// entering NCCL wait for it.
inline bool ApplicationCallsHeld() noexcept {
  return internal::g_holding_application_calls.load(std::memory_order_relaxed);
}

// Waits for ever, while the watchdog exits the process: WaitIfExiting's rare case, out of line.
void WaitForExit() noexcept;

// Called at the start of every intercepted call: waits for ever once ApplicationCallsHeld. Inline:
// every call asks, and nearly every answer is no.
inline void WaitIfExiting() noexcept {
  if (ApplicationCallsHeld()) [[unlikely]]
    WaitForExit();
}

// Has the watchdog put this process on record now (its status on the job board), for the thread
// that completed a communicator's initialisation, which does not wait for it: a process that dies
// before the watchdog's next status interval is then known to have been part of the job.
void WriteStatusAtInit() noexcept;

// The same once the application closed a communicator; `last`: none of the process's is open any
// more. A forked worker may then end at once with _exit, which runs no exit hook, so the status
// that says its communicators are closed (not a process that died) is written before the last
// one's closing returns: within a second, and at most once a second, so that a program that
// creates and destroys communicators in a loop is not slowed. Nothing on the watchdog's thread.
void WriteStatusAfterClosing(bool last) noexcept;

}  // namespace ncclguard
