// Recording operations and following them on the (fake) GPU: every state transition and stall
// rule, driven by a fake clock and fake events.
#include <vector>

#include <catch2/catch.hpp>

#include "tests/detect/fakes.h"
#include "watchdog/common/in_process_recovery.h"
#include "watchdog/common/nccl_api.h"
#include "watchdog/detect/progress.h"
#include "watchdog/record/hooks.h"
#include "watchdog/recover/probation.h"
#include "watchdog/state/registry.h"

using namespace ncclguard;
using ncclguard::testing::FakeGpuEvents;

namespace {

constexpr std::int64_t kSecond = 1'000'000'000;
constexpr std::int64_t kTimeout = 10 * kSecond;

cudaStream_t Stream(std::uintptr_t n) { return reinterpret_cast<cudaStream_t>(n); }

// A communicator of its own for each test, with fake events in place.
struct Fixture {
  FakeGpuEvents events;
  CommState* comm;

  explicit Fixture(std::size_t ring_size = 8) {
    static std::uintptr_t next_handle = 0x10000;
    ReplaceGpuEventsForTesting(&events);
    comm = GetRegistry().Add(reinterpret_cast<ncclComm_t>(next_handle += 0x100), 0, ring_size);
    std::snprintf(comm->id, sizeof(comm->id), "00000000000000aa");
    comm->rank = 2;
    comm->nranks = 4;
    comm->context = events.CurrentContext();
    comm->lifecycle = CommLifecycle::kReady;
  }
  ~Fixture() { ReplaceGpuEventsForTesting(nullptr); }

  std::uint64_t AllReduce(cudaStream_t stream = Stream(1), ncclResult_t result = ncclSuccess) {
    OperationArguments arguments;
    arguments.comm = comm->handle;
    arguments.stream = stream;
    arguments.count = 1048576;
    arguments.datatype = ncclFloat32;
    arguments.reduction = ncclSum;
    const Ticket ticket = BeforeOperation(Api::ncclAllReduce, 0, arguments);
    AfterOperation(ticket, result);
    return ticket.seq;
  }
  OpRecord& Op(std::uint64_t seq) { return comm->Slot(seq); }
  std::int64_t EnqueuedAt(std::uint64_t seq) { return Op(seq).enqueue_ns.load(); }
};

}  // namespace

TEST_CASE("an operation goes enqueued, started, completed as the GPU reaches its events", "[operations]") {
  Fixture f;
  const std::uint64_t seq = f.AllReduce();
  REQUIRE(seq == 1);
  OpRecord& op = f.Op(seq);
  CHECK(op.state.load() == OpState::kEnqueued);
  CHECK(op.start_recorded.load());
  CHECK(op.end_recorded.load());
  CHECK(f.comm->last_enqueued.load() == 1);
  // Start event recorded before the launch, end event after it.
  CHECK(f.events.Recorded() == std::vector<GpuEvent>{op.start_event, op.end_event});

  const std::int64_t t0 = f.EnqueuedAt(seq);
  AdvanceOperations(*f.comm, f.events, t0 + kSecond);
  CHECK(op.state.load() == OpState::kEnqueued);

  f.events.Reach(op.start_event);
  AdvanceOperations(*f.comm, f.events, t0 + 2 * kSecond);
  CHECK(op.state.load() == OpState::kStarted);
  CHECK(op.start_ns.load() == t0 + 2 * kSecond);
  CHECK(f.comm->last_started.load() == 1);
  CHECK(f.comm->last_completed.load() == 0);

  f.events.Reach(op.end_event);
  AdvanceOperations(*f.comm, f.events, t0 + 3 * kSecond);
  CHECK(op.state.load() == OpState::kCompleted);
  CHECK(op.end_ns.load() == t0 + 3 * kSecond);
  CHECK(op.gpu_ms.load() == 1.5f);
  CHECK(f.comm->last_completed.load() == 1);
  CHECK_FALSE(FindOperationStall(*f.comm, t0 + 100 * kSecond, kTimeout).has_value());
}

