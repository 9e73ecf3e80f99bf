// The emulated NCCL's profiler plugin interface (v5, as NCCL 2.28.9 drives it), with the test
// plugin of profiler_plugin.cc reporting every call here: how NCCL_PROFILER_PLUGIN finds the
// plugin, init and finalize per communicator, the events of collectives and Send/Recv down to the
// kernel's channels and, over NET, the proxy's steps, the activation mask, and a stopped link
// (hang with peer=). Each case runs in a process of its own (ctest): NCCL looks the plugin up at
// the process's first init, and reads the transport settings once.
#include <cuda.h>
#include <dlfcn.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "nccl_test_support.h"
#include "profiler_recorder.h"
#include "tests/support/process.h"

using profilertest::CallKind;
using profilertest::RecordedCall;

namespace {
std::mutex g_mutex;
std::condition_variable g_recorded;
std::vector<RecordedCall> g_calls;
}  // namespace

extern "C" __attribute__((visibility("default"))) void emuProfilerTestRecord(const RecordedCall* call) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_calls.push_back(*call);
  g_recorded.notify_all();
}

namespace {

using namespace std::chrono_literals;
using ncclguard::testing::ReadFile;
using nccltest::LocalRanks;

constexpr int kAllV5Events = 0xfff;

std::vector<RecordedCall> recordedCalls() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_calls;
}

