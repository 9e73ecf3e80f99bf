// The watchdog's rounds with a fake clock, fake events and recorded effects: what it dumps, logs
// and does for each kind of trouble, and under each NCCLGUARD_ACTION.
#include <catch2/catch.hpp>

#include "tests/detect/fakes.h"
#include "watchdog/detect/runtime.h"
#include "watchdog/detect/watchdog.h"
#include "watchdog/report/op_signature.h"
#include "watchdog/state/registration.h"
#include "watchdog/state/registry.h"

using namespace ncclguard;
using ncclguard::testing::EnqueueAllReduce;
using ncclguard::testing::ExitCalled;
using ncclguard::testing::FakeGpuEvents;
using ncclguard::testing::RecordingEffects;

namespace {

constexpr std::int64_t kSecond = 1'000'000'000;

Config TestConfig(Action action = Action::kWarn) {
  Config config;
  config.timeout = Seconds{10};
  config.init_timeout = Seconds{30};
  config.status_interval = Seconds{2};
  config.action = action;
  return config;
}

// One ready communicator of rank 3, and a way to put operations in its ring.
struct Fixture : ncclguard::testing::WatchdogFixture {
  explicit Fixture(Action action = Action::kWarn) : WatchdogFixture(TestConfig(action), 3) {}

  // An AllReduce handed to NCCL at `enqueued_at`, its events recorded.
  std::uint64_t Enqueue(std::int64_t enqueued_at) {
    return EnqueueAllReduce(*comm, events, enqueued_at, ncclBfloat16, 4096).seq;
  }
};

}  // namespace

TEST_CASE("a stall is dumped once, with the stalled operation, and peers are asked to dump", "[watchdog]") {
  Fixture f;
  const std::uint64_t seq = f.Enqueue(0);
  f.events.Reach(f.comm->Slot(seq).start_event);
  f.watchdog.PollOnce(1 * kSecond);
  CHECK(f.effects.dumps.empty());
  f.watchdog.PollOnce(12 * kSecond);  // started at 1 s: 11 s > 10 s
  REQUIRE(f.effects.dumps.size() == 1);
  const ProcessSnapshot& dump = f.effects.dumps[0];
  CHECK(dump.reason == "stall");
  REQUIRE(dump.stall.has_value());
  CHECK(dump.stall->kind == "not_completed");
  CHECK(dump.stall->seq == 1);
  CHECK(dump.stall->comm_id == "1111222233334444");
  CHECK(dump.stall->message ==
        "rank 3 comm 1111222233334444: AllReduce #1 (bfloat16 × 4096, sum) started on the GPU 11.0 s "
        "ago and has not completed");
  CHECK(dump.last_nccl_warning == "NCCL WARN something broke");
  CHECK(dump.stall->verdict.empty());  // no job directory to judge from: the timeout decides
  REQUIRE(dump.comms.size() == 1);
  CHECK(dump.comms[0].last_started == 1);
  CHECK(dump.comms[0].last_completed == 0);
  REQUIRE(dump.comms[0].ring.size() == 1);
  CHECK(dump.comms[0].ring[0].state == "started");
  CHECK(f.effects.peer_requests_sent.size() == 1);
  CHECK(f.effects.aborted.empty());  // NCCLGUARD_ACTION=warn only reports

  f.watchdog.PollOnce(20 * kSecond);  // the same stall is not reported again
  CHECK(f.effects.dumps.size() == 1);
}

TEST_CASE("NCCLGUARD_ACTION=abort aborts the stalled communicator", "[watchdog]") {
  Fixture f(Action::kAbort);
  f.Enqueue(0);
  f.watchdog.PollOnce(11 * kSecond);
  REQUIRE(f.effects.aborted.size() == 1);
  CHECK(f.effects.aborted[0] == f.comm);
  f.watchdog.PollOnce(30 * kSecond);  // an aborted communicator is no longer watched
  CHECK(f.effects.aborted.size() == 1);
  CHECK(f.effects.dumps.size() == 1);
}

TEST_CASE("NCCLGUARD_ACTION=exit dumps, aborts everything and exits with the restart code", "[watchdog]") {
  Fixture f(Action::kExit);
  CommState* other = f.registry.Add(reinterpret_cast<ncclComm_t>(0xdef0), 0, 16);
  other->lifecycle = CommLifecycle::kReady;
  f.Enqueue(0);
  try {
    f.watchdog.PollOnce(11 * kSecond);
    FAIL("the watchdog did not exit");
  } catch (const ExitCalled& exit) {
    CHECK(exit.code == kRestartExitCode);
  }
  CHECK(f.effects.dumps.size() == 1);
  CHECK(f.effects.holding_application_calls);  // before the aborts release the application
  CHECK(f.effects.aborted.size() == 2);
}