TEST_CASE("an operation the GPU has not reached is 'not started' after the timeout", "[operations]") {
  Fixture f;
  const std::uint64_t seq = f.AllReduce();
  const std::int64_t t0 = f.EnqueuedAt(seq);
  CHECK_FALSE(FindOperationStall(*f.comm, t0 + kTimeout, kTimeout).has_value());
  const auto stall = FindOperationStall(*f.comm, t0 + kTimeout + kSecond, kTimeout);
  REQUIRE(stall.has_value());
  CHECK(stall->kind == Stall::Kind::kNotStarted);
  CHECK(stall->seq == 1);
  CHECK(stall->seconds == Approx(11.0));
  CHECK(StallMessage(*stall) ==
        "rank 2 comm 00000000000000aa: AllReduce #1 (float32 × 1048576, sum) was enqueued 11.0 s "
        "ago and has not started on the GPU (queued behind earlier work on its stream)");
}

TEST_CASE("a started operation that does not complete is a stall, timed from its start", "[operations]") {
  Fixture f;
  const std::uint64_t seq = f.AllReduce();
  const std::int64_t t0 = f.EnqueuedAt(seq);
  f.events.Reach(f.Op(seq).start_event);
  AdvanceOperations(*f.comm, f.events, t0 + 5 * kSecond);  // started at t0 + 5 s
  CHECK_FALSE(FindOperationStall(*f.comm, t0 + 14 * kSecond, kTimeout).has_value());
  const auto stall = FindOperationStall(*f.comm, t0 + 20 * kSecond, kTimeout);
  REQUIRE(stall.has_value());
  CHECK(stall->kind == Stall::Kind::kNotCompleted);
  CHECK(StallMessage(*stall) ==
        "rank 2 comm 00000000000000aa: AllReduce #1 (float32 × 1048576, sum) started on the GPU "
        "15.0 s ago and has not completed");
}

TEST_CASE("the oldest unfinished operation decides, and a stream completes in order", "[operations]") {
  Fixture f;
  const std::uint64_t first = f.AllReduce(Stream(1));
  const std::uint64_t second = f.AllReduce(Stream(1));
  const std::uint64_t other = f.AllReduce(Stream(2));
  const std::int64_t t0 = f.EnqueuedAt(first);
  // The GPU can never reach the second before the first on one stream: the second is not asked.
  f.events.Reach(f.Op(second).start_event);
  f.events.Reach(f.Op(second).end_event);
  f.events.Reach(f.Op(other).start_event);
  f.events.Reach(f.Op(other).end_event);
  AdvanceOperations(*f.comm, f.events, t0 + kSecond);
  CHECK(f.Op(first).state.load() == OpState::kEnqueued);
  CHECK(f.Op(second).state.load() == OpState::kEnqueued);
  CHECK(f.events.QueriesOf(f.Op(second).start_event) == 0);
  CHECK(f.Op(other).state.load() == OpState::kCompleted);
  const auto stall = FindOperationStall(*f.comm, t0 + kTimeout + kSecond, kTimeout);
  REQUIRE(stall.has_value());
  CHECK(stall->seq == first);
}

TEST_CASE("captured, untimed and failed operations are never stalls", "[operations]") {
  Fixture f;
  f.events.capturing.insert(Stream(7));
  const std::uint64_t captured = f.AllReduce(Stream(7));
  CHECK(f.Op(captured).state.load() == OpState::kCaptured);
  CHECK_FALSE(f.Op(captured).start_recorded.load());  // no event recorded into the graph

  const std::uint64_t failed = f.AllReduce(Stream(1), ncclInvalidArgument);
  CHECK(f.Op(failed).state.load() == OpState::kFailed);
  CHECK(f.Op(failed).result.load() == ncclInvalidArgument);

  f.events.available = false;
  const std::uint64_t untimed = f.AllReduce(Stream(1));
  CHECK(f.Op(untimed).state.load() == OpState::kUntimed);

  const std::int64_t t0 = f.EnqueuedAt(captured);
  AdvanceOperations(*f.comm, f.events, t0 + kSecond);
  CHECK(f.events.QueriesOf(f.Op(captured).start_event) == 0);
  CHECK_FALSE(FindOperationStall(*f.comm, t0 + 1000 * kSecond, kTimeout).has_value());
}

