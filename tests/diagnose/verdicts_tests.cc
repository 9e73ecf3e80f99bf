// The classifier: one case per verdict kind, from the field case it serves, with the message a
// user reads; the job directory reader (dumps and status files merged per process).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <tuple>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/diagnose/alive_rank.h"
#include "tests/support/process.h"
#include "watchdog/common/clock.h"
#include "watchdog/detect/stall_decision.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/dump.h"
#include "watchdog/report/dump_reader.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/report/op_signature.h"

namespace ncclguard {
namespace {

using testing::TemporaryDirectory;

constexpr std::int64_t kSecond = 1'000'000'000;
constexpr std::int64_t kMillisecond = 1'000'000;
constexpr std::int64_t kNow = 1'700'000'000 * kSecond;
const std::string kComm = "00000000000000aa";

OpSnapshot Op(std::uint64_t seq, const std::string& state) {
  OpSnapshot op;
  op.seq = seq;
  op.op = "AllReduce";
  op.dtype = "float32";
  op.count = 1024;
  op.bytes = 4096;
  op.reduction = "sum";
  // Every operation was enqueued a minute ago, give or take: whatever is unfinished is stuck.
  op.enqueue_ns = kNow - 60 * kSecond + static_cast<std::int64_t>(seq) * kMillisecond;
  op.state = state;
  return op;
}

// A rank of a 4-rank job on host node-1 that completed #1..#last_completed and enqueued up to
// #last_enqueued, seen just now and alive.
ProcessView Rank(int rank, std::uint64_t last_completed, std::uint64_t last_enqueued, int nranks = 4) {
  ProcessView process = testing::AliveRank("node-1", 1000 + rank, rank, kComm, nranks, kNow);
  CommSnapshot& comm = process.snapshot.comms[0];
  comm.last_enqueued = last_enqueued;
  comm.last_started = last_enqueued;
  comm.last_completed = last_completed;
  for (std::uint64_t seq = 1; seq <= last_enqueued; ++seq) {
    comm.ring.push_back(Op(seq, seq <= last_completed ? "completed" : "started"));
  }
  return process;
}

JobView Job(std::vector<ProcessView> processes) {
  JobView job;
  job.directory = "/jobs/test";
  job.now_ns = kNow;
  job.status_interval_seconds = 2;
  job.processes = std::move(processes);
  return job;
}

// The classifier with the shipped known-bad entries (the test's NCCLGUARD_KNOWN_BAD_FILE), as the
// watchdog and `ncclguard analyze` run it.
std::vector<Verdict> Classify(JobView job) { return ncclguard::Classify(job, ProcessKnownBad().entries); }

std::vector<std::string> Kinds(const std::vector<Verdict>& verdicts) {
  std::vector<std::string> kinds;
  for (const Verdict& verdict : verdicts) kinds.emplace_back(VerdictKindName(verdict.kind));
  return kinds;
}

TEST_CASE("S4: a rank that finished its loop early is named as not joined", "[verdicts]") {
  JobView job = Job({Rank(0, 41, 42), Rank(1, 41, 42), Rank(2, 41, 42), Rank(3, 41, 41)});
  job.processes[3].exited = true;
  job.processes[3].liveness = ProcessView::Liveness::kGone;
  const std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"rank_not_joined"});
  CHECK(verdicts[0].comm == kComm);
  CHECK(verdicts[0].seq == 42);
  CHECK(verdicts[0].ranks == std::vector<int>{3});
  CHECK(verdicts[0].message ==
        "rank 3 completed AllReduce #41 and issued nothing after; it finished its loop (exited normally) "
        "while ranks 0,1,2 wait in AllReduce #42 (float32 × 1024, sum) — uneven data across ranks, not a "
        "network fault");
  CHECK(verdicts[0].evidence["late_ranks"][0]["where"] == "finished");
  // It will never come: waiting for the hard timeout would only delay the restart.
  CHECK(ActOnTimeout(verdicts));
}

TEST_CASE("a rank that destroyed the communicator its peers wait in is named with it", "[verdicts]") {
  JobView job = Job({Rank(0, 30, 31), Rank(1, 30, 30), Rank(2, 30, 31), Rank(3, 30, 31)});
  job.processes[1].snapshot.comms[0].state = "destroyed";
  const std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"rank_not_joined"});
  CHECK(verdicts[0].ranks == std::vector<int>{1});
  CHECK(
      verdicts[0].message.starts_with("rank 1 completed AllReduce #30 and issued nothing after; its "
                                      "communicator is destroyed (the application "
                                      "closed it); it is alive"));
}

TEST_CASE("S5: a rank busy outside NCCL (a slow save) delays the action to the hard timeout", "[verdicts]") {
  JobView job = Job({Rank(0, 30, 30), Rank(1, 30, 31), Rank(2, 30, 31), Rank(3, 30, 31)});
  std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"rank_not_joined"});
  CHECK(verdicts[0].ranks == std::vector<int>{0});
  CHECK(verdicts[0].message ==
        "rank 0 completed AllReduce #30 and issued nothing after; it is alive and busy outside NCCL (e.g. "
        "saving a checkpoint or evaluating) while ranks 1,2,3 wait in AllReduce #31 (float32 × 1024, sum) — "
        "not a network fault");
  CHECK_FALSE(ActOnTimeout(verdicts));

  SECTION("inside another NCCL call it is no longer just busy") {
    job.processes[0].snapshot.in_nccl_call = "ncclAllGather";
    verdicts = Classify(job);
    REQUIRE(Kinds(verdicts) == std::vector<std::string>{"rank_not_joined"});
    CHECK(verdicts[0].message ==
          "rank 0 completed AllReduce #30 and issued nothing after; it is inside ncclAllGather (not in this "
          "operation) while ranks 1,2,3 wait in AllReduce #31 (float32 × 1024, sum) — not a network fault");
    CHECK(ActOnTimeout(verdicts));
  }
}

TEST_CASE("a stopped rank is said to be stopped, where its last status left it, not busy", "[verdicts]") {
  JobView job = Job({Rank(0, 30, 31), Rank(1, 30, 31), Rank(2, 30, 30), Rank(3, 30, 31)});
  job.processes[2].liveness = ProcessView::Liveness::kStopped;
  // Its status is as old as the stop: older than three intervals, yet it is not gone.
  job.processes[2].last_seen_ns = kNow - 9 * kSecond;
  job.processes[2].snapshot.time_ns = kNow - 9 * kSecond;
  std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"rank_not_joined"});
  CHECK(verdicts[0].ranks == std::vector<int>{2});
  CHECK(verdicts[0].message ==
        "rank 2 (pid 1002) is stopped (SIGSTOP, a debugger or a cgroup freezer: it runs nothing until it is "
        "continued); its last status, 9.0 s old, says it completed AllReduce #30 and issued nothing after "
        "while ranks 0,1,3 wait in AllReduce #31 (float32 × 1024, sum) — not a network fault");
  CHECK(verdicts[0].evidence["late_ranks"][0]["where"] == "stopped");
  // Once continued it comes back: as for a rank busy outside NCCL, the hard timeout decides.
  CHECK_FALSE(ActOnTimeout(verdicts));

  SECTION("stopped inside the operation its peers wait in: not a stuck transport") {
    job.processes[2].snapshot.comms[0].last_enqueued = 31;
    job.processes[2].snapshot.comms[0].ring.push_back(Op(31, "started"));
    verdicts = Classify(job);
    REQUIRE(Kinds(verdicts) == std::vector<std::string>{"rank_not_joined"});
    CHECK(verdicts[0].ranks == std::vector<int>{2});
    CHECK(
        absl::StrContains(verdicts[0].message,
                          "continued); its last status, 9.0 s old, says it was in AllReduce #31 while ranks "
                          "0,1,3 wait in AllReduce #31"));
    CHECK_FALSE(ActOnTimeout(verdicts));
  }
  SECTION("just continued: alive, its status not written since the stop") {
    job.processes[2].liveness = ProcessView::Liveness::kAlive;
    job.processes[2].snapshot.comms[0].last_enqueued = 31;
    job.processes[2].snapshot.comms[0].ring.push_back(Op(31, "started"));
    verdicts = Classify(job);
    // Not all four in #31 and stuck inside NCCL: what its old status says is no news of now.
    REQUIRE(Kinds(verdicts) == std::vector<std::string>{"rank_not_joined"});
    CHECK(absl::StrContains(verdicts[0].message, "rank 2 (pid 1002) has not run its watchdog for a while"));
    CHECK_FALSE(ActOnTimeout(verdicts));
  }
}

TEST_CASE("S5: a killed rank is named as dead with its last completed operation", "[verdicts]") {
  JobView job = Job({Rank(0, 31, 32), Rank(1, 31, 31), Rank(2, 31, 32), Rank(3, 31, 32)});
  job.processes[1].liveness = ProcessView::Liveness::kGone;
  const std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"rank_dead"});
  CHECK(verdicts[0].seq == 32);
  CHECK(verdicts[0].ranks == std::vector<int>{1});
  CHECK(verdicts[0].message ==
        "rank 1 (pid 1001 on host node-1) is gone: it completed AllReduce #31 and never entered #32; the "
        "others wait in AllReduce #32 (float32 × 1024, sum) — it was killed or crashed (e.g. out of memory), "
        "not a network fault");
  CHECK(ActOnTimeout(verdicts));
}

TEST_CASE("on another host, a stale status file means the process is gone", "[verdicts]") {
  JobView job = Job({Rank(0, 31, 32), Rank(1, 31, 31)});
  for (ProcessView& process : job.processes) process.snapshot.comms[0].nranks = 2;
  job.processes[1].liveness = ProcessView::Liveness::kUnknown;
  job.processes[1].host = "node-2";

  SECTION("stale: older than three status intervals") {
    job.processes[1].last_seen_ns = kNow - 20 * kSecond;
    const std::vector<Verdict> verdicts = Classify(job);
    REQUIRE(Kinds(verdicts) == std::vector<std::string>{"rank_dead"});
    CHECK(verdicts[0].message ==
          "rank 1 (pid 1001 on host node-2) stopped updating its status 20.0 s ago (presumed gone): it "
          "completed AllReduce #31 and never entered #32; the others wait in AllReduce #32 (float32 × 1024, "
          "sum) — it was killed or crashed (e.g. out of memory), not a network fault");
  }
  SECTION("fresh: taken as alive") {
    job.processes[1].last_seen_ns = kNow - 5 * kSecond;
    const std::vector<Verdict> verdicts = Classify(job);
    REQUIRE(Kinds(verdicts) == std::vector<std::string>{"rank_not_joined"});
    CHECK(verdicts[0].evidence["late_ranks"][0]["where"] == "busy_outside_nccl");
  }
}

TEST_CASE("a desync: the same seq with different counts shows both sides", "[verdicts]") {
  JobView job = Job({Rank(0, 25, 26), Rank(1, 25, 26), Rank(2, 25, 26), Rank(3, 25, 26)});
  OpSnapshot& odd = job.processes[2].snapshot.comms[0].ring.back();
  odd.count = 1049600;
  odd.bytes = 4 * 1049600;
  const std::vector<Verdict> verdicts = Classify(job);
  // Not also stuck_inside_nccl: the desync, not the transport, is why #26 never completes.
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"mismatch"});
  CHECK(verdicts[0].seq == 26);
  CHECK(verdicts[0].ranks == std::vector<int>{2});
  CHECK(
      verdicts[0].message ==
      "rank 2 issued AllReduce #26 with 1049600 float32 elements while ranks 0,1,3 issued 1024 — the ranks' "
      "calls are out of step (a desync in the application), not a network fault");
  CHECK(verdicts[0].evidence["sides"].size() == 2);

  SECTION("a different operation is described in full") {
    odd.count = 1024;
    odd.bytes = 4096;
    odd.op = "Broadcast";
    odd.reduction = "";
    odd.root = 1;
    const std::vector<Verdict> different = Classify(job);
    REQUIRE(Kinds(different) == std::vector<std::string>{"mismatch"});
    CHECK(different[0].message ==
          "rank 2 issued Broadcast #26 (float32 × 1024, root 1) while ranks 0,1,3 issued AllReduce #26 "
          "(float32 × 1024, sum) — the ranks' calls are out of step (a desync in the application), not a "
          "network fault");
  }
  SECTION("Send and Recv under one seq are not a desync") {
    job = Job({Rank(0, 1, 1, 2), Rank(1, 1, 1, 2)});
    job.processes[0].snapshot.comms[0].ring[0].op = "Send";
    job.processes[1].snapshot.comms[0].ring[0].op = "Recv";
    CHECK(Kinds(Classify(job)) == std::vector<std::string>{"healthy"});
  }
}

