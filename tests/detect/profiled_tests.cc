// Operations timed by NCCL's profiler (records.h, TimingSource::kProfiler): the calling thread makes
// no driver call, NCCL's API event ties the call's events to its ring record, and the kernel
// channels' events say started and completed. The events are sent as NCCL 2.28 sends them
// (docs/architecture.md, "Timing"): the API event inside the call, the Coll or P2p event at the
// launch (the outermost ncclGroupEnd for a group), the kernel channels later, from the proxy thread.
#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/detect/fakes.h"
#include "watchdog/common/nccl_api.h"
#include "watchdog/common/pace.h"
#include "watchdog/detect/progress.h"
#include "watchdog/record/hooks.h"
#include "watchdog/state/pace.h"
#include "watchdog/state/profiles.h"
#include "watchdog/state/registry.h"

using namespace ncclguard;
using ncclguard::testing::FakeGpuEvents;

namespace {

constexpr std::int64_t kSecond = 1'000'000'000;
constexpr std::int64_t kTimeout = 10 * kSecond;

cudaStream_t Stream(std::uintptr_t n) { return reinterpret_cast<cudaStream_t>(n); }

// A communicator timed by the profiler, its profile linked as at the end of its creation.
struct Fixture {
  FakeGpuEvents events;
  CommState* comm;
  CommProfile* profile;

  explicit Fixture(std::size_t ring_size = 8) {
    static std::uintptr_t next_handle = 0x90000;
    static int next_id = 0;
    ReplaceGpuEventsForTesting(&events);
    comm = GetRegistry().Add(reinterpret_cast<ncclComm_t>(next_handle += 0x100), 0, ring_size);
    std::snprintf(comm->id, sizeof(comm->id), "00000000000a%04x", ++next_id);
    comm->rank = 1;
    comm->nranks = 2;
    comm->context = events.CurrentContext();
    comm->lifecycle = CommLifecycle::kReady;
    GetProfileTable().Open(comm->id, 1);
    profile = GetProfileTable().Link(*comm);
    comm->timing = TimingSource::kProfiler;
  }
  ~Fixture() {
    GetProfileTable().Close(profile);
    ReplaceGpuEventsForTesting(nullptr);
  }

  // A call as NCCL makes it; `api` gets the call's API event (none for a call NCCL does not
  // profile), `captured` says what it says of the stream.
  Ticket Call(Api api, std::size_t count, ProfileRef* api_event, bool captured = false,
              ncclResult_t result = ncclSuccess) {
    OperationArguments arguments;
    arguments.comm = comm->handle;
    arguments.stream = Stream(1);
    arguments.count = count;
    arguments.datatype = ncclFloat32;
    arguments.reduction = ncclSum;
    arguments.root_or_peer = api == Api::ncclSend || api == Api::ncclRecv ? 0 : -1;
    const Ticket ticket = BeforeOperation(api, 0, arguments);
    if (api_event != nullptr) *api_event = hooks::profiler::StartApi(profile, captured);
    AfterOperation(ticket, result);
    return ticket;
  }
  // An AllReduce launched at once (not grouped): its Coll event, on `channels` channels.
  ProfileRef AllReduce(int channels = 2) {
    ProfileRef api;
    Call(Api::ncclAllReduce, 1024, &api);
    return Launch(api, "AllReduce", channels);
  }
  ProfileRef Launch(const ProfileRef& api, const char* func, int channels) {
    return hooks::profiler::StartOp(profile, {.func = func, .channels = channels}, api);
  }
  OpRecord& Op(std::uint64_t seq) { return comm->Slot(seq); }
};

}  // namespace

