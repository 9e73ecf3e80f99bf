// The links' time (NCCLEMU_LINKS, the slow_link fault) as NCCL's profiler sees it: over NET, how
// long each proxy step of a send spends on the network (SendWait) and what it carries
// (transSize), how long each kernel channel runs, and that an abort ends a modelled wait at once.
// Each case runs in a process of its own (ctest), with the variables its tag's entry sets: NCCL
// reads them at the process's first init.
#include <cuda.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "nccl_test_support.h"
#include "profiler_events.h"

namespace {

using namespace std::chrono_literals;
using namespace profilertest;
using nccltest::LocalRanks;

// 4 MiB of floats: 2 MiB per channel, which NCCL's proxy sends in 8 steps of 256 KiB.
constexpr size_t kCount = 1 << 20;
constexpr size_t kChannelBytes = kCount * sizeof(float) / 2;
constexpr int kSteps = 8;

double median(std::vector<double> values) {
  REQUIRE_FALSE(values.empty());
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// One send connection of one operation: from `rank` on `channel`, each step's time on the network.
struct SendConnection {
  int rank;
  int peer;
  int channel;
  std::vector<double> step_ms;  // from SendWait to the step's stop
  size_t bytes = 0;             // the sum of the steps' transSize in SendWait
};

std::vector<SendConnection> sendConnections(const EventLog& log, int nranks) {
  std::vector<SendConnection> found;
  for (int rank = 0; rank < nranks; ++rank) {
    for (const Event* op : log.ofType(ncclProfileProxyOp, rank)) {
      const auto& d = op->start.descr.proxyOp;
      if (!d.isSend) continue;
      SendConnection connection{rank, d.peer, d.channelId, {}, 0};
      for (const Event* step : log.childrenOf(*op, ncclProfileProxyStep)) {
        REQUIRE(step->stopped());
        for (const RecordedCall& state : step->states) {
          if (state.state != ncclProfilerProxyStepSendWait) continue;
          CHECK(state.args.proxyStep.transSize > 0);
          connection.bytes += state.args.proxyStep.transSize;
          connection.step_ms.push_back(static_cast<double>(step->stop_ns - state.ns) / 1e6);
        }
      }
      found.push_back(connection);
    }
  }
  return found;
}

// Each kernel channel's durations (the GPU's timestamps), by channel and rank: one per operation.
std::map<int, std::map<int, std::vector<double>>> channelMilliseconds(const EventLog& log) {
  std::map<int, std::map<int, std::vector<double>>> found;
  for (const Event* channel : log.ofType(ncclProfileKernelCh)) {
    REQUIRE(channel->stopped());
    const uint64_t stop = channel->states.back().args.kernelCh.pTimer;
    found[channel->start.descr.kernelCh.channelId][channel->start.context_rank].push_back(
        static_cast<double>(stop - channel->start.descr.kernelCh.pTimer) / 1e6);
  }
  return found;
}

// Communicators on every rank, whose every event the recording plugin reports.
void initRecorded(LocalRanks& ranks) {
  setenv("NCCL_PROFILER_PLUGIN", recorderPath().c_str(), 1);
  initWithMask(ranks, kAllV5Events);
}

// `operations` AllReduces over NET, one after the other on the same buffers, with every event
// recorded.
EventLog runAllReduces(LocalRanks& ranks, int operations) {
  // A first operation touches the buffers and the staging memory; the ranks start it further apart.
  const std::vector<float*> buffers = allReduce(ranks, kCount);
  REQUIRE(ranks.synchronize());
  forgetCalls();
  for (int i = 0; i < operations; ++i) {
    // Every buffer is ready before the first launch: the ranks' kernels start together.
    for (int r = 0; r < ranks.size(); ++r)
      std::fill(buffers[r], buffers[r] + kCount, static_cast<float>(r + 1));
    REQUIRE(ncclGroupStart() == ncclSuccess);
    for (int r = 0; r < ranks.size(); ++r) {
      REQUIRE(ncclAllReduce(buffers[r], buffers[r], kCount, ncclFloat32, ncclSum, ranks.comm(r),
                            ranks.stream(r)) == ncclSuccess);
    }
    REQUIRE(ncclGroupEnd() == ncclSuccess);
    REQUIRE(ranks.synchronize());
    checkAllReduceResult(ranks, buffers, kCount);
  }
  const size_t proxy_ops = static_cast<size_t>(operations * ranks.size() * 4);
  REQUIRE(waitForCalls([&](const EventLog& log) { return stoppedOf(log, ncclProfileProxyOp) == proxy_ops; }));
  return EventLog(recordedCalls());
}

}  // namespace

// NCCLEMU_LINKS=gbps=1,latency_us=50 NCCLEMU_FAULTS=slow_link:rank=1,peer=2,factor=3
TEST_CASE("a link 3 times slower: its sender's steps spend 3 times as long in SendWait", "[slow_link]") {
  useNetTransport();
  LocalRanks ranks(4);
  initRecorded(ranks);
  const EventLog log = runAllReduces(ranks, 5);

  std::vector<double> slow, others;
  for (const SendConnection& connection : sendConnections(log, 4)) {
    INFO("rank " << connection.rank << " channel " << connection.channel);
    CHECK(connection.peer == (connection.rank + 1) % 4);
    CHECK(connection.step_ms.size() == static_cast<size_t>(kSteps));
    CHECK(connection.bytes == kChannelBytes);
    auto& into = connection.rank == 1 ? slow : others;
    into.insert(into.end(), connection.step_ms.begin(), connection.step_ms.end());
  }
  // A step: (50 us + 2 MiB at 1 Gbit/s) / 8 = 2.1 ms; the slow link's 6.3 ms.
  const double ratio = median(slow) / median(others);
  INFO("SendWait per step: rank 1 " << median(slow) << " ms, the others " << median(others) << " ms");
  CHECK(ratio > 2);
  CHECK(ratio < 4.5);
  CHECK(median(others) > 1.0);

  // The whole ring waits for its slowest link: every rank's channel takes as long (the median of
  // the operations: a machine busy with other work may start one rank's kernel late).
  const auto channels = channelMilliseconds(log);
  REQUIRE(channels.size() == 2);
  for (const auto& [channel, by_rank] : channels) {
    REQUIRE(by_rank.size() == 4);
    std::map<int, double> typical;
    for (const auto& [rank, durations] : by_rank) typical[rank] = median(durations);
    double longest = 0;
    for (const auto& [rank, duration] : typical) longest = std::max(longest, duration);
    CHECK(longest > 3 * 16.8);
    for (const auto& [rank, duration] : typical) {
      INFO("channel " << channel << " rank " << rank << ": " << duration << " ms, the longest " << longest);
      CHECK(duration > 0.8 * longest);
    }
  }
  ranks.destroyAll();
}

// NCCLEMU_LINKS=gbps=1,latency_us=50,jitter=0.2,seed=11
TEST_CASE("jitter 0.2: the links' times on the network stay within 1.5 times the median", "[jitter]") {
  useNetTransport();
  LocalRanks ranks(4);
  initRecorded(ranks);
  const EventLog log = runAllReduces(ranks, 4);
  // A link's time in one operation and channel: its steps' median times their number (a step whose
  // wake-up came late on a loaded machine does not count).
  std::vector<double> totals;
  for (const SendConnection& connection : sendConnections(log, 4)) {
    totals.push_back(median(connection.step_ms) * static_cast<double>(connection.step_ms.size()));
  }
  REQUIRE(totals.size() == 32);
  const double middle = median(totals);
  const auto [low, high] = std::minmax_element(totals.begin(), totals.end());
  INFO("a link's time per operation and channel: median " << middle << " ms, " << *low << " to " << *high);
  // nccl_link_spec_test checks every draw; here a machine busy with other work may delay a few.
  const auto within = std::count_if(totals.begin(), totals.end(), [&](double total) {
    return total < 1.5 * middle && total > middle / 1.5;
  });
  CHECK(within >= 29);
  CHECK(*high - *low > 0.1 * middle);  // the links do vary
  ranks.destroyAll();
}

// NCCLEMU_LINKS=gbps=1,latency_us=50 NCCLEMU_FAULTS=slow_link:rank=1,peer=2,factor=3
TEST_CASE("Send/Recv over a slow link: the sender's steps spend the link's time in SendWait",
          "[slow_link_send]") {
  useNetTransport();
  LocalRanks ranks(4);
  initRecorded(ranks);
  forgetCalls();
  std::vector<float*> received;
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < 4; ++r) {
    float* send = ranks.allocate<float>(r, kCount * sizeof(float));
    std::fill(send, send + kCount, static_cast<float>(r + 1));
    received.push_back(ranks.allocate<float>(r, kCount * sizeof(float)));
    REQUIRE(ncclSend(send, kCount, ncclFloat32, (r + 1) % 4, ranks.comm(r), ranks.stream(r)) == ncclSuccess);
    REQUIRE(ncclRecv(received[r], kCount, ncclFloat32, (r + 3) % 4, ranks.comm(r), ranks.stream(r)) ==
            ncclSuccess);
  }
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  REQUIRE(ranks.synchronize());
  for (int r = 0; r < 4; ++r) {
    CHECK(received[r][0] == static_cast<float>((r + 3) % 4 + 1));
    CHECK(received[r][kCount - 1] == static_cast<float>((r + 3) % 4 + 1));
  }
  REQUIRE(waitForCalls([](const EventLog& log) { return stoppedOf(log, ncclProfileProxyOp) == 8; }));
  std::vector<double> slow, others;
  for (const SendConnection& connection : sendConnections(EventLog(recordedCalls()), 4)) {
    CHECK(connection.bytes == kCount * sizeof(float));
    auto& into = connection.rank == 1 ? slow : others;
    into.insert(into.end(), connection.step_ms.begin(), connection.step_ms.end());
  }
  INFO("SendWait per step: rank 1 " << median(slow) << " ms, the others " << median(others) << " ms");
  CHECK(median(slow) / median(others) > 2);
  CHECK(median(others) > 2.0);  // (50 us + 4 MiB at 1 Gbit/s) / 8 = 4.2 ms
  ranks.destroyAll();
}