TEST_CASE("an asynchronous error is dumped with NCCL's warning and acted on", "[watchdog]") {
  Fixture f(Action::kAbort);
  f.effects.async_errors[f.comm] = ncclRemoteError;
  f.effects.last_error = "NCCL WARN Cuda failure 'peer access is not supported between these two devices'";
  f.watchdog.PollOnce(1 * kSecond);
  REQUIRE(f.effects.dumps.size() == 1);
  CHECK(f.effects.dumps[0].reason == "async_error");
  CHECK(f.effects.dumps[0].comms[0].async_error == "ncclRemoteError");
  CHECK(f.effects.dumps[0].last_nccl_warning.find("peer access") != std::string::npos);
  CHECK(f.effects.aborted.size() == 1);
}

TEST_CASE(
    "an asynchronous error the application saw before it aborted the communicator is reported once, "
    "without acting",
    "[watchdog]") {
  Fixture f(Action::kAbort);
  RecordAsyncError(*f.comm, ncclRemoteError);
  f.comm->lifecycle = CommLifecycle::kAborted;
  f.watchdog.PollOnce(1 * kSecond);
  REQUIRE(f.effects.dumps.size() == 1);
  CHECK(f.effects.dumps[0].reason == "async_error");
  CHECK(f.effects.dumps[0].comms[0].async_error == "ncclRemoteError");
  CHECK(f.effects.aborted.empty());
  CHECK(f.effects.async_error_queries[f.comm] == 0);  // NCCL has freed it
  f.watchdog.PollOnce(2 * kSecond);
  CHECK(f.effects.dumps.size() == 1);
}

TEST_CASE("an error the application saw is not forgotten when NCCL later says success", "[watchdog]") {
  Fixture f;
  RecordAsyncError(*f.comm, ncclSystemError);
  RecordAsyncError(*f.comm, ncclSuccess);
  f.watchdog.PollOnce(1 * kSecond);
  REQUIRE(f.effects.dumps.size() == 1);
  CHECK(f.effects.dumps[0].comms[0].async_error == "ncclSystemError");
}

TEST_CASE("at exit, what the watchdog has not reported yet is dumped", "[watchdog][exit]") {
  Fixture f;
  f.watchdog.PollOnce(1 * kSecond);
  REQUIRE(f.effects.dumps.empty());
  SECTION("an asynchronous error the application saw") {
    RecordAsyncError(*f.comm, ncclRemoteError);
    f.watchdog.RequestDump("error_return");
    f.watchdog.FlushAtExit(1 * kSecond);
    REQUIRE(f.effects.dumps.size() == 1);  // one dump says it all
    CHECK(f.effects.dumps[0].reason == "async_error");
  }
  SECTION("a dump a failed call asked for") {
    f.watchdog.RequestDump("error_return");
    f.watchdog.FlushAtExit(1 * kSecond);
    REQUIRE(f.effects.dumps.size() == 1);
    CHECK(f.effects.dumps[0].reason == "error_return");
  }
  SECTION("nothing") {
    f.watchdog.FlushAtExit(1 * kSecond);
    CHECK(f.effects.dumps.empty());
  }
}

TEST_CASE("a communicator created in a group that has not ended is not asked about", "[watchdog][init]") {
  Fixture f;
  f.comm->lifecycle = CommLifecycle::kInitializing;
  f.comm->awaiting_group_end = true;
  f.effects.async_errors[f.comm] = ncclInProgress;
  f.watchdog.PollOnce(1 * kSecond);
  CHECK(f.effects.async_error_queries[f.comm] == 0);
  f.comm->awaiting_group_end = false;
  f.watchdog.PollOnce(2 * kSecond);
  CHECK(f.effects.async_error_queries[f.comm] == 1);
}

TEST_CASE("a status is written at once when a communicator is created, once the job directory is known",
          "[watchdog][init]") {
  Fixture f;
  f.effects.job_directory_known = false;
  f.watchdog.WriteStatusNow(1 * kSecond);
  CHECK(f.effects.statuses.empty());
  f.effects.job_directory_known = true;
  f.watchdog.WriteStatusNow(1 * kSecond);
  REQUIRE(f.effects.statuses.size() == 1);
  CHECK(f.effects.statuses[0].comms.at(0).rank == 3);
  CHECK(f.effects.statuses[0].comms.at(0).nranks == 4);
}

