#include "watchdog/report/python_stacks.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "watchdog/common/libraries.h"
#include "watchdog/report/symbolizer.h"

namespace ncclguard {
namespace {

// Opaque: the reader only passes the pointers on.
struct PyInterpreterState;
struct PyThreadState;

// No Python.h at build time: these are the C declarations of CPython's own headers, read in
// 3.9.18, 3.10.13, 3.11.7, 3.12.1 and 3.13.0 (Include/pylifecycle.h, Include/pystate.h, and
// Include/internal/pycore_traceback.h for the reader, whose declaration is
//   const char* _Py_DumpTracebackThreads(int fd, PyInterpreterState* interp,
//                                        PyThreadState* current_tstate);
// in all five, and in 3.14's Python/traceback.c). Exported by 3.11 and 3.12 and by Debian's
// statically linked python3.11, but a hidden symbol of the shared libpython of 3.9, 3.10 and 3.13.
using IsInitializedFunction = int (*)();
using IsFinalizingFunction = int (*)();  // _Py_IsFinalizing before 3.13, Py_IsFinalizing since
using GetVersionFunction = const char* (*)();
using InterpreterFunction = PyInterpreterState* (*)();  // PyInterpreterState_Main / _Head
using DumpTracebackThreadsFunction = const char* (*)(int fd, PyInterpreterState* interp,
                                                     PyThreadState* current_tstate);

constexpr int kOldestMinor = 9;
constexpr int kNewestMinor = 14;
// CPython prints at most 100 threads of 100 frames, each line at most about 5,000 bytes (500
// characters each escaped to up to 10); what a real program writes fits well within 1 MiB.
constexpr std::size_t kMaxText = 1 << 20;
constexpr std::size_t kMaxThreads = 1000;
constexpr std::size_t kMaxFrames = 1000;
constexpr std::size_t kMaxName = 8192;

template <typename Function>
Function Lookup(const char* name) {
  return reinterpret_cast<Function>(Real().Symbol(RTLD_DEFAULT, name));
}

bool ConsumePrefix(std::string_view* text, std::string_view prefix) {
  if (text->substr(0, prefix.size()) != prefix) return false;
  text->remove_prefix(prefix.size());
  return true;
}

bool ConsumeSuffix(std::string_view* text, std::string_view suffix) {
  if (text->size() < suffix.size() || text->substr(text->size() - suffix.size()) != suffix) return false;
  text->remove_suffix(suffix.size());
  return true;
}

std::string Bounded(std::string_view text) { return std::string(text.substr(0, kMaxName)); }

// "Thread 0x00007f3a2b7fe640 (most recent call first):", "Current thread 0x...", and since 3.14
// with the thread's name: "Thread 0x00007f3a2b7fe640 [loader] (most recent call first):".
std::optional<PythonThread> ParseThreadHeader(std::string_view line) {
  PythonThread thread;
  if (ConsumePrefix(&line, "Current thread 0x")) {
    thread.current = true;
  } else if (!ConsumePrefix(&line, "Thread 0x")) {
    return std::nullopt;
  }
  if (!ConsumeSuffix(&line, " (most recent call first):")) return std::nullopt;
  std::size_t digits = 0;
  for (; digits < line.size() && std::isxdigit(static_cast<unsigned char>(line[digits])); ++digits) {
    const char digit = static_cast<char>(std::tolower(static_cast<unsigned char>(line[digits])));
    thread.thread_id =
        thread.thread_id * 16 + static_cast<std::uint64_t>(digit <= '9' ? digit - '0' : digit - 'a' + 10);
  }
  if (digits == 0 || digits > 16) return std::nullopt;
  line.remove_prefix(digits);
  if (!line.empty()) {
    if (!ConsumePrefix(&line, " [") || !ConsumeSuffix(&line, "]")) return std::nullopt;
    thread.name = Bounded(line);
  }
  return thread;
}

// `42` or `???` (0).
bool ParseLineNumber(std::string_view text, int* line) {
  if (text == "???") {
    *line = 0;
    return true;
  }
  if (text.empty() || text.size() > 10) return false;
  long long value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < 0 || value > INT32_MAX)
    return false;
  *line = static_cast<int>(value);
  return true;
}

// `  File "train.py", line 88 in save_checkpoint`; the file may be `???` (no quotes), the line
// `???`. A file name may hold quotes itself, so the separator taken is the last `", line ` that is
// followed by a line number and ` in `.
std::optional<PythonFrame> ParseFrame(std::string_view line) {
  if (!ConsumePrefix(&line, "  File ")) return std::nullopt;
  PythonFrame frame;
  std::string_view rest;
  if (ConsumePrefix(&line, "???, line ")) {
    frame.file = "???";
    rest = line;
  } else if (ConsumePrefix(&line, "\"")) {
    std::size_t separator = line.rfind("\", line ");
    while (true) {
      if (separator == std::string_view::npos) return std::nullopt;
      std::string_view candidate = line.substr(separator + 8);
      const std::size_t in = candidate.find(" in ");
      int number = 0;
      if (in != std::string_view::npos && ParseLineNumber(candidate.substr(0, in), &number)) break;
      if (separator == 0) return std::nullopt;
      separator = line.rfind("\", line ", separator - 1);
    }
    frame.file = Bounded(line.substr(0, separator));
    rest = line.substr(separator + 8);
  } else {
    return std::nullopt;
  }
  const std::size_t in = rest.find(" in ");
  if (in == std::string_view::npos || !ParseLineNumber(rest.substr(0, in), &frame.line)) return std::nullopt;
  frame.function = Bounded(rest.substr(in + 4));
  return frame;
}

}  // namespace

