// The test side of the recording profiler plugin (profiler_plugin.cc): the calls it reported
// (recorded by profiler_events.cc, which a test program links), the calls as events, and the
// operations the tests run under it.
#pragma once

#include <cuda.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "nccl_test_support.h"
#include "profiler_recorder.h"
#include "tests/support/process.h"

namespace profilertest {

using nccltest::LocalRanks;

// Every call the plugin reported, in order (profiler_events.cc).
extern std::mutex g_mutex;
extern std::condition_variable g_recorded;
extern std::vector<RecordedCall> g_calls;

constexpr int kAllV5Events = 0xfff;

inline std::vector<RecordedCall> recordedCalls() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_calls;
}

inline void forgetCalls() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_calls.clear();
}

// The calls as events: each start with what happened to it later, in call order.
struct Event {
  size_t index = 0;  // of the start, in call order
  RecordedCall start;
  std::vector<RecordedCall> states;
  int stops = 0;
  size_t stop_index = 0;  // of the first stop
  uint64_t stop_ns = 0;   // when the first stop came
  std::vector<int> stateNumbers() const {
    std::vector<int> numbers;
    for (const RecordedCall& call : states) numbers.push_back(call.state);
    return numbers;
  }
  bool stopped() const { return stops > 0; }
};

class EventLog {
 public:
  explicit EventLog(std::vector<RecordedCall> calls) : calls_(std::move(calls)) {
    for (size_t i = 0; i < calls_.size(); ++i) {
      const RecordedCall& call = calls_[i];
      if (call.kind == CallKind::Start) {
        order_.push_back(call.event);
        events_[call.event] = Event{i, call, {}, 0, 0, 0};
      } else if (call.kind == CallKind::State && events_.count(call.event)) {
        events_[call.event].states.push_back(call);
      } else if (call.kind == CallKind::Stop && events_.count(call.event)) {
        Event& event = events_[call.event];
        if (event.stops++ == 0) {
          event.stop_index = i;
          event.stop_ns = call.ns;
        }
      }
    }
  }

  // Events of a type, in start order; rank: the communicator rank of the context they came with.
  std::vector<const Event*> ofType(uint64_t type, int rank = -1) const {
    std::vector<const Event*> found;
    for (uint64_t id : order_) {
      const Event& event = events_.at(id);
      if (event.start.type == type && (rank < 0 || event.start.context_rank == rank)) found.push_back(&event);
    }
    return found;
  }
  std::vector<const Event*> childrenOf(const Event& parent, uint64_t type) const {
    std::vector<const Event*> found;
    for (const Event* event : ofType(type)) {
      if (event->start.parent == parent.start.event) found.push_back(event);
    }
    return found;
  }
  const Event* find(uint64_t id) const { return events_.count(id) ? &events_.at(id) : nullptr; }
  std::vector<RecordedCall> callsOf(CallKind kind) const {
    std::vector<RecordedCall> found;
    std::copy_if(calls_.begin(), calls_.end(), std::back_inserter(found),
                 [&](const auto& c) { return c.kind == kind; });
    return found;
  }

 private:
  std::vector<RecordedCall> calls_;
  std::vector<uint64_t> order_;
  std::map<uint64_t, Event> events_;
};

// Waits until the recorded calls satisfy `done`: the kernel's events come from stream workers.
template <class Done>
bool waitForCalls(Done done, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  std::unique_lock<std::mutex> lock(g_mutex);
  return g_recorded.wait_for(lock, timeout, [&] { return done(EventLog(g_calls)); });
}

inline std::string pluginDirectory() { return EMU_PROFILER_PLUGIN_DIR; }
inline std::string recorderPath() { return pluginDirectory() + "/libnccl-profiler-recorder.so"; }

// Whether the library at `path` is loaded in this process now.
inline bool loaded(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle != nullptr) dlclose(handle);
  return handle != nullptr;
}

// NCCL's INFO log in a file of the case's own: read at the first log line, so set first.
class InfoLog {
 public:
  InfoLog() : path_(directory_.path() + "/nccl.log") {
    setenv("NCCL_DEBUG", "INFO", 1);
    setenv("NCCL_DEBUG_FILE", path_.c_str(), 1);
  }
  std::string text() const { return ncclguard::testing::ReadFile(path_); }
  bool contains(const std::string& needle) const { return text().find(needle) != std::string::npos; }

 private:
  ncclguard::testing::TemporaryDirectory directory_;
  std::string path_;
};

inline std::string text(const char* literal) { return literal ? literal : "(null)"; }

// A float AllReduce(sum) on every rank, from one thread; each rank's value is its rank + 1.
inline std::vector<float*> allReduce(LocalRanks& ranks, size_t count, bool grouped = true) {
  std::vector<float*> buffers;
  for (int r = 0; r < ranks.size(); ++r) {
    buffers.push_back(ranks.allocate<float>(r, count * sizeof(float)));
    std::fill(buffers.back(), buffers.back() + count, static_cast<float>(r + 1));
  }
  if (grouped) REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < ranks.size(); ++r) {
    REQUIRE(ncclAllReduce(buffers[r], buffers[r], count, ncclFloat32, ncclSum, ranks.comm(r),
                          ranks.stream(r)) == ncclSuccess);
  }
  if (grouped) REQUIRE(ncclGroupEnd() == ncclSuccess);
  return buffers;
}

inline void checkAllReduceResult(const LocalRanks& ranks, const std::vector<float*>& buffers, size_t count) {
  const float sum = static_cast<float>(ranks.size() * (ranks.size() + 1) / 2);
  for (float* buffer : buffers) {
    CHECK(buffer[0] == sum);
    CHECK(buffer[count - 1] == sum);
  }
}

// Every rank sends `count` floats to the next and receives as many from the previous one.
inline void ringExchange(LocalRanks& ranks, size_t count) {
  const int n = ranks.size();
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < n; ++r) {
    float* send = ranks.allocate<float>(r, count * sizeof(float));
    float* recv = ranks.allocate<float>(r, count * sizeof(float));
    REQUIRE(ncclSend(send, count, ncclFloat32, (r + 1) % n, ranks.comm(r), ranks.stream(r)) == ncclSuccess);
    REQUIRE(ncclRecv(recv, count, ncclFloat32, (r - 1 + n) % n, ranks.comm(r), ranks.stream(r)) ==
            ncclSuccess);
  }
  REQUIRE(ncclGroupEnd() == ncclSuccess);
}

inline void initWithMask(LocalRanks& ranks, int mask) {
  setenv("EMU_PROFILER_MASK", std::to_string(mask).c_str(), 1);
  ranks.initAll();
}

inline const Event& only(const std::vector<const Event*>& events) {
  REQUIRE(events.size() == 1);
  return *events[0];
}

inline size_t stoppedKernelChannels(const EventLog& log) {
  size_t count = 0;
  for (const Event* channel : log.ofType(ncclProfileKernelCh)) count += channel->stopped();
  return count;
}

inline size_t stoppedOf(const EventLog& log, uint64_t type) {
  size_t count = 0;
  for (const Event* event : log.ofType(type)) count += event->stopped();
  return count;
}

// Without P2P and SHM, ranks of one host talk through the network (NCCL reads both at the first
// init of the process).
inline void useNetTransport() {
  setenv("NCCL_P2P_DISABLE", "1", 1);
  setenv("NCCL_SHM_DISABLE", "1", 1);
}

}  // namespace profilertest
