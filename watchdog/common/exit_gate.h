// The exit gate: once the application's exit has begun, ncclguard's threads stop using libraries
// whose global objects the exit destroys (simdjson, spdlog and fmt, nlohmann, hiredis, the C++
// runtime's own). exit() runs the atexit handlers and the static destructors on the exiting thread
// while every other thread keeps running; a thread of ncclguard still parsing a status file then
// meets a destroyed object ("pure virtual method called", SIGABRT) and the application's exit
// status is lost. A thread holds an ExitPass while it uses such libraries; the exit hook closes
// the gate and waits, a bounded time, for the passes held; a thread of ncclguard that reaches the
// closed gate parks for ever, holding nothing, until the process ends.
#pragma once

#include <chrono>

namespace ncclguard {

// Held for its lifetime; passes nest. Asked for on a closed gate, it parks a thread of ncclguard's
// own for ever (its enclosing passes are given back first) and is refused on any other thread
// (open() is false; the caller skips the work).
class ExitPass {
 public:
  ExitPass() noexcept;
  ~ExitPass();
  ExitPass(const ExitPass&) = delete;
  ExitPass& operator=(const ExitPass&) = delete;

  bool open() const noexcept { return open_; }

 private:
  bool open_ = false;
};

// Marks the calling thread as one of ncclguard's, which a closed gate parks rather than refuses.
// Every thread ncclguard starts calls it first.
void MarkOwnThread() noexcept;
bool IsOwnThread() noexcept;

// Closes the gate and waits, at most `deadline`, until no pass is held (the caller's own passes
// excepted). True when none is; a thread still inside a pass after the deadline parks at its next
// pass, which every use of those libraries asks for. Called on the exiting thread, before the
// libraries' clean-up.
bool CloseExitGate(std::chrono::milliseconds deadline) noexcept;

bool ExitGateClosed() noexcept;

// In a forked child: the parent's other threads, and the passes they held, do not exist.
void ResetExitGateAfterFork() noexcept;

}  // namespace ncclguard