TEST_CASE("with the profiler the calling thread makes no driver call, and channels time the operation",
          "[profiled]") {
  Fixture f;
  const ProfileRef coll = f.AllReduce();
  CHECK(f.events.Calls() == 0);
  OpRecord& op = f.Op(1);
  CHECK(op.state.load() == OpState::kEnqueued);
  CHECK(op.start_event == nullptr);
  const std::int64_t t0 = op.enqueue_ns.load();

  AdvanceOperations(*f.comm, f.events, t0 + kSecond);
  CHECK(op.state.load() == OpState::kEnqueued);
  const ProfileRef channel0 = hooks::profiler::StartChannel(coll, 0, 5'000'000);
  AdvanceOperations(*f.comm, f.events, t0 + 2 * kSecond);
  CHECK(op.state.load() == OpState::kStarted);
  CHECK(op.start_ns.load() == t0 + 2 * kSecond);
  CHECK(f.comm->last_started.load() == 1);

  const ProfileRef channel1 = hooks::profiler::StartChannel(coll, 1, 5'200'000);
  hooks::profiler::StopChannel(channel0, 6'000'000);
  AdvanceOperations(*f.comm, f.events, t0 + 3 * kSecond);
  CHECK(op.state.load() == OpState::kStarted);  // one channel still runs
  hooks::profiler::StopChannel(channel1, 7'500'000);
  AdvanceOperations(*f.comm, f.events, t0 + 4 * kSecond);
  CHECK(op.state.load() == OpState::kCompleted);
  CHECK(op.end_ns.load() == t0 + 4 * kSecond);
  CHECK(op.gpu_ms.load() == Approx(2.5));  // first start to last stop, GPU timestamps
  CHECK(f.comm->last_completed.load() == 1);
  // The watchdog made no driver call either.
  CHECK(f.events.Calls() == 0);
  // The profile names ncclguard's operation.
  const CommProfileSnapshot snapshot = f.profile->Snapshot();
  REQUIRE(snapshot.ops.size() == 1);
  CHECK(snapshot.ops[0].seq == 1);
}

TEST_CASE("with the profiler, 'has not even started' and 'started and not completed' stay apart",
          "[profiled]") {
  Fixture f;
  const ProfileRef coll = f.AllReduce();
  const std::int64_t t0 = f.Op(1).enqueue_ns.load();
  AdvanceOperations(*f.comm, f.events, t0 + kTimeout + kSecond);
  auto stall = FindOperationStall(*f.comm, t0 + kTimeout + kSecond, kTimeout);
  REQUIRE(stall.has_value());
  CHECK(stall->kind == Stall::Kind::kNotStarted);

  hooks::profiler::StartChannel(coll, 0, 1000);
  AdvanceOperations(*f.comm, f.events, t0 + 12 * kSecond);
  CHECK_FALSE(FindOperationStall(*f.comm, t0 + 21 * kSecond, kTimeout).has_value());
  stall = FindOperationStall(*f.comm, t0 + 23 * kSecond, kTimeout);
  REQUIRE(stall.has_value());
  CHECK(stall->kind == Stall::Kind::kNotCompleted);
}

TEST_CASE("with the profiler, capture into a graph comes from the API event", "[profiled]") {
  Fixture f;
  ProfileRef api;
  f.Call(Api::ncclAllReduce, 1024, &api, /*captured=*/true);
  CHECK(f.Op(1).state.load() == OpState::kCaptured);
  CHECK(f.events.Calls() == 0);
  // A replay's events have the capture's API event as parent: they are tied to nothing.
  const ProfileRef replay = f.Launch(api, "AllReduce", 1);
  hooks::profiler::StartChannel(replay, 0, 1000);
  CHECK(f.Op(1).channels_started.load() == 0);
  CHECK_FALSE(FindOperationStall(*f.comm, f.Op(1).enqueue_ns.load() + 100 * kSecond, kTimeout).has_value());
}

TEST_CASE("with the profiler, calls NCCL does not profile are timed otherwise or left untimed",
          "[profiled]") {
  Fixture f;
  // An empty collective: NCCL drops it, with no event; CUDA events time it.
  f.Call(Api::ncclAllReduce, 0, nullptr);
  CHECK_FALSE(f.Op(1).profiled.load());
  CHECK(f.Op(1).start_recorded.load());
  CHECK(f.Op(1).end_recorded.load());
  // A Send NCCL sent no API event for: never told started, so never a stall.
  f.Call(Api::ncclSend, 16, nullptr);
  CHECK(f.Op(2).profiled.load());
  CHECK(f.Op(2).state.load() == OpState::kUntimed);
  // A failed call stays failed.
  ProfileRef api;
  f.Call(Api::ncclAllReduce, 16, &api, false, ncclInvalidArgument);
  CHECK(f.Op(3).state.load() == OpState::kFailed);
}