void forgetCalls() {
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
        events_[call.event] = Event{i, call, {}, 0, 0};
      } else if (call.kind == CallKind::State && events_.count(call.event)) {
        events_[call.event].states.push_back(call);
      } else if (call.kind == CallKind::Stop && events_.count(call.event)) {
        Event& event = events_[call.event];
        if (event.stops++ == 0) event.stop_index = i;
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
bool waitForCalls(Done done, std::chrono::milliseconds timeout = 10s) {
  std::unique_lock<std::mutex> lock(g_mutex);
  return g_recorded.wait_for(lock, timeout, [&] { return done(EventLog(g_calls)); });
}

std::string pluginDirectory() { return EMU_PROFILER_PLUGIN_DIR; }
std::string recorderPath() { return pluginDirectory() + "/libnccl-profiler-recorder.so"; }

bool loaded(const std::string& path) {
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
  std::string text() const { return ReadFile(path_); }
  bool contains(const std::string& needle) const { return text().find(needle) != std::string::npos; }

 private:
  ncclguard::testing::TemporaryDirectory directory_;
  std::string path_;
};

// A float AllReduce(sum) on every rank, from one thread; each rank's value is its rank + 1.
std::vector<float*> allReduce(LocalRanks& ranks, size_t count, bool grouped = true) {
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

void checkAllReduceResult(const LocalRanks& ranks, const std::vector<float*>& buffers, size_t count) {
  const float sum = static_cast<float>(ranks.size() * (ranks.size() + 1) / 2);
  for (float* buffer : buffers) {
    CHECK(buffer[0] == sum);
    CHECK(buffer[count - 1] == sum);
  }
}

// Every rank sends `count` floats to the next and receives as many from the previous one.
void ringExchange(LocalRanks& ranks, size_t count) {
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

void initWithMask(LocalRanks& ranks, int mask) {
  setenv("EMU_PROFILER_MASK", std::to_string(mask).c_str(), 1);
  ranks.initAll();
}

std::string text(const char* literal) { return literal ? literal : "(null)"; }

}  // namespace

// ---- Finding the plugin ------------------------------------------------------------------------

TEST_CASE(
    "NCCL_PROFILER_PLUGIN as a path: loaded once, init per communicator, finalize at destroy, closed after",
    "[path]") {
  InfoLog log;
  setenv("NCCL_PROFILER_PLUGIN", recorderPath().c_str(), 1);
  LocalRanks ranks(2);
  ranks.initAll();
  REQUIRE(loaded(recorderPath()));
  EventLog events(recordedCalls());
  const auto inits = events.callsOf(CallKind::Init);
  REQUIRE(inits.size() == 2);
  for (int r = 0; r < 2; ++r) {
    CHECK(inits[r].nranks == 2);
    CHECK(inits[r].n_nodes == 1);
    CHECK_FALSE(inits[r].has_name);
    CHECK(inits[r].has_logger);
  }
  CHECK(((inits[0].rank == 0 && inits[1].rank == 1) || (inits[0].rank == 1 && inits[1].rank == 0)));
  CHECK(inits[0].comm_id != 0);
  CHECK(inits[0].comm_id == inits[1].comm_id);  // NCCL's commHash: the same on every rank
  CHECK(log.contains("NCCL INFO NCCL_PROFILER_PLUGIN set by environment to " + recorderPath()));
  CHECK(log.contains("NCCL INFO PROFILER/Plugin: Loaded emu-recorder (v5)"));
  CHECK(log.contains("NCCL INFO Successfully loaded external profiler plugin " + recorderPath()));
  CHECK(log.contains("NCCL INFO emu-recorder: init rank 1 of 2"));  // through the logger NCCL passes

  ranks.destroyAll();
  const auto finalizes = EventLog(recordedCalls()).callsOf(CallKind::Finalize);
  REQUIRE(finalizes.size() == 2);
  std::vector<uint64_t> initialized{inits[0].context, inits[1].context};
  std::vector<uint64_t> finalized{finalizes[0].context, finalizes[1].context};
  std::sort(initialized.begin(), initialized.end());
  std::sort(finalized.begin(), finalized.end());
  CHECK(finalized == initialized);
  CHECK_FALSE(loaded(recorderPath()));  // the last communicator's free closes it
  CHECK(log.contains("PROFILER/Plugin: Closing profiler plugin emu-recorder"));
}

// Run with NCCL_PROFILER_PLUGIN=recorder and the plugins' directory in LD_LIBRARY_PATH.
TEST_CASE("NCCL_PROFILER_PLUGIN as a short name finds libnccl-profiler-<name>.so", "[short_name]") {
  InfoLog log;
  LocalRanks ranks(2);
  ranks.initAll();
  CHECK(EventLog(recordedCalls()).callsOf(CallKind::Init).size() == 2);
  CHECK(log.contains("PROFILER/Plugin: Loaded emu-recorder (v5)"));
  CHECK(log.contains("Successfully loaded external profiler plugin " + recorderPath()));
  ranks.destroyAll();
}

// Run with NCCL_PROFILER_PLUGIN unset and libnccl-profiler.so in LD_LIBRARY_PATH.
TEST_CASE("NCCL_PROFILER_PLUGIN unset: libnccl-profiler.so is tried", "[default_name]") {
  REQUIRE(getenv("NCCL_PROFILER_PLUGIN") == nullptr);
  LocalRanks ranks(2);
  ranks.initAll();
  CHECK(EventLog(recordedCalls()).callsOf(CallKind::Init).size() == 2);
  ranks.destroyAll();
  CHECK(EventLog(recordedCalls()).callsOf(CallKind::Finalize).size() == 2);
}

TEST_CASE("a prefix of STATIC_PLUGIN finds ncclProfiler_v5 in the process's global scope", "[static]") {
  // As an LD_PRELOAD'ed library (ncclguard's) would provide it.
  void* preloaded = dlopen(recorderPath().c_str(), RTLD_NOW | RTLD_GLOBAL);
  REQUIRE(preloaded != nullptr);
  setenv("NCCL_PROFILER_PLUGIN", "static", 1);  // NCCL compares case-insensitively, as a prefix
  setenv("EMU_PROFILER_MASK", std::to_string(ncclProfileColl).c_str(), 1);
  LocalRanks ranks(2);
  ranks.initAll();
  CHECK(EventLog(recordedCalls()).callsOf(CallKind::Init).size() == 2);
  allReduce(ranks, 16);
  REQUIRE(ranks.synchronize());
  CHECK(EventLog(recordedCalls()).ofType(ncclProfileColl).size() == 2);
  ranks.destroyAll();
}

// Run with libnccl-profiler.so in LD_LIBRARY_PATH: "none" wins over it.
TEST_CASE("NCCL_PROFILER_PLUGIN=none (any case) loads nothing", "[none]") {
  setenv("NCCL_PROFILER_PLUGIN", "NoNe", 1);
  LocalRanks ranks(2);
  ranks.initAll();
  allReduce(ranks, 16);
  REQUIRE(ranks.synchronize());
  CHECK(recordedCalls().empty());
  CHECK_FALSE(loaded(pluginDirectory() + "/libnccl-profiler.so"));
  ranks.destroyAll();
}

TEST_CASE("a plugin that cannot be found is logged and never tried again in the process", "[missing]") {
  InfoLog log;
  setenv("NCCL_PROFILER_PLUGIN", "nope", 1);
  LocalRanks ranks(2);
  ranks.initAll();
  CHECK(log.contains("PROFILER/Plugin: Could not find: nope libnccl-profiler-nope.so"));
  ranks.destroyAll();
  // Sticky: a plugin that exists now is not looked for.
  setenv("NCCL_PROFILER_PLUGIN", recorderPath().c_str(), 1);
  ranks.initAll();
  allReduce(ranks, 16);
  REQUIRE(ranks.synchronize());
  CHECK(recordedCalls().empty());
  CHECK_FALSE(loaded(recorderPath()));
  ranks.destroyAll();
}

namespace {

// What the version 4 plugin (profiler_plugin_v4.cc) counted, while it is loaded.
long v4Count(const std::string& path, const char* what) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return -1;
  auto* count = reinterpret_cast<long (*)(const char*)>(dlsym(handle, "emuV4Count"));
  const long value = count != nullptr ? count(what) : -1;
  dlclose(handle);
  return value;
}

// A 2-rank AllReduce under the version 4 plugin at `path`, loaded by whatever looked it up: its
// inits, the Group and Coll events (each Coll under its Group, as version 4 has it), both kernel
// channels of each rank started and stopped, no other events; finalized at destroy.
void checkVersion4Plugin(const std::string& path) {
  LocalRanks ranks(2);
  ranks.initAll();
  REQUIRE(loaded(path));
  CHECK(v4Count(path, "init") == 2);
  const std::vector<float*> buffers = allReduce(ranks, 16);
  REQUIRE(ranks.synchronize());
  checkAllReduceResult(ranks, buffers, 16);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (v4Count(path, "kernel_channel_stops") < 4 && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(v4Count(path, "kernel_channel_stops") == 4);
  CHECK(v4Count(path, "KernelCh") == 4);
  CHECK(v4Count(path, "Coll") == 2);
  CHECK(v4Count(path, "tasks_under_groups") == 2);
  CHECK(v4Count(path, "Group") >= 1);
  CHECK(v4Count(path, "ProxyOp") == 0);  // P2P transfers: no proxy
  ranks.destroyAll();
}

}  // namespace

TEST_CASE("a plugin with only ncclProfiler_v4 is loaded behind NCCL 2.28.9's adapter, without API events",
          "[v4_only]") {
  InfoLog log;
  const std::string path = pluginDirectory() + "/libnccl-profiler-v4only.so";
  setenv("NCCL_PROFILER_PLUGIN", path.c_str(), 1);
  void* keep = nullptr;  // the counts outlive the last communicator's dlclose
  {
    checkVersion4Plugin(path);
    keep = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  }
  CHECK(log.contains("PROFILER/Plugin: Loaded emu-v4-only (v4)"));
  if (keep != nullptr) dlclose(keep);
}

// Run with NCCLEMU_PROFILER_VERSION=4: the emulator looks the plugin up as NCCL 2.26 and 2.27 do,
// ncclProfiler_v4 first; preloaded, ncclguard serves that version and forwards it to this plugin.
TEST_CASE("as NCCL 2.26 and 2.27, ncclProfiler_v4 is looked up and called in version 4", "[v4_nccl]") {
  InfoLog log;
  const std::string path = pluginDirectory() + "/libnccl-profiler-v4only.so";
  setenv("NCCL_PROFILER_PLUGIN", path.c_str(), 1);
  checkVersion4Plugin(path);
  const char* preload = getenv("LD_PRELOAD");
  const bool behind_ncclguard = preload != nullptr && std::string(preload).find("ncclguard") != std::string::npos;
  CHECK(log.contains(behind_ncclguard ? "PROFILER/Plugin: Loaded ncclguard (v4)"
                                      : "PROFILER/Plugin: Loaded emu-v4-only (v4)"));
}

// ---- Lifetime ----------------------------------------------------------------------------------

namespace {

std::vector<RecordedCall> initsSince(size_t first) {
  const auto inits = EventLog(recordedCalls()).callsOf(CallKind::Init);
  return std::vector<RecordedCall>(inits.begin() + std::min(first, inits.size()), inits.end());
}

// The inits a new communicator of `nranks` ranks made: one per rank, named as expected.
void checkInits(const std::vector<RecordedCall>& inits, int nranks, const char* name) {
  REQUIRE(inits.size() == static_cast<size_t>(nranks));
  std::vector<int> ranks;
  for (const RecordedCall& init : inits) {
    ranks.push_back(init.rank);
    CHECK(init.nranks == nranks);
    CHECK(init.comm_id == inits[0].comm_id);
    CHECK(init.has_name == (name != nullptr));
    if (name != nullptr) CHECK(init.comm_name == name);
  }
  std::sort(ranks.begin(), ranks.end());
  for (int r = 0; r < nranks; ++r) CHECK(ranks[r] == r);
}

std::vector<ncclComm_t> initNonBlocking(LocalRanks& ranks, int n, const char* name) {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = name;
  std::vector<ncclComm_t> comms(n, nullptr);
  for (int r = 0; r < n; ++r) {
    ranks.makeCurrent(r);
    REQUIRE(ncclCommInitRankConfig(&comms[r], n, id, r, &config) == ncclInProgress);
  }
  for (ncclComm_t comm : comms) REQUIRE(nccltest::waitForAsyncResult(comm, ncclSuccess, 10s));
  return comms;
}

std::vector<ncclComm_t> initScalable(LocalRanks& ranks, int n) {
  std::vector<ncclUniqueId> ids(2);
  for (ncclUniqueId& id : ids) REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  std::vector<ncclComm_t> comms(n, nullptr);
  std::vector<ncclResult_t> results(n, ncclInternalError);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      if (cuCtxSetCurrent(ranks.context(r)) != CUDA_SUCCESS) return;
      results[r] = ncclCommInitRankScalable(&comms[r], n, r, 2, ids.data(), nullptr);
    });
  }
  for (std::thread& thread : threads) thread.join();
  REQUIRE(results == std::vector<ncclResult_t>(n, ncclSuccess));
  return comms;
}

}  // namespace