OpSnapshot BigBroadcast(std::uint64_t seq, const std::string& state) {
  OpSnapshot op = Op(seq, state);
  op.op = "Broadcast";
  op.count = 253440000;
  op.bytes = 4 * op.count;
  op.reduction = "";
  op.root = 0;
  return op;
}

TEST_CASE("S3: a broadcast that some ranks finished and one did not", "[verdicts]") {
  JobView job = Job({Rank(0, 1, 2, 3), Rank(1, 1, 2, 3), Rank(2, 0, 1, 3)});
  for (ProcessView& process : job.processes) {
    auto& ring = process.snapshot.comms[0].ring;
    ring[0] = BigBroadcast(1, ring[0].state);
  }
  const std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"stuck_inside_nccl"});
  CHECK(verdicts[0].seq == 1);
  CHECK(verdicts[0].ranks == std::vector<int>{2});
  CHECK(verdicts[0].message ==
        "Broadcast #1 (float32 × 253440000, root 0) — ranks 0,1 completed it and went on to AllReduce #2, "
        "rank 2 has "
        "not (waiting 60.0 s): "
        "stuck inside NCCL, a transport fault (network, P2P or driver), not the application");
  CHECK(ActOnTimeout(verdicts));
}

JobView EveryRankInside() {
  return Job({Rank(0, 11, 12), Rank(1, 11, 12), Rank(2, 11, 12), Rank(3, 11, 12)});
}

TEST_CASE("every rank entered and none completed: stuck inside NCCL", "[verdicts]") {
  const std::vector<Verdict> verdicts = Classify(EveryRankInside());
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"stuck_inside_nccl"});
  CHECK(verdicts[0].ranks == std::vector<int>{0, 1, 2, 3});
  CHECK(verdicts[0].message ==
        "all 4 ranks entered AllReduce #12 (float32 × 1024, sum) and none has completed it (waiting 60.0 s): "
        "stuck inside NCCL, a transport fault (network, P2P or driver), not the application");
  CHECK(ActOnTimeout(verdicts));
}

// Each rank's profile of the stuck AllReduce over a ring of 4, as NCCL's profiler leaves it when
// the link from `from` to `from`+1 stopped on channel 0: that send posted and not completed, its
// peer waiting for it, every other send of channel 0 waiting for its own GPU; channel 1 done.
void GiveRingProfiles(JobView& job, int from, bool over_network) {
  for (ProcessView& process : job.processes) {
    const int rank = process.snapshot.rank;
    OpProfileSnapshot op;
    op.func = "AllReduce";
    op.nccl_seq = 11;
    op.algo = "RING";
    op.proto = "SIMPLE";
    op.channels = 2;
    op.kernel_channels = {ChannelSnapshot{.channel = 0}, ChannelSnapshot{.channel = 1, .stopped = true}};
    if (over_network) {
      const int next = (rank + 1) % 4;
      const int previous = (rank + 3) % 4;
      op.proxy_ops.push_back(
          ProxyOpSnapshot{.channel = 0,
                          .peer = next,
                          .send = true,
                          .steps = 4,
                          .waiting_step = 0,
                          .waiting = rank == from ? StepWait::kSendNet : StepWait::kSendGpu});
      op.proxy_ops.push_back(ProxyOpSnapshot{
          .channel = 0, .peer = previous, .steps = 4, .waiting_step = 0, .waiting = StepWait::kRecvNet});
      op.proxy_ops.push_back(ProxyOpSnapshot{
          .channel = 1, .peer = next, .send = true, .steps = 4, .steps_done = 4, .stopped = true});
    }
    process.snapshot.comms[0].profile = {op};
  }
}

TEST_CASE("NCCL's profiler shows a send posted and never received: link_stalled names that link",
          "[verdicts]") {
  JobView job = EveryRankInside();
  GiveRingProfiles(job, 2, true);
  const std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"link_stalled"});
  CHECK(verdicts[0].ranks == std::vector<int>{2, 3});
  CHECK(verdicts[0].seq == 12);
  CHECK(verdicts[0].message.starts_with(
      "AllReduce #12 (float32 × 1024, sum) stopped on the link from rank 2 (host node-1) to rank 3 (host "
      "node-1) on "
      "channel 0: rank 2 sent step 0 of 4 and it was never received; ranks 0-3 wait behind it (RING/SIMPLE, "
      "from NCCL's profiler)"));
  const nlohmann::json& link = verdicts[0].evidence.at("links").at(0);
  CHECK(link.at("sender_waits") == "send_net_wait");
  CHECK(link.at("receiver_waits") == "recv_net_wait");
  CHECK(ActOnTimeout(verdicts));

  SECTION("a receiver that got the data is no stopped link") {
    job.processes[3].snapshot.comms[0].profile[0].proxy_ops[1].waiting = StepWait::kRecvGpu;
    CHECK(Kinds(Classify(job)) == std::vector<std::string>{"stuck_inside_nccl"});
  }
  SECTION("profiles of different operations say nothing together") {
    for (ProcessView& process : job.processes)
      process.snapshot.comms[0].profile[0].nccl_seq = process.snapshot.rank;
    CHECK(Kinds(Classify(job)) == std::vector<std::string>{"stuck_inside_nccl"});
  }
}

TEST_CASE("without proxy steps (P2P, NVLink) stuck_inside_nccl says which kernel channels never stopped",
          "[verdicts]") {
  JobView job = EveryRankInside();
  GiveRingProfiles(job, 2, false);
  const std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"stuck_inside_nccl"});
  CHECK(
      verdicts[0].message.ends_with("; NCCL's profiler: channel 0 never stopped on ranks 0-3 (no proxy "
                                    "operation is waiting on the network: a "
                                    "transfer inside the kernel, P2P, NVLink or shared memory, which NCCL "
                                    "does not report step by step, so which "
                                    "link is not known)"));
}

TEST_CASE("an operation in flight for a moment is not stuck", "[verdicts]") {
  JobView job = EveryRankInside();
  for (ProcessView& process : job.processes)
    process.snapshot.comms[0].ring.back().enqueue_ns = kNow - kSecond;
  CHECK(Kinds(Classify(job)) == std::vector<std::string>{"healthy"});
  SECTION("unless a watchdog reported it stalled") {
    job.processes[0].snapshot.stall = StallSnapshot{};
    job.processes[0].snapshot.stall->comm_id = kComm;
    CHECK(Kinds(Classify(job)) == std::vector<std::string>{"stuck_inside_nccl"});
  }
}

void GiveFacts(JobView& job, const std::string& gpu, const std::string& driver) {
  for (ProcessView& process : job.processes) {
    process.facts.driver_version = driver;
    process.facts.cuda.gpus.push_back(GpuFacts{.device = 0,
                                               .name = gpu,
                                               .pci_bus_id = "0000:01:00.0",
                                               .memory_free_bytes = -1,
                                               .memory_total_bytes = -1});
  }
}

TEST_CASE("S1/S2: stuck inside NCCL on GeForce GPUs with a known-bad driver is P2P-suspect", "[verdicts]") {
  JobView job = EveryRankInside();
  GiveFacts(job, "NVIDIA GeForce RTX 4090", "545.23.08");
  std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"p2p_suspect", "stuck_inside_nccl"});
  CHECK(verdicts[0].seq == 12);
  CHECK(verdicts[0].message ==
        "stuck inside NCCL with P2P in use on NVIDIA GeForce RTX 4090 GPUs with driver 545.23.08: P2P "
        "transfers "
        "are the likely cause; NCCL_P2P_DISABLE=1 avoids them");
  CHECK(ActOnTimeout(verdicts));

  SECTION("a P2P warning from NCCL is evidence on data-centre GPUs too") {
    job = EveryRankInside();
    GiveFacts(job, "NVIDIA A100-SXM4-80GB", "550.54.15");
    job.processes[2].snapshot.last_nccl_warning = "transport/p2p.cc:274 NCCL WARN failed to peer map";
    verdicts = Classify(job);
    REQUIRE(Kinds(verdicts) == std::vector<std::string>{"p2p_suspect", "stuck_inside_nccl"});
    CHECK(verdicts[0].message ==
          "stuck inside NCCL with P2P in use (NCCL warned: \"transport/p2p.cc:274 NCCL WARN failed to peer "
          "map\"): P2P transfers are the likely cause; NCCL_P2P_DISABLE=1 avoids them");
  }
  SECTION("no suspicion with P2P disabled, on workstation cards, or across hosts") {
    job.processes[1].facts.environment = {{"NCCL_P2P_DISABLE", "1"}};
    CHECK(Kinds(Classify(job)) == std::vector<std::string>{"stuck_inside_nccl"});
    job = EveryRankInside();
    GiveFacts(job, "NVIDIA RTX 4000 Ada Generation", "550.54.15");
    CHECK(Kinds(Classify(job)) == std::vector<std::string>{"stuck_inside_nccl"});
    job = EveryRankInside();
    GiveFacts(job, "NVIDIA GeForce RTX 3090", "550.54.15");
    for (ProcessView& process : job.processes) process.host = absl::StrCat("node-", process.pid);
    CHECK(Kinds(Classify(job)) == std::vector<std::string>{"stuck_inside_nccl"});
  }
}

TEST_CASE("the known-bad entries are the classifier's argument", "[verdicts]") {
  JobView job = EveryRankInside();
  GiveFacts(job, "NVIDIA GeForce RTX 4090", "545.23.08");
  CHECK(Kinds(ncclguard::Classify(job, {})) == std::vector<std::string>{"stuck_inside_nccl"});
  KnownBadEntry entry;
  entry.id = "a-driver";
  entry.match.driver_versions = {"545.23.08"};
  const std::vector<Verdict> verdicts = ncclguard::Classify(job, {entry});
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"p2p_suspect", "stuck_inside_nccl"});
  CHECK(verdicts[0].message ==
        "stuck inside NCCL with P2P in use with driver 545.23.08: P2P transfers are the likely cause; "
        "NCCL_P2P_DISABLE=1 avoids them");
  CHECK(verdicts[0].evidence["known_bad"][0]["id"] == "a-driver");
}

TEST_CASE("an asynchronous error names the rank and NCCL's warning", "[verdicts]") {
  JobView job = Job({Rank(0, 5, 5), Rank(1, 5, 5)});
  job.processes[1].snapshot.comms[0].async_error = "ncclRemoteError";
  job.processes[1].snapshot.last_nccl_warning = "NET/IB : Got completion from peer 10.0.0.2 with status=12";
  const std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"async_error"});
  CHECK(verdicts[0].ranks == std::vector<int>{1});
  CHECK(
      verdicts[0].message ==
      "rank 1 reported an asynchronous NCCL error on communicator 00000000000000aa: ncclRemoteError; NCCL's "
      "last warning: \"NET/IB : Got completion from peer 10.0.0.2 with status=12\"");
  CHECK(verdicts[0].evidence["ranks"][0]["last_nccl_warning"] ==
        "NET/IB : Got completion from peer 10.0.0.2 with status=12");
  CHECK(ActOnTimeout(verdicts));
}

ProcessView Initialising(int rank, std::int64_t since_ns) {
  ProcessView process = Rank(rank, 0, 0);
  process.snapshot.comms.clear();
  process.snapshot.pending_inits.push_back(PendingInitSnapshot{.comm_id = "00000000000000bb",
                                                               .api = "ncclCommInitRank",
                                                               .rank = rank,
                                                               .nranks = 4,
                                                               .start_ns = since_ns,
                                                               .result = ""});
  return process;
}

