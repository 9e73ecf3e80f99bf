// The classifier on communicators whose ranks number their operations differently: pipeline
// stages, each receiving from the stage before and sending to the stage after in one
// ncclGroupStart/End block (as batch_isend_irecv issues them), then an AllReduce of every stage.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "tests/diagnose/alive_rank.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/job_read.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {
namespace {

constexpr std::int64_t kSecond = 1'000'000'000;
constexpr std::int64_t kNow = 1'700'000'000 * kSecond;
constexpr int kStages = 4;
const std::string kComm = "00000000000000bb";

// What stage `rank` issued by the end of `steps` steps, and of the next step: `next_receive`,
// `next_send`, `next_all_reduce` say which of its calls it issued (those it has are unfinished).
struct Progress {
  int steps = 5;
  bool next_receive = false;
  bool next_send = false;
  bool next_all_reduce = false;
};

OpSnapshot Operation(std::string name, int peer, std::uint64_t group, CommSnapshot& comm, bool finished) {
  OpSnapshot op;
  op.seq = ++comm.last_enqueued;
  op.op = std::move(name);
  const bool collective = op.op == "AllReduce";
  if (collective) ++comm.collectives;
  op.coll_seq = comm.collectives;
  op.dtype = "float32";
  op.count = collective ? 4096 : 1048576;
  op.bytes = op.count * 4;
  op.reduction = collective ? "sum" : "";
  op.peer = collective ? -1 : peer;
  op.group = group;
  // Every operation was enqueued a minute ago, give or take: whatever is unfinished is stuck.
  op.enqueue_ns = kNow - 60 * kSecond + static_cast<std::int64_t>(op.seq) * 1'000'000;
  op.state = finished ? "completed" : "started";
  if (finished) comm.last_completed = op.seq;
  return op;
}

void Step(int rank, int step, bool receive, bool send, bool all_reduce, bool finished, CommSnapshot& comm) {
  const auto group = static_cast<std::uint64_t>(step);
  if (receive && rank > 0) comm.ring.push_back(Operation("Recv", rank - 1, group, comm, finished));
  if (send && rank < kStages - 1) comm.ring.push_back(Operation("Send", rank + 1, group, comm, finished));
  if (all_reduce) comm.ring.push_back(Operation("AllReduce", -1, 0, comm, finished));
}

ProcessView Stage(int rank, Progress progress) {
  ProcessView process = testing::AliveRank("node-1", 2000 + rank, rank, kComm, kStages, kNow);
  CommSnapshot& comm = process.snapshot.comms[0];
  for (int step = 1; step <= progress.steps; ++step) Step(rank, step, true, true, true, true, comm);
  Step(rank, progress.steps + 1, progress.next_receive, progress.next_send, progress.next_all_reduce, false,
       comm);
  comm.last_started = comm.last_enqueued;
  return process;
}

// The pipeline of the field case: stage 2 never comes back from loading its batch of step 6.
// Stage 0 sent to stage 1 and waits in the AllReduce; stage 1 received from stage 0 and waits in
// its send to stage 2; stage 3 waits in its receive from stage 2.
std::vector<ProcessView> StageTwoLate() {
  std::vector<ProcessView> stages{
      Stage(0, {.next_send = true, .next_all_reduce = true}),
      Stage(1, {.next_receive = true, .next_send = true}),
      Stage(2, {}),
      Stage(3, {.next_receive = true}),
  };
  // Stage 0's send and stage 1's receive met: both completed.
  for (OpSnapshot& op : stages[0].snapshot.comms[0].ring) {
    if (op.op == "Send" && op.group == 6) op.state = "completed";
  }
  stages[0].snapshot.comms[0].last_completed = 11;
  for (OpSnapshot& op : stages[1].snapshot.comms[0].ring) {
    if (op.op == "Recv" && op.group == 6) op.state = "completed";
  }
  stages[1].snapshot.comms[0].last_completed = 16;
  return stages;
}

JobView Job(std::vector<ProcessView> processes) {
  JobView job;
  job.directory = "/jobs/pipeline";
  job.now_ns = kNow;
  job.status_interval_seconds = 2;
  job.processes = std::move(processes);
  return job;
}

std::vector<Verdict> Judge(std::vector<ProcessView> processes) {
  JobView job = Job(std::move(processes));
  return Classify(job, {});
}

// A status file's view of a ring: its last completed operation and its oldest outstanding one.
void AsStatusFiles(std::vector<ProcessView>& processes) {
  for (ProcessView& process : processes) {
    CommSnapshot& comm = process.snapshot.comms[0];
    std::vector<OpSnapshot> kept;
    for (const OpSnapshot& op : comm.ring) {
      if (op.seq == comm.last_completed || (op.state != "completed" && kept.size() < 2)) kept.push_back(op);
    }
    comm.ring = kept;
  }
}

TEST_CASE("a pipeline stage busy outside NCCL is named, with what each stage waits in", "[verdicts][waits]") {
  std::vector<ProcessView> stages = StageTwoLate();
  const bool status_files_only = GENERATE(false, true);
  if (status_files_only) AsStatusFiles(stages);
  const std::vector<Verdict> verdicts = Judge(stages);
  REQUIRE(verdicts.size() == 1);
  const Verdict& verdict = verdicts[0];
  CHECK(VerdictKindName(verdict.kind) == std::string("rank_not_joined"));
  CHECK(verdict.ranks == std::vector<int>{2});
  CHECK(
      verdict.message.starts_with("rank 2 completed AllReduce #15 and issued nothing after; it is alive and "
                                  "busy outside NCCL"));
  CHECK(absl::StrContains(verdict.message, "rank 0 waits in AllReduce #12 (collective 6)"));
  CHECK(absl::StrContains(verdict.message, "rank 1 waits in Send #17 to rank 2"));
  CHECK(absl::StrContains(verdict.message, "rank 3 waits in Recv #11 from rank 2"));
  CHECK(verdict.late_ranks_busy_outside_nccl);
}

// Stage 3's files were not read (a deadline): stage 2 is still named, and stage 3 may be late too,
// so nobody can say that waiting for the late stages to come back is safe.
TEST_CASE("a late pipeline stage is named while a stage's files were not read", "[verdicts][waits]") {
  std::vector<ProcessView> stages = StageTwoLate();
  stages.pop_back();
  JobView job = Job(stages);
  job.not_read.processes = 1;
  job.not_read.files = 1;
  job.not_read.why = "the deadline passed";
  const std::vector<Verdict> verdicts = Classify(job, {});
  REQUIRE(verdicts.size() == 1);
  CHECK(VerdictKindName(verdicts[0].kind) == std::string("rank_not_joined"));
  CHECK(verdicts[0].ranks == std::vector<int>{2});
  CHECK(absl::StrContains(verdicts[0].message, "rank 3 is not among the processes read and may be late too"));
  CHECK_FALSE(verdicts[0].late_ranks_busy_outside_nccl);
  CHECK(verdicts[0].evidence.at("not_read_ranks") == nlohmann::json::array({3}));
}

TEST_CASE("a killed pipeline stage is named dead", "[verdicts][waits]") {
  std::vector<ProcessView> stages = StageTwoLate();
  stages[2].liveness = ProcessView::Liveness::kGone;
  const std::vector<Verdict> verdicts = Judge(stages);
  REQUIRE(verdicts.size() == 1);
  CHECK(VerdictKindName(verdicts[0].kind) == std::string("rank_dead"));
  CHECK(verdicts[0].ranks == std::vector<int>{2});
  CHECK(
      absl::StrContains(verdicts[0].message, "completed AllReduce #15 and never entered what they wait in"));
}

TEST_CASE("pipeline stages that each entered their send and receive are stuck inside NCCL",
          "[verdicts][waits]") {
  // Every stage posted its receive and send of step 6; stage 0's send completed, nothing else.
  std::vector<ProcessView> stages{
      Stage(0, {.next_send = true, .next_all_reduce = true}),
      Stage(1, {.next_receive = true, .next_send = true}),
      Stage(2, {.next_receive = true, .next_send = true}),
      Stage(3, {.next_receive = true}),
  };
  for (OpSnapshot& op : stages[0].snapshot.comms[0].ring) {
    if (op.op == "Send" && op.group == 6) op.state = "completed";
  }
  for (OpSnapshot& op : stages[1].snapshot.comms[0].ring) {
    if (op.op == "Recv" && op.group == 6) op.state = "completed";
  }
  const std::vector<Verdict> verdicts = Judge(stages);
  REQUIRE(verdicts.size() == 1);
  CHECK(VerdictKindName(verdicts[0].kind) == std::string("stuck_inside_nccl"));
  // Stage 0 waits in the AllReduce behind them: it is not where the fault is.
  CHECK(verdicts[0].ranks == std::vector<int>{1, 2, 3});
  CHECK(absl::StrContains(verdicts[0].message, "a transport fault"));
}

TEST_CASE("stages whose sends wait for each other are out of step, not a transport fault",
          "[verdicts][waits]") {
  // Stage 1 waits in the AllReduce before its receive; stage 0 waits in its send to stage 1 first.
  std::vector<ProcessView> stages{Stage(0, {.next_send = true}), Stage(1, {.next_all_reduce = true}),
                                  Stage(2, {.next_all_reduce = true}), Stage(3, {.next_all_reduce = true})};
  const std::vector<Verdict> verdicts = Judge(stages);
  REQUIRE(verdicts.size() == 1);
  CHECK(VerdictKindName(verdicts[0].kind) == std::string("mismatch"));
  CHECK(absl::StrContains(verdicts[0].message, "rank 0 waits in Send #11 to rank 1"));
}

TEST_CASE("pipeline stages are compared collective by collective for a desync", "[verdicts][waits]") {
  std::vector<ProcessView> stages = StageTwoLate();
  // Stage 3 reduced a different size in its fourth AllReduce: its #8, stage 1's #12.
  for (OpSnapshot& op : stages[3].snapshot.comms[0].ring) {
    if (op.coll_seq == 4 && op.op == "AllReduce") op.count = 2048;
  }
  const std::vector<Verdict> verdicts = Judge(stages);
  REQUIRE(!verdicts.empty());
  CHECK(VerdictKindName(verdicts[0].kind) == std::string("mismatch"));
  CHECK(verdicts[0].ranks == std::vector<int>{3});
  CHECK(absl::StrContains(verdicts[0].message, "rank 3 issued AllReduce #8 with 2048 float32 elements"));
}

}  // namespace
}  // namespace ncclguard