TEST_CASE("grouped operations get their events at the outermost ncclGroupEnd", "[operations]") {
  Fixture f;
  BeforeGroupCall(Api::ncclGroupStart);
  AfterGroupCall(Api::ncclGroupStart, ncclSuccess);
  BeforeGroupCall(Api::ncclGroupStart);  // nested
  AfterGroupCall(Api::ncclGroupStart, ncclSuccess);
  const std::uint64_t a = f.AllReduce(Stream(1));
  const std::uint64_t b = f.AllReduce(Stream(1));
  BeforeGroupCall(Api::ncclGroupEnd);  // inner end: nothing launches yet
  AfterGroupCall(Api::ncclGroupEnd, ncclSuccess);
  CHECK(f.events.Recorded().empty());
  CHECK(f.Op(a).group.load() != 0);
  CHECK(f.Op(a).group.load() == f.Op(b).group.load());

  BeforeGroupCall(Api::ncclGroupEnd);  // outermost: starts before the launch...
  CHECK(f.events.Recorded() == std::vector<GpuEvent>{f.Op(a).start_event, f.Op(b).start_event});
  AfterGroupCall(Api::ncclGroupEnd, ncclSuccess);  // ...ends after it
  CHECK(f.events.Recorded() == std::vector<GpuEvent>{f.Op(a).start_event, f.Op(b).start_event,
                                                     f.Op(a).end_event, f.Op(b).end_event});
  CHECK(f.Op(a).end_recorded.load());
}

TEST_CASE("a non-blocking launch gets its end event once NCCL is no longer in progress", "[operations]") {
  Fixture f;
  const std::uint64_t seq = f.AllReduce(Stream(1), ncclInProgress);
  CHECK(f.Op(seq).launch_pending.load());
  CHECK_FALSE(f.Op(seq).end_recorded.load());
  const std::int64_t t0 = f.EnqueuedAt(seq);
  AdvanceOperations(*f.comm, f.events, t0 + kSecond);  // still in progress
  CHECK_FALSE(f.Op(seq).end_recorded.load());
  f.comm->async_error = ncclSuccess;
  AdvanceOperations(*f.comm, f.events, t0 + 2 * kSecond);
  CHECK(f.Op(seq).end_recorded.load());
}

TEST_CASE("a ring full of unfinished operations drops new records but keeps numbering", "[operations]") {
  Fixture f(4);
  for (int i = 0; i < 4; ++i) f.AllReduce();
  const std::uint64_t fifth = f.AllReduce();
  CHECK(fifth == 0);  // not recorded
  CHECK(f.comm->dropped.load() == 1);
  CHECK(f.comm->last_enqueued.load() == 5);
  CHECK(f.Op(1).seq.load() == 1);  // the oldest, still watched, was kept
  // Once the GPU finishes them, slots are reused.
  f.events.ReachEverything();
  AdvanceOperations(*f.comm, f.events, f.EnqueuedAt(1) + kSecond);
  CHECK(f.AllReduce() == 6);
  CHECK(f.Op(6).seq.load() == 6);
}

TEST_CASE("calls on a communicator ncclguard aborted never reach NCCL", "[operations]") {
  Fixture f;
  f.comm->aborted_by_ncclguard = true;
  OperationArguments arguments;
  arguments.comm = f.comm->handle;
  const Ticket operation = BeforeOperation(Api::ncclAllReduce, 0, arguments);
  CHECK_FALSE(operation.forward);
  CHECK(operation.result == ncclInvalidUsage);
  const Ticket destroy = BeforeCommCall(Api::ncclCommDestroy, f.comm->handle);
  CHECK_FALSE(destroy.forward);
  CHECK(destroy.result == ncclSuccess);
  const Ticket abort = BeforeCommCall(Api::ncclCommAbort, f.comm->handle);
  CHECK_FALSE(abort.forward);
  CHECK(abort.result == ncclSuccess);
  const Ticket count = BeforeCommCall(Api::ncclCommCount, f.comm->handle);
  CHECK_FALSE(count.forward);
  CHECK(count.result == ncclInvalidUsage);
}

TEST_CASE("an application abort marks unfinished operations aborted", "[operations]") {
  Fixture f;
  const std::uint64_t seq = f.AllReduce();
  AfterCommCall(Api::ncclCommAbort, f.comm->handle, ncclSuccess);
  CHECK(f.comm->lifecycle.load() == CommLifecycle::kAborted);
  CHECK(f.Op(seq).state.load() == OpState::kAborted);
}

