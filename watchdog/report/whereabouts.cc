#include "watchdog/report/whereabouts.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "watchdog/report/snapshot.h"

namespace ncclguard {
namespace {

// A dump this much older than the verdict that reads it is said to be so.
constexpr double kStaleDumpSeconds = 0.5;

std::string_view BaseName(std::string_view path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// Modules whose frames say how, not where: the runtimes (the sanitizers' too, whose interceptors
// stand between the application and the C library), the interpreter, CUDA, NCCL, ncclguard.
bool IsRuntimeModule(std::string_view module) {
  static constexpr std::array<std::string_view, 19> kPrefixes = {
      "libc.so",   "libc-",      "libpthread", "ld-linux",  "libdl",   "librt",        "libm.so",
      "libstdc++", "libgcc_s",   "libcuda",    "libcudart", "libnccl", "libncclguard", "libunwind",
      "libpython", "linux-vdso", "libasan",    "libtsan",   "libubsan"};
  const std::string_view name = BaseName(module);
  if (name.empty()) return true;  // an address in no module
  return std::ranges::any_of(kPrefixes, [name](std::string_view prefix) { return name.starts_with(prefix); });
}

// Python's own library (lib/pythonX.Y/, but not the packages installed into it).
bool IsPythonLibrary(std::string_view file) {
  const auto contains = [file](std::string_view part) { return file.find(part) != std::string_view::npos; };
  if (contains("site-packages") || contains("dist-packages")) return false;
  return contains("/lib/python") || file.starts_with("<frozen ");
}

std::string Duration(double seconds) {
  if (seconds < 0.05) return "under 0.1 s";  // "0.0 s" would read as no time at all
  if (seconds < 10) return fmt::format("{:.1f} s", seconds);
  return fmt::format("{:.0f} s", seconds);
}

// What the thread waits on, from /proc: "sleeping", "blocked in read() on pipe:[42]", ...
std::string Waiting(const ThreadSnapshot& thread) {
  const std::string& call = thread.syscall;
  if (call == "clock_nanosleep" || call == "nanosleep") return "sleeping";
  if (call == "futex") return "waiting on a lock or condition variable (futex)";
  if (!call.empty() && thread.fd >= 0) {
    return fmt::format(
        "blocked in {}() on {}", call,
        thread.fd_target.empty() ? fmt::format("file descriptor {}", thread.fd) : thread.fd_target);
  }
  if (!call.empty()) return fmt::format("blocked in {}()", call);
  if (thread.state == "disk_sleep") {
    return thread.wchan.empty() ? std::string("in uninterruptible sleep")
                                : fmt::format("in uninterruptible sleep ({})", thread.wchan);
  }
  if (thread.state == "running") return "running";
  return thread.state.empty() ? std::string("in an unknown state") : thread.state;
}

const FrameSnapshot* ApplicationFrame(const ThreadSnapshot& thread, bool& python) {
  for (const FrameSnapshot& frame : thread.python) {
    if (!IsPythonLibrary(frame.file)) {
      python = true;
      return &frame;
    }
  }
  if (!thread.python.empty()) {
    python = true;
    return &thread.python.front();
  }
  for (const FrameSnapshot& frame : thread.native) {
    if (!IsRuntimeModule(frame.module)) return &frame;
  }
  return nullptr;
}

}  // namespace

std::string FrameText(const FrameSnapshot& frame, bool python) {
  const std::string function = frame.function.empty() ? std::string("??") : frame.function;
  if (python) return fmt::format("{} ({}:{})", function, frame.file, frame.line);
  const std::string where = fmt::format("{}+0x{:x}", BaseName(frame.module), frame.offset);
  if (!frame.file.empty() && frame.line > 0)
    return fmt::format("{} ({}:{}, in {})", function, BaseName(frame.file), frame.line, where);
  return fmt::format("{} ({})", function, where);
}

std::optional<ThreadLocation> LocateProcess(const ThreadsSnapshot& threads, std::int64_t preferred_tid,
                                            int pid, std::int64_t judged_ns) {
  const auto with_tid = [&threads](std::int64_t tid) {
    return std::ranges::find_if(threads.threads,
                                [tid](const ThreadSnapshot& thread) { return thread.tid == tid; });
  };
  auto chosen = with_tid(preferred_tid);
  if (preferred_tid <= 0 || chosen == threads.threads.end()) chosen = with_tid(pid);
  if (chosen == threads.threads.end()) {
    chosen = std::ranges::find_if(threads.threads,
                                  [](const ThreadSnapshot& thread) { return !thread.python.empty(); });
  }
  if (chosen == threads.threads.end()) return std::nullopt;
  ThreadLocation location;
  location.thread = &*chosen;
  location.frame = ApplicationFrame(*chosen, location.python);
  location.waiting = Waiting(*chosen);
  std::string sentence = location.waiting;
  if (location.frame != nullptr) {  // the function alone in backquotes: "in `f` (a.py:3), ..."
    const FrameSnapshot& frame = *location.frame;
    const std::string function = frame.function.empty() ? std::string("??") : frame.function;
    const std::string text = FrameText(frame, location.python);
    sentence = fmt::format("in `{}`{}, {}", function, text.substr(function.size()), location.waiting);
  }
  if (chosen->blocked_seconds >= 0 && location.waiting != "running")
    sentence += fmt::format(" for {}", Duration(chosen->blocked_seconds));
  // A late rank's dump answers its peers' request of an earlier stall: read at a later one, how
  // long it had waited then is no news of now (a straggler dumps just as it begins a step).
  const double dump_age_seconds = static_cast<double>(judged_ns - threads.time_ns) / 1e9;
  if (judged_ns > 0 && dump_age_seconds >= kStaleDumpSeconds)
    sentence += fmt::format(" at its dump, {} before", Duration(dump_age_seconds));
  location.sentence = std::move(sentence);
  return location;
}

}  // namespace ncclguard