PythonStacks ParsePythonTracebacks(std::string_view text, bool text_truncated) noexcept {
  PythonStacks stacks;
  try {
    PythonThread* thread = nullptr;  // the thread whose frames follow, nullptr after a bad header
    while (!text.empty()) {
      const std::size_t end = text.find('\n');
      std::string_view line = text.substr(0, end);
      text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);

      if (line.empty()) continue;
      if (line == "...") {  // CPython's limit of threads
        stacks.threads_truncated = true;
        thread = nullptr;
        continue;
      }
      // "  ..." up to 3.13, "plus N frames" in later sources: CPython's limit of frames.
      if (line == "  ..." || line.starts_with("plus ") || line.starts_with("  plus ")) {
        if (thread != nullptr) thread->truncated = true;
        continue;
      }
      if (line[0] != ' ') {
        std::optional<PythonThread> header = ParseThreadHeader(line);
        thread = nullptr;
        if (!header) continue;
        if (stacks.threads.size() >= kMaxThreads) {
          stacks.threads_truncated = true;
          continue;
        }
        thread = &stacks.threads.emplace_back(std::move(*header));
        continue;
      }
      if (thread == nullptr) continue;
      std::optional<PythonFrame> frame = ParseFrame(line);
      // Other lines: "  <no Python frame>", "  <tstate is freed>", "  Garbage-collecting".
      if (!frame) continue;
      if (thread->frames.size() >= kMaxFrames) {
        thread->truncated = true;
        continue;
      }
      thread->frames.push_back(std::move(*frame));
    }
    if (text_truncated) {
      stacks.threads_truncated = true;
      if (!stacks.threads.empty()) stacks.threads.back().truncated = true;
    }
  } catch (...) {
    // Out of memory: what was parsed so far.
    stacks.threads_truncated = true;
  }
  return stacks;
}

namespace {

// Runs the reader into a memory file and returns what it wrote, at most kMaxText bytes.
PythonStacks RunReader(DumpTracebackThreadsFunction reader, PyInterpreterState* interpreter) {
  PythonStacks stacks;
  const int fd = memfd_create("ncclguard-python-stacks", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    stacks.unavailable = absl::StrCat("memfd_create failed: ", strerror(errno));
    return stacks;
  }
  // A file of kMaxText bytes that cannot grow: CPython's writes past it fail (it ignores write
  // errors), so even a runaway traceback costs at most kMaxText bytes of memory. Where sealing is
  // refused the file grows and only its start is read.
  if (ftruncate(fd, kMaxText) == 0) fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK);