TEST_CASE(
    "a status asked for at a communicator's creation is written at the next round, not an interval later",
    "[watchdog][init]") {
  Fixture f;
  f.watchdog.PollOnce(0);
  REQUIRE(f.effects.statuses.size() == 1);
  f.watchdog.PollOnce(kSecond / 2);
  CHECK(f.effects.statuses.size() == 1);
  f.watchdog.RequestStatus();
  CHECK(f.effects.statuses.size() == 1);  // nothing on the asking thread
  f.watchdog.PollOnce(kSecond / 2 + 1);
  CHECK(f.effects.statuses.size() == 2);
  f.watchdog.PollOnce(kSecond);
  CHECK(f.effects.statuses.size() == 2);
}

TEST_CASE("a pending initialisation past the init timeout is a stall", "[watchdog]") {
  Fixture f;
  PendingInit init;
  init.api = Api::ncclCommInitRank;
  init.comm_id = "5555666677778888";
  init.rank = 1;
  init.nranks = 4;
  init.start_ns = 0;
  f.registry.BeginInit(init);
  f.watchdog.PollOnce(29 * kSecond);
  CHECK(f.effects.dumps.empty());
  f.watchdog.PollOnce(31 * kSecond);
  REQUIRE(f.effects.dumps.size() == 1);
  CHECK(f.effects.dumps[0].stall->kind == "init");
  CHECK(f.effects.dumps[0].stall->message ==
        "rank 1 comm 5555666677778888: ncclCommInitRank (rank 1 of 4) has not completed after 31.0 s");
  f.watchdog.PollOnce(40 * kSecond);
  CHECK(f.effects.dumps.size() == 1);
}

TEST_CASE("dump requests: a signal, and peers unless a dump of our own answers them", "[watchdog]") {
  Fixture f;
  f.watchdog.RequestDump("signal");
  f.watchdog.PollOnce(1 * kSecond);
  REQUIRE(f.effects.dumps.size() == 1);
  CHECK(f.effects.dumps[0].reason == "signal");
  CHECK_FALSE(f.effects.dumps[0].stall.has_value());

  // A peer's request at about the time of our own dump: nothing new to say.
  f.effects.pending_peer_request_ns = f.effects.wall_ns + kSecond;
  f.watchdog.PollOnce(3 * kSecond);
  CHECK(f.effects.dumps.size() == 1);

  // A later one is answered.
  f.effects.wall_ns += 60 * kSecond;
  f.effects.pending_peer_request_ns = f.effects.wall_ns;
  f.watchdog.PollOnce(70 * kSecond);
  REQUIRE(f.effects.dumps.size() == 2);
  CHECK(f.effects.dumps[1].reason == "peer_request");
}

TEST_CASE("the status file is rewritten every status interval, without rings", "[watchdog]") {
  Fixture f;
  f.Enqueue(0);
  f.Enqueue(0);
  f.watchdog.PollOnce(0);
  f.watchdog.PollOnce(1 * kSecond);
  CHECK(f.effects.statuses.size() == 1);
  f.watchdog.PollOnce(2 * kSecond);
  REQUIRE(f.effects.statuses.size() == 2);
  // Only the oldest unfinished operation goes into a status file.
  REQUIRE(f.effects.statuses[1].comms.size() == 1);
  REQUIRE(f.effects.statuses[1].comms[0].ring.size() == 1);
  CHECK(f.effects.statuses[1].comms[0].ring[0].seq == 1);
}

TEST_CASE("status files and dump requests wait for the job directory", "[watchdog]") {
  Fixture f;
  f.effects.job_directory_known = false;
  f.effects.pending_peer_request_ns = f.effects.wall_ns;
  f.watchdog.PollOnce(0);
  f.watchdog.PollOnce(1 * kSecond);
  CHECK(f.effects.statuses.empty());
  // Known now: the first look comes at once, not a status interval later.
  f.effects.job_directory_known = true;
  f.watchdog.PollOnce(1 * kSecond + 1);
  CHECK(f.effects.statuses.size() == 1);
  REQUIRE(f.effects.dumps.size() == 1);
  CHECK(f.effects.dumps[0].reason == "peer_request");
}

TEST_CASE("a destroyed communicator is no longer watched", "[watchdog]") {
  Fixture f;
  f.Enqueue(0);
  f.comm->lifecycle = CommLifecycle::kDestroyed;
  f.watchdog.PollOnce(100 * kSecond);
  CHECK(f.effects.dumps.empty());
}