TEST_CASE(
    "init once per communicator on every init path; finalize at destroy and abort; reload after the last",
    "[lifecycle]") {
  InfoLog log;
  setenv("NCCL_PROFILER_PLUGIN", recorderPath().c_str(), 1);
  LocalRanks ranks(4);
  ranks.initAll();
  checkInits(initsSince(0), 4, nullptr);

  ncclConfig_t named = NCCL_CONFIG_INITIALIZER;
  named.commName = "split-child";
  std::vector<ncclComm_t> children(4, nullptr);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < 4; ++r)
    REQUIRE(ncclCommSplit(ranks.comm(r), r / 2, r, &children[r], &named) == ncclSuccess);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  const auto split_inits = initsSince(4);
  REQUIRE(split_inits.size() == 4);
  for (const RecordedCall& init : split_inits) {
    CHECK(init.nranks == 2);
    CHECK(init.comm_name == "split-child");
  }

  int excluded[] = {3};
  std::vector<ncclComm_t> shrunk(3, nullptr);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < 3; ++r) {
    REQUIRE(ncclCommShrink(ranks.comm(r), excluded, 1, &shrunk[r], nullptr, NCCL_SHRINK_DEFAULT) ==
            ncclSuccess);
  }
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  checkInits(initsSince(8), 3, nullptr);  // without a config: the parent's, which has no name

  const auto nonblocking = initNonBlocking(ranks, 2, "nonblocking");
  checkInits(initsSince(11), 2, "nonblocking");
  const auto scalable = initScalable(ranks, 2);
  checkInits(initsSince(13), 2, nullptr);

  for (ncclComm_t comm : children) REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  for (ncclComm_t comm : shrunk) REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  for (ncclComm_t comm : nonblocking) REQUIRE(ncclCommAbort(comm) == ncclSuccess);
  for (ncclComm_t comm : scalable) REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  CHECK(EventLog(recordedCalls()).callsOf(CallKind::Finalize).size() == 11);
  CHECK(loaded(recorderPath()));  // the first communicator still holds it
  ranks.destroyAll();

  // Every context finalized exactly once.
  const EventLog all(recordedCalls());
  std::vector<uint64_t> initialized, finalized;
  for (const RecordedCall& init : all.callsOf(CallKind::Init)) initialized.push_back(init.context);
  for (const RecordedCall& end : all.callsOf(CallKind::Finalize)) finalized.push_back(end.context);
  std::sort(initialized.begin(), initialized.end());
  std::sort(finalized.begin(), finalized.end());
  CHECK(initialized.size() == 15);
  CHECK(finalized == initialized);
  CHECK_FALSE(loaded(recorderPath()));

  // The next communicator loads the plugin afresh.
  ranks.initAll();
  CHECK(loaded(recorderPath()));
  checkInits(initsSince(15), 4, nullptr);
  CHECK(ncclguard::testing::CountOccurrences(log.text(), "PROFILER/Plugin: Loaded emu-recorder (v5)") == 2);
  ranks.destroyAll();
}

// ---- Events of operations ----------------------------------------------------------------------

