// What ncclguard keeps of NCCL's profiler events (state/profiles.h): bounded, and never applied to
// an operation other than the one an event belongs to.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "watchdog/state/profiles.h"

namespace ncclguard {
namespace {

ProfiledOpStart AllReduce(std::uint64_t nccl_seq) {
  return ProfiledOpStart{
      .func = "AllReduce", .nccl_seq = nccl_seq, .algo = "RING", .proto = "SIMPLE", .channels = 2};
}

TEST_CASE("a profile keeps each operation's channels, proxy operations and the step each waits on",
          "[profiles]") {
  CommProfile profile("4865c4aaa8a6022e", 1);
  const ProfileRef op = profile.StartOp(AllReduce(7), {});
  const ProfileRef channel0 = CommProfile::StartChannel(op, 0, 1000);
  const ProfileRef channel1 = CommProfile::StartChannel(op, 1, 1001);
  CommProfile::StopChannel(channel1, 2000);
  const ProfileRef send = CommProfile::StartProxyOp(op, 0, 2, true, 4);
  const ProfileRef step0 = CommProfile::StartStep(send, 0);
  CommProfile::SetStepWait(step0, StepWait::kSendGpu);
  CommProfile::StopStep(step0);
  const ProfileRef step1 = CommProfile::StartStep(send, 1);
  CommProfile::SetStepWait(step1, StepWait::kSendNet);
  const ProfileRef step2 = CommProfile::StartStep(send, 2);
  CommProfile::SetStepWait(step2, StepWait::kSendGpu);
  (void)channel0;

  const CommProfileSnapshot snapshot = profile.Snapshot();
  CHECK(snapshot.comm_id == "4865c4aaa8a6022e");
  CHECK(snapshot.rank == 1);
  REQUIRE(snapshot.ops.size() == 1);
  const OpProfileSnapshot& recorded = snapshot.ops[0];
  CHECK(recorded.func == "AllReduce");
  CHECK(recorded.nccl_seq == 7);
  CHECK(recorded.seq == 0);  // no API event tied it to an operation
  REQUIRE(recorded.kernel_channels.size() == 2);
  CHECK_FALSE(recorded.kernel_channels[0].stopped);
  CHECK(recorded.kernel_channels[1].stopped);
  CHECK(recorded.kernel_channels[1].gpu_stop_ns == 2000);
  REQUIRE(recorded.proxy_ops.size() == 1);
  const ProxyOpSnapshot& proxy = recorded.proxy_ops[0];
  CHECK(proxy.peer == 2);
  CHECK(proxy.send);
  CHECK(proxy.steps_done == 1);
  // The oldest step in flight is the one the link waits on, not the newest.
  CHECK(proxy.waiting_step == 1);
  CHECK(proxy.waiting == StepWait::kSendNet);
  CHECK(StillRunning(recorded));
}

TEST_CASE("a send's steps add their time on the network and their bytes to their proxy operation",
          "[profiles]") {
  CommProfile profile("4865c4aaa8a6022e", 1);
  const ProfileRef op = profile.StartOp(AllReduce(1), {});
  const ProfileRef send = CommProfile::StartProxyOp(op, 1, 2, true, 2);
  for (int number = 0; number < 2; ++number) {
    const ProfileRef step = CommProfile::StartStep(send, number);
    CommProfile::SetStepWait(step, StepWait::kSendGpu, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(150));  // the GPU's wait: not the network's
    CommProfile::SetStepWait(step, StepWait::kSendPeer, 0);
    CommProfile::SetStepWait(step, StepWait::kSendNet, 1 << 20);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    CommProfile::StopStep(step);
  }
  const ProfileRef receive = CommProfile::StartProxyOp(op, 1, 0, false, 1);
  const ProfileRef step = CommProfile::StartStep(receive, 0);
  CommProfile::SetStepWait(step, StepWait::kRecvNet, 1 << 20);
  CommProfile::StopStep(step);

  const CommProfileSnapshot snapshot = profile.Snapshot();
  REQUIRE(snapshot.ops.size() == 1);
  REQUIRE(snapshot.ops[0].proxy_ops.size() == 2);
  const ProxyOpSnapshot& sent = snapshot.ops[0].proxy_ops[0];
  CHECK(sent.network_steps == 2);
  CHECK(sent.network_bytes == 2u << 20);
  CHECK(sent.network_ns >= 20'000'000);
  CHECK(sent.network_ns < 300'000'000);  // with the GPU's waits it would be 320 ms or more
  const ProxyOpSnapshot& received = snapshot.ops[0].proxy_ops[1];
  CHECK(received.network_steps == 0);
  CHECK(received.network_ns == 0);

  // A later operation in the same slot starts from nothing.
  for (std::uint64_t nccl_seq = 2; nccl_seq <= kProfiledOps + 1; ++nccl_seq) {
    const ProfileRef later = profile.StartOp(AllReduce(nccl_seq), {});
    const ProfileRef proxy = CommProfile::StartProxyOp(later, 1, 2, true, 1);
    CommProfile::StopStep(CommProfile::StartStep(proxy, 0));
  }
  for (const OpProfileSnapshot& later : profile.Snapshot().ops) {
    REQUIRE(later.proxy_ops.size() == 1);
    CHECK(later.proxy_ops[0].network_steps == 0);
    CHECK(later.proxy_ops[0].network_ns == 0);
  }
}

TEST_CASE("events for an operation whose slot a newer one took are dropped", "[profiles]") {
  CommProfile profile("c0ffee", 0);
  const ProfileRef first = profile.StartOp(AllReduce(0), {});
  const ProfileRef channel = CommProfile::StartChannel(first, 0, 10);
  const ProfileRef proxy = CommProfile::StartProxyOp(first, 0, 1, false, 2);
  for (int op = 1; op <= kProfiledOps; ++op) profile.StartOp(AllReduce(op), {});
  // All three refer to the first operation, whose slot the ninth reuses.
  CommProfile::StopChannel(channel, 20);
  CHECK_FALSE(CommProfile::StartStep(proxy, 0).valid());
  CHECK_FALSE(CommProfile::StartChannel(first, 1, 30).valid());
  const CommProfileSnapshot snapshot = profile.Snapshot();
  REQUIRE(snapshot.ops.size() == static_cast<size_t>(kProfiledOps));
  CHECK(snapshot.ops.front().nccl_seq == 1);
  for (const OpProfileSnapshot& op : snapshot.ops) {
    CHECK(op.kernel_channels.empty());
    CHECK(op.proxy_ops.empty());
  }
}

TEST_CASE("channel and proxy operation numbers beyond the bounds are refused, not written", "[profiles]") {
  CommProfile profile("c0ffee", 0);
  const ProfileRef op = profile.StartOp(AllReduce(0), {});
  CHECK_FALSE(CommProfile::StartChannel(op, kProfiledChannels, 1).valid());
  CHECK_FALSE(CommProfile::StartChannel(op, -1, 1).valid());
  for (int proxy = 0; proxy < kProfiledProxyOps; ++proxy)
    CHECK(CommProfile::StartProxyOp(op, 0, 1, true, 1).valid());
  CHECK_FALSE(CommProfile::StartProxyOp(op, 0, 1, true, 1).valid());
  CHECK(profile.Snapshot().ops.at(0).proxy_ops.size() == static_cast<size_t>(kProfiledProxyOps));
}

TEST_CASE("NCCL's threads record into one profile while another thread takes snapshots", "[profiles]") {
  CommProfile profile("c0ffee", 0);
  std::thread proxy([&] {
    for (int op = 0; op < 2000; ++op) {
      const ProfileRef started = profile.StartOp(AllReduce(op), {});
      const ProfileRef send = CommProfile::StartProxyOp(started, 0, 1, true, 4);
      for (int step = 0; step < 4; ++step) {
        const ProfileRef recorded = CommProfile::StartStep(send, step);
        CommProfile::SetStepWait(recorded, StepWait::kSendNet);
        CommProfile::StopStep(recorded);
      }
      CommProfile::StopProxyOp(send);
    }
  });
  for (int look = 0; look < 200; ++look)
    CHECK(profile.Snapshot().ops.size() <= static_cast<size_t>(kProfiledOps));
  proxy.join();
  for (const OpProfileSnapshot& op : profile.Snapshot().ops) CHECK_FALSE(StillRunning(op));
}

TEST_CASE("the table keeps finalized profiles for the dumps, up to its bound", "[profiles]") {
  ProfileTable table;
  CommProfile* first = table.Open("aaaa", 0);
  REQUIRE(first != nullptr);
  first->StartOp(AllReduce(3), {});
  table.Close(first);
  REQUIRE(table.Find("aaaa", 0).has_value());
  CHECK(table.Find("aaaa", 0)->ops.size() == 1);
  CHECK_FALSE(table.Find("aaaa", 1).has_value());
  // Live profiles are never dropped: past the bound, a new one is refused.
  for (std::size_t open = 1; open < ProfileTable::kMaxProfiles; ++open)
    REQUIRE(table.Open("bbbb", 0) != nullptr);
  CHECK(table.Open("cccc", 0) != nullptr);  // takes the finalized one's place
  CHECK_FALSE(table.Find("aaaa", 0).has_value());
  CHECK(table.Open("dddd", 0) == nullptr);
}

}  // namespace
}  // namespace ncclguard