TEST_CASE("the monitor reports a watchdog stuck in a call, once per episode", "[watchdog]") {
  HeartbeatMonitor monitor(10 * kSecond);
  CHECK_FALSE(monitor.Check(1, nullptr, 0).has_value());
  CHECK_FALSE(monitor.Check(2, nullptr, 5 * kSecond).has_value());
  CHECK_FALSE(monitor.Check(2, "cuEventQuery", 15 * kSecond).has_value());
  const auto message = monitor.Check(2, "cuEventQuery", 16 * kSecond);
  REQUIRE(message.has_value());
  CHECK(*message == "the watchdog has been stuck for 11 s in cuEventQuery: stalls are not being detected");
  CHECK_FALSE(monitor.Check(2, "cuEventQuery", 30 * kSecond).has_value());
  CHECK_FALSE(monitor.Check(3, nullptr, 31 * kSecond).has_value());            // moving again
  CHECK(monitor.Check(3, "ncclCommGetAsyncError", 42 * kSecond).has_value());  // a new episode
}

namespace {

Verdict MakeVerdict(const std::string& kind, const std::string& message) {
  Verdict verdict;
  verdict.kind = ParseVerdictKind(kind).value();
  verdict.message = message;
  verdict.ranks = {0};
  return verdict;
}

}  // namespace

TEST_CASE("a verdict that says the network is stuck is acted on at the timeout", "[watchdog]") {
  Fixture f(Action::kAbort);
  f.effects.verdicts = {MakeVerdict("stuck_inside_nccl", "every rank entered AllReduce #1")};
  f.Enqueue(0);
  f.watchdog.PollOnce(11 * kSecond);
  REQUIRE(f.effects.dumps.size() == 1);
  CHECK(f.effects.dumps[0].stall->verdict == "stuck_inside_nccl");
  CHECK(f.effects.dumps[0].stall->verdict_message == "every rank entered AllReduce #1");
  CHECK(f.effects.aborted.size() == 1);
}

TEST_CASE("a late rank busy outside NCCL is waited for until the hard timeout", "[watchdog]") {
  Fixture f(Action::kAbort);
  f.config.hard_timeout = Seconds{60};
  Verdict busy = MakeVerdict("rank_not_joined", "rank 0 is busy outside NCCL");
  busy.late_ranks_busy_outside_nccl = true;
  f.effects.verdicts = {busy};
  f.Enqueue(0);
  f.watchdog.PollOnce(11 * kSecond);  // the stall: reported, dumped, not acted on
  CHECK(f.effects.dumps.size() == 1);
  CHECK(f.effects.aborted.empty());
  f.watchdog.PollOnce(12 * kSecond);  // the late ranks have not answered the dump request yet
  CHECK(f.effects.classifications == 1);
  // One status interval (2 s) and two polls on, their dumps (where they are) can be in: a look again.
  f.watchdog.PollOnce(14 * kSecond);
  CHECK(f.effects.classifications == 2);
  f.watchdog.PollOnce(20 * kSecond);  // then only every NCCLGUARD_TIMEOUT
  CHECK(f.effects.classifications == 2);
  f.watchdog.PollOnce(25 * kSecond);
  CHECK(f.effects.classifications == 3);
  CHECK(f.effects.aborted.empty());
  f.watchdog.PollOnce(61 * kSecond);  // past NCCLGUARD_HARD_TIMEOUT
  CHECK(f.effects.aborted.size() == 1);
  CHECK(f.effects.dumps.size() == 1);  // one dump per stall
}

TEST_CASE("a waited-for stall is acted on as soon as its verdict changes", "[watchdog]") {
  Fixture f(Action::kAbort);
  Verdict busy = MakeVerdict("rank_not_joined", "rank 0 is busy outside NCCL");
  busy.late_ranks_busy_outside_nccl = true;
  f.effects.verdicts = {busy};
  f.Enqueue(0);
  f.watchdog.PollOnce(11 * kSecond);
  CHECK(f.effects.aborted.empty());
  f.effects.verdicts = {MakeVerdict("rank_dead", "rank 0 is gone")};
  f.watchdog.PollOnce(22 * kSecond);
  CHECK(f.effects.aborted.size() == 1);
}

TEST_CASE("status files carry the reported stall until its operation completes", "[watchdog]") {
  Fixture f;
  const std::uint64_t seq = f.Enqueue(0);
  f.watchdog.PollOnce(11 * kSecond);  // stalled (not started): reported
  f.watchdog.PollOnce(14 * kSecond);
  REQUIRE(f.effects.statuses.size() >= 2);
  REQUIRE(f.effects.statuses.back().stall.has_value());
  CHECK(f.effects.statuses.back().stall->seq == seq);
  f.events.ReachEverything();
  f.watchdog.PollOnce(16 * kSecond);
  f.watchdog.PollOnce(18 * kSecond);
  CHECK_FALSE(f.effects.statuses.back().stall.has_value());
}