TEST_CASE("an initialisation that some ranks never joined", "[verdicts]") {
  JobView job = Job({Initialising(0, kNow - 30 * kSecond), Initialising(1, kNow - 30 * kSecond),
                     Initialising(2, kNow - 29 * kSecond)});
  std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"stuck_in_init"});
  CHECK(verdicts[0].comm == "00000000000000bb");
  CHECK(verdicts[0].ranks == std::vector<int>{3});
  CHECK(verdicts[0].message ==
        "the initialisation of communicator 00000000000000bb (ncclCommInitRank, 4 ranks) has waited 30.0 s: "
        "ranks 0,1,2 arrived, rank 3 did not — that rank never called ncclCommInitRank for it (not started, "
        "crashed before, or given another unique id)");
  CHECK(ActOnTimeout(verdicts));

  SECTION("shorter than a status interval: still starting") {
    for (ProcessView& process : job.processes) process.snapshot.pending_inits[0].start_ns = kNow - kSecond;
    CHECK(Kinds(Classify(job)) == std::vector<std::string>{"healthy"});
  }
  SECTION("all arrived: stuck only once a watchdog reported it") {
    job.processes.push_back(Initialising(3, kNow - 30 * kSecond));
    CHECK(Kinds(Classify(job)) == std::vector<std::string>{"healthy"});
    job.processes[0].snapshot.stall = StallSnapshot{};
    job.processes[0].snapshot.stall->kind = "init";
    job.processes[0].snapshot.stall->comm_id = "00000000000000bb";
    verdicts = Classify(job);
    REQUIRE(Kinds(verdicts) == std::vector<std::string>{"stuck_in_init"});
    CHECK(verdicts[0].ranks == std::vector<int>{0, 1, 2, 3});
    CHECK(
        verdicts[0].message ==
        "the initialisation of communicator 00000000000000bb (ncclCommInitRank, 4 ranks) has waited 30.0 s "
        "although all 4 ranks arrived: stuck inside NCCL's bootstrap or transport setup (network interfaces, "
        "firewall, NCCL_SOCKET_IFNAME)");
  }
}

TEST_CASE("a rank consistently late into collectives is a straggler", "[verdicts]") {
  JobView job = Job({Rank(0, 20, 20), Rank(1, 20, 20), Rank(2, 20, 20), Rank(3, 20, 20)});
  for (ProcessView& process : job.processes) {
    const int rank = process.snapshot.rank;
    for (OpSnapshot& op : process.snapshot.comms[0].ring) {
      const std::int64_t base = kNow - 100 * kSecond + static_cast<std::int64_t>(op.seq) * kSecond;
      const bool late = rank == 2 && op.seq != 20;
      op.enqueue_ns = base + (late ? 210 * kMillisecond : rank * kMillisecond);
    }
  }
  std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"straggler"});
  CHECK(verdicts[0].ranks == std::vector<int>{2});
  CHECK(verdicts[0].message ==
        "rank 2 enters collectives a median 210 ms after the others (latest in 19 of 20): it is slow outside "
        "NCCL (data loading, compute)");
  SECTION("not below 50 ms") {
    for (ProcessView& process : job.processes) {
      for (OpSnapshot& op : process.snapshot.comms[0].ring) {
        if (process.snapshot.rank == 2 && op.seq != 20) op.enqueue_ns -= 170 * kMillisecond;
      }
    }
    CHECK(Kinds(Classify(job)) == std::vector<std::string>{"healthy"});
  }
  SECTION("not from fewer than 10 operations") {
    for (ProcessView& process : job.processes) process.snapshot.comms[0].ring.resize(9);
    CHECK(Kinds(Classify(job)) == std::vector<std::string>{"healthy"});
  }
}

TEST_CASE("a job where everything completed is healthy", "[verdicts]") {
  const std::vector<Verdict> verdicts = Classify(Job({Rank(0, 50, 50), Rank(1, 50, 50)}));
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"healthy"});
  CHECK(verdicts[0].ranks.empty());
  CHECK(verdicts[0].message == "nothing wrong found in 2 processes");
}

TEST_CASE("verdicts come most important first", "[verdicts]") {
  // Communicator aa: rank 3 finished early. Communicator cc: a desync and an async error.
  JobView job = Job({Rank(0, 41, 42), Rank(1, 41, 42), Rank(2, 41, 42), Rank(3, 41, 41)});
  job.processes[3].exited = true;
  for (ProcessView& process : job.processes) {
    CommSnapshot other = Rank(process.snapshot.rank, 7, 8).snapshot.comms[0];
    other.id = "00000000000000cc";
    if (process.snapshot.rank == 1) other.ring.back().dtype = "bfloat16";
    if (process.snapshot.rank == 0) other.async_error = "ncclSystemError";
    process.snapshot.comms.push_back(std::move(other));
  }
  const std::vector<Verdict> verdicts = Classify(job);
  CHECK(Kinds(verdicts) == std::vector<std::string>{"async_error", "mismatch", "rank_not_joined"});
  CHECK(verdicts[1].comm == "00000000000000cc");
  CHECK(verdicts[2].comm == kComm);
}

TEST_CASE("the JSON of the verdicts carries every field", "[verdicts]") {
  JobView job = Job({Rank(0, 31, 32), Rank(1, 31, 31), Rank(2, 31, 32), Rank(3, 31, 32)});
  job.processes[1].liveness = ProcessView::Liveness::kGone;
  job.problems.push_back("dump-x.json: not JSON");
  const std::vector<Verdict> verdicts = Classify(job);
  const nlohmann::json document = nlohmann::json::parse(VerdictsToJson(job, verdicts).dump());
  REQUIRE(document["verdicts"].size() == verdicts.size());
  for (size_t i = 0; i < verdicts.size(); ++i) {
    const nlohmann::json& verdict = document["verdicts"][i];
    CHECK(verdict["kind"] == VerdictKindName(verdicts[i].kind));
    CHECK(verdict["comm"] == verdicts[i].comm);
    CHECK(verdict["seq"].get<std::uint64_t>() == verdicts[i].seq);
    CHECK(verdict["ranks"].get<std::vector<int>>() == verdicts[i].ranks);
    CHECK(verdict["message"] == verdicts[i].message);
    CHECK(verdict["evidence"] == verdicts[i].evidence);
  }
  CHECK(document["healthy"] == false);
  CHECK(document["directory"] == "/jobs/test");
  CHECK(document["time_ns"].get<std::int64_t>() == kNow);
  CHECK(document["problems"] == nlohmann::json::array({"dump-x.json: not JSON"}));
  REQUIRE(document["processes"].size() == 4);
  CHECK(document["processes"][1]["liveness"] == "gone");
  CHECK(document["processes"][1]["pid"] == 1001);
  CHECK(VerdictsToJson(Job({}), Classify(Job({})))["healthy"] == false);
  // An operation in the evidence: what was asked, its state and times.
  const nlohmann::json& op = document["verdicts"][0]["evidence"].at("op");
  std::vector<std::string> keys;
  for (const auto& [key, value] : op.items()) keys.push_back(key);
  CHECK(keys == std::vector<std::string>{"bytes", "coll_seq", "count", "dtype", "enqueue_ns", "op", "peer",
                                         "reduction", "root", "seq", "start_ns", "state"});
  CHECK(op["seq"] == 32);
}

// --- a stalled rank, whatever its peers did ---------------------------------------------------

// Ranks `stalled` of a 4-rank job report a stall in #12 (they completed #11); the others are
// built by `peer`, or left out when it returns nothing.
JobView StalledJob(const std::vector<int>& stalled,
                   const std::function<std::optional<ProcessView>(int)>& peer) {
  std::vector<ProcessView> processes;
  for (int rank = 0; rank < 4; ++rank) {
    if (std::find(stalled.begin(), stalled.end(), rank) == stalled.end()) {
      if (std::optional<ProcessView> process = peer(rank)) processes.push_back(*std::move(process));
      continue;
    }
    ProcessView process = Rank(rank, 11, 12);
    // Enqueued a moment ago: only the watchdog's report makes it stuck.
    process.snapshot.comms[0].ring.back().enqueue_ns = kNow - kSecond;
    process.snapshot.stall = StallSnapshot{.kind = "not_completed",
                                           .comm_id = kComm,
                                           .seq = 12,
                                           .seconds = 5,
                                           .message = "",
                                           .verdict = "",
                                           .verdict_message = ""};
    processes.push_back(std::move(process));
  }
  return Job(std::move(processes));
}

TEST_CASE("a stall is never healthy: the stalled ranks and what their peers did", "[verdicts][stall]") {
  const auto [stalled, stalled_text, peers_text, waits] =
      GENERATE(std::make_tuple(std::vector<int>{2}, "rank 2", "ranks 0,1,3", "has"),
               std::make_tuple(std::vector<int>{1, 2}, "ranks 1,2", "ranks 0,3", "have"));
  INFO(stalled_text);
  const std::vector<int> peers = stalled.size() == 1 ? std::vector<int>{0, 1, 3} : std::vector<int>{0, 3};

  SECTION("peers completed the operation and went on") {
    const std::vector<Verdict> verdicts =
        Classify(StalledJob(stalled, [](int rank) { return Rank(rank, 12, 13); }));
    REQUIRE(Kinds(verdicts) == std::vector<std::string>{"stuck_inside_nccl"});
    CHECK(verdicts[0].seq == 12);
    CHECK(verdicts[0].ranks == stalled);
    CHECK(verdicts[0].message.starts_with(fmt::format(
        "AllReduce #12 (float32 × 1024, sum) — {} completed it and went on to AllReduce #13, {} {} not",
        peers_text, stalled_text, waits)));
    CHECK(verdicts[0].message.ends_with(
        "unless the ranks' calls went out of step (a desync) before the oldest operation recorded: AllReduce "
        "cannot complete on some ranks only"));
  }
  SECTION("peers completed the operation and exited") {
    const std::vector<Verdict> verdicts = Classify(StalledJob(stalled, [](int rank) {
      ProcessView process = Rank(rank, 12, 12);
      process.exited = true;
      process.liveness = ProcessView::Liveness::kGone;
      return process;
    }));
    REQUIRE(Kinds(verdicts) == std::vector<std::string>{"stuck_inside_nccl"});
    CHECK(verdicts[0].ranks == stalled);
    CHECK(verdicts[0].message.starts_with(
        fmt::format("AllReduce #12 (float32 × 1024, sum) — {} completed it and "
                    "exited, {} {} not",
                    peers_text, stalled_text, waits)));
  }
  SECTION("peers are alive elsewhere and never issued it") {
    const std::vector<Verdict> verdicts = Classify(StalledJob(stalled, [](int rank) {
      ProcessView process = Rank(rank, 11, 11);
      if (rank == 0) process.snapshot.in_nccl_call = "ncclAllGather";
      return process;
    }));
    REQUIRE(Kinds(verdicts) == std::vector<std::string>{"rank_not_joined"});
    CHECK(verdicts[0].ranks == peers);
    CHECK(absl::StrContains(
        verdicts[0].message,
        "rank 0 completed AllReduce #11 and issued nothing after; it is inside ncclAllGather"));
    CHECK(absl::StrContains(verdicts[0].message,
                            fmt::format("; rank {} completed AllReduce #11 and issued nothing "
                                        "after; it is alive and busy outside NCCL",
                                        peers.back())));
    CHECK(absl::StrContains(verdicts[0].message, fmt::format("while {} {} in AllReduce #12", stalled_text,
                                                             stalled.size() == 1 ? "waits" : "wait")));
  }
  SECTION("peers left no record") {
    const std::vector<Verdict> verdicts =
        Classify(StalledJob(stalled, [](int) { return std::optional<ProcessView>(); }));
    REQUIRE(Kinds(verdicts) == std::vector<std::string>{"rank_not_joined"});
    CHECK(verdicts[0].ranks == peers);
    CHECK(absl::StrContains(verdicts[0].message, "rank 0 left no record of this communicator"));
    CHECK(absl::StrContains(verdicts[0].message, "never created the communicator, or closed it"));
    CHECK(absl::StrContains(verdicts[0].message, fmt::format("while {} {} in AllReduce #12", stalled_text,
                                                             stalled.size() == 1 ? "waits" : "wait")));
  }
}

