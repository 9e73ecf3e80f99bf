// Loaded by python_stacks_probe.py through ctypes.CDLL in every CPython interpreter the tests find:
// takes the Python stacks of the process, as the watchdog would, and hands them back as JSON.
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "watchdog/report/python_stacks.h"

namespace {

nlohmann::json ToJson(const std::optional<ncclguard::PythonStacks>& stacks, double seconds) {
  nlohmann::json json = {{"seconds", seconds}, {"python", stacks.has_value()}};
  if (!stacks) return json;
  json["version"] = stacks->version;
  json["unavailable"] = stacks->unavailable;
  json["threads_truncated"] = stacks->threads_truncated;
  json["threads"] = nlohmann::json::array();
  for (const ncclguard::PythonThread& thread : stacks->threads) {
    nlohmann::json frames = nlohmann::json::array();
    for (const ncclguard::PythonFrame& frame : thread.frames) {
      frames.push_back({{"file", frame.file}, {"line", frame.line}, {"function", frame.function}});
    }
    json["threads"].push_back({{"thread_id", thread.thread_id},
                               {"name", thread.name},
                               {"current", thread.current},
                               {"truncated", thread.truncated},
                               {"frames", frames}});
  }
  return json;
}

}  // namespace

// Writes the JSON of the stacks into `out` (NUL-terminated) and returns its length, or -1 when it
// does not fit. from_calling_thread 0: taken on a thread of its own, which Python does not know,
// as the watchdog thread; 1: on the calling Python thread, which ctypes has let go of the GIL.
extern "C" __attribute__((visibility("default"))) long ncclguard_python_stacks_probe(int from_calling_thread,
                                                                                     char* out, long size) {
  std::optional<ncclguard::PythonStacks> stacks;
  double seconds = 0;
  const auto capture = [&] {
    const auto start = std::chrono::steady_clock::now();
    stacks = ncclguard::CapturePythonStacks();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  if (from_calling_thread != 0) {
    capture();
  } else {
    std::thread watchdog(capture);
    watchdog.join();
  }
  const std::string text = ToJson(stacks, seconds).dump();
  if (size <= 0 || text.size() >= static_cast<std::size_t>(size)) return -1;
  std::memcpy(out, text.c_str(), text.size() + 1);
  return static_cast<long>(text.size());
}