namespace {

const Event& only(const std::vector<const Event*>& events) {
  REQUIRE(events.size() == 1);
  return *events[0];
}

size_t stoppedKernelChannels(const EventLog& log) {
  size_t count = 0;
  for (const Event* channel : log.ofType(ncclProfileKernelCh)) count += channel->stopped();
  return count;
}

// The user's call and its launch: CollApi inside the call, then KernelLaunch, then the hand-over
// (Group, Coll) before the GroupApi ends.
const Event& checkLaunch(const EventLog& log, int rank, const Event& group_api, CUstream stream) {
  const Event& api = only(log.ofType(ncclProfileCollApi, rank));
  CHECK(api.start.parent == group_api.start.event);
  CHECK(text(api.start.descr.collApi.func) == "AllReduce");
  CHECK(api.start.descr.collApi.count == 1024);
  CHECK(text(api.start.descr.collApi.datatype) == "ncclFloat32");
  CHECK(api.start.descr.collApi.stream == stream);
  CHECK(api.start.thread == gettid());
  const Event& launch = only(log.ofType(ncclProfileKernelLaunch, rank));
  CHECK(launch.start.parent == group_api.start.event);
  CHECK(launch.start.descr.kernelLaunch.stream == stream);
  const Event& group = only(log.ofType(ncclProfileGroup, rank));
  const Event& coll = only(log.ofType(ncclProfileColl, rank));
  CHECK(coll.start.parent == api.start.event);
  CHECK(coll.start.parent_group == group.start.event);
  CHECK(api.stop_index < launch.index);
  CHECK(launch.stop_index < group.index);
  CHECK(group.index < coll.index);
  CHECK(coll.stop_index < group.stop_index);
  CHECK(group.stop_index < group_api.stop_index);
  return coll;
}

void checkCollDescriptor(const Event& coll, int rank, uint64_t sequence, const char* func, size_t count,
                         const char* datatype) {
  const auto& d = coll.start.descr;
  CHECK(coll.start.descr.rank == rank);
  CHECK(d.coll.seqNumber == sequence);
  CHECK(text(d.coll.func) == func);
  CHECK(d.coll.count == count);
  CHECK(text(d.coll.datatype) == datatype);
  CHECK(d.coll.root == 0);
  CHECK(d.coll.nChannels == 2);
  CHECK(d.coll.nWarps == 16);
  CHECK(text(d.coll.algo) == "RING");
  CHECK(text(d.coll.proto) == "SIMPLE");
  CHECK(coll.stopped());
}

// Every channel of the task's kernel: started after the hand-over, on the stream's worker, and
// stopped with KernelChStop carrying the end time.
void checkKernelChannels(const EventLog& log, const Event& task, int channels) {
  const auto kernel = log.childrenOf(task, ncclProfileKernelCh);
  REQUIRE(kernel.size() == static_cast<size_t>(channels));
  for (int c = 0; c < channels; ++c) {
    const Event& channel = *kernel[c];
    CHECK(channel.start.descr.kernelCh.channelId == c);
    CHECK(channel.index > task.stop_index);
    CHECK(channel.start.thread != gettid());
    REQUIRE(channel.stateNumbers() == std::vector<int>{ncclProfilerKernelChStop});
    CHECK(channel.states[0].args.kernelCh.pTimer >= channel.start.descr.kernelCh.pTimer);
    CHECK(channel.stopped());
  }
  CHECK(log.childrenOf(task, ncclProfileProxyOp).empty());  // P2P: no proxy
}

}  // namespace

TEST_CASE("an AllReduce's events: API call, launch, hand-over, then each channel of the kernel", "[events]") {
  setenv("NCCL_PROFILER_PLUGIN", recorderPath().c_str(), 1);
  LocalRanks ranks(4);
  initWithMask(ranks, kAllV5Events);
  forgetCalls();
  const auto buffers = allReduce(ranks, 1024);
  REQUIRE(ranks.synchronize());
  checkAllReduceResult(ranks, buffers, 1024);
  REQUIRE(waitForCalls([](const EventLog& log) { return stoppedKernelChannels(log) == 8; }));
  const EventLog log(recordedCalls());
  // One GroupApi event for the user's group, started under the first call's communicator.
  const Event& group_api = only(log.ofType(ncclProfileGroupApi));
  CHECK(group_api.start.descr.groupApi.groupDepth == 2);
  CHECK_FALSE(group_api.start.descr.groupApi.graphCaptured);
  CHECK(group_api.stateNumbers() ==
        std::vector<int>{ncclProfilerGroupStartApiStop, ncclProfilerGroupEndApiStart});
  CHECK(group_api.stopped());
  for (int r = 0; r < 4; ++r) {
    const Event& coll = checkLaunch(log, r, group_api, ranks.stream(r));
    checkCollDescriptor(coll, r, 0, "AllReduce", 1024, "ncclFloat32");
    checkKernelChannels(log, coll, 2);
  }

  SECTION("sequence numbers count per function; AllGather's task is in bytes") {
    forgetCalls();
    float* gathered = ranks.allocate<float>(0, 4 * 8 * sizeof(float));
    REQUIRE(ncclGroupStart() == ncclSuccess);
    for (int r = 0; r < 4; ++r) {
      REQUIRE(ncclAllReduce(buffers[r], buffers[r], 1024, ncclFloat32, ncclSum, ranks.comm(r),
                            ranks.stream(r)) == ncclSuccess);
      float* output = r == 0 ? gathered : ranks.allocate<float>(r, 4 * 8 * sizeof(float));
      REQUIRE(ncclAllGather(buffers[r], output, 8, ncclFloat32, ranks.comm(r), ranks.stream(r)) ==
              ncclSuccess);
    }
    REQUIRE(ncclGroupEnd() == ncclSuccess);
    REQUIRE(ranks.synchronize());
    const EventLog next(recordedCalls());
    const auto colls = next.ofType(ncclProfileColl, 2);
    REQUIRE(colls.size() == 2);
    checkCollDescriptor(*colls[0], 2, 1, "AllReduce", 1024, "ncclFloat32");
    checkCollDescriptor(*colls[1], 2, 0, "AllGather", 8 * sizeof(float), "ncclInt8");
    const auto apis = next.ofType(ncclProfileCollApi, 2);
    REQUIRE(apis.size() == 2);
    CHECK(apis[1]->start.descr.collApi.count == 8);  // the user's call as made
    CHECK(text(apis[1]->start.descr.collApi.datatype) == "ncclFloat32");
  }

  SECTION("without a group each call is a group of its own") {
    forgetCalls();
    allReduce(ranks, 1024, /*grouped=*/false);
    REQUIRE(ranks.synchronize());
    const EventLog next(recordedCalls());
    for (int r = 0; r < 4; ++r) {
      const Event& own = only(next.ofType(ncclProfileGroupApi, r));
      CHECK(own.start.descr.groupApi.groupDepth == 1);
      CHECK(own.stopped());
      CHECK(only(next.ofType(ncclProfileCollApi, r)).start.parent == own.start.event);
    }
  }
  ranks.destroyAll();
}

