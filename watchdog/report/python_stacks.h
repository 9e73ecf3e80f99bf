// The Python stack of every thread of the CPython interpreter running in this process, read the way
// CPython's own faulthandler reads them from its watchdog thread (dump_traceback_later): by
// _Py_DumpTracebackThreads(), without the GIL and without running Python code. A thread may hold
// the GIL for ever in a hang, and only a reader that does not need it can say where it is.
// Runs on the watchdog thread, never in a signal handler.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ncclguard {

struct PythonFrame {
  std::string file;      // as CPython prints it: non-ASCII escaped, long names cut with "..."
  int line = 0;          // 0 when CPython printed "???"
  std::string function;  // "???" when CPython did not know
};

struct PythonThread {
  std::uint64_t thread_id = 0;      // the pthread_t CPython prints (threading.get_ident())
  std::string name;                 // the thread's name, printed by CPython 3.14 and later; "" before
  bool current = false;             // the thread that read the stacks, when it is a Python thread
  std::vector<PythonFrame> frames;  // innermost first
  bool truncated = false;           // CPython stopped after its 100 frames, or the text was cut
};

struct PythonStacks {
  std::string version;      // Py_GetVersion(), up to the first space ("3.12.1")
  std::string unavailable;  // why the stacks could not be taken; "" when they were
  std::vector<PythonThread> threads;
  bool threads_truncated = false;  // CPython stops after 100 threads, or the text was cut
};

// The stacks of the main interpreter's threads, std::nullopt when this process runs no Python
// interpreter. Never throws; when the reader cannot be used (an unsupported version, a stripped
// libpython, an interpreter finalizing) the stacks are empty and `unavailable` says why.
//
// Not atomic: threads may start, end or move on while CPython walks their frames, as for
// faulthandler. CPython reads each frame's memory without a lock; a thread that frees a frame at
// that moment may make it print garbage, which the parser drops.
std::optional<PythonStacks> CapturePythonStacks() noexcept;

// The threads in the text that _Py_DumpTracebackThreads() writes (3.9 to 3.14), in `threads` and
// `threads_truncated` of the result. Lines of no known form are skipped, and at most 1000 threads
// of 1000 frames are kept. `text_truncated`: the text was cut at a size limit, so its last thread
// is marked truncated.
PythonStacks ParsePythonTracebacks(std::string_view text, bool text_truncated) noexcept;

}  // namespace ncclguard