// NCCLEMU_LINKS=gbps=0.001: 4 MiB take more than half a minute on a link.
TEST_CASE("an abort during the links' time ends the collective and the Send/Recv at once", "[abort]") {
  useNetTransport();
  LocalRanks ranks(4);
  initRecorded(ranks);
  for (bool collective : {true, false}) {
    INFO((collective ? "AllReduce" : "Send/Recv"));
    if (collective) {
      allReduce(ranks, kCount);
    } else {
      ringExchange(ranks, kCount);
    }
    REQUIRE_FALSE(ranks.synchronize(300ms));
    const auto aborted = std::chrono::steady_clock::now();
    for (int r = 0; r < 4; ++r) {
      REQUIRE(ncclCommAbort(ranks.comm(r)) == ncclSuccess);
      ranks.comm(r) = nullptr;
    }
    REQUIRE(ranks.synchronize(5s));
    CHECK(std::chrono::steady_clock::now() - aborted < 2s);
    if (collective) ranks.initAll();
  }
}

// Without a network (P2P), the links take the same time; the profiler sees only kernel channels.
// NCCLEMU_LINKS=gbps=1,latency_us=50 NCCLEMU_FAULTS=slow_link:rank=1,peer=2,factor=3
TEST_CASE("over P2P the links take their time too, without proxy events", "[slow_link_p2p]") {
  LocalRanks ranks(4);
  initRecorded(ranks);
  forgetCalls();
  const auto started = std::chrono::steady_clock::now();
  const auto buffers = allReduce(ranks, kCount);
  REQUIRE(ranks.synchronize());
  const double elapsed_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  checkAllReduceResult(ranks, buffers, kCount);
  CHECK(elapsed_ms > 2 * 3 * 16.8);  // two channels, each 3 times (50 us + 2 MiB at 1 Gbit/s)
  REQUIRE(waitForCalls([](const EventLog& log) { return stoppedKernelChannels(log) == 8; }));
  const EventLog log(recordedCalls());
  CHECK(log.ofType(ncclProfileProxyOp).empty());
  for (const auto& [channel, by_rank] : channelMilliseconds(log)) CHECK(by_rank.size() == 4);
  ranks.destroyAll();
}