TEST_CASE("a stall with a desync earlier names the desync and where the ranks are now", "[verdicts][stall]") {
  JobView job = StalledJob({2}, [](int rank) {
    ProcessView process = Rank(rank, 12, 12);
    process.exited = true;
    return process;
  });
  OpSnapshot& odd = job.processes[2].snapshot.comms[0].ring[4];
  odd.count = 2048;
  odd.bytes = 8192;
  const std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"mismatch"});
  CHECK(verdicts[0].seq == 5);
  CHECK(verdicts[0].message ==
        "rank 2 issued AllReduce #5 with 2048 float32 elements while ranks 0,1,3 issued 1024 — the ranks' "
        "calls are "
        "out of step (a desync in the application), not a network fault; since then rank 2 waits in "
        "AllReduce #12 "
        "(float32 × 1024, sum): ranks 0,1,3 completed it and exited");
  CHECK(verdicts[0].evidence["stalled_ranks"] == nlohmann::json({2}));
}

// --- operation signatures in status files --------------------------------------------------------

ProcessFacts Facts(const std::string& host, int pid);

// What a status file shows of a rank: its last completed operation and signatures of the latest
// ones, no ring.
void KeepOnlyStatus(ProcessView& process) {
  CommSnapshot& comm = process.snapshot.comms[0];
  comm.signatures_first_seq = comm.ring.front().seq;
  comm.signatures.clear();
  for (const OpSnapshot& op : comm.ring) comm.signatures.push_back(OperationSignature(op));
  std::erase_if(comm.ring, [&](const OpSnapshot& op) { return op.seq != comm.last_completed; });
}

TEST_CASE("a desync is found from the status files' operation signatures alone", "[verdicts][signatures]") {
  JobView job = Job({Rank(0, 40, 40), Rank(1, 40, 40), Rank(2, 39, 40), Rank(3, 40, 40)});
  for (ProcessView& process : job.processes) {
    process.exited = process.snapshot.rank != 2;
    process.snapshot.comms[0].ring[25].count = process.snapshot.rank == 2 ? 1049600 : 1024;
  }
  const std::uint32_t odd = OperationSignature(job.processes[2].snapshot.comms[0].ring[25]);
  const std::uint32_t usual = OperationSignature(job.processes[0].snapshot.comms[0].ring[25]);
  REQUIRE(odd != usual);

  SECTION("no ring anywhere: which rank's signature differs") {
    for (ProcessView& process : job.processes) KeepOnlyStatus(process);
    const std::vector<Verdict> verdicts = Classify(job);
    REQUIRE_FALSE(verdicts.empty());
    CHECK(verdicts[0].kind == VerdictKind::kMismatch);
    CHECK(verdicts[0].seq == 26);
    CHECK(verdicts[0].ranks == std::vector<int>{2});
    CHECK(verdicts[0].message.starts_with(fmt::format(
        "rank 2 issued #26 with signature {:08x} while ranks 0,1,3 issued #26 with signature {:08x} "
        "(operation signatures from status files: no record of the call itself) — the ranks' calls are "
        "out of step",
        odd, usual)));
    CHECK(verdicts[0].evidence["sides"][1]["signature"] == fmt::format("{:08x}", odd));
  }
  SECTION("the stalled rank's dump describes its side") {
    for (ProcessView& process : job.processes) {
      if (process.snapshot.rank != 2) KeepOnlyStatus(process);
    }
    const std::vector<Verdict> verdicts = Classify(job);
    REQUIRE_FALSE(verdicts.empty());
    CHECK(verdicts[0].kind == VerdictKind::kMismatch);
    CHECK(
        verdicts[0].message.starts_with(fmt::format("rank 2 issued AllReduce #26 (float32 × 1049600, sum) "
                                                    "while ranks 0,1,3 issued #26 with signature {:08x} "
                                                    "(operation signatures",
                                                    usual)));
  }
  SECTION("a status file that carries the operation itself says what differs") {
    for (ProcessView& process : job.processes) KeepOnlyStatus(process);
    OpSnapshot described = Op(26, "completed");
    job.processes[0].snapshot.comms[0].ring.insert(job.processes[0].snapshot.comms[0].ring.begin(),
                                                   described);
    described.count = 1049600;
    job.processes[2].snapshot.comms[0].ring.insert(job.processes[2].snapshot.comms[0].ring.begin(),
                                                   described);
    const std::vector<Verdict> verdicts = Classify(job);
    REQUIRE_FALSE(verdicts.empty());
    CHECK(verdicts[0].message.starts_with(
        "rank 2 issued AllReduce #26 with 1049600 float32 elements while ranks "
        "0,1,3 issued 1024 — the ranks' calls are out of step"));
  }
  SECTION("the same signatures everywhere are no mismatch") {
    job.processes[2].snapshot.comms[0].ring[25].count = 1024;
    for (ProcessView& process : job.processes) KeepOnlyStatus(process);
    for (const Verdict& verdict : Classify(job)) CHECK(verdict.kind != VerdictKind::kMismatch);
  }
}

TEST_CASE("status files carry the signatures of the latest operations, within a bounded size",
          "[verdicts][signatures][job_dir]") {
  TemporaryDirectory temporary;
  ProcessSnapshot snapshot;
  snapshot.time_ns = kNow;
  // Far more communicators than a process holds in practice, each with a full set of signatures.
  for (int i = 0; i < 100; ++i) {
    CommSnapshot comm = Rank(0, 100, 100).snapshot.comms[0];
    comm.id = fmt::format("{:016x}", i);
    comm.ring.clear();
    comm.signatures_first_seq = 37;
    for (std::uint64_t seq = 37; seq <= 100; ++seq)
      comm.signatures.push_back(OperationSignature(Op(seq, "completed")));
    comm.signatures[3] = kNoSignature;
    snapshot.comms.push_back(std::move(comm));
  }
  snapshot.comms[1].signatures_first_seq = 36;  // not ending at #last_enqueued: not what a writer writes
  REQUIRE(WriteStatus(temporary.path(), snapshot, Facts("node-1", 5)).ok());
  const std::string path = temporary.path() + "/status-node-1-5.json";
  std::ifstream file(path, std::ios::binary);
  const std::string content((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  CHECK(content.find_last_not_of(' ') < 48 * 1024);  // less the spaces it is padded with

  const absl::StatusOr<StatusScan> scan = ReadStatuses(temporary.path());
  REQUIRE(scan.ok());
  REQUIRE(scan->statuses.size() == 1);
  const std::vector<CommSnapshot>& comms = scan->statuses[0].snapshot.comms;
  REQUIRE(comms.size() == 100);
  CHECK(comms[0].signatures_first_seq == 37);
  CHECK(comms[0].signatures == snapshot.comms[0].signatures);
  CHECK(comms[1].signatures.empty());
  CHECK(comms[kMaxSignedCommunicators - 1].signatures.size() == kSignedOperations);
  CHECK(comms[kMaxSignedCommunicators].signatures.empty());
}

TEST_CASE("signatures: stable, blind to point-to-point, and read back only when well formed",
          "[verdicts][signatures]") {
  OpSnapshot op = Op(1, "completed");
  const std::uint32_t signature = OperationSignature(op);
  // FNV-1a of "AllReduce/float32/1024/-1/sum", as docs/dump-format.md says: every build agrees.
  CHECK(signature == 0x6e5627eb);
  CHECK(OperationSignature(Op(2, "started")) == signature);  // neither seq nor state nor time is signed
  op.root = 1;
  CHECK(OperationSignature(op) != signature);
  op.op = "Send";
  CHECK(OperationSignature(op) == kNoSignature);
  std::vector<std::uint32_t> parsed;
  CHECK(SignaturesFromHex(SignaturesToHex({signature, 0, 0xdeadbeef}), parsed));
  CHECK(parsed == std::vector<std::uint32_t>{signature, 0, 0xdeadbeef});
  CHECK_FALSE(SignaturesFromHex("0123456", parsed));
  CHECK_FALSE(SignaturesFromHex("0123456g", parsed));
  CHECK_FALSE(SignaturesFromHex(std::string(8 * (kSignedOperations + 1), '0'), parsed));
  CHECK(parsed.empty());
}

// --- nothing healthy about recorded trouble ------------------------------------------------------

TEST_CASE("an empty or unreadable job directory is unknown, not healthy", "[verdicts]") {
  JobView job = Job({});
  std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"unknown"});
  CHECK(verdicts[0].message ==
        "the job directory holds no readable status file or dump: no process of the job wrote there, or its "
        "files "
        "could not be written");
  job.problems = {"status-a-1.json: not JSON", "dump-b.json: too big"};
  verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"unknown"});
  CHECK(verdicts[0].message ==
        "the job directory holds no readable status file or dump (2 files could not be read; first: "
        "status-a-1.json: not JSON)");
  CHECK(ActOnTimeout(verdicts));
  CHECK(VerdictsToJson(job, verdicts)["healthy"] == false);
}

TEST_CASE("a call that returned an error is named", "[verdicts]") {
  JobView job = Job({Rank(0, 5, 5), Rank(1, 4, 5)});
  for (ProcessView& process : job.processes) process.snapshot.comms[0].nranks = 2;
  OpSnapshot& failed = job.processes[1].snapshot.comms[0].ring[4];
  failed.state = "failed";
  failed.result = 4;  // ncclInvalidArgument
  const std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"failed_call"});
  CHECK(verdicts[0].seq == 5);
  CHECK(verdicts[0].ranks == std::vector<int>{1});
  CHECK(verdicts[0].message ==
        "rank 1's AllReduce #5 (float32 × 1024, sum) returned ncclInvalidArgument on communicator "
        "00000000000000aa: "
        "NCCL refused or failed the call, and the application got the error");
}

TEST_CASE("a recorded stall or error that no rule explains is still named", "[verdicts]") {
  JobView job = Job({Rank(0, 5, 5), Rank(1, 5, 5)});
  for (ProcessView& process : job.processes) process.snapshot.comms[0].nranks = 2;
  REQUIRE(Kinds(Classify(job)) == std::vector<std::string>{"healthy"});

  SECTION("a stalled initialisation younger than the rules' status interval") {
    job.processes[1].snapshot.stall = StallSnapshot{.kind = "init",
                                                    .comm_id = "00000000000000bb",
                                                    .seq = 0,
                                                    .seconds = 30,
                                                    .message = "",
                                                    .verdict = "",
                                                    .verdict_message = ""};
    job.processes[1].snapshot.pending_inits.push_back(PendingInitSnapshot{.comm_id = "00000000000000bb",
                                                                          .api = "ncclCommInitRank",
                                                                          .rank = 1,
                                                                          .nranks = 2,
                                                                          .start_ns = kNow - kSecond,
                                                                          .result = ""});
    const std::vector<Verdict> verdicts = Classify(job);
    REQUIRE(Kinds(verdicts) == std::vector<std::string>{"unexplained"});
    CHECK(verdicts[0].ranks == std::vector<int>{1});
    CHECK(verdicts[0].message ==
          "rank 1 (pid 1001 on host node-1) reported a stall of an initialisation of communicator "
          "00000000000000bb, "
          "and the records in the job directory do not show why");
  }
  SECTION("a dump taken for an error") {
    job.processes[0].dump_reason = "error_return";
    job.processes[0].dump_file = "/jobs/test/dump-node-1-1000-0-1.json";
    const std::vector<Verdict> verdicts = Classify(job);
    REQUIRE(Kinds(verdicts) == std::vector<std::string>{"unexplained"});
    CHECK(verdicts[0].message ==
          "rank 0 (pid 1000 on host node-1) dumped after an NCCL call returned an error, and the records in "
          "the job "
          "directory do not show why (its dump: /jobs/test/dump-node-1-1000-0-1.json)");
  }
}