TEST_CASE("Send/Recv events: P2pApi per call, P2p per task with its peer, one kernel channel each",
          "[events]") {
  setenv("NCCL_PROFILER_PLUGIN", recorderPath().c_str(), 1);
  LocalRanks ranks(3);
  initWithMask(ranks, kAllV5Events);
  forgetCalls();
  ringExchange(ranks, 300);
  REQUIRE(ranks.synchronize());
  REQUIRE(waitForCalls([](const EventLog& log) { return stoppedKernelChannels(log) == 6; }));
  const EventLog log(recordedCalls());
  for (int r = 0; r < 3; ++r) {
    const auto apis = log.ofType(ncclProfileP2pApi, r);
    const auto tasks = log.ofType(ncclProfileP2p, r);
    REQUIRE(apis.size() == 2);
    REQUIRE(tasks.size() == 2);
    for (int i = 0; i < 2; ++i) {
      const auto& d = tasks[i]->start.descr;
      const bool send = text(d.p2p.func) == "Send";
      CHECK(text(apis[i]->start.descr.p2pApi.func) == text(d.p2p.func));
      CHECK(tasks[i]->start.parent == apis[i]->start.event);
      CHECK(d.rank == r);
      CHECK(d.p2p.peer == (send ? (r + 1) % 3 : (r + 2) % 3));
      CHECK(d.p2p.count == 300);
      CHECK(text(d.p2p.datatype) == "ncclFloat32");
      CHECK(d.p2p.nChannels == 1);
      CHECK(tasks[i]->start.parent_group == only(log.ofType(ncclProfileGroup, r)).start.event);
      checkKernelChannels(log, *tasks[i], 1);
    }
  }
  ranks.destroyAll();
}