TEST_CASE("with the profiler, a group's operations are tied in whatever order NCCL launches them",
          "[profiled]") {
  Fixture f;
  BeforeGroupCall(Api::ncclGroupStart);
  AfterGroupCall(Api::ncclGroupStart, ncclSuccess);
  ProfileRef send_api;
  ProfileRef all_reduce_api;
  f.Call(Api::ncclSend, 16, &send_api);
  f.Call(Api::ncclAllReduce, 1024, &all_reduce_api);
  BeforeGroupCall(Api::ncclGroupEnd);
  // NCCL's plan: collectives first, then Send/Recv.
  const ProfileRef all_reduce = f.Launch(all_reduce_api, "AllReduce", 2);
  const ProfileRef send = f.Launch(send_api, "Send", 1);
  AfterGroupCall(Api::ncclGroupEnd, ncclSuccess);
  CHECK(f.events.Calls() == 0);
  CHECK(f.Op(1).channels_expected.load() == 1);
  CHECK(f.Op(2).channels_expected.load() == 2);

  hooks::profiler::StopChannel(hooks::profiler::StartChannel(send, 0, 100), 300);
  const std::int64_t t0 = f.Op(1).enqueue_ns.load();
  AdvanceOperations(*f.comm, f.events, t0 + kSecond);
  CHECK(f.Op(1).state.load() == OpState::kCompleted);
  CHECK(f.Op(2).state.load() == OpState::kEnqueued);
  hooks::profiler::StartChannel(all_reduce, 0, 100);
  hooks::profiler::StartChannel(all_reduce, 1, 100);
  AdvanceOperations(*f.comm, f.events, t0 + 2 * kSecond);
  CHECK(f.Op(2).state.load() == OpState::kStarted);
}

TEST_CASE("with the profiler, a non-blocking communicator's launch needs no event afterwards", "[profiled]") {
  Fixture f;
  f.comm->nonblocking = true;
  ProfileRef api;
  f.Call(Api::ncclAllReduce, 1024, &api, false, ncclInProgress);
  OpRecord& op = f.Op(1);
  CHECK(op.state.load() == OpState::kEnqueued);
  CHECK_FALSE(op.launch_pending.load());
  // NCCL's own thread launches it later: its Coll event, then the proxy thread's channels.
  const ProfileRef coll = f.Launch(api, "AllReduce", 1);
  f.comm->async_error = ncclSuccess;
  hooks::profiler::StopChannel(hooks::profiler::StartChannel(coll, 0, 1000), 4000);
  AdvanceOperations(*f.comm, f.events, op.enqueue_ns.load() + kSecond);
  CHECK(op.state.load() == OpState::kCompleted);
  CHECK(f.events.Calls() == 0);
}

TEST_CASE("with the profiler, a ring that wraps is reclaimed without a driver call", "[profiled]") {
  Fixture f(4);
  for (int i = 0; i < 6; ++i) {
    const ProfileRef coll = f.AllReduce(1);
    hooks::profiler::StopChannel(hooks::profiler::StartChannel(coll, 0, 1000), 3000);
  }
  // The watchdog never looked: the calling thread reclaimed the finished slots itself.
  CHECK(f.comm->dropped.load() == 0);
  CHECK(f.comm->last_enqueued.load() == 6);
  CHECK(f.comm->last_completed.load() == 2);
  CHECK(f.events.Calls() == 0);
  AdvanceOperations(*f.comm, f.events, f.Op(6).enqueue_ns.load() + kSecond);
  CHECK(f.Op(6).state.load() == OpState::kCompleted);
  CHECK(f.Op(6).gpu_ms.load() == Approx(0.002));
  // Events that come late for an operation whose slot was reused are not applied to the new one.
  ProfileRef api;
  f.Call(Api::ncclAllReduce, 1024, &api);  // #7 takes #3's slot
  ProfileRef stale = api;
  stale.record_seq = 3;
  hooks::profiler::StartChannel(f.Launch(stale, "AllReduce", 1), 0, 1000);
  CHECK(f.Op(7).channels_started.load() == 0);
}

TEST_CASE("with the profiler, channels an abort stopped do not complete the operation", "[profiled]") {
  Fixture f;
  const ProfileRef coll = f.AllReduce(1);
  const ProfileRef channel = hooks::profiler::StartChannel(coll, 0, 1000);
  const Ticket abort = BeforeCommCall(Api::ncclCommAbort, f.comm->handle);
  hooks::profiler::StopChannel(channel, 2000);
  AdvanceOperations(*f.comm, f.events, f.Op(1).enqueue_ns.load() + kSecond);
  CHECK(f.Op(1).state.load() == OpState::kStarted);
  (void)abort;
  AfterCommCall(Api::ncclCommAbort, f.comm->handle, ncclSuccess);
  CHECK(f.Op(1).state.load() == OpState::kAborted);
}

