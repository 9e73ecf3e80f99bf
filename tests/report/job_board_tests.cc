// The job board, on both backends: the job directory and a real redis-server started by the test.
// Every behaviour the watchdog relies on is checked on each; what only Redis does (a heartbeat
// apart from the status, failure and return of the server) has cases of its own.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/support/board.h"
#include "tests/support/process.h"
#include "tests/support/redis_server.h"
#include "watchdog/diagnose/job_view.h"
#include "watchdog/report/dump.h"
#include "watchdog/report/job_board.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {
namespace {

using std::chrono::milliseconds;
using testing::RedisServer;
using testing::TemporaryDirectory;

constexpr std::int64_t kNoFreshRequests = std::numeric_limits<std::int64_t>::max();

// A board of each kind for one job, seen by the process `host`/`pid`.
struct Boards {
  TemporaryDirectory temporary;
  std::unique_ptr<RedisServer> redis = std::make_unique<RedisServer>();
  std::string job_dir = temporary.path() + "/job-7";

  std::shared_ptr<JobBoard> Open(const std::string& store, const std::string& host, int pid,
                                 std::int64_t fresh_since = kNoFreshRequests) const {
    absl::StatusOr<std::shared_ptr<JobBoard>> board = OpenJobBoard(
        store, job_dir, "job-7", BoardIdentity{.host = host, .pid = pid, .started_wall_ns = fresh_since});
    REQUIRE(board.ok());
    return *board;
  }
  std::string Store(bool redis_board) const { return redis_board ? redis->Url() : ""; }
};

std::string OwnHostForTests() {
  char host[256] = {};
  REQUIRE(gethostname(host, sizeof(host) - 1) == 0);
  return host;
}

ProcessSnapshot Snapshot(int rank, std::int64_t time_ns, const std::string& stalled_op = "") {
  ProcessSnapshot snapshot;
  snapshot.time_ns = time_ns;
  snapshot.rank = rank;
  CommSnapshot comm;
  comm.id = "4865c4aaa8a6022e";
  comm.rank = rank;
  comm.nranks = 4;
  comm.state = "ready";
  comm.last_enqueued = 20;
  comm.last_completed = stalled_op.empty() ? 20 : 19;
  if (!stalled_op.empty()) {
    OpSnapshot op;
    op.seq = 20;
    op.op = stalled_op;
    op.state = "started";
    comm.ring.push_back(op);
  }
  snapshot.comms.push_back(comm);
  return snapshot;
}

ProcessFacts Facts(const std::string& host, int pid) {
  ProcessFacts facts;
  facts.host = host;
  facts.pid = pid;
  return facts;
}

JobView Read(const std::shared_ptr<JobBoard>& board) {
  absl::StatusOr<JobView> job =
      ReadJob(board, 2'000'000'000'000'000'000, 2, JobDirectoryOrigin::kOwn, JobReadLimits{});
  REQUIRE(job.ok());
  return *job;
}

TEST_CASE("statuses published on either board are read back as the job's processes", "[job_board]") {
  Boards boards;
  REQUIRE(boards.redis->started());
  const bool redis = GENERATE(false, true);
  INFO((redis ? "Redis" : "the job directory"));
  const std::string store = boards.Store(redis);
  std::shared_ptr<JobBoard> rank0 = boards.Open(store, "node-a", 100);
  std::shared_ptr<JobBoard> rank1 = boards.Open(store, "node-b", 200);
  REQUIRE(rank0->PublishStatus(Snapshot(0, 1'000), Facts("node-a", 100)).ok());
  REQUIRE(rank1->PublishStatus(Snapshot(1, 1'000, "AllReduce"), Facts("node-b", 200)).ok());
  CHECK(rank0->StatusesAreFiles() == !redis);

  const JobView job = Read(boards.Open(store, "analyst", 1));
  CHECK(job.problems.empty());
  REQUIRE(job.processes.size() == 2);
  CHECK(job.processes[0].host == "node-a");
  CHECK(job.processes[0].snapshot.rank == 0);
  CHECK(job.processes[1].host == "node-b");
  CHECK(job.processes[1].pid == 200);
  REQUIRE(job.processes[1].snapshot.comms.size() == 1);
  REQUIRE(job.processes[1].snapshot.comms[0].ring.size() == 1);
  CHECK(job.processes[1].snapshot.comms[0].ring[0].op == "AllReduce");
  CHECK_FALSE(job.not_read.SomeProcessMissing());

  // A later status replaces the earlier one: still two processes, the newer time.
  REQUIRE(rank1->PublishStatus(Snapshot(1, 5'000), Facts("node-b", 200)).ok());
  const JobView later = Read(boards.Open(store, "analyst", 1));
  REQUIRE(later.processes.size() == 2);
  CHECK(later.processes[1].snapshot.time_ns == 5'000);
  CHECK(later.processes[1].snapshot.comms[0].ring.empty());
}

TEST_CASE("dump requests are seen once by every other process, on either board", "[job_board]") {
  Boards boards;
  REQUIRE(boards.redis->started());
  const bool redis = GENERATE(false, true);
  INFO((redis ? "Redis" : "the job directory"));
  const std::string store = boards.Store(redis);
  std::shared_ptr<JobBoard> requester = boards.Open(store, OwnHostForTests(), static_cast<int>(getpid()));
  std::shared_ptr<JobBoard> other = boards.Open(store, "node-b", 77);

  // A request made before a process first looks is an earlier launch's: not acted on.
  REQUIRE(requester->RequestDumps("an earlier launch").ok());
  REQUIRE(other->PollDumpRequests().ok());
  CHECK(other->PollDumpRequests()->empty());
  CHECK(requester->PollDumpRequests()->empty());

  const absl::StatusOr<std::string> request =
      requester->RequestDumps("rank 2: AllReduce #20 stalled", {"1111222233334444"});
  REQUIRE(request.ok());
  const absl::StatusOr<std::vector<DumpRequest>> seen = other->PollDumpRequests();
  REQUIRE(seen.ok());
  REQUIRE(seen->size() == 1);
  CHECK((*seen)[0].name == *request);
  CHECK((*seen)[0].requester == "rank 2: AllReduce #20 stalled");
  CHECK((*seen)[0].pid == getpid());
  CHECK((*seen)[0].comms == std::vector<std::string>{"1111222233334444"});
  CHECK(other->PollDumpRequests()->empty());      // not seen again
  CHECK(requester->PollDumpRequests()->empty());  // a process does not answer its own request

  // A process that started before a request it has not looked for yet still sees it.
  std::shared_ptr<JobBoard> late = boards.Open(store, "node-c", 88, /*fresh_since=*/0);
  CHECK(late->PollDumpRequests()->size() == 2);
}

TEST_CASE("records: replaced, created once, read, listed, on either board", "[job_board]") {
  Boards boards;
  REQUIRE(boards.redis->started());
  const bool redis = GENERATE(false, true);
  INFO((redis ? "Redis" : "the job directory"));
  std::shared_ptr<JobBoard> board = boards.Open(boards.Store(redis), "node-a", 100);
  const std::string folder = "recovery/4865c4aaa8a6022e/20";

  CHECK(absl::IsNotFound(board->Get(folder, "decision.json", 1024).status()));
  CHECK(board->ListNames(folder, "vote-", ".json")->empty());
  REQUIRE(board->Put(folder, "vote-1.json", "one", false).ok());
  REQUIRE(board->Put(folder, "vote-0.json", "zero", false).ok());
  REQUIRE(board->Put(folder, "vote-0.json", "zero again", false).ok());
  CHECK(*board->Get(folder, "vote-0.json", 1024) == "zero again");
  CHECK(*board->ListNames(folder, "vote-", ".json") ==
        std::vector<std::string>{"vote-0.json", "vote-1.json"});

  REQUIRE(board->PutOnce(folder, "decision.json", "recover", milliseconds(1000)).ok());
  CHECK(absl::IsAlreadyExists(board->PutOnce(folder, "decision.json", "fallback", milliseconds(1000))));
  CHECK(*board->Get(folder, "decision.json", 1024) == "recover");
  // A record larger than the reader accepts is not one of ours.
  const absl::Status too_large = board->Get(folder, "decision.json", 3).status();
  CHECK_FALSE(too_large.ok());
  CHECK_FALSE(absl::IsNotFound(too_large));
  CHECK_FALSE(absl::IsUnavailable(too_large));

  // The job's own records ("" folder) are apart from the meeting's.
  REQUIRE(board->Put("", "p2p-verdict.json", "{}", true).ok());
  CHECK(board->ListNames("", "vote-", ".json")->empty());
}

TEST_CASE("on Redis, a status that has not changed is not written again: a heartbeat is",
          "[job_board][redis]") {
  Boards boards;
  REQUIRE(boards.redis->started());
  std::shared_ptr<JobBoard> board = boards.Open(boards.redis->Url(), "node-a", 100);
  REQUIRE(board->PublishStatus(Snapshot(0, 1'000), Facts("node-a", 100)).ok());
  REQUIRE(board->PublishStatus(Snapshot(0, 9'000), Facts("node-a", 100)).ok());
  absl::StatusOr<StatusRecords> fetched =
      board->FetchStatuses(std::chrono::steady_clock::now() + std::chrono::seconds(5), nullptr);
  REQUIRE(fetched.ok());
  REQUIRE(fetched->records.size() == 1);
  // The document is the first one (time 1000); the heartbeat says the process is alive at 9000.
  const absl::StatusOr<PeerStatus> status =
      ParseStatusRecord(fetched->records[0].name, fetched->records[0].content);
  REQUIRE(status.ok());
  CHECK(status->snapshot.time_ns == 1'000);
  CHECK(fetched->records[0].heartbeat_ns == 9'000);
  // ... and the reader takes the newer of the two.
  CHECK(Read(board).processes[0].snapshot.time_ns == 9'000);

  // A change is written at once.
  REQUIRE(board->PublishStatus(Snapshot(0, 12'000, "Broadcast"), Facts("node-a", 100)).ok());
  const JobView job = Read(board);
  REQUIRE(job.processes[0].snapshot.comms[0].ring.size() == 1);
  CHECK(job.processes[0].snapshot.comms[0].ring[0].op == "Broadcast");
}

// A status on Redis names its facts (environment, system) by digest instead of holding them: a
// job's processes share a few records, and the statuses the reader fetches are a third smaller.
TEST_CASE("on Redis, the facts that do not change are a record that processes alike share",
          "[job_board][redis]") {
  Boards boards;
  REQUIRE(boards.redis->started());
  const std::string facts_key = "ncclguard:{" + std::to_string(getuid()) + ":job-7}:facts";
  auto facts_of = [](const std::string& host, int pid, const std::string& p2p_disable) {
    ProcessFacts facts = Facts(host, pid);
    facts.environment = {{"NCCL_P2P_DISABLE", p2p_disable}};
    facts.driver_version = "550.127.05";
    facts.cuda.gpus = {GpuFacts{.device = 0, .name = "NVIDIA H100 80GB HBM3", .pci_bus_id = "0000:31:00.0"}};
    return facts;
  };
  std::shared_ptr<JobBoard> rank0 = boards.Open(boards.redis->Url(), "node-a", 100);
  std::shared_ptr<JobBoard> rank1 = boards.Open(boards.redis->Url(), "node-b", 200);
  REQUIRE(rank0->PublishStatus(Snapshot(0, 1'000), facts_of("node-a", 100, "0")).ok());
  REQUIRE(rank1->PublishStatus(Snapshot(1, 1'000), facts_of("node-b", 200, "0")).ok());
  CHECK(boards.redis->HashLength(facts_key) == 1);  // alike but for host and pid: one record

  absl::StatusOr<StatusRecords> fetched =
      boards.Open(boards.redis->Url(), "analyst", 1)
          ->FetchStatuses(std::chrono::steady_clock::now() + std::chrono::seconds(5), nullptr);
  REQUIRE(fetched.ok());
  REQUIRE(fetched->records.size() == 2);
  CHECK(fetched->facts.size() == 1);
  CHECK(fetched->records[0].content.find("550.127.05") == std::string::npos);
  const absl::StatusOr<PeerStatus> parsed =
      ParseStatusRecord(fetched->records[0].name, fetched->records[0].content);
  REQUIRE(parsed.ok());
  CHECK(fetched->facts.contains(parsed->facts_digest));

  JobView job = Read(boards.Open(boards.redis->Url(), "analyst", 1));
  CHECK(job.problems.empty());
  REQUIRE(job.processes.size() == 2);
  for (const ProcessView& process : job.processes) {
    CHECK(process.facts.host == process.host);
    CHECK(process.facts.pid == process.pid);
    CHECK(process.facts.driver_version == "550.127.05");
    REQUIRE(process.facts.cuda.gpus.size() == 1);
    CHECK(process.facts.cuda.gpus[0].pci_bus_id == "0000:31:00.0");
    CHECK(process.facts.environment == EnvironmentVariables{{"NCCL_P2P_DISABLE", "0"}});
  }

  // Facts that change (recovery disabled P2P) are a new record, named by the next status.
  REQUIRE(rank1->PublishStatus(Snapshot(1, 2'000), facts_of("node-b", 200, "1")).ok());
  CHECK(boards.redis->HashLength(facts_key) == 2);
  job = Read(boards.Open(boards.redis->Url(), "analyst", 1));
  REQUIRE(job.processes.size() == 2);
  CHECK(job.processes[0].facts.environment == EnvironmentVariables{{"NCCL_P2P_DISABLE", "0"}});
  CHECK(job.processes[1].facts.environment == EnvironmentVariables{{"NCCL_P2P_DISABLE", "1"}});

  // Records lost (evicted) or not ours: the statuses are still read, their facts said to be unknown.
  const std::string digest = parsed->facts_digest;
  REQUIRE(boards.redis->Run({"HSET", facts_key, digest, R"({"format":"ncclguard-status-facts"})"}) == ":0");
  job = Read(boards.Open(boards.redis->Url(), "analyst", 1));
  REQUIRE(job.processes.size() == 2);
  CHECK_FALSE(job.not_read.SomeProcessMissing());
  CHECK(job.processes[0].facts.driver_version == "unknown");
  CHECK(job.processes[0].facts.environment.empty());
  CHECK(job.processes[1].facts.driver_version == "550.127.05");
  REQUIRE(job.problems.size() == 1);
  CHECK_THAT(job.problems[0], Catch::Contains("1 statuses name facts records that could not be read") &&
                                  Catch::Contains("digest does not match"));
  REQUIRE(boards.redis->Run({"DEL", facts_key}) == ":1");
  job = Read(boards.Open(boards.redis->Url(), "analyst", 1));
  REQUIRE(job.processes.size() == 2);
  CHECK(job.processes[1].facts.driver_version == "unknown");
  REQUIRE(job.problems.size() == 1);
  CHECK_THAT(job.problems[0], Catch::Contains("2 statuses") && Catch::Contains("not on the board"));

  // Redis lost the job's keys: the next status writes its facts again with it.
  REQUIRE(boards.redis->Run({"FLUSHALL"}) == "+OK");
  REQUIRE(rank0->PublishStatus(Snapshot(0, 1'000), facts_of("node-a", 100, "0")).ok());
  REQUIRE(rank0->PublishStatus(Snapshot(0, 3'000), facts_of("node-a", 100, "0")).ok());
  CHECK(boards.redis->HashLength(facts_key) == 1);
  job = Read(boards.Open(boards.redis->Url(), "analyst", 1));
  CHECK(job.problems.empty());
  REQUIRE(job.processes.size() == 1);
  CHECK(job.processes[0].facts.driver_version == "550.127.05");
}

// 9,000 statuses take two round trips (8 batches of 1,000 each): the first round trip's batches
// are parsed while the second is fetched, and every status is read once, by one thread or another.
TEST_CASE("on Redis, statuses of several round trips are each read once, parsed while the rest is fetched",
          "[job_board][redis]") {
  Boards boards;
  REQUIRE(boards.redis->started());
  constexpr int kRanks = 9'000;
  std::shared_ptr<JobBoard> writer = boards.Open(boards.redis->Url(), "writer", 1);
  for (int rank = 0; rank < kRanks; ++rank) {
    ProcessSnapshot snapshot = Snapshot(rank, 1'000);
    snapshot.comms[0].nranks = kRanks;
    const std::string host = "node-" + std::to_string(rank / 8);
    REQUIRE(writer->PublishStatus(snapshot, Facts(host, 1'000 + rank)).ok());
  }
  const JobView job = Read(boards.Open(boards.redis->Url(), "analyst", 1));
  CHECK(job.problems.empty());
  CHECK_FALSE(job.not_read.SomeProcessMissing());
  REQUIRE(job.processes.size() == kRanks);
  for (int rank = 0; rank < kRanks; ++rank) {  // in rank order, each once, each its own
    const ProcessView& process = job.processes[rank];
    REQUIRE(process.snapshot.rank == rank);
    REQUIRE(process.pid == 1'000 + rank);
    REQUIRE(process.snapshot.comms.size() == 1);
    REQUIRE(process.snapshot.comms[0].nranks == kRanks);
  }

  // A fetch past its deadline stops after a round trip and says how many it left; the round trip
  // already asked for is read and dropped, so that the next fetch is answered in step.
  std::shared_ptr<JobBoard> hurried = boards.Open(boards.redis->Url(), "analyst", 2);
  const absl::StatusOr<StatusRecords> partial =
      hurried->FetchStatuses(std::chrono::steady_clock::now() - std::chrono::seconds(1), nullptr);
  REQUIRE(partial.ok());
  CHECK(partial->records.size() == 8'000);
  CHECK(partial->not_fetched == 1'000);
  CHECK(partial->why_not_fetched == "the deadline passed");
  CHECK(partial->facts.size() == 1);  // 9,000 processes alike: one facts record
  const absl::StatusOr<StatusRecords> whole =
      hurried->FetchStatuses(std::chrono::steady_clock::now() + std::chrono::seconds(5), nullptr);
  REQUIRE(whole.ok());
  CHECK(whole->records.size() == kRanks);
  CHECK(whole->not_fetched == 0);
}

TEST_CASE("on Redis, a sample of the dumps of processes like the rest is read, and every dump of the others",
          "[job_board][redis]") {
  Boards boards;
  REQUIRE(boards.redis->started());
  const std::string hosts[] = {"node-a", "node-b", "node-c", "node-d", "node-e"};
  for (int rank = 0; rank < 5; ++rank) {
    const std::string& host = hosts[rank];
    // Rank 3 is out of NCCL while the others wait in it: the process unlike the rest.
    ProcessSnapshot snapshot = Snapshot(rank, 1'000, "AllReduce");
    snapshot.in_nccl_call = rank == 3 ? "" : "ncclAllReduce";
    snapshot.comms[0].nranks = 5;
    REQUIRE(boards.Open(boards.redis->Url(), host, 100 + rank)
                ->PublishStatus(snapshot, Facts(host, 100 + rank))
                .ok());
    snapshot.reason = "peer_request";
    REQUIRE(WriteDump(boards.job_dir, snapshot, Facts(host, 100 + rank)).ok());
  }
  JobReadLimits limits;
  limits.sampled_dumps = 2;
  const absl::StatusOr<JobView> job = ReadJob(boards.Open(boards.redis->Url(), "analyst", 1),
                                              2'000'000'000'000'000'000, 2, JobDirectoryOrigin::kOwn, limits);
  REQUIRE(job.ok());
  REQUIRE(job->processes.size() == 5);
  CHECK_FALSE(job->processes[3].dump_file.empty());
  int dumps_read = 0;
  for (const ProcessView& process : job->processes) dumps_read += process.dump_file.empty() ? 0 : 1;
  CHECK(dumps_read == 3);
  CHECK(job->not_read.files == 2);
  CHECK_THAT(job->not_read.why, Catch::Contains("like most of the job's, and 2 of their dumps were read"));
  // Every process is known from its status: nobody is missing for a dump left unread.
  CHECK(job->not_read.processes == 0);
  CHECK_FALSE(job->not_read.SomeProcessMissing());
}

TEST_CASE("Redis killed and restarted in the middle of a job: no hang, then statuses and requests again",
          "[job_board][redis]") {
  Boards boards;
  REQUIRE(boards.redis->started());
  std::shared_ptr<JobBoard> rank0 = boards.Open(boards.redis->Url(), "node-a", 100);
  std::shared_ptr<JobBoard> rank1 = boards.Open(boards.redis->Url(), "node-b", 200);
  REQUIRE(rank0->PublishStatus(Snapshot(0, 1'000), Facts("node-a", 100)).ok());
  REQUIRE(rank1->PublishStatus(Snapshot(1, 1'000), Facts("node-b", 200)).ok());
  REQUIRE(rank1->PollDumpRequests().ok());

  boards.redis->Kill();
  const auto before = std::chrono::steady_clock::now();
  const absl::Status published = rank0->PublishStatus(Snapshot(0, 2'000), Facts("node-a", 100));
  CHECK(absl::IsUnavailable(published));
  CHECK(absl::IsUnavailable(rank0->RequestDumps("while down").status()));
  CHECK(absl::IsUnavailable(rank1->PollDumpRequests().status()));
  CHECK_FALSE(ReadJob(rank0, 0, 2, JobDirectoryOrigin::kOwn, JobReadLimits{}).ok());
  // Refused at once, not waited for: the watchdog keeps its pace while the board is down.
  CHECK(std::chrono::steady_clock::now() - before < std::chrono::seconds(3));

  // Back, empty (it persisted nothing): the next statuses are written whole, though unchanged.
  REQUIRE(boards.redis->Start());
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!rank0->PublishStatus(Snapshot(0, 3'000), Facts("node-a", 100)).ok() &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  while (!rank1->PublishStatus(Snapshot(1, 3'000), Facts("node-b", 200)).ok() &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  const JobView job = Read(rank0);
  CHECK(job.processes.size() == 2);
  const absl::StatusOr<std::string> request = rank0->RequestDumps("after the restart");
  REQUIRE(request.ok());
  const absl::StatusOr<std::vector<DumpRequest>> seen = rank1->PollDumpRequests();
  REQUIRE(seen.ok());
  REQUIRE(seen->size() == 1);
  CHECK((*seen)[0].name == *request);
}

TEST_CASE("a Redis board that nothing answers fails at once and names itself", "[job_board][redis]") {
  TemporaryDirectory temporary;
  // A port that nobody listens on: the board's server is down from the start.
  RedisServer placeholder;
  REQUIRE(placeholder.started());
  const std::string url = placeholder.Url();
  placeholder.Kill();
  absl::StatusOr<std::shared_ptr<JobBoard>> board =
      OpenJobBoard(url, temporary.path() + "/job", "job", BoardIdentity{.host = "h", .pid = 1});
  REQUIRE(board.ok());
  const absl::Status published = (*board)->PublishStatus(Snapshot(0, 1), Facts("h", 1));
  CHECK(absl::IsUnavailable(published));
  CHECK(published.message().find(url.substr(0, url.size() - 2)) != std::string::npos);
}

TEST_CASE("NCCLGUARD_STORE names a board, or is refused with the forms it takes", "[job_board]") {
  CHECK(OpenJobBoard("", "/tmp/x/job", "job", {}).ok());
  CHECK(OpenJobBoard("dir", "/tmp/x/job", "job", {}).ok());
  CHECK(absl::IsInvalidArgument(OpenJobBoard("mongodb://db", "/tmp/x/job", "job", {}).status()));
  CHECK(absl::IsInvalidArgument(OpenJobBoard("redis://", "/tmp/x/job", "job", {}).status()));
  CHECK(absl::IsInvalidArgument(OpenJobBoard("redis://host:99999", "/tmp/x/job", "job", {}).status()));
  const absl::StatusOr<RedisAddress> address = ParseRedisAddress("redis://cache.cluster:6380/3");
  REQUIRE(address.ok());
  CHECK(address->host == "cache.cluster");
  CHECK(address->port == 6380);
  CHECK(address->database == 3);
  CHECK(ParseRedisAddress("redis://cache")->port == 6379);
  const absl::StatusOr<RedisJob> job = ParseRedisJob("redis://cache:6380/2/slurm-1234");
  REQUIRE(job.ok());
  CHECK(job->job_id == "slurm-1234");
  CHECK(job->address.database == 2);
  CHECK(ParseRedisJob("redis://cache/slurm-1234")->address.database == 0);
  CHECK_FALSE(ParseRedisJob("redis://cache").ok());
}

}  // namespace
}  // namespace ncclguard