// --- a rank killed during its initialisation ------------------------------------------------------

TEST_CASE("a rank killed inside ncclCommInitRank is dead, not missing", "[verdicts]") {
  ProcessView killed = Initialising(1, kNow - 40 * kSecond);
  killed.snapshot.pending_inits[0].comm_id = kComm;
  killed.snapshot.time_ns = kNow - 39 * kSecond;  // its last status, shortly before kill -9
  killed.last_seen_ns = killed.snapshot.time_ns;
  killed.liveness = ProcessView::Liveness::kGone;

  SECTION("while the others wait in an operation") {
    JobView job = Job({Rank(0, 0, 1), killed, Rank(2, 0, 1), Rank(3, 0, 1)});
    const std::vector<Verdict> verdicts = Classify(job);
    REQUIRE_FALSE(verdicts.empty());
    CHECK(verdicts[0].kind == VerdictKind::kRankDead);
    CHECK(verdicts[0].ranks == std::vector<int>{1});
    CHECK(verdicts[0].message ==
          "rank 1 (pid 1001 on host node-1) is gone: it was still in ncclCommInitRank for this communicator "
          "and never "
          "entered #1; the others wait in AllReduce #1 (float32 × 1024, sum) — it was killed or crashed "
          "(e.g. out of "
          "memory), not a network fault");
    CHECK(verdicts[0].evidence["dead_ranks"][0]["in_init"] == "ncclCommInitRank");
  }
  SECTION("while the others wait in the initialisation") {
    JobView job = Job({Initialising(0, kNow - 40 * kSecond), killed, Initialising(2, kNow - 40 * kSecond),
                       Initialising(3, kNow - 40 * kSecond)});
    for (ProcessView& process : job.processes) process.snapshot.pending_inits[0].comm_id = kComm;
    const std::vector<Verdict> verdicts = Classify(job);
    REQUIRE(Kinds(verdicts) == std::vector<std::string>{"rank_dead"});
    CHECK(verdicts[0].ranks == std::vector<int>{1});
    CHECK(verdicts[0].message ==
          "rank 1 (pid 1001 on host node-1) is gone: it died in ncclCommInitRank for communicator "
          "00000000000000aa (4 "
          "ranks); ranks 0,2,3 wait for it — it was killed or crashed (e.g. out of memory), not a network "
          "fault");
    CHECK(ActOnTimeout(verdicts));

    // A launcher that ends the hung job stops every rank at once: no rank died on its own.
    for (ProcessView& process : job.processes) {
      process.liveness = ProcessView::Liveness::kGone;
      process.snapshot.time_ns = process.last_seen_ns = kNow - 10 * kSecond;
      process.snapshot.stall = StallSnapshot{.kind = "init",
                                             .comm_id = kComm,
                                             .seq = 0,
                                             .seconds = 30,
                                             .message = "",
                                             .verdict = "",
                                             .verdict_message = ""};
    }
    CHECK(Kinds(Classify(job)) == std::vector<std::string>{"stuck_in_init"});
  }
}

// --- a job killed as a whole -------------------------------------------------------------------

// Every process gone without an exit mark, its last record `ago` before kNow, as a launcher that
// killed the job then leaves it.
void KillAt(ProcessView& process, std::int64_t ago) {
  process.liveness = ProcessView::Liveness::kGone;
  process.snapshot.time_ns = process.last_seen_ns = kNow - ago;
}

// S5 with rank 1 saving a checkpoint, then the job ended by its time limit 30 s before kNow: the
// processes' last status files were written up to an interval apart, as each was rewritten.
JobView KilledWhileRank1Saves() {
  JobView job = Job({Rank(0, 30, 31), Rank(1, 30, 30), Rank(2, 30, 31), Rank(3, 30, 31)});
  const std::int64_t offsets[] = {400 * kMillisecond, 1900 * kMillisecond, 0, 1200 * kMillisecond};
  for (size_t i = 0; i < job.processes.size(); ++i) KillAt(job.processes[i], 30 * kSecond + offsets[i]);
  for (const int rank : {0, 2, 3}) {
    job.processes[rank].snapshot.stall = StallSnapshot{.kind = "not_completed",
                                                       .comm_id = kComm,
                                                       .seq = 31,
                                                       .seconds = 20,
                                                       .message = "",
                                                       .verdict = "rank_not_joined",
                                                       .verdict_message = ""};
  }
  return job;
}

TEST_CASE("a job killed as a whole is judged as it was at its end: the late rank is not dead",
          "[verdicts][job_end]") {
  const JobView job = KilledWhileRank1Saves();
  const std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"rank_not_joined"});
  CHECK(verdicts[0].ranks == std::vector<int>{1});
  CHECK(verdicts[0].message ==
        "rank 1 completed AllReduce #30 and issued nothing after; it is alive and busy outside NCCL (e.g. "
        "saving a checkpoint or evaluating) while ranks 0,2,3 wait in AllReduce #31 (float32 × 1024, sum) — "
        "not a network fault");
  CHECK(verdicts[0].evidence["late_ranks"][0]["where"] == "busy_outside_nccl");
  // Its status age is counted from the job's end, not from when the directory was read.
  CHECK(verdicts[0].evidence["late_ranks"][0]["status_age_seconds"].get<double>() == Approx(1.9));

  const std::optional<JobEnd> end = EndedTogether(job);
  REQUIRE(end.has_value());
  CHECK(end->processes == 4);
  CHECK(end->within_seconds == Approx(1.9));
  CHECK(end->ended_ns == kNow - 30 * kSecond);
  CHECK(end->killed_from_outside);
  CHECK(end->message ==
        "all 4 processes ended within 1.9 s of each other (at " + IsoTime(kNow - 30 * kSecond) +
            ") and none exited normally: the job was killed from outside (a launcher's or "
            "scheduler's time limit, or a signal to the whole job) after what the verdicts say, "
            "which judge each rank as it was then");
  const nlohmann::json document = VerdictsToJson(job, verdicts);
  CHECK(document["job_end"]["killed_from_outside"] == true);
  CHECK(document["job_end"]["processes"] == 4);
  CHECK(document["job_end"]["ended_ns"] == kNow - 30 * kSecond);
  CHECK(document["job_end"]["time"] == IsoTime(kNow - 30 * kSecond));
  CHECK(document["job_end"]["message"] == end->message);
  // The processes themselves are listed as they are now: gone.
  CHECK(document["processes"][1]["liveness"] == "gone");

  // As analyze does it: the view classified is the one described after. Classify says when the job
  // ended, and leaves what was found when it was read.
  JobView classified = job;
  CHECK(Kinds(ncclguard::Classify(classified, ProcessKnownBad().entries)) == Kinds(verdicts));
  CHECK(classified.ended_together_ns == kNow - 30 * kSecond);
  CHECK(classified.now_ns == job.now_ns);
  CHECK(classified.processes[1].liveness == ProcessView::Liveness::kGone);
  REQUIRE(EndedTogether(classified).has_value());
  CHECK(VerdictsToJson(classified, verdicts) == document);
  // Classified again once rank 1 is seen to have vanished long before: judged as read.
  KillAt(classified.processes[1], 90 * kSecond);
  CHECK(Kinds(ncclguard::Classify(classified, ProcessKnownBad().entries)) ==
        std::vector<std::string>{"rank_dead"});
  CHECK_FALSE(classified.ended_together_ns.has_value());

  SECTION("on other hosts, where stale status files are all there is") {
    JobView remote = job;
    for (ProcessView& process : remote.processes) {
      process.host = "node-2";
      process.liveness = ProcessView::Liveness::kUnknown;
    }
    REQUIRE(EndedTogether(remote).has_value());
    const std::vector<Verdict> remote_verdicts = Classify(remote);
    REQUIRE(Kinds(remote_verdicts) == std::vector<std::string>{"rank_not_joined"});
    CHECK(remote_verdicts[0].evidence["late_ranks"][0]["where"] == "busy_outside_nccl");
  }
}

TEST_CASE("a process that closed its communicators before it ended finished: an _exit is no kill",
          "[verdicts][job_end]") {
  // A forked worker that destroys its communicators and ends with os._exit writes no final status:
  // its last status says its communicators are closed (record/operations.cc writes it then).
  JobView job = KilledWhileRank1Saves();
  for (ProcessView& process : job.processes) process.snapshot.comms[0].state = "destroyed";
  job.processes[1].closed_nccl = true;
  CHECK_FALSE(EndedTogether(job).has_value());
  const std::vector<Verdict> verdicts = Classify(job);
  REQUIRE_FALSE(verdicts.empty());
  CHECK(verdicts[0].ranks == std::vector<int>{1});
  CHECK(VerdictKindName(verdicts[0].kind) != std::string("rank_dead"));
  CHECK(absl::StrContains(verdicts[0].message,
                          "it finished its loop (closed its communicators, then its process ended)"));
  CHECK(verdicts[0].evidence["late_ranks"][0]["where"] == "finished");

  SECTION("without its communicators closed, the same end is a kill from outside") {
    job.processes[1].closed_nccl = false;
    CHECK(EndedTogether(job).has_value());
  }
}

TEST_CASE("a rank that vanished while its peers lived on is dead, even when the rest was killed later",
          "[verdicts][job_end]") {
  JobView job = KilledWhileRank1Saves();
  const auto dead_verdict = [](const JobView& view) {
    const std::vector<Verdict> verdicts = Classify(view);
    REQUIRE_FALSE(verdicts.empty());
    CHECK(verdicts[0].ranks == std::vector<int>{1});
    return std::string(VerdictKindName(verdicts[0].kind));
  };

  SECTION("crashed long before the launcher's time limit ended the others") {
    KillAt(job.processes[1], 90 * kSecond);
    CHECK_FALSE(EndedTogether(job).has_value());
    CHECK(dead_verdict(job) == "rank_dead");
    CHECK(VerdictsToJson(job, Classify(job))["job_end"].is_null());
  }
  SECTION("the bound: one status interval and a second between the first and the last record") {
    // Interval 2 s: 2.9 s apart is one kill, 3.1 s apart is not.
    KillAt(job.processes[1], 32900 * kMillisecond);
    CHECK(EndedTogether(job).has_value());
    CHECK(dead_verdict(job) == "rank_not_joined");
    KillAt(job.processes[1], 33100 * kMillisecond);
    CHECK_FALSE(EndedTogether(job).has_value());
    CHECK(dead_verdict(job) == "rank_dead");
    // A stretched interval (a large job) stretches the bound with it.
    job.status_interval_seconds = 4;
    CHECK(EndedTogether(job).has_value());
  }
  SECTION("a process still alive, or one that exited normally, means the job was not killed as a whole") {
    job.processes[2].liveness = ProcessView::Liveness::kAlive;
    CHECK_FALSE(EndedTogether(job).has_value());
    CHECK(dead_verdict(job) == "rank_dead");
    job.processes[2].liveness = ProcessView::Liveness::kGone;
    job.processes[2].exited = true;
    CHECK_FALSE(EndedTogether(job).has_value());
  }
}

TEST_CASE("a single-process job that ended is judged at its end, and not said to be killed from outside",
          "[verdicts][job_end]") {
  // One process drives both ranks (one GPU each): rank 1's thread is busy while rank 0 waits.
  ProcessView process = Rank(0, 30, 31, 2);
  process.snapshot.comms.push_back(Rank(1, 30, 30, 2).snapshot.comms[0]);
  KillAt(process, 30 * kSecond);
  process.snapshot.stall = StallSnapshot{.kind = "not_completed",
                                         .comm_id = kComm,
                                         .seq = 31,
                                         .seconds = 20,
                                         .message = "",
                                         .verdict = "",
                                         .verdict_message = ""};
  const JobView job = Job({process});
  const std::vector<Verdict> verdicts = Classify(job);
  // Its ranks died together with the process: none of them vanished while the other lived.
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"rank_not_joined"});
  CHECK(verdicts[0].ranks == std::vector<int>{1});
  const std::optional<JobEnd> end = EndedTogether(job);
  REQUIRE(end.has_value());
  CHECK(end->processes == 1);
  CHECK(end->within_seconds == 0);
  CHECK_FALSE(end->killed_from_outside);
  CHECK(end->message ==
        "the job's only process (pid 1000 on host node-1) ended at " + IsoTime(kNow - 30 * kSecond) +
            " without exiting normally: killed from outside or crashed (one process alone cannot "
            "tell which); the verdicts judge its ranks as they were then");
  CHECK(VerdictsToJson(job, verdicts)["job_end"]["killed_from_outside"] == false);
}