TEST_CASE("the final status asks the GPU once more and says the process is exiting", "[watchdog]") {
  Fixture f;
  const std::uint64_t seq = f.Enqueue(0);
  f.events.ReachEverything();  // finished on the GPU; the watchdog never looked
  const ProcessSnapshot status = f.watchdog.FinalStatus(kSecond);
  CHECK(status.exiting);
  REQUIRE(status.comms.size() == 1);
  CHECK(status.comms[0].last_completed == seq);
  REQUIRE(status.comms[0].ring.size() == 1);  // the last completed, nothing unfinished
  CHECK(status.comms[0].ring[0].state == "completed");
}

TEST_CASE("status files sign the latest operations the ring still holds", "[watchdog]") {
  Fixture f;  // a ring of 16
  for (int i = 0; i < 20; ++i) f.Enqueue(0);
  f.comm->Slot(10).count = 8192;  // #10 asked for something else
  const ProcessSnapshot status = f.watchdog.FinalStatus(kSecond);
  REQUIRE(status.comms.size() == 1);
  const CommSnapshot& comm = status.comms[0];
  CHECK(comm.signatures_first_seq == 5);
  REQUIRE(comm.signatures.size() == 16);
  for (size_t i = 0; i < comm.signatures.size(); ++i) {
    INFO("#" << comm.signatures_first_seq + i);
    CHECK(comm.signatures[i] != kNoSignature);
    CHECK((comm.signatures[i] == comm.signatures[0]) == (comm.signatures_first_seq + i != 10));
  }
  // A dump has the ring itself: no signatures.
  f.watchdog.RequestDump("signal");
  f.watchdog.PollOnce(2 * kSecond);
  REQUIRE(f.effects.dumps.size() == 1);
  CHECK(f.effects.dumps[0].comms[0].signatures.empty());
}

namespace {

// A stall classified `kind`, under NCCLGUARD_ACTION=reinit: the exit code, or -1 when the
// watchdog did not exit.
int ExitCodeOfStall(Fixture& f, const std::string& kind) {
  Verdict verdict = MakeVerdict(
      kind, kind == "p2p_suspect"
                ? "all 4 ranks entered AllReduce #1 with P2P in use: NCCL_P2P_DISABLE=1 avoids them"
                : "all 4 ranks entered AllReduce #1 and none has completed it");
  verdict.comm = f.comm->id;
  verdict.seq = 1;
  verdict.ranks = {0, 1, 2, 3};
  f.effects.verdicts = {verdict};
  f.Enqueue(0);
  try {
    f.watchdog.PollOnce(11 * kSecond);
  } catch (const ExitCalled& exit) {
    return exit.code;
  }
  return -1;
}

}  // namespace

TEST_CASE("reinit with a p2p_suspect verdict records it, asks every process to follow and exits 75",
          "[watchdog][reinit]") {
  Fixture f(Action::kReinit);
  f.effects.facts.host = "node3";
  f.effects.facts.pid = 4211;
  f.effects.facts.environment = {{"NCCLGUARD_ACTION", "reinit"}};
  CHECK(ExitCodeOfStall(f, "p2p_suspect") == kRestartExitCode);
  REQUIRE(f.effects.p2p_records.size() == 1);
  const P2pVerdictRecord& record = f.effects.p2p_records[0];
  CHECK(record.message.find("NCCL_P2P_DISABLE=1") != std::string::npos);
  CHECK(record.comm == "1111222233334444");
  CHECK(record.seq == 1);
  CHECK(record.ranks == std::vector<int>{0, 1, 2, 3});
  CHECK(record.host == "node3");
  CHECK(record.pid == 4211);
  CHECK(record.rank == 3);
  CHECK(record.time_ns == f.effects.wall_ns);
  CHECK(f.effects.dumps.size() == 1);
  // The stall's own request, then the one after the record that makes the other processes follow.
  REQUIRE(f.effects.peer_requests_sent.size() == 2);
  CHECK(f.effects.peer_requests_sent[1].find("p2p_suspect recorded") != std::string::npos);
  CHECK(f.effects.holding_application_calls);
  CHECK(f.effects.aborted.size() == 1);
}

TEST_CASE("reinit with any other verdict exits 75 without a record", "[watchdog][reinit]") {
  Fixture f(Action::kReinit);
  CHECK(ExitCodeOfStall(f, "stuck_inside_nccl") == kRestartExitCode);
  CHECK(f.effects.p2p_records.empty());
  CHECK(f.effects.peer_requests_sent.size() == 1);
  CHECK(f.effects.aborted.size() == 1);
}

TEST_CASE("reinit records nothing when the user set P2P explicitly, and still exits 75",
          "[watchdog][reinit]") {
  const std::string variable = GENERATE("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL");
  Fixture f(Action::kReinit);
  f.effects.facts.environment = {{variable, variable == "NCCL_P2P_LEVEL" ? "SYS" : "0"}};
  CHECK(ExitCodeOfStall(f, "p2p_suspect") == kRestartExitCode);
  CHECK(f.effects.p2p_records.empty());
  CHECK(f.effects.aborted.size() == 1);
}

