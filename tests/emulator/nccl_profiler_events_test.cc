// The emulated NCCL's profiler events of operations (v5, as NCCL 2.28.9 drives it): the API call,
// the launch, the hand-over and each channel of the kernel, for collectives, Send/Recv and
// captured graphs, under the activation mask, and with a plugin that fails. Part of
// emu_nccl_profiler_test (see nccl_profiler_test.cc).
#include <cuda.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "nccl_test_support.h"
#include "profiler_events.h"

using namespace std::chrono_literals;
using namespace profilertest;
using nccltest::LocalRanks;

namespace {

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