// --- the job directory -------------------------------------------------------------------------

std::string OwnHost() {
  char host[256] = {};
  REQUIRE(gethostname(host, sizeof(host) - 1) == 0);
  return host;
}

ProcessFacts Facts(const std::string& host, int pid) {
  ProcessFacts facts;
  facts.host = host;
  facts.pid = pid;
  facts.driver_version = "545.23.08";
  facts.cuda.gpus.push_back(GpuFacts{.device = 0,
                                     .name = "NVIDIA GeForce RTX 4090",
                                     .pci_bus_id = "0000:01:00.0",
                                     .memory_free_bytes = 1 << 30,
                                     .memory_total_bytes = 2 << 30});
  facts.environment = {{"NCCL_DEBUG", "INFO"}};
  return facts;
}

TEST_CASE("a dump reads back as the snapshot and facts it was written from", "[verdicts][job_dir]") {
  ProcessSnapshot snapshot = Rank(2, 4, 5).snapshot;
  snapshot.reason = "stall";
  snapshot.comms[0].handle = 0xdeadbeef00ULL;
  snapshot.comms[0].ring[4].stream = 0x7f0000001234ULL;
  snapshot.comms[0].nccl_version = 22809;
  snapshot.stall = StallSnapshot{};
  snapshot.stall->kind = "not_completed";
  snapshot.stall->comm_id = kComm;
  snapshot.stall->seq = 5;
  snapshot.stall->message = "stalled";
  snapshot.pending_inits.push_back(PendingInitSnapshot{.comm_id = "00000000000000bb",
                                                       .api = "ncclCommSplit",
                                                       .rank = 1,
                                                       .nranks = 2,
                                                       .start_ns = kNow - kSecond,
                                                       .result = ""});
  snapshot.exiting = true;
  snapshot.last_nccl_warning = "warned";
  const absl::StatusOr<ParsedDump> parsed = ParseDump(FormatDump(snapshot, Facts("node-7", 77)));
  REQUIRE(parsed.ok());
  CHECK(parsed->facts.host == "node-7");
  CHECK(parsed->facts.pid == 77);
  CHECK(parsed->facts.driver_version == "545.23.08");
  REQUIRE(parsed->facts.cuda.gpus.size() == 1);
  CHECK(parsed->facts.cuda.gpus[0].name == "NVIDIA GeForce RTX 4090");
  CHECK(parsed->facts.environment == EnvironmentVariables{{"NCCL_DEBUG", "INFO"}});
  const ProcessSnapshot& read = parsed->snapshot;
  CHECK(read.reason == "stall");
  CHECK(read.time_ns == kNow);
  CHECK(read.rank == 2);
  REQUIRE(read.comms.size() == 1);
  CHECK(read.comms[0].handle == 0xdeadbeef00ULL);
  CHECK(read.comms[0].nccl_version == 22809);
  CHECK(read.comms[0].last_enqueued == 5);
  CHECK(read.comms[0].last_started == 5);
  CHECK(read.comms[0].last_completed == 4);
  REQUIRE(read.comms[0].ring.size() == 5);
  CHECK(read.comms[0].ring[4].stream == 0x7f0000001234ULL);
  CHECK(read.comms[0].ring[4].count == 1024);
  CHECK(read.comms[0].ring[4].state == "started");
  REQUIRE(read.stall.has_value());
  CHECK(read.stall->message == "stalled");
  REQUIRE(read.pending_inits.size() == 1);
  CHECK(read.pending_inits[0].api == "ncclCommSplit");
  CHECK(read.pending_inits[0].start_ns == kNow - kSecond);
  CHECK(read.exiting);
  CHECK(read.last_nccl_warning == "warned");
  CHECK_FALSE(ParseDump("{\"format\": \"something else\"}").ok());
  CHECK_FALSE(ParseDump("not json").ok());
}

TEST_CASE("status files carry pending initialisations and the exit mark", "[verdicts][job_dir]") {
  TemporaryDirectory temporary;
  ProcessSnapshot snapshot;
  snapshot.time_ns = kNow;
  snapshot.pending_inits.push_back(PendingInitSnapshot{.comm_id = "00000000000000bb",
                                                       .api = "ncclCommInitRank",
                                                       .rank = 3,
                                                       .nranks = 4,
                                                       .start_ns = kNow - kSecond,
                                                       .result = ""});
  snapshot.exiting = true;
  REQUIRE(WriteStatus(temporary.path(), snapshot, Facts("node-1", 5)).ok());
  const absl::StatusOr<StatusScan> scan = ReadStatuses(temporary.path());
  REQUIRE(scan.ok());
  REQUIRE(scan->statuses.size() == 1);
  const ProcessSnapshot& read = scan->statuses[0].snapshot;
  REQUIRE(read.pending_inits.size() == 1);
  CHECK(read.pending_inits[0].comm_id == "00000000000000bb");
  CHECK(read.pending_inits[0].rank == 3);
  CHECK(read.pending_inits[0].nranks == 4);
  CHECK(read.exiting);
}

TEST_CASE("reading a job directory merges each process's newest dump with its newer status",
          "[verdicts][job_dir]") {
  TemporaryDirectory temporary;
  const std::string host = OwnHost();
  const int own_pid = static_cast<int>(getpid());
  ProcessSnapshot older = Rank(0, 3, 4).snapshot;
  older.reason = "stall";
  older.time_ns = kNow - 20 * kSecond;
  ProcessSnapshot newer = Rank(0, 4, 5).snapshot;
  newer.reason = "peer_request";
  newer.time_ns = kNow - 10 * kSecond;
  REQUIRE(WriteDump(temporary.path(), newer, Facts(host, own_pid)).ok());
  REQUIRE(WriteDump(temporary.path(), older, Facts(host, own_pid)).ok());
  // Later, the status says #5 completed and #6 is under way.
  ProcessSnapshot status = Rank(0, 5, 6).snapshot;
  status.time_ns = kNow;
  status.in_nccl_call = "ncclAllReduce";
  REQUIRE(WriteStatus(temporary.path(), status, Facts(host, own_pid)).ok());

  const absl::StatusOr<JobView> job = ReadJobDirectory(temporary.path(), kNow, 2);
  REQUIRE(job.ok());
  CHECK(job->problems.empty());
  REQUIRE(job->processes.size() == 1);
  const ProcessView& process = job->processes[0];
  CHECK(process.host == host);
  CHECK(process.pid == own_pid);
  CHECK(process.dump_reason == "peer_request");
  CHECK(process.dump_file.find(temporary.path() + "/dump-") == 0);
  CHECK(process.status_file ==
        temporary.path() + "/status-" + SafeFileName(host) + "-" + std::to_string(own_pid) + ".json");
  CHECK(process.last_seen_ns == kNow);
  CHECK(process.liveness == ProcessView::Liveness::kAlive);
  CHECK_FALSE(process.exited);
  CHECK(process.facts.cuda.gpus.at(0).name == "NVIDIA GeForce RTX 4090");
  CHECK(process.snapshot.in_nccl_call == "ncclAllReduce");
  const CommSnapshot& comm = process.snapshot.comms.at(0);
  CHECK(comm.last_completed == 5);
  CHECK(comm.last_enqueued == 6);
  REQUIRE(comm.ring.size() == 6);  // the dump's five and the status's oldest unfinished
  CHECK(comm.ring[4].state == "completed");
  CHECK(comm.ring[4].count == 1024);  // the dump's full record is kept
  CHECK(comm.ring[5].seq == 6);
  CHECK(comm.ring[5].state == "started");
}

TEST_CASE("reading a job directory: liveness, exit marks and unreadable files", "[verdicts][job_dir]") {
  TemporaryDirectory temporary;
  const std::string host = OwnHost();
  // Above any pid_max Linux allows (2^22): no such process.
  const int absent_pid = (1 << 22) + 17;
  ProcessSnapshot snapshot = Rank(0, 1, 1).snapshot;
  REQUIRE(WriteStatus(temporary.path(), snapshot, Facts(host, static_cast<int>(getpid()))).ok());
  REQUIRE(WriteStatus(temporary.path(), snapshot, Facts(host, absent_pid)).ok());
  REQUIRE(WriteStatus(temporary.path(), snapshot, Facts("elsewhere", 12)).ok());
  ProcessSnapshot leaving = snapshot;
  leaving.reason = "exit";
  REQUIRE(WriteDump(temporary.path(), leaving, Facts("elsewhere", 13)).ok());
  std::ofstream(temporary.path() + "/dump-broken-1-0-1.json") << "{not json";
  std::ofstream(temporary.path() + "/status-broken-2.json") << "[]";

  const absl::StatusOr<JobView> job = ReadJobDirectory(temporary.path(), kNow, 2);
  REQUIRE(job.ok());
  std::map<int, const ProcessView*> by_pid;
  for (const ProcessView& process : job->processes) by_pid[process.pid] = &process;
  REQUIRE(by_pid.size() == 4);
  CHECK(by_pid.at(static_cast<int>(getpid()))->liveness == ProcessView::Liveness::kAlive);
  CHECK(by_pid.at(absent_pid)->liveness == ProcessView::Liveness::kGone);
  CHECK(by_pid.at(12)->liveness == ProcessView::Liveness::kUnknown);
  CHECK_FALSE(by_pid.at(12)->exited);
  CHECK(by_pid.at(13)->exited);
  REQUIRE(job->problems.size() == 2);
  CHECK(job->problems[0].find("dump-broken-1-0-1.json: ") == 0);
  CHECK(job->problems[1].find("status-broken-2.json: ") == 0);

  CHECK_FALSE(ReadJobDirectory(temporary.path() + "/missing", kNow, 2).ok());
}

TEST_CASE("reading a job directory: a zombie process is gone", "[verdicts][job_dir][job_end]") {
  TemporaryDirectory temporary;
  // A child that ended and that nobody reaped yet: kill() still finds it.
  const pid_t zombie = fork();
  REQUIRE(zombie >= 0);
  if (zombie == 0) _exit(0);
  std::string state;
  for (int tries = 0; tries < 1000 && state != "Z"; ++tries) {
    std::ifstream stat("/proc/" + std::to_string(zombie) + "/stat");
    std::string line;
    std::getline(stat, line);
    state = line.size() > line.rfind(')') + 2 ? line.substr(line.rfind(')') + 2, 1) : "";
    if (state != "Z") usleep(1000);
  }
  REQUIRE(state == "Z");
  REQUIRE(kill(zombie, 0) == 0);
  REQUIRE(WriteStatus(temporary.path(), Rank(0, 1, 1).snapshot, Facts(OwnHost(), zombie)).ok());
  const absl::StatusOr<JobView> job = ReadJobDirectory(temporary.path(), kNow, 2);
  int status = 0;
  waitpid(zombie, &status, 0);
  REQUIRE(job.ok());
  REQUIRE(job->processes.size() == 1);
  CHECK(job->processes[0].liveness == ProcessView::Liveness::kGone);
}