TEST_CASE("reinit exits 75 when the record cannot be written", "[watchdog][reinit]") {
  Fixture f(Action::kReinit);
  f.effects.p2p_record_writable = false;
  CHECK(ExitCodeOfStall(f, "p2p_suspect") == kRestartExitCode);
  CHECK(f.effects.peer_requests_sent.size() == 1);  // nothing for the others to follow
}

TEST_CASE("exit does not record a p2p_suspect verdict", "[watchdog][reinit]") {
  Fixture f(Action::kExit);
  CHECK(ExitCodeOfStall(f, "p2p_suspect") == kRestartExitCode);
  CHECK(f.effects.p2p_records.empty());
}

TEST_CASE("under reinit, a fresh P2P verdict of another process makes this one dump, abort and exit 75",
          "[watchdog][reinit]") {
  Fixture f(Action::kReinit);
  f.Enqueue(0);  // in flight, not stalled: this process has seen nothing wrong
  f.watchdog.PollOnce(0);
  CHECK(f.effects.p2p_verdict_reads == 0);  // looked for only when a peer asks

  P2pVerdictRecord record;
  record.comm = "1111222233334444";
  record.seq = 1;
  record.rank = 0;
  record.host = "node1";
  record.pid = 77;
  f.effects.fresh_p2p_verdict = record;
  f.effects.pending_peer_request_ns = f.effects.wall_ns;
  try {
    f.watchdog.PollOnce(2 * kSecond);
    FAIL("the watchdog did not exit");
  } catch (const ExitCalled& exit) {
    CHECK(exit.code == kRestartExitCode);
  }
  REQUIRE(f.effects.dumps.size() == 1);
  CHECK(f.effects.dumps[0].reason == "peer_request");
  CHECK(f.effects.aborted.size() == 1);
  CHECK(f.effects.holding_application_calls);
  CHECK(f.effects.p2p_records.empty());  // following is not recording
}

TEST_CASE("a process that runs with P2P disabled does not follow a P2P verdict", "[watchdog][reinit]") {
  Fixture f(Action::kReinit);
  f.effects.facts.environment = {{"NCCL_P2P_DISABLE", "1"}};
  f.effects.fresh_p2p_verdict = P2pVerdictRecord{};
  f.effects.pending_peer_request_ns = f.effects.wall_ns;
  f.watchdog.PollOnce(0);
  CHECK(f.effects.dumps.size() == 1);
  CHECK(f.effects.aborted.empty());
}

TEST_CASE("a fresh P2P verdict naming no communicator of this process is another job's, and not followed",
          "[watchdog][reinit]") {
  Fixture f(Action::kReinit);
  P2pVerdictRecord record;
  record.comm = "bf35000000000000";  // another job's: this process has only 1111222233334444
  record.seq = 11;
  record.time_ns = f.effects.wall_ns;
  f.effects.fresh_p2p_verdict = record;
  for (int request = 1; request <= 3; ++request) {
    f.effects.pending_peer_request_ns = f.effects.wall_ns + request;
    f.watchdog.PollOnce(request * 2 * kSecond);  // each request seen: no ExitCalled thrown
  }
  CHECK(f.effects.p2p_verdict_reads == 3);
  CHECK(f.effects.aborted.empty());
  CHECK_FALSE(f.effects.holding_application_calls);
}

TEST_CASE("a peer's request without a fresh P2P verdict (none, or an earlier attempt's) is only a dump",
          "[watchdog][reinit]") {
  const Action action = GENERATE(Action::kReinit, Action::kExit);
  Fixture f(action);
  f.effects.pending_peer_request_ns = f.effects.wall_ns;
  f.watchdog.PollOnce(0);
  CHECK(f.effects.dumps.size() == 1);
  CHECK(f.effects.aborted.empty());
  CHECK(f.effects.p2p_verdict_reads == (action == Action::kReinit ? 1 : 0));
}

TEST_CASE("a stream of dump signals makes at most one dump per second", "[watchdog]") {
  Fixture f;
  // 30 s of signals, ten per poll interval of 0.1 s.
  for (std::int64_t round = 0; round < 300; ++round) {
    for (int signal = 0; signal < 10; ++signal) f.watchdog.RequestSignalDump();
    f.watchdog.PollOnce(round * kSecond / 10);
  }
  CHECK(f.effects.dumps.size() == 30);
  for (const auto& dump : f.effects.dumps) CHECK(dump.reason == "signal");
  // A signal within the second of the last dump is answered once that second has passed.
  f.watchdog.RequestSignalDump();
  f.watchdog.PollOnce(29 * kSecond + kSecond / 2);
  CHECK(f.effects.dumps.size() == 30);
  f.watchdog.PollOnce(30 * kSecond);
  CHECK(f.effects.dumps.size() == 31);
  f.watchdog.PollOnce(40 * kSecond);
  CHECK(f.effects.dumps.size() == 31);
}