namespace {

// Captures one AllReduce per rank into a graph per rank, and returns the executable graphs.
std::vector<CUgraphExec> captureAllReduce(LocalRanks& ranks, const std::vector<float*>& buffers,
                                          size_t count) {
  for (int r = 0; r < ranks.size(); ++r) {
    REQUIRE(cuStreamBeginCapture(ranks.stream(r), CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  }
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < ranks.size(); ++r) {
    REQUIRE(ncclAllReduce(buffers[r], buffers[r], count, ncclFloat32, ncclSum, ranks.comm(r),
                          ranks.stream(r)) == ncclSuccess);
  }
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  std::vector<CUgraphExec> executables(ranks.size());
  for (int r = 0; r < ranks.size(); ++r) {
    CUgraph graph = nullptr;
    REQUIRE(cuStreamEndCapture(ranks.stream(r), &graph) == CUDA_SUCCESS);
    REQUIRE(cuGraphInstantiate(&executables[r], graph, 0) == CUDA_SUCCESS);
    REQUIRE(cuGraphDestroy(graph) == CUDA_SUCCESS);
  }
  return executables;
}

}  // namespace

TEST_CASE("a captured AllReduce: API events at capture; with KernelCh, hand-over and kernel at every launch",
          "[events]") {
  setenv("NCCL_PROFILER_PLUGIN", recorderPath().c_str(), 1);
  LocalRanks ranks(2);
  initWithMask(ranks, ncclProfileCollApi | ncclProfileKernelCh);
  forgetCalls();
  const auto buffers = allReduce(ranks, 256);
  REQUIRE(ranks.synchronize());
  const auto graphs = captureAllReduce(ranks, buffers, 256);
  EventLog log(recordedCalls());
  for (const Event* group_api : log.ofType(ncclProfileGroupApi)) {
    CHECK(group_api->start.descr.groupApi.graphCaptured == (group_api != log.ofType(ncclProfileGroupApi)[0]));
  }
  CHECK(log.ofType(ncclProfileColl).size() == 2);  // the first AllReduce's only: not handed over yet
  for (int launch = 0; launch < 2; ++launch) {
    for (int r = 0; r < 2; ++r) REQUIRE(cuGraphLaunch(graphs[r], ranks.stream(r)) == CUDA_SUCCESS);
    REQUIRE(ranks.synchronize());
  }
  REQUIRE(waitForCalls([](const EventLog& log) { return stoppedKernelChannels(log) == 12; }));
  log = EventLog(recordedCalls());
  for (int r = 0; r < 2; ++r) {
    const auto colls = log.ofType(ncclProfileColl, r);
    REQUIRE(colls.size() == 3);
    const auto captured_api = log.ofType(ncclProfileCollApi, r).at(1);
    for (int i = 0; i < 3; ++i) {
      CHECK(colls[i]->start.descr.coll.seqNumber == static_cast<uint64_t>(i));
      CHECK(log.childrenOf(*colls[i], ncclProfileKernelCh).size() == 2);
      if (i > 0) CHECK(colls[i]->start.parent == captured_api->start.event);
      if (i > 0) CHECK(colls[i]->start.thread != gettid());  // handed over by the stream at replay
    }
  }
  for (CUgraphExec graph : graphs) REQUIRE(cuGraphExecDestroy(graph) == CUDA_SUCCESS);
  ranks.destroyAll();
}

TEST_CASE("the activation mask: KernelCh alone still brings its parents; 0 brings nothing", "[mask]") {
  setenv("NCCL_PROFILER_PLUGIN", recorderPath().c_str(), 1);
  LocalRanks ranks(2);
  initWithMask(ranks, ncclProfileKernelCh);
  forgetCalls();
  allReduce(ranks, 64);
  REQUIRE(ranks.synchronize());
  REQUIRE(waitForCalls([](const EventLog& log) { return stoppedKernelChannels(log) == 4; }));
  EventLog log(recordedCalls());
  CHECK(log.ofType(ncclProfileGroupApi).size() == 1);
  CHECK(log.ofType(ncclProfileCollApi).size() == 2);
  CHECK(log.ofType(ncclProfileGroup).size() == 2);
  CHECK(log.ofType(ncclProfileColl).size() == 2);
  CHECK(log.ofType(ncclProfileKernelLaunch).empty());  // only its own bit starts it
  ranks.destroyAll();

  // The last init's mask is the process's: Coll alone has no kernel channels.
  initWithMask(ranks, ncclProfileColl);
  forgetCalls();
  allReduce(ranks, 64);
  REQUIRE(ranks.synchronize());
  log = EventLog(recordedCalls());
  CHECK(log.ofType(ncclProfileColl).size() == 2);
  CHECK(log.ofType(ncclProfileKernelCh).empty());
  const uint64_t stale = log.ofType(ncclProfileCollApi).back()->start.event;
  ranks.destroyAll();

  initWithMask(ranks, 0);
  forgetCalls();
  allReduce(ranks, 64);
  REQUIRE(ranks.synchronize());
  log = EventLog(recordedCalls());
  CHECK(log.callsOf(CallKind::Start).empty());
  CHECK(log.callsOf(CallKind::State).empty());
  // As NCCL 2.28.9 does: the thread's last CollApi handle is never cleared, so each collective
  // stops it once more when its own CollApi event is not started. Behind a plugin that keeps
  // NCCL starting them (ncclguard's, which records collectives), this plugin gets no such stop.
  const auto stops = log.callsOf(CallKind::Stop);
  CHECK(stops.size() == (std::getenv("EMU_PROFILER_BEHIND_ANOTHER") != nullptr ? 0U : 2U));
  for (const RecordedCall& stop : stops) CHECK(stop.event == stale);
  ranks.destroyAll();
}

TEST_CASE("a plugin that returns errors from every call changes nothing for NCCL", "[errors]") {
  InfoLog log;
  setenv("NCCL_PROFILER_PLUGIN", recorderPath().c_str(), 1);
  setenv("EMU_PROFILER_ERRORS", "1", 1);
  LocalRanks ranks(2);
  initWithMask(ranks, ncclProfileColl | ncclProfileKernelCh);
  CHECK(log.contains("Profiler init failed with error '3'"));
  const auto buffers = allReduce(ranks, 4096);
  REQUIRE(ranks.synchronize());
  checkAllReduceResult(ranks, buffers, 4096);
  REQUIRE(waitForCalls([](const EventLog& log) { return stoppedKernelChannels(log) == 4; }));
  CHECK(EventLog(recordedCalls()).ofType(ncclProfileColl).size() == 2);
  ranks.destroyAll();
  CHECK(EventLog(recordedCalls()).callsOf(CallKind::Finalize).size() == 2);
}

// ---- NET: the proxy's events -------------------------------------------------------------------

namespace {

// Without P2P and SHM, ranks of one host talk through the network (NCCL reads both at the first
// init of the process).
void useNetTransport() {
  setenv("NCCL_P2P_DISABLE", "1", 1);
  setenv("NCCL_SHM_DISABLE", "1", 1);
}

// 1 MiB: 512 KiB per channel, which the emulator moves in 4 steps of 128 KiB.
constexpr size_t kNetCount = 256 << 10;
constexpr int kNetSteps = 4;

const std::vector<int> kSendStates = {ncclProfilerProxyStepSendGPUWait, ncclProfilerProxyStepSendPeerWait,
                                      ncclProfilerProxyStepSendWait};
const std::vector<int> kRecvStates = {ncclProfilerProxyStepRecvWait, ncclProfilerProxyStepRecvFlushWait,
                                      ncclProfilerProxyStepRecvGPUWait};

size_t stoppedOf(const EventLog& log, uint64_t type) {
  size_t count = 0;
  for (const Event* event : log.ofType(type)) count += event->stopped();
  return count;
}

// One ProxyOp of a completed operation: its steps went through NCCL's states, then it stopped.
void checkCompletedProxyOp(const EventLog& log, const Event& op, int rank, int steps) {
  const auto& d = op.start.descr;
  CHECK(d.rank == rank);
  CHECK(d.proxyOp.pid == getpid());
  CHECK(d.proxyOp.nSteps == steps);
  CHECK(d.proxyOp.chunkSize == 128 << 10);
  CHECK(op.stateNumbers() == std::vector<int>{ncclProfilerProxyOpInProgress});
  const auto step_events = log.childrenOf(op, ncclProfileProxyStep);
  REQUIRE(step_events.size() == static_cast<size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    const Event& step = *step_events[s];
    CHECK(step.start.descr.proxyStep.step == s);
    CHECK(step.start.descr.rank == rank);
    CHECK(step.stateNumbers() == (d.proxyOp.isSend ? kSendStates : kRecvStates));
    CHECK(step.states.back().args.proxyStep.transSize > 0);
    CHECK(step.stopped());
    CHECK(step.stop_index < op.stop_index);
  }
  CHECK(op.stopped());
}

// A ring collective's connections on every channel: receive from the previous rank, send to the next.
void checkRingProxyOps(const EventLog& log, const Event& coll, int rank, int nranks) {
  const auto ops = log.childrenOf(coll, ncclProfileProxyOp);
  REQUIRE(ops.size() == 4);
  int per_channel[2][2] = {};  // [channel][isSend]
  for (const Event* op : ops) {
    const auto& d = op->start.descr.proxyOp;
    CHECK(d.peer == (d.isSend ? (rank + 1) % nranks : (rank - 1 + nranks) % nranks));
    ++per_channel[d.channelId][d.isSend];
    checkCompletedProxyOp(log, *op, rank, kNetSteps);
  }
  for (auto& channel : per_channel) CHECK((channel[0] == 1 && channel[1] == 1));
}

const Event* channelZeroProxyOp(const EventLog& log, int rank, int is_send) {
  for (const Event* op : log.ofType(ncclProfileProxyOp, rank)) {
    if (op->start.descr.proxyOp.channelId == 0 && op->start.descr.proxyOp.isSend == is_send) return op;
  }
  return nullptr;
}

// Rank 1's send to rank 2 on channel 0: its first step went out on the network and never
// completed, the others still wait for the GPU. Rank 2's receive from rank 1 waits for data.
void checkStoppedLink(const EventLog& log) {
  const Event* send = channelZeroProxyOp(log, 1, 1);
  REQUIRE(send != nullptr);
  CHECK(send->start.descr.proxyOp.peer == 2);
  const auto send_steps = log.childrenOf(*send, ncclProfileProxyStep);
  REQUIRE(send_steps.size() == static_cast<size_t>(kNetSteps));
  CHECK(send_steps[0]->stateNumbers() == kSendStates);
  for (const Event* step : send_steps) CHECK_FALSE(step->stopped());
  for (size_t s = 1; s < send_steps.size(); ++s) {
    CHECK(send_steps[s]->stateNumbers() == std::vector<int>{ncclProfilerProxyStepSendGPUWait});
  }
  const Event* recv = channelZeroProxyOp(log, 2, 0);
  REQUIRE(recv != nullptr);
  CHECK(recv->start.descr.proxyOp.peer == 1);
  for (const Event* step : log.childrenOf(*recv, ncclProfileProxyStep)) {
    CHECK(step->stateNumbers() == std::vector<int>{ncclProfilerProxyStepRecvWait});
    CHECK_FALSE(step->stopped());
  }
}

}  // namespace

TEST_CASE("over NET: a ProxyOp per channel and ring neighbour, ProxySteps in NCCL's state order", "[net]") {
  InfoLog log;
  useNetTransport();
  setenv("NCCL_PROFILER_PLUGIN", recorderPath().c_str(), 1);
  LocalRanks ranks(4);
  initWithMask(ranks, kAllV5Events);
  CHECK(log.contains("Channel 00/0 : 1[1] -> 2[2] [send] via NET/Socket/0"));
  CHECK(log.contains("Channel 00/0 : 0[0] -> 1[1] [receive] via NET/Socket/0"));
  forgetCalls();
  const auto buffers = allReduce(ranks, kNetCount);
  REQUIRE(ranks.synchronize());
  checkAllReduceResult(ranks, buffers, kNetCount);
  REQUIRE(waitForCalls([](const EventLog& log) {
    return stoppedKernelChannels(log) == 8 && stoppedOf(log, ncclProfileProxyOp) == 16;
  }));
  EventLog events(recordedCalls());
  for (int r = 0; r < 4; ++r) checkRingProxyOps(events, only(events.ofType(ncclProfileColl, r)), r, 4);

  // Send/Recv: one connection each, on channel 0; 256 KiB are 2 steps.
  forgetCalls();
  ringExchange(ranks, 64 << 10);
  REQUIRE(ranks.synchronize());
  REQUIRE(waitForCalls([](const EventLog& log) { return stoppedOf(log, ncclProfileProxyOp) == 8; }));
  events = EventLog(recordedCalls());
  for (int r = 0; r < 4; ++r) {
    for (const Event* task : events.ofType(ncclProfileP2p, r)) {
      const Event& op = only(events.childrenOf(*task, ncclProfileProxyOp));
      const bool send = text(task->start.descr.p2p.func) == "Send";
      CHECK(op.start.descr.proxyOp.isSend == (send ? 1 : 0));
      CHECK(op.start.descr.proxyOp.peer == task->start.descr.p2p.peer);
      CHECK(op.start.descr.proxyOp.channelId == 0);
      checkCompletedProxyOp(events, op, r, 2);
    }
  }

  // Broadcast from rank 0 is a chain: the root receives nothing, its predecessor sends nothing.
  forgetCalls();
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < 4; ++r) {
    REQUIRE(ncclBroadcast(buffers[r], buffers[r], 1024, ncclFloat32, 0, ranks.comm(r), ranks.stream(r)) ==
            ncclSuccess);
  }
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  REQUIRE(ranks.synchronize());
  REQUIRE(waitForCalls([](const EventLog& log) { return stoppedOf(log, ncclProfileProxyOp) == 12; }));
  events = EventLog(recordedCalls());
  for (int r = 0; r < 4; ++r) {
    for (const Event* op : events.childrenOf(only(events.ofType(ncclProfileColl, r)), ncclProfileProxyOp)) {
      if (r == 0) CHECK(op->start.descr.proxyOp.isSend == 1);
      if (r == 3) CHECK(op->start.descr.proxyOp.isSend == 0);
    }
  }
  ranks.destroyAll();
}

