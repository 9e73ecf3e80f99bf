// Every thread's stack, native and Python, and what each thread is blocked on: taken when the
// process dumps, so that a late rank's dump says where it is (a checkpoint save, a read that never
// returns) without anyone attaching a debugger to it.
//
// Native frames: each thread in turn is sent ncclguard's stack signal (tgkill), whose handler
// unwinds the thread's own stack with libunwind into preallocated memory; the frames are
// symbolized afterwards, on the capturing thread. A thread that cannot answer (it blocks the
// signal, sleeps uninterruptibly, or sits in a call that a signal would cut short) is not sent the
// signal: it still gets its line from /proc/self/task/<tid> (state, wchan, system call, the file
// descriptor it waits on). Python frames come from the interpreter itself (python_stacks.h).
#pragma once

#include <chrono>
#include <cstdint>

#include "watchdog/report/snapshot.h"

namespace ncclguard {

// Installs the handler of NCCLGUARD_STACK_SIGNAL (0: none, and no native stacks) unless the
// application handles that signal already, in which case native stacks are skipped and the
// stacks say so. Loads libunwind (privately: its exported C++ unwinder must not replace the
// application's). Called when the watchdog starts, never at load time. Logs nothing.
void InstallStackSignal(int signal) noexcept;

struct StackCaptureLimits {
  int max_threads = 1024;                          // listed; the rest only counted
  std::chrono::milliseconds thread_deadline{100};  // for one thread to answer the signal
  std::chrono::milliseconds total_deadline{2000};  // for all signals of one capture
  bool symbolize = true;  // false: native frames keep only their address (as `offset`, no module)
  bool python = true;     // false: no Python frames
};

// The stacks of every thread of the process (the calling thread is listed, without frames).
// Never throws; what could not be taken is said in the notes of each thread and of the whole.
// Captures are serialized: a concurrent call waits for the one under way.
ThreadsSnapshot CaptureThreadStacks(const StackCaptureLimits& limits = {}) noexcept;

}  // namespace ncclguard