TEST_CASE("a closed communicator's ring is freed at once, the communicator one status interval later",
          "[watchdog]") {
  const CommLifecycle closed = GENERATE(CommLifecycle::kDestroyed, CommLifecycle::kAborted);
  Fixture f;
  const ncclComm_t handle = f.comm->handle;
  f.Enqueue(0);
  f.Enqueue(0);
  f.events.ReachEverything();
  f.watchdog.PollOnce(0);
  f.comm->lifecycle = closed;
  f.watchdog.PollOnce(kSecond / 10);
  CHECK(f.comm->ring == nullptr);
  CHECK(f.events.Destroyed().size() == 4);
  CHECK(f.registry.Find(handle) == nullptr);
  f.watchdog.PollOnce(2 * kSecond);  // a status round: the communicator is shown closed
  REQUIRE(f.effects.statuses.size() == 2);
  REQUIRE(f.effects.statuses[1].comms.size() == 1);
  const CommSnapshot& shown = f.effects.statuses[1].comms[0];
  CHECK(shown.state == std::string(CommLifecycleName(closed)));
  // What its status said before the ring was freed: peers that find a desync after this process
  // destroyed its communicators and exited need the signatures and its last completed operation.
  CHECK(shown.signatures_first_seq == 1);
  CHECK(shown.signatures.size() == 2);
  REQUIRE(shown.ring.size() == 1);
  CHECK(shown.ring[0].seq == 2);
  f.watchdog.PollOnce(2 * kSecond + kSecond / 10);
  CHECK(f.registry.All().empty());
  f.watchdog.PollOnce(4 * kSecond);
  REQUIRE(f.effects.statuses.size() == 3);
  CHECK(f.effects.statuses[2].comms.empty());
}

TEST_CASE("a communicator ncclguard aborted keeps its state for the application's later calls",
          "[watchdog]") {
  Fixture f;
  f.effects.Abort(*f.comm);
  f.watchdog.PollOnce(0);
  f.watchdog.PollOnce(10 * kSecond);
  CHECK(f.registry.Find(f.comm->handle) == f.comm);
  CHECK(f.comm->ring != nullptr);
}

TEST_CASE("the registry reuses the slots of removed communicators", "[watchdog][registry]") {
  Registry registry;
  // Some communicators live throughout, their probe sequences crossed by the removed ones'.
  std::vector<CommState*> kept;
  for (std::uintptr_t i = 1; i <= 100; ++i)
    kept.push_back(registry.Add(reinterpret_cast<ncclComm_t>(i * 4096), 0, 1));
  for (std::uintptr_t cycle = 0; cycle < 20000; ++cycle) {
    const auto handle = reinterpret_cast<ncclComm_t>(0x10000000 + cycle * 64);
    CommState* state = registry.Add(handle, 0, 1);
    REQUIRE(state != nullptr);
    REQUIRE(registry.Find(handle) == state);
    registry.Remove(state);
    REQUIRE(registry.Find(handle) == nullptr);
  }
  for (CommState* state : kept) CHECK(registry.Find(state->handle) == state);
  CHECK(registry.All().size() == kept.size());

  // A handle NCCL reused names the newest communicator; removing the older one leaves it.
  const auto reused = reinterpret_cast<ncclComm_t>(0x7000);
  CommState* older = registry.Add(reused, 0, 1);
  CommState* newer = registry.Add(reused, 0, 1);
  registry.Remove(older);
  CHECK(registry.Find(reused) == newer);
}

namespace {

// NCCLGUARD_RECOVER=inprocess, with the fixture's operation #1 on probation (its stream gated).
struct ProbationFixture : Fixture {
  explicit ProbationFixture(Action action) : Fixture(action) {
    config.recover = RecoverMode::kInProcess;
    seq = Enqueue(0);
    ProbationOp& op = comm->probation[0];
    op.seq = seq;
    op.api = Api::ncclAllReduce;
    op.state.store(ProbationState::kPending);
    comm->probation_taken = 1;
    comm->probation_limit = 4;
    effects.job_directory_known = true;
  }

  void Judge(VerdictKind kind) {
    Verdict verdict;
    verdict.kind = kind;
    verdict.comm = comm->id;
    verdict.seq = seq;
    effects.verdicts = {verdict};
  }

  std::uint64_t seq;
};

}  // namespace