// NCCLEMU_LINKS=gbps=10,bw=5
TEST_CASE("a malformed NCCLEMU_LINKS fails every init with the part that is wrong", "[bad_spec]") {
  InfoLog log;
  LocalRanks ranks(2);
  CHECK(ncclCommInitAll(&ranks.comm(0), 2, nullptr) == ncclInvalidArgument);
  CHECK(log.contains(
      "NCCL WARN NCCLEMU_LINKS: unknown key 'bw' in 'gbps=10,bw=5' (keys: gbps, latency_us, jitter, seed)"));
  const char* last = ncclGetLastError(nullptr);
  CHECK(std::string(last ? last : "").find("NCCLEMU_LINKS: unknown key 'bw'") != std::string::npos);
}

// Not a test: the figures of the link model (run by hand, with NCCLEMU_LINKS and NCCLEMU_FAULTS).
TEST_CASE("figures: 100 AllReduces of 4 MiB on 4 ranks over NET", "[.figures]") {
  useNetTransport();
  LocalRanks ranks(4);
  initRecorded(ranks);
  const auto started = std::chrono::steady_clock::now();
  const EventLog log = runAllReduces(ranks, 100);
  const double per_op =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count() / 100;
  std::map<int, std::vector<double>> by_rank;
  for (const SendConnection& connection : sendConnections(log, 4))
    by_rank[connection.rank].insert(by_rank[connection.rank].end(), connection.step_ms.begin(),
                                    connection.step_ms.end());
  std::printf("per operation: %.2f ms\n", per_op);
  for (const auto& [rank, steps] : by_rank)
    std::printf("rank %d -> %d: SendWait per step, median %.3f ms\n", rank, (rank + 1) % 4, median(steps));
  ranks.destroyAll();
}