// NCCL refused every rank's ncclCommInitRank (a bad setting): each rank dumped the failure before
// the call returned, then exited.
TEST_CASE("every rank's failed initialisation is one failed_call with NCCL's warning, not unexplained",
          "[verdicts][job_dir][failed_init]") {
  TemporaryDirectory temporary;
  const std::string warning = "NCCLEMU_FAULTS: unknown key 'sq' for hang in 'hang:rank=1,sq=3'";
  const int nranks = 3;
  for (int rank = 0; rank < nranks; ++rank) {
    ProcessSnapshot failing;
    failing.reason = "error_return";
    failing.time_ns = kNow - 2 * kSecond;
    failing.rank = rank;
    failing.last_nccl_warning = warning;
    failing.pending_inits.push_back(PendingInitSnapshot{.comm_id = kComm,
                                                        .api = "ncclCommInitRank",
                                                        .rank = rank,
                                                        .nranks = nranks,
                                                        .start_ns = kNow - 3 * kSecond,
                                                        .result = "ncclInvalidArgument"});
    const int pid = (1 << 22) + 100 + rank;  // no such process
    REQUIRE(WriteDump(temporary.path(), failing, Facts("elsewhere", pid)).ok());
    if (rank == 2) continue;  // its dump is its last record
    ProcessSnapshot exiting = failing;
    exiting.reason = "";
    exiting.time_ns = kNow - kSecond;
    exiting.pending_inits.clear();
    exiting.exiting = true;
    REQUIRE(WriteStatus(temporary.path(), exiting, Facts("elsewhere", pid)).ok());
  }
  const absl::StatusOr<JobView> job = ReadJobDirectory(temporary.path(), kNow, 2);
  REQUIRE(job.ok());
  REQUIRE(job->processes.size() == nranks);
  for (const ProcessView& process : job->processes) {
    REQUIRE(process.failed_inits.size() == 1);
    CHECK(process.failed_inits[0].api == "ncclCommInitRank");
    // No longer an initialisation in progress: nothing waits in it.
    CHECK(process.snapshot.pending_inits.empty());
  }
  const std::vector<Verdict> verdicts = Classify(*job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"failed_call"});
  CHECK(verdicts[0].comm == kComm);
  CHECK(verdicts[0].ranks == std::vector<int>{0, 1, 2});
  CHECK(verdicts[0].message ==
        "every rank's ncclCommInitRank for communicator 00000000000000aa (3 ranks) failed (ranks 0,1,2); "
        "NCCL's "
        "warning: \"" +
            warning + "\" — NCCL refused the initialisation and the application got ncclInvalidArgument");
  CHECK(verdicts[0].evidence["results"] == nlohmann::json::array({"ncclInvalidArgument"}));
  CHECK(verdicts[0].evidence["api"] == "ncclCommInitRank");
  CHECK(verdicts[0].evidence["every_rank"] == true);
  CHECK(verdicts[0].evidence["inits"].size() == 3);
  CHECK(verdicts[0].evidence["inits"][1]["last_nccl_warning"] == warning);

  SECTION("on some ranks only, each with its own warning") {
    JobView some = *job;
    some.processes.pop_back();
    some.processes[1].snapshot.last_nccl_warning = "";
    const std::vector<Verdict> partial = Classify(some);
    REQUIRE(Kinds(partial) == std::vector<std::string>{"failed_call"});
    CHECK(
        partial[0].message.starts_with("ncclCommInitRank for communicator 00000000000000aa (3 ranks) failed "
                                       "on ranks 0,1; NCCL's warnings: rank 0: "
                                       "\"" +
                                       warning + "\"; rank 1: no warning text — "));
    CHECK(partial[0].evidence["every_rank"] == false);
  }
  SECTION("dumps of earlier builds do not name the error: the log lines do") {
    JobView older = *job;
    for (ProcessView& process : older.processes) process.failed_inits[0].result.clear();
    const std::vector<Verdict> unnamed = Classify(older);
    REQUIRE(Kinds(unnamed) == std::vector<std::string>{"failed_call"});
    CHECK(absl::StrContains(unnamed[0].message,
                            "the application got the error (its name is in each rank's log line"));
  }
}

TEST_CASE(
    "a dump for a failed call before any communicator, from a build that did not name the initialisation",
    "[verdicts][failed_init]") {
  JobView job = Job({Rank(0, 0, 0), Rank(1, 0, 0)});
  for (ProcessView& process : job.processes) {
    process.snapshot.comms.clear();
    process.dump_reason = "error_return";
    process.snapshot.last_nccl_warning = "bad config";
  }
  const std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"failed_call"});
  CHECK(verdicts[0].comm.empty());
  CHECK(
      verdicts[0].message.starts_with("every rank's initialisation failed (ranks 0,1): an NCCL call returned "
                                      "an error before any of them had a "
                                      "communicator; NCCL's warning: \"bad config\" — "));
}

TEST_CASE("every verdict kind is named as docs/verdicts.md names it, and read back from its name",
          "[verdicts]") {
  const std::vector<std::string> names{"async_error", "p2p_suspect",     "stuck_in_init", "rank_dead",
                                       "mismatch",    "rank_not_joined", "link_stalled",  "stuck_inside_nccl",
                                       "failed_call", "unexplained",     "straggler",     "slow_link",
                                       "slow_rank",   "healthy",         "unknown"};
  for (int kind = 0; kind <= static_cast<int>(VerdictKind::kUnknown); ++kind) {
    const std::string name(VerdictKindName(static_cast<VerdictKind>(kind)));
    CHECK(name == names[kind]);
    CHECK(ParseVerdictKind(name) == static_cast<VerdictKind>(kind));
  }
  CHECK_FALSE(ParseVerdictKind("").has_value());
  CHECK_FALSE(ParseVerdictKind("P2P_SUSPECT").has_value());
}

}  // namespace
// Where a late rank is, from the stacks of the dump its peers' request made it write.
namespace {

FrameSnapshot PythonFrame(const std::string& function, int line) {
  FrameSnapshot frame;
  frame.function = function;
  frame.file = "train.py";
  frame.line = line;
  return frame;
}

ThreadsSnapshot SavingCheckpoint(std::int64_t taken_ns, std::int64_t tid) {
  ThreadSnapshot thread;
  thread.tid = tid;
  thread.name = "python3";
  thread.state = "sleeping";
  thread.syscall = "clock_nanosleep";
  thread.blocked_seconds = 41;
  thread.python = {PythonFrame("save_checkpoint", 88), PythonFrame("<module>", 120)};
  ThreadsSnapshot threads;
  threads.time_ns = taken_ns;
  threads.total = 1;
  threads.threads = {thread};
  return threads;
}

}  // namespace

TEST_CASE("S5: a late rank's stacks say where it is, in the verdict and its evidence", "[verdicts]") {
  JobView job = Job({Rank(0, 10, 11), Rank(1, 10, 10), Rank(2, 10, 11), Rank(3, 10, 11)});
  ProcessView& late = job.processes[1];
  OpSnapshot& last = late.snapshot.comms[0].ring.back();
  last.host_thread = 4242;
  last.end_ns = last.enqueue_ns + kMillisecond;
  late.snapshot.threads = SavingCheckpoint(kNow - kSecond, 4242);
  const std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"rank_not_joined"});
  CHECK(absl::StrContains(
      verdicts[0].message,
      "rank 1 completed AllReduce #10 and issued nothing after; it is alive and busy outside "
      "NCCL: in `save_checkpoint` (train.py:88), sleeping for 41 s at its dump, 1.0 s before while ranks "
      "0,2,3 "
      "wait"));
  const nlohmann::json& location = verdicts[0].evidence["late_ranks"][0]["location"];
  CHECK(location["function"] == "save_checkpoint");
  CHECK(location["line"] == 88);
  CHECK(location["tid"] == 4242);
  CHECK(location["stack"][0] == "py save_checkpoint (train.py:88)");
  // Still a late rank that will come back: the watchdog waits for the hard timeout.
  CHECK_FALSE(ActOnTimeout(verdicts));
}

TEST_CASE("stacks taken before a rank left its last operation do not say where it is now", "[verdicts]") {
  JobView job = Job({Rank(0, 10, 11), Rank(1, 10, 10), Rank(2, 10, 11), Rank(3, 10, 11)});
  ProcessView& late = job.processes[1];
  OpSnapshot& last = late.snapshot.comms[0].ring.back();
  last.end_ns = last.enqueue_ns + kMillisecond;
  late.snapshot.threads = SavingCheckpoint(last.enqueue_ns - kSecond, late.pid);
  const std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"rank_not_joined"});
  CHECK_FALSE(absl::StrContains(verdicts[0].message, "save_checkpoint"));
  CHECK(
      absl::StrContains(verdicts[0].message, "it is alive and busy outside NCCL (e.g. saving a checkpoint"));
  CHECK_FALSE(verdicts[0].evidence["late_ranks"][0].contains("location"));
}

TEST_CASE("a dead rank's last dump says where it was", "[verdicts]") {
  JobView job = Job({Rank(0, 10, 11), Rank(1, 10, 10), Rank(2, 10, 11), Rank(3, 10, 11)});
  ProcessView& dead = job.processes[1];
  dead.liveness = ProcessView::Liveness::kGone;
  OpSnapshot& last = dead.snapshot.comms[0].ring.back();
  last.end_ns = last.enqueue_ns + kMillisecond;
  dead.snapshot.threads = SavingCheckpoint(kNow - 5 * kSecond, dead.pid);
  const std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(!verdicts.empty());
  CHECK(Kinds(verdicts)[0] == "rank_dead");
  CHECK(
      absl::StrContains(verdicts[0].message, "(its last dump showed it in `save_checkpoint` (train.py:88)"));
}

TEST_CASE("a late rank's dump taken just after it went to sleep says so, not that it slept 0.0 s",
          "[verdicts]") {
  JobView job = Job({Rank(0, 10, 11), Rank(1, 10, 10), Rank(2, 10, 11), Rank(3, 10, 11)});
  ProcessView& late = job.processes[1];
  OpSnapshot& last = late.snapshot.comms[0].ring.back();
  last.host_thread = 4242;
  last.end_ns = last.enqueue_ns + kMillisecond;
  // A straggler dumps at its peers' request of the last stall, just as it begins its next step.
  ThreadsSnapshot threads = SavingCheckpoint(kNow - 9 * kSecond, 4242);
  threads.threads[0].blocked_seconds = 0.01;
  late.snapshot.threads = threads;
  std::vector<Verdict> verdicts = Classify(job);
  CHECK_FALSE(absl::StrContains(verdicts[0].message, "sleeping for 0.0 s"));
  CHECK(absl::StrContains(
      verdicts[0].message,
      "in `save_checkpoint` (train.py:88), sleeping for under 0.1 s at its dump, 9.0 s before"));
  SECTION("a fresh dump says how long as of now") {
    late.snapshot.threads->time_ns = kNow - 100 * kMillisecond;
    late.snapshot.threads->threads[0].blocked_seconds = 6;
    verdicts = Classify(job);
    CHECK(absl::StrContains(verdicts[0].message,
                            "in `save_checkpoint` (train.py:88), sleeping for 6.0 s while"));
  }
}

TEST_CASE("an initialisation that a rank never joined says where that rank is", "[verdicts]") {
  // Rank 3 is a process of the job (its first communicator exists) that has not called the
  // initialisation of the second: it loads data, and dumped at its peers' request.
  ProcessView busy = Rank(3, 5, 5);
  busy.snapshot.threads = SavingCheckpoint(kNow - kSecond, busy.pid);
  JobView job = Job({Initialising(0, kNow - 30 * kSecond), Initialising(1, kNow - 30 * kSecond),
                     Initialising(2, kNow - 29 * kSecond), busy});
  const std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(!verdicts.empty());
  const auto init = std::find_if(verdicts.begin(), verdicts.end(), [](const Verdict& verdict) {
    return verdict.kind == VerdictKind::kStuckInInit;
  });
  REQUIRE(init != verdicts.end());
  CHECK(init->ranks == std::vector<int>{3});
  CHECK(
      absl::StrContains(init->message,
                        "; rank 3 (pid 1003) is in `save_checkpoint` (train.py:88), sleeping for 41 s at its "
                        "dump, 1.0 s before"));
  CHECK(init->evidence["missing_whereabouts"][0]["rank"] == 3);

  SECTION("stacks older than the initialisation say nothing") {
    job.processes[3].snapshot.threads->time_ns = kNow - 60 * kSecond;
    const std::vector<Verdict> older = Classify(job);
    for (const Verdict& verdict : older) CHECK_FALSE(absl::StrContains(verdict.message, "save_checkpoint"));
  }
}