// NCCL ends the kernels of an aborted or revoked communicator early and the stream goes on: the
// end event fires while the application is still inside the call, and the watchdog may look then.
TEST_CASE("an operation whose end event fires during an abort or a revoke is aborted, never completed",
          "[operations]") {
  const Api api = GENERATE(Api::ncclCommAbort, Api::ncclCommRevoke);
  INFO(Describe(api).name);
  Fixture f;
  const std::uint64_t seq = f.AllReduce();
  OpRecord& op = f.Op(seq);
  f.events.Reach(op.start_event);
  AdvanceOperations(*f.comm, f.events, f.EnqueuedAt(seq) + kSecond);
  REQUIRE(op.state.load() == OpState::kStarted);

  const Ticket call = BeforeCommCall(api, f.comm->handle);
  REQUIRE(call.forward);
  f.events.Reach(op.end_event);  // the kernel returned, cut short
  AdvanceOperations(*f.comm, f.events, f.EnqueuedAt(seq) + 2 * kSecond);
  CHECK(op.state.load() == OpState::kStarted);
  CHECK(f.comm->last_completed.load() == 0);

  AfterCommCall(api, f.comm->handle, ncclSuccess);
  CHECK(op.state.load() == OpState::kAborted);
  CHECK(f.comm->last_completed.load() == 0);
}

TEST_CASE("a revoke that fails leaves the operations to complete as the GPU reaches them", "[operations]") {
  Fixture f;
  const std::uint64_t seq = f.AllReduce();
  const Ticket call = BeforeCommCall(Api::ncclCommRevoke, f.comm->handle);
  REQUIRE(call.forward);
  AfterCommCall(Api::ncclCommRevoke, f.comm->handle, ncclInvalidArgument);
  f.events.ReachEverything();
  AdvanceOperations(*f.comm, f.events, f.EnqueuedAt(seq) + kSecond);
  CHECK(f.Op(seq).state.load() == OpState::kCompleted);
  CHECK(f.comm->last_completed.load() == seq);
}

TEST_CASE("a destroyed communicator's operations are complete: destroy waited for them", "[operations]") {
  Fixture f;
  const std::uint64_t seq = f.AllReduce();  // the watchdog has not looked yet
  AfterCommCall(Api::ncclCommDestroy, f.comm->handle, ncclSuccess);
  CHECK(f.comm->lifecycle.load() == CommLifecycle::kDestroyed);
  CHECK(f.Op(seq).state.load() == OpState::kCompleted);
  CHECK(f.comm->last_completed.load() == seq);
}

TEST_CASE("an initialisation that does not complete is a stall after the init timeout", "[operations]") {
  PendingInit init;
  init.api = Api::ncclCommInitRank;
  init.comm_id = "00000000000000bb";
  init.rank = 1;
  init.nranks = 4;
  init.start_ns = 100 * kSecond;
  CHECK_FALSE(FindInitStall(init, 110 * kSecond, kTimeout).has_value());
  const auto stall = FindInitStall(init, 112 * kSecond, kTimeout);
  REQUIRE(stall.has_value());
  CHECK(stall->kind == Stall::Kind::kInit);
  CHECK(StallMessage(*stall) ==
        "rank 1 comm 00000000000000bb: ncclCommInitRank (rank 1 of 4) has not completed after 12.0 s");
}

TEST_CASE("communicator ids agree across ranks and lineages", "[operations]") {
  ncclUniqueId id{};
  id.internal[0] = 7;
  const std::string parent = CommIdFromUniqueId(id);
  CHECK(parent.size() == 16);
  CHECK(CommIdFromUniqueId(id) == parent);
  id.internal[127] = 1;
  CHECK(CommIdFromUniqueId(id) != parent);
  CHECK(ChildCommId(parent, "split", 0, 3) == ChildCommId(parent, "split", 0, 3));
  CHECK(ChildCommId(parent, "split", 0, 3) != ChildCommId(parent, "split", 0, 4));
  CHECK(ChildCommId(parent, "split", 0, 3) != ChildCommId(parent, "split", 1, 3));
  CHECK(ChildCommId(parent, "split", 0, 0) != ChildCommId(parent, "shrink", 0, 0));
}