TEST_CASE("with the profiler, the proxy thread's channel events race the watchdog safely", "[profiled]") {
  Fixture f(64);
  constexpr int kOps = 2000;
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    while (!done.load()) AdvanceOperations(*f.comm, f.events, 1);
  });
  std::vector<ProfileRef> pending;
  for (int i = 0; i < kOps; ++i) {
    pending.push_back(f.AllReduce(2));
    // The proxy thread, while the watchdog looks.
    std::thread proxy([coll = pending.back()] {
      const ProfileRef a = hooks::profiler::StartChannel(coll, 0, 10);
      const ProfileRef b = hooks::profiler::StartChannel(coll, 1, 11);
      hooks::profiler::StopChannel(b, 20);
      hooks::profiler::StopChannel(a, 21);
    });
    proxy.join();
  }
  done.store(true);
  watchdog.join();
  AdvanceOperations(*f.comm, f.events, 2);
  CHECK(f.comm->dropped.load() == 0);
  CHECK(f.comm->last_completed.load() == kOps);
  CHECK(f.Op(kOps).gpu_ms.load() == Approx(11e-6));
}

TEST_CASE("with the profiler, every operation's send links count in its pace block, not only the profile's",
          "[profiled][pace]") {
  Fixture f(64);
  constexpr std::uint64_t kOps = 5 * kPaceBlockOps;  // five times what the profile holds
  static_assert(kOps > static_cast<std::uint64_t>(kProfiledOps));
  // Runs the next operation on one channel, its send of one step to rank 2 on the network; the send
  // stays open with `keep_open`.
  auto run = [&](bool keep_open) {
    const ProfileRef coll = f.AllReduce(1);
    hooks::profiler::StopChannel(hooks::profiler::StartChannel(coll, 0, 1000), 3000);
    const ProfileRef send = hooks::profiler::StartProxyOp(coll, 0, 2, true, 1);
    const ProfileRef step = hooks::profiler::StartStep(send, 0);
    hooks::profiler::SetStepWait(step, StepWait::kSendNet, 1000);
    hooks::profiler::StopStep(step);
    if (!keep_open) hooks::profiler::StopProxyOp(send);
    return send;
  };
  for (std::uint64_t seq = 1; seq <= kOps; ++seq) run(false);
  const std::int64_t now = f.Op(kOps).enqueue_ns.load() + kSecond / 10;
  AdvanceOperations(*f.comm, f.events, now);
  FoldPace(*f.comm, now);  // one look after them all, as a job issuing hundreds a second gets
  std::vector<PaceBlockSnapshot> blocks = f.comm->pace.Blocks();
  REQUIRE(blocks.size() == kOps / kPaceBlockOps);
  for (const PaceBlockSnapshot& block : blocks) {
    INFO("block of #" << block.first_seq);
    REQUIRE(block.links.size() == 1);
    CHECK(block.links[0].peer == 2);
    CHECK(block.links[0].channel == 0);
    CHECK(block.links[0].steps == static_cast<int>(kPaceBlockOps));
    CHECK(block.links[0].bytes == kPaceBlockOps * 1000);
  }

  // A block whose send still runs waits for it, up to a grace after its last operation's end.
  ProfileRef open;
  for (std::uint64_t seq = kOps + 1; seq <= kOps + kPaceBlockOps; ++seq)
    open = run(seq == kOps + kPaceBlockOps);
  const std::int64_t later = f.Op(kOps + kPaceBlockOps).enqueue_ns.load() + kSecond / 10;
  AdvanceOperations(*f.comm, f.events, later);
  FoldPace(*f.comm, later);
  CHECK(f.comm->pace.Blocks().size() == blocks.size());
  hooks::profiler::StopProxyOp(open);
  hooks::profiler::StopProxyOp(open);  // NCCL may stop it twice: it counts once
  FoldPace(*f.comm, later);
  blocks = f.comm->pace.Blocks();
  REQUIRE(blocks.size() == kOps / kPaceBlockOps + 1);
  REQUIRE(blocks.back().links.size() == 1);
  CHECK(blocks.back().links[0].steps == static_cast<int>(kPaceBlockOps));
  CHECK(f.profile->pace_links().dropped() == 0);
}