TEST_CASE("hang with peer=: rank 1's link to rank 2 stops on channel 0, the other channel completes",
          "[hang_peer]") {
  useNetTransport();
  setenv("NCCLEMU_FAULTS", "hang:rank=1,peer=2,seq=2", 1);  // read at the first init
  setenv("NCCL_PROFILER_PLUGIN", recorderPath().c_str(), 1);
  LocalRanks ranks(4);
  initWithMask(ranks, kAllV5Events);
  std::vector<uint64_t> contexts;
  for (const RecordedCall& init : EventLog(recordedCalls()).callsOf(CallKind::Init))
    contexts.push_back(init.context);
  allReduce(ranks, kNetCount);
  REQUIRE(ranks.synchronize());
  forgetCalls();
  allReduce(ranks, kNetCount);  // the communicator's second operation
  auto send_posted = [](const EventLog& log) {
    for (const Event* op : log.ofType(ncclProfileProxyOp, 1)) {
      if (op->start.descr.proxyOp.isSend && op->start.descr.proxyOp.channelId == 0) {
        return log.childrenOf(*op, ncclProfileProxyStep).at(0)->stateNumbers() == kSendStates;
      }
    }
    return false;
  };
  REQUIRE(
      waitForCalls([&](const EventLog& log) { return stoppedKernelChannels(log) == 4 && send_posted(log); }));
  REQUIRE_FALSE(ranks.synchronize(300ms));
  const EventLog stuck(recordedCalls());
  for (int r = 0; r < 4; ++r) {
    const Event& coll = only(stuck.ofType(ncclProfileColl, r));
    const auto channels = stuck.childrenOf(coll, ncclProfileKernelCh);
    REQUIRE(channels.size() == 2);
    CHECK_FALSE(channels[0]->stopped());
    CHECK(channels[1]->stopped());
    for (const Event* op : stuck.childrenOf(coll, ncclProfileProxyOp)) {
      CHECK(op->stopped() == (op->start.descr.proxyOp.channelId == 1));
    }
  }
  checkStoppedLink(stuck);

  // Abort ends it on every rank; each communicator is finalized; channel 0 never reports a stop.
  for (int r = 0; r < 4; ++r) {
    REQUIRE(ncclCommAbort(ranks.comm(r)) == ncclSuccess);
    ranks.comm(r) = nullptr;
  }
  REQUIRE(ranks.synchronize(5s));
  const EventLog after(recordedCalls());
  std::vector<uint64_t> finalized;
  for (const RecordedCall& end : after.callsOf(CallKind::Finalize)) finalized.push_back(end.context);
  std::sort(finalized.begin(), finalized.end());
  std::sort(contexts.begin(), contexts.end());
  CHECK(finalized == contexts);
  CHECK(stoppedKernelChannels(after) == 4);
}