TEST_CASE("the GPU reaching the start before NCCL returns still gets the end event", "[operations]") {
  Fixture f;
  OperationArguments arguments;
  arguments.comm = f.comm->handle;
  arguments.stream = Stream(1);
  arguments.count = 4;
  arguments.datatype = ncclFloat32;
  const Ticket ticket = BeforeOperation(Api::ncclAllReduce, 0, arguments);
  OpRecord& op = f.Op(ticket.seq);
  f.events.Reach(op.start_event);
  AdvanceOperations(*f.comm, f.events, f.EnqueuedAt(ticket.seq) + 1);  // while NCCL is still launching
  REQUIRE(op.state.load() == OpState::kStarted);
  AfterOperation(ticket, ncclSuccess);
  CHECK(op.end_recorded.load());
  f.events.Reach(op.end_event);
  AdvanceOperations(*f.comm, f.events, f.EnqueuedAt(ticket.seq) + 2);
  CHECK(op.state.load() == OpState::kCompleted);
}

TEST_CASE("a wrapped ring reclaims finished operations without waiting for the watchdog", "[operations]") {
  Fixture f(4);
  for (int i = 0; i < 4; ++i) f.AllReduce();
  f.events.ReachEverything();  // the GPU finished them; the watchdog has not looked yet
  CHECK(f.AllReduce() == 5);
  CHECK(f.comm->dropped.load() == 0);
  CHECK(f.Op(1).seq.load() == 5);  // slot 1 holds #5 now
  CHECK(f.comm->last_completed.load() >= 1);
}

// In-process recovery is reached through one pointer, null unless NCCLGUARD_RECOVER=inprocess (this
// program never sets it): a collective then leaves probation alone even on a communicator that
// says it has some.
TEST_CASE("without in-process recovery an operation is never put on probation", "[operations][probation]") {
  REQUIRE(InProcessRecoveryOn() == nullptr);
  Fixture f;
  f.comm->probation_limit = 4;
  OperationArguments arguments;
  arguments.comm = f.comm->handle;
  arguments.stream = Stream(1);
  arguments.count = 16;
  arguments.datatype = ncclFloat32;
  arguments.reduction = ncclSum;
  const Ticket ticket = BeforeOperation(Api::ncclAllReduce, 0, arguments);
  CHECK(ticket.forward);
  CHECK(ticket.probation == nullptr);
  AfterOperation(ticket, ncclSuccess);
  CHECK(f.comm->probation_taken.load() == 0);
  CHECK(f.comm->probation[0].state.load() == ProbationState::kNone);
  CHECK(f.Op(ticket.seq).start_recorded.load());
}

TEST_CASE("which operations overwrite their own input, and so need a copy to be replayed", "[probation]") {
  std::vector<float> buffer(64);
  std::vector<float> other(64);
  ProbationOp op;
  op.datatype = ncclFloat;
  op.count = 16;
  auto overwritten = [&op](Api api, const void* send, void* recv, int root, int rank) {
    op.api = api;
    op.send = send;
    op.recv = recv;
    op.root_or_peer = root;
    return OverwrittenInputBytes(op, rank, 4);
  };
  // In place: the whole input.
  CHECK(overwritten(Api::ncclAllReduce, buffer.data(), buffer.data(), -1, 0) == 64);
  CHECK(overwritten(Api::ncclReduceScatter, buffer.data(), buffer.data(), -1, 0) == 256);
  // NCCL's in-place AllGather: the input is this rank's slice of the output.
  CHECK(overwritten(Api::ncclAllGather, buffer.data() + 16, buffer.data(), -1, 1) == 64);
  // Out of place: nothing.
  CHECK(overwritten(Api::ncclAllReduce, buffer.data(), other.data(), -1, 0) == 0);
  // Only a rooted operation's root has an output.
  CHECK(overwritten(Api::ncclReduce, buffer.data(), buffer.data(), 0, 0) == 64);
  CHECK(overwritten(Api::ncclReduce, buffer.data(), buffer.data(), 0, 2) == 0);
  // The root of a Broadcast only reads its buffer; Send and Recv have one buffer each.
  CHECK(overwritten(Api::ncclBroadcast, buffer.data(), buffer.data(), 0, 0) == 0);
  CHECK(overwritten(Api::ncclBcast, nullptr, buffer.data(), 0, 1) == 0);
  CHECK(overwritten(Api::ncclSend, buffer.data(), nullptr, 1, 0) == 0);
  CHECK(overwritten(Api::ncclRecv, nullptr, buffer.data(), 1, 0) == 0);
}