TEST_CASE("in-process recovery: a probation operation stuck inside NCCL is recovered instead of acted on",
          "[watchdog][inprocess]") {
  ProbationFixture f(Action::kExit);
  f.Judge(VerdictKind::kStuckInsideNccl);
  f.effects.recovery_outcome = {RecoveryOutcome::Result::kRecovered, "all 4 ranks are ready", 11 * kSecond};
  f.watchdog.PollOnce(11 * kSecond);  // no ExitCalled: recovered
  REQUIRE(f.effects.recoveries.size() == 1);
  CHECK(f.effects.recoveries[0].first == f.seq);
  CHECK(f.effects.recoveries[0].second.empty());  // this rank is ready
  CHECK(f.effects.aborted.empty());
  CHECK_FALSE(f.effects.holding_application_calls);
  f.watchdog.PollOnce(30 * kSecond);  // the stall is dealt with: not reported or acted on again
  CHECK(f.effects.recoveries.size() == 1);
  CHECK(f.effects.dumps.size() == 1);
}

TEST_CASE(
    "in-process recovery: a verdict that P2P off cannot mend makes this rank vote not ready, then the "
    "action is taken",
    "[watchdog][inprocess]") {
  ProbationFixture f(Action::kExit);
  f.Judge(VerdictKind::kMismatch);
  f.effects.recovery_outcome = {RecoveryOutcome::Result::kFellBack, "rank 3 cannot recover", 0};
  // A peer's status file may predate the stall: the verdict gets two status intervals (2 s each
  // here) past the timeout to settle, rechecked every second, before this rank gives up.
  f.watchdog.PollOnce(11 * kSecond);
  f.watchdog.PollOnce(12 * kSecond);
  f.watchdog.PollOnce(13 * kSecond);
  CHECK(f.effects.recoveries.empty());
  CHECK(f.effects.dumps.size() == 1);  // the stall is reported once, at once
  CHECK_THROWS_AS(f.watchdog.PollOnce(15 * kSecond), ExitCalled);
  REQUIRE(f.effects.recoveries.size() == 1);
  CHECK(f.effects.recoveries[0].second ==
        "its verdict is mismatch, which a communicator with P2P off does not mend");
  CHECK(f.effects.holding_application_calls);  // NCCLGUARD_ACTION=exit, as without recovery
}

TEST_CASE(
    "in-process recovery: a verdict that settles to stuck_inside_nccl within two status intervals is "
    "recovered",
    "[watchdog][inprocess]") {
  ProbationFixture f(Action::kExit);
  f.Judge(VerdictKind::kRankNotJoined);  // a peer's status file from before the stall
  f.effects.recovery_outcome = {RecoveryOutcome::Result::kRecovered, "all 4 ranks are ready", 12 * kSecond};
  f.watchdog.PollOnce(11 * kSecond);
  CHECK(f.effects.recoveries.empty());
  f.Judge(VerdictKind::kStuckInsideNccl);  // the peer's next status file
  f.watchdog.PollOnce(12 * kSecond);
  REQUIRE(f.effects.recoveries.size() == 1);
  CHECK(f.effects.recoveries[0].second.empty());
  CHECK_FALSE(f.effects.holding_application_calls);
}

TEST_CASE("in-process recovery: a failure after the abort exits with the restart code whatever the action",
          "[watchdog][inprocess]") {
  ProbationFixture f(Action::kWarn);
  f.Judge(VerdictKind::kP2pSuspect);
  f.effects.recovery_outcome = {RecoveryOutcome::Result::kBroken, "the replay did not complete in time", 0};
  try {
    f.watchdog.PollOnce(11 * kSecond);
    FAIL("no exit");
  } catch (const ExitCalled& exit) {
    CHECK(exit.code == 75);
  }
}

TEST_CASE("in-process recovery: a stall outside probation, or with NCCLGUARD_RECOVER=off, goes as before",
          "[watchdog][inprocess]") {
  SECTION("outside probation") {
    ProbationFixture f(Action::kAbort);
    f.Judge(VerdictKind::kStuckInsideNccl);
    f.comm->probation[0].state.store(ProbationState::kReleased);  // #1 completed; a later op stalls
    f.watchdog.PollOnce(11 * kSecond);
    CHECK(f.effects.recoveries.empty());
    CHECK(f.effects.aborted.size() == 1);
  }
  SECTION("NCCLGUARD_RECOVER=off") {
    ProbationFixture f(Action::kAbort);
    f.config.recover = RecoverMode::kOff;
    f.Judge(VerdictKind::kStuckInsideNccl);
    f.watchdog.PollOnce(11 * kSecond);
    CHECK(f.effects.recoveries.empty());
    CHECK(f.effects.aborted.size() == 1);
  }
}
