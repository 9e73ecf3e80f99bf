// The sink the recording plugin reports to: it looks emuProfilerTestRecord up in the program's
// global scope (the program is built with ENABLE_EXPORTS).
#include "profiler_events.h"

namespace profilertest {
std::mutex g_mutex;
std::condition_variable g_recorded;
std::vector<RecordedCall> g_calls;
}  // namespace profilertest

extern "C" __attribute__((visibility("default"))) void emuProfilerTestRecord(
    const profilertest::RecordedCall* call) {
  std::lock_guard<std::mutex> lock(profilertest::g_mutex);
  profilertest::g_calls.push_back(*call);
  profilertest::g_recorded.notify_all();
}
