// Where a thread is, from a dump's stacks: its innermost frame of application code and what it is
// blocked on, as the verdicts and `ncclguard analyze` say it ("in `save_checkpoint`
// (train.py:88), sleeping for 41 s").
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "watchdog/report/snapshot.h"

namespace ncclguard {

struct ThreadLocation {
  const ThreadSnapshot* thread = nullptr;
  // The innermost frame of application code: Python first (outside Python's own library), then
  // native outside the C and C++ runtimes, CUDA, NCCL, the interpreter and ncclguard. Null when
  // none.
  const FrameSnapshot* frame = nullptr;
  bool python = false;   // `frame` is a Python frame
  std::string waiting;   // "sleeping", "blocked in read() on pipe:[42]", "running", ...
  std::string sentence;  // "in `f` (a.py:3), sleeping for 41 s"
};

// The thread of `threads` that tells where the process is: `preferred_tid` (the thread that issued
// its NCCL operations) when it is listed, else the process's main thread (`pid`), else the first
// thread with Python frames. Nothing when no thread is listed. `judged_ns` (epoch ns, 0: the
// dump's own time) is when the sentence is read: from a dump taken long before it, how long a
// thread had waited is said as of the dump ("sleeping for 0.1 s at its dump, 9.0 s before"), never
// as if it were now.
std::optional<ThreadLocation> LocateProcess(const ThreadsSnapshot& threads, std::int64_t preferred_tid,
                                            int pid, std::int64_t judged_ns = 0);

// The frame as one line: "save_checkpoint (train.py:88)", "write_shard (app.c:42, in app+0x11a9)",
// "?? (libfoo.so+0x1234)".
std::string FrameText(const FrameSnapshot& frame, bool python);

}  // namespace ncclguard