TEST_CASE("hang with peer= on a Send: only that Send stops; the rank's other transfers and the others' go on",
          "[hang_peer_send]") {
  useNetTransport();
  setenv("NCCLEMU_FAULTS", "hang:rank=1,peer=2,seq=1", 1);  // rank 1's Send to rank 2
  setenv("NCCL_PROFILER_PLUGIN", recorderPath().c_str(), 1);
  LocalRanks ranks(3);
  initWithMask(ranks, kAllV5Events);
  forgetCalls();
  ringExchange(ranks, 64 << 10);  // every rank: Send to the next, Recv from the previous
  // Rank 0's Send to 1, Recv from 2; rank 1's Recv from 0; rank 2's Send to 0 complete.
  REQUIRE(waitForCalls([](const EventLog& log) { return stoppedKernelChannels(log) == 4; }));
  CHECK(nccltest::waitForStream(ranks.stream(0), 5s));
  CHECK_FALSE(nccltest::waitForStream(ranks.stream(1), 300ms));
  CHECK_FALSE(nccltest::waitForStream(ranks.stream(2), 10ms));
  const EventLog log(recordedCalls());
  auto task = [&](int rank, const char* func) -> const Event& {
    for (const Event* p2p : log.ofType(ncclProfileP2p, rank)) {
      if (text(p2p->start.descr.p2p.func) == func) return *p2p;
    }
    FAIL("no " << func << " on rank " << rank);
    throw std::logic_error("unreachable");
  };
  auto channel_stopped = [&](const Event& p2p) {
    return only(log.childrenOf(p2p, ncclProfileKernelCh)).stopped();
  };
  CHECK_FALSE(channel_stopped(task(1, "Send")));
  CHECK(channel_stopped(task(1, "Recv")));
  CHECK_FALSE(channel_stopped(task(2, "Recv")));
  CHECK(channel_stopped(task(2, "Send")));
  const Event& send = only(log.childrenOf(task(1, "Send"), ncclProfileProxyOp));
  const auto send_steps = log.childrenOf(send, ncclProfileProxyStep);
  REQUIRE(send_steps.size() == 2);
  CHECK(send_steps[0]->stateNumbers() == kSendStates);
  CHECK(send_steps[1]->stateNumbers() == std::vector<int>{ncclProfilerProxyStepSendGPUWait});
  const Event& recv = only(log.childrenOf(task(2, "Recv"), ncclProfileProxyOp));
  for (const Event* step : log.childrenOf(recv, ncclProfileProxyStep)) {
    CHECK(step->stateNumbers() == std::vector<int>{ncclProfilerProxyStepRecvWait});
  }
  for (int r = 0; r < 3; ++r) {
    REQUIRE(ncclCommAbort(ranks.comm(r)) == ncclSuccess);
    ranks.comm(r) = nullptr;
  }
  REQUIRE(ranks.synchronize(5s));
  CHECK(EventLog(recordedCalls()).callsOf(CallKind::Finalize).size() == 3);
}

// NCCL reads its config files into the environment at its first call, without overriding it: a
// plugin named in $NCCL_CONF_FILE is loaded like one named in the environment, and a setting in the
// environment wins over the file's.
TEST_CASE("NCCL_PROFILER_PLUGIN in the file NCCL_CONF_FILE names is loaded, the environment winning over it",
          "[conf_file]") {
  InfoLog log;
  ncclguard::testing::TemporaryDirectory directory;
  const std::string conf = directory.path() + "/nccl.conf";
  {
    std::ofstream out(conf);
    out << "# a comment\nNCCL_PROFILER_PLUGIN=" << recorderPath() << "\r\nNCCL_EMU_UNUSED=1\nno equals sign\n";
  }
  setenv("NCCL_CONF_FILE", conf.c_str(), 1);
  setenv("NCCL_EMU_UNUSED", "from the environment", 1);
  REQUIRE(getenv("NCCL_PROFILER_PLUGIN") == nullptr);
  LocalRanks ranks(2);
  initWithMask(ranks, kAllV5Events);
  CHECK(std::string(text(getenv("NCCL_EMU_UNUSED"))) == "from the environment");
  REQUIRE(loaded(recorderPath()));
  // emu-recorder, or ncclguard with emu-recorder behind it when preloaded.
  CHECK(log.contains("NCCL INFO PROFILER/Plugin: Loaded "));
  CHECK(EventLog(recordedCalls()).callsOf(CallKind::Init).size() == 2);
  const std::vector<float*> buffers = allReduce(ranks, 1024);
  REQUIRE(ranks.synchronize());
  checkAllReduceResult(ranks, buffers, 1024);
  CHECK(waitForCalls([](const EventLog& events) { return stoppedKernelChannels(events) == 4; }));
}