// ---------------------------------------------------------------------------------------------
// A partial read: what a deadline or a cap left unread is never taken for absent

// What a read that the deadline stopped left out: `processes` processes, one status file each.
NotRead DeadlinePassed(std::size_t processes) {
  return NotRead{.files = processes,
                 .processes = processes,
                 .listing_cut_short = false,
                 .first_files = {"status-node-1-1002.json"},
                 .why = "the deadline passed"};
}

TEST_CASE("a rank whose files were not read is never named as missing", "[verdicts][partial]") {
  // Ranks 0 and 1 wait in #42; ranks 2 and 3 left files that were not read.
  JobView job = Job({Rank(0, 41, 42), Rank(1, 41, 42)});
  SECTION("all read: the ranks with no record did not join") {
    const std::vector<Verdict> verdicts = Classify(job);
    REQUIRE(Kinds(verdicts) == std::vector<std::string>{"rank_not_joined"});
    CHECK(verdicts[0].ranks == std::vector<int>{2, 3});
    CHECK(VerdictsToJson(job, verdicts)["verdicts"][0]["partial_read"].is_null());
  }
  SECTION("not read: unknown, naming nobody, saying what it rests on") {
    job.not_read = DeadlinePassed(2);
    const std::vector<Verdict> verdicts = Classify(job);
    REQUIRE(Kinds(verdicts) == std::vector<std::string>{"unknown"});
    CHECK(verdicts[0].comm == kComm);
    CHECK(verdicts[0].seq == 42);
    CHECK(verdicts[0].ranks.empty());
    CHECK(
        verdicts[0].message ==
        "ranks 0,1 wait in AllReduce #42 (float32 × 1024, sum); ranks 2,3 are not among the processes read, "
        "so which rank the others wait for is not known (read the job directory again with more time: "
        "ncclguard analyze --deadline SECONDS) [this rests on 2 of 4 processes: the files of 2 were not read "
        "(the deadline passed)]");
    CHECK(verdicts[0].evidence["not_read_ranks"] == nlohmann::json::array({2, 3}));
    // The stalls the waiting ranks reported are what the verdict describes.
    CHECK(ActOnTimeout(verdicts));
    const nlohmann::json document = VerdictsToJson(job, verdicts);
    CHECK(document["verdicts"][0]["partial_read"] == nlohmann::json{{"processes_read", 2},
                                                                    {"processes_not_read", 2},
                                                                    {"files_not_read", 2},
                                                                    {"listing_cut_short", false}});
    CHECK(document["not_read"]["files"] == 2);
    CHECK(document["not_read"]["why"] == "the deadline passed");
    CHECK(document["not_read"]["first_files"] == nlohmann::json::array({"status-node-1-1002.json"}));
  }
  SECTION("a late rank that was read is named; those not read are only said") {
    job.processes.push_back(Rank(2, 41, 41));
    job.not_read = DeadlinePassed(1);
    const std::vector<Verdict> verdicts = Classify(job);
    REQUIRE(Kinds(verdicts) == std::vector<std::string>{"rank_not_joined"});
    CHECK(verdicts[0].ranks == std::vector<int>{2});
    CHECK(absl::StrContains(
        verdicts[0].message,
        "; rank 3 is not among the processes read and may be late too [this rests on 3 of 4 "
        "processes: the files of 1 were not read (the deadline passed)]"));
    CHECK(verdicts[0].evidence["not_read_ranks"] == nlohmann::json::array({3}));
    // Whether rank 3 is alive is not known: the late rank's being busy is no reason to wait longer.
    CHECK_FALSE(verdicts[0].late_ranks_busy_outside_nccl);
  }
  SECTION("dumps not read, every process read: the verdict stands, and says so") {
    job.processes.push_back(Rank(2, 41, 41));
    job.processes.push_back(Rank(3, 41, 42));
    job.not_read = NotRead{.files = 3,
                           .processes = 0,
                           .listing_cut_short = false,
                           .first_files = {},
                           .why = "the deadline passed"};
    const std::vector<Verdict> verdicts = Classify(job);
    REQUIRE(Kinds(verdicts) == std::vector<std::string>{"rank_not_joined"});
    CHECK(verdicts[0].ranks == std::vector<int>{2});
    CHECK(absl::EndsWith(
        verdicts[0].message,
        " [this rests on every process but not every file: 3 files were not read (the deadline "
        "passed)]"));
  }
}

TEST_CASE("a job read in part is not called healthy", "[verdicts][partial]") {
  JobView job = Job({Rank(0, 50, 50), Rank(1, 50, 50)});
  job.not_read = DeadlinePassed(2);
  std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"unknown"});
  CHECK(verdicts[0].message ==
        "nothing wrong found in the 2 processes read, but not every process was read [this rests on 2 of 4 "
        "processes: the files of 2 were not read (the deadline passed)]");
  CHECK(VerdictsToJson(job, verdicts)["healthy"] == false);

  job.processes.clear();
  job.not_read = DeadlinePassed(4);
  verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"unknown"});
  CHECK(absl::StartsWith(verdicts[0].message,
                         "no status file or dump of the job directory was read: 4 files were not read (the "
                         "deadline passed)"));
}

TEST_CASE("an initialisation some ranks of which were not read names none as missing",
          "[verdicts][partial]") {
  JobView job = Job({Initialising(0, kNow - 30 * kSecond), Initialising(1, kNow - 30 * kSecond),
                     Initialising(2, kNow - 29 * kSecond)});
  job.not_read = DeadlinePassed(1);
  const std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(Kinds(verdicts) == std::vector<std::string>{"stuck_in_init"});
  CHECK(verdicts[0].ranks.empty());
  CHECK(absl::StartsWith(
      verdicts[0].message,
      "the initialisation of communicator 00000000000000bb (ncclCommInitRank, 4 ranks) has waited "
      "30.0 s: ranks 0,1,2 arrived; rank 3 is not among the processes read, so whether it called "
      "ncclCommInitRank is not known"));
  CHECK(verdicts[0].evidence["missing_ranks"].empty());
  CHECK(verdicts[0].evidence["not_read_ranks"] == nlohmann::json::array({3}));
}

// Four ranks of a job, one status file each (status-<host>-<1000 + rank>.json, in rank order):
// ranks 0, 1 and 3 wait in #42, rank `late` completed #41 only.
void WriteWaitingJob(const std::string& job_dir, int late, int ranks = 4) {
  for (int rank = 0; rank < ranks; ++rank) {
    ProcessSnapshot snapshot = Rank(rank, 41, rank == late ? 41 : 42, ranks).snapshot;
    if (rank != late) {
      snapshot.stall = StallSnapshot{};
      snapshot.stall->kind = "not_completed";
      snapshot.stall->comm_id = kComm;
      snapshot.stall->seq = 42;
    }
    REQUIRE(WriteStatus(job_dir, snapshot, Facts("node-1", 1000 + rank)).ok());
  }
}

// The job directory read within `limits`, as `ncclguard analyze` reads it at kNow.
JobView ReadWithin(const std::string& job_dir, const JobReadLimits& limits) {
  absl::StatusOr<JobView> job = ReadJobDirectory(job_dir, kNow, 2, JobDirectoryOrigin::kNamedByUser, limits);
  REQUIRE(job.ok());
  return *std::move(job);
}

bool Names(const std::vector<Verdict>& verdicts, int rank) {
  return std::any_of(verdicts.begin(), verdicts.end(), [&](const Verdict& verdict) {
    return std::find(verdict.ranks.begin(), verdict.ranks.end(), rank) != verdict.ranks.end();
  });
}

TEST_CASE("reading a job directory: what a cap on the files leaves out is not read, not absent",
          "[verdicts][job_dir][partial]") {
  TemporaryDirectory temporary;
  WriteWaitingJob(temporary.path(), /*late=*/2);
  JobReadLimits limits;
  SECTION("the normal case: every file read, the late rank named") {
    const JobView job = ReadWithin(temporary.path(), limits);
    CHECK(job.processes.size() == 4);
    CHECK(job.not_read.files == 0);
    CHECK_FALSE(job.not_read.SomeProcessMissing());
    const std::vector<Verdict> verdicts = Classify(job);
    REQUIRE(Kinds(verdicts) == std::vector<std::string>{"rank_not_joined"});
    CHECK(verdicts[0].ranks == std::vector<int>{2});
    CHECK_FALSE(absl::StrContains(verdicts[0].message, "rests on"));
  }
  SECTION("the late rank's file not read: nobody named") {
    limits.max_files = 2;
    const JobView job = ReadWithin(temporary.path(), limits);
    CHECK(job.processes.size() == 2);
    CHECK(job.not_read.files == 2);
    CHECK(job.not_read.processes == 2);
    CHECK(job.not_read.first_files ==
          std::vector<std::string>{"status-node-1-1002.json", "status-node-1-1003.json"});
    CHECK(job.not_read.why == "more than 2 files");
    CHECK(job.problems ==
          std::vector<std::string>{
              "2 status files: not read, more than 2 files (the first: status-node-1-1002.json)"});
    const std::vector<Verdict> verdicts = Classify(job);
    REQUIRE(Kinds(verdicts) == std::vector<std::string>{"unknown"});
    CHECK_FALSE(Names(verdicts, 2));
    CHECK_FALSE(Names(verdicts, 3));
    CHECK(absl::StrContains(
        verdicts[0].message,
        "[this rests on 2 of 4 processes: the files of 2 were not read (more than 2 files)]"));
  }
  SECTION("the late rank's file read, another not: the late rank alone named") {
    limits.max_files = 3;
    const JobView job = ReadWithin(temporary.path(), limits);
    const std::vector<Verdict> verdicts = Classify(job);
    REQUIRE(Kinds(verdicts) == std::vector<std::string>{"rank_not_joined"});
    CHECK(verdicts[0].ranks == std::vector<int>{2});
    CHECK_FALSE(Names(verdicts, 3));
    CHECK(absl::StrContains(verdicts[0].message, "rank 3 is not among the processes read"));
  }
}

TEST_CASE("reading a job directory: what the deadline leaves out is not read, not absent",
          "[verdicts][job_dir][partial]") {
  TemporaryDirectory temporary;
  WriteWaitingJob(temporary.path(), /*late=*/9, /*ranks=*/12);
  // A clock that moves on by a second at each look: the reading stops at 8 s of a 10 s deadline,
  // after the first eight files (one thread reads them in order).
  auto looks = std::make_shared<std::atomic<int>>(0);
  const auto start = std::chrono::steady_clock::now();
  JobReadLimits limits;
  limits.deadline = std::chrono::seconds(10);
  limits.threads = 1;
  limits.now = [looks, start] { return start + std::chrono::seconds((*looks)++); };
  const JobView job = ReadWithin(temporary.path(), limits);
  CHECK(job.processes.size() == 8);
  CHECK(job.not_read.files == 4);
  CHECK(job.not_read.processes == 4);
  CHECK(job.not_read.why == "the deadline passed");
  CHECK(job.problems ==
        std::vector<std::string>{
            "4 status files: not read, the deadline passed (the first: status-node-1-1008.json)"});
  const std::vector<Verdict> verdicts = Classify(job);
  REQUIRE(!verdicts.empty());
  for (const int rank : {8, 9, 10, 11}) CHECK_FALSE(Names(verdicts, rank));
  CHECK(verdicts[0].kind == VerdictKind::kUnknown);
  CHECK(absl::StrContains(verdicts[0].message, "ranks 8-11 are not among the processes read"));
  CHECK(absl::StrContains(
      verdicts[0].message,
      "[this rests on 8 of 12 processes: the files of 4 were not read (the deadline passed)]"));
}

}  // namespace ncclguard
