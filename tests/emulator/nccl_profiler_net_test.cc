// The emulated NCCL's profiler events over NET: NCCL's proxy reports a ProxyOp per channel and
// connection, and a ProxyStep per network transfer, in NCCL's state order; a stopped link (hang
// with peer=) leaves its steps where NCCL's would stay. Part of emu_nccl_profiler_test (see
// nccl_profiler_test.cc).
#include <cuda.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "nccl_test_support.h"
#include "profiler_events.h"

using namespace std::chrono_literals;
using namespace profilertest;
using nccltest::LocalRanks;

namespace {

// 1 MiB: 512 KiB per channel, which the emulator moves in 4 steps of 128 KiB.
constexpr size_t kNetCount = 256 << 10;
constexpr int kNetSteps = 4;

const std::vector<int> kSendStates = {ncclProfilerProxyStepSendGPUWait, ncclProfilerProxyStepSendPeerWait,
                                      ncclProfilerProxyStepSendWait};
const std::vector<int> kRecvStates = {ncclProfilerProxyStepRecvWait, ncclProfilerProxyStepRecvFlushWait,
                                      ncclProfilerProxyStepRecvGPUWait};

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
    REQUIRE(step.stateNumbers() == (d.proxyOp.isSend ? kSendStates : kRecvStates));
    // NCCL's sub->transSize: set to the step's size as it enters SendWait (RecvFlushWait); the
    // states before carry the previous step's size, nothing before the first step moved.
    const size_t chunk = static_cast<size_t>(d.proxyOp.chunkSize);
    CHECK(step.states[d.proxyOp.isSend ? 2 : 1].args.proxyStep.transSize == chunk);
    CHECK(step.states[0].args.proxyStep.transSize == 0);  // every step is posted before any moves
    if (d.proxyOp.isSend) CHECK(step.states[1].args.proxyStep.transSize == (s == 0 ? 0 : chunk));
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