  // current_tstate nullptr: CPython takes the calling thread's own state, which the watchdog
  // thread has none of, so no thread is marked current, as for faulthandler's
  // dump_traceback_later thread.
  const char* error = reader(fd, interpreter, nullptr);

  const off_t written = lseek(fd, 0, SEEK_CUR);
  std::string text;
  if (written > 0) {
    text.resize(std::min<std::size_t>(static_cast<std::size_t>(written), kMaxText));
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t got = pread(fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      done += static_cast<std::size_t>(got);
    }
    text.resize(done);
  }
  close(fd);

  const bool cut = written >= static_cast<off_t>(kMaxText);
  stacks = ParsePythonTracebacks(text, cut);
  if (error != nullptr) stacks.unavailable = absl::StrCat("CPython: ", error);
  return stacks;
}

}  // namespace

std::optional<PythonStacks> CapturePythonStacks() noexcept {
  try {
    const auto is_initialized = Lookup<IsInitializedFunction>("Py_IsInitialized");
    if (is_initialized == nullptr || is_initialized() != 1) return std::nullopt;

    PythonStacks stacks;
    const auto get_version = Lookup<GetVersionFunction>("Py_GetVersion");
    const char* version = get_version != nullptr ? get_version() : nullptr;
    if (version != nullptr) stacks.version = std::string(version, strcspn(version, " "));
    int major = 0;
    int minor = 0;
    const char* const version_end = stacks.version.data() + stacks.version.size();
    const auto [major_end, major_error] = std::from_chars(stacks.version.data(), version_end, major);
    if (major_error == std::errc() && major_end != version_end && *major_end == '.') {
      std::from_chars(major_end + 1, version_end, minor);
    }
    if (major != 3 || minor < kOldestMinor || minor > kNewestMinor) {
      stacks.unavailable = absl::StrCat(
          "Python ", stacks.version.empty() ? "of unknown version" : stacks.version, " is not supported (3.",
          kOldestMinor, " to 3.", kNewestMinor, " are): its stacks are not read");
      return stacks;
    }

    auto is_finalizing = Lookup<IsFinalizingFunction>("Py_IsFinalizing");
    if (is_finalizing == nullptr) is_finalizing = Lookup<IsFinalizingFunction>("_Py_IsFinalizing");
    if (is_finalizing != nullptr && is_finalizing() != 0) {
      stacks.unavailable = "the interpreter is finalizing: its thread states are being freed";
      return stacks;
    }

    auto interpreter_function = Lookup<InterpreterFunction>("PyInterpreterState_Main");
    if (interpreter_function == nullptr)
      interpreter_function = Lookup<InterpreterFunction>("PyInterpreterState_Head");
    PyInterpreterState* interpreter = interpreter_function != nullptr ? interpreter_function() : nullptr;
    if (interpreter == nullptr) {
      stacks.unavailable = "no interpreter state (PyInterpreterState_Main) was found";
      return stacks;
    }

    auto reader = Lookup<DumpTracebackThreadsFunction>("_Py_DumpTracebackThreads");
    if (reader == nullptr) {
      // Hidden in some builds: found in the full symbol table of the module that holds the
      // interpreter (libpython, or the python executable itself).
      const std::optional<std::uint64_t> address =
          FindSymbolInModuleOf(reinterpret_cast<const void*>(is_initialized), "_Py_DumpTracebackThreads");
      if (address) reader = reinterpret_cast<DumpTracebackThreadsFunction>(*address);
    }
    if (reader == nullptr) {
      stacks.unavailable =
          "CPython's traceback reader _Py_DumpTracebackThreads was not found (not exported, and libpython "
          "has "
          "no symbol table: a stripped build, or libdw is missing)";
      return stacks;
    }

    PythonStacks taken = RunReader(reader, interpreter);
    taken.version = std::move(stacks.version);
    return taken;
  } catch (...) {
    PythonStacks stacks;
    stacks.unavailable = "out of memory";  // short enough not to allocate
    return stacks;
  }
}

}  // namespace ncclguard
