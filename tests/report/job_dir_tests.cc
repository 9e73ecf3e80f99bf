// The job's coordination directory: job ids, status files, dump requests.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/support/process.h"
#include "watchdog/common/files.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/dump.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/report/snapshot_fields.h"

namespace ncclguard {
namespace {

namespace fs = std::filesystem;
using testing::TemporaryDirectory;

EnvironmentReader FakeEnvironment(std::map<std::string, std::string> variables) {
  return [variables = std::move(variables)](const char* name, std::string* value) {
    const auto found = variables.find(name);
    if (found == variables.end()) return false;
    *value = found->second;
    return true;
  };
}

// A status file's size without the spaces it is padded with to its size.
std::size_t WrittenBytes(const std::string& path) {
  const std::string content = testing::ReadFile(path);
  return content.find_last_not_of(' ') + 1;
}

std::string OwnHost() {
  char host[256] = {};
  REQUIRE(gethostname(host, sizeof(host) - 1) == 0);
  return host;
}

TEST_CASE("the job id: NCCLGUARD_JOB_ID, else every launcher's id present, else the communicator's",
          "[job_dir]") {
  const std::map<std::string, std::string> everything{
      {"NCCLGUARD_JOB_ID", "my-run"},  {"SLURM_JOB_ID", "4242"},
      {"SLURM_STEP_ID", "3"},          {"TORCHELASTIC_RUN_ID", "abc"},
      {"PADDLE_JOB_ID", "p1"},         {"OMPI_MCA_ess_base_jobid", "77"},
      {"PMIX_NAMESPACE", "prterun-x"}, {"LSB_JOBID", "5"},
      {"PBS_JOBID", "6.server"},       {"FLUX_JOB_ID", "f7"}};
  // {the id expected, the variable then removed}: each launcher's id stays in until it goes.
  const std::vector<std::pair<std::string, std::string>> expected_in_order{
      {"my-run", "NCCLGUARD_JOB_ID"},
      {"slurm-4242.3_torchelastic-abc_paddle-p1_ompi-77_pmix-prterun-x_lsf-5_pbs-6.server_flux-f7",
       "SLURM_JOB_ID"},
      // SLURM_STEP_ID alone means nothing
      {"torchelastic-abc_paddle-p1_ompi-77_pmix-prterun-x_lsf-5_pbs-6.server_flux-f7", "TORCHELASTIC_RUN_ID"},
      {"paddle-p1_ompi-77_pmix-prterun-x_lsf-5_pbs-6.server_flux-f7", "PADDLE_JOB_ID"},
      {"ompi-77_pmix-prterun-x_lsf-5_pbs-6.server_flux-f7", "OMPI_MCA_ess_base_jobid"},
      {"pmix-prterun-x_lsf-5_pbs-6.server_flux-f7", "PMIX_NAMESPACE"},
      {"lsf-5_pbs-6.server_flux-f7", "LSB_JOBID"},
      {"pbs-6.server_flux-f7", "PBS_JOBID"},
      {"flux-f7", "FLUX_JOB_ID"},
      {"nccl-0123abcd", ""}};
  std::map<std::string, std::string> remaining = everything;
  for (const auto& [expected, removed_after] : expected_in_order) {
    INFO("deciding: " << expected);
    CHECK(JobId(FakeEnvironment(remaining), "0123abcd") == expected);
    remaining.erase(removed_after);
  }
  CHECK(JobId(FakeEnvironment({{"SLURM_JOB_ID", "4242"}}), "ff") == "slurm-4242");
  CHECK(JobId(FakeEnvironment({{"TORCHELASTIC_RUN_ID", "none"}}), "ff") == "nccl-ff");
  CHECK(JobId(FakeEnvironment({{"PADDLE_JOB_ID", "default"}}), "ff") == "nccl-ff");
  // A launcher's shared default is left out of a combination too.
  CHECK(JobId(FakeEnvironment({{"SLURM_JOB_ID", "4242"}, {"TORCHELASTIC_RUN_ID", "none"}}), "ff") ==
        "slurm-4242");
  // Only the first communicator could name these jobs: there is no name before it exists.
  CHECK(NamedJobId(FakeEnvironment({{"TORCHELASTIC_RUN_ID", "none"}, {"PADDLE_JOB_ID", "default"}})) ==
        std::nullopt);
  CHECK(NamedJobId(FakeEnvironment({{"PBS_JOBID", "6.server"}})) == "pbs-6.server");
  CHECK(JobId(FakeEnvironment({}), "") == "nccl-unknown");
  CHECK(JobId(nullptr, "ee") == "nccl-ee");
}

TEST_CASE("two jobs of one allocation never share a job id", "[job_dir]") {
  // Two torchrun jobs in the batch step of one Slurm allocation.
  const auto torchrun_in_allocation = [](const std::string& run) {
    return JobId(FakeEnvironment({{"SLURM_JOB_ID", "4242"}, {"TORCHELASTIC_RUN_ID", run}}), "ff");
  };
  CHECK(torchrun_in_allocation("a") == "slurm-4242_torchelastic-a");
  CHECK(torchrun_in_allocation("a") != torchrun_in_allocation("b"));
  // Two steps of one allocation (srun ... & srun ... &), and two mpirun jobs in one of them.
  CHECK(JobId(FakeEnvironment({{"SLURM_JOB_ID", "4242"}, {"SLURM_STEP_ID", "0"}}), "ff") !=
        JobId(FakeEnvironment({{"SLURM_JOB_ID", "4242"}, {"SLURM_STEP_ID", "1"}}), "ff"));
  CHECK(JobId(FakeEnvironment({{"SLURM_JOB_ID", "4242"}, {"PMIX_NAMESPACE", "prterun-1"}}), "ff") !=
        JobId(FakeEnvironment({{"SLURM_JOB_ID", "4242"}, {"PMIX_NAMESPACE", "prterun-2"}}), "ff"));
  // Ids too long for a file name keep a hash of the whole: two that differ only at their end differ.
  const std::string long_run(150, 'r');
  const std::string first = torchrun_in_allocation(long_run + "1");
  const std::string second = torchrun_in_allocation(long_run + "2");
  CHECK(first.size() == 100);
  CHECK(first != second);
  CHECK(first.starts_with("slurm-4242_torchelastic-rrr"));
}

TEST_CASE("the launch id: NCCLGUARD_LAUNCH_ID, else every launcher's id, whatever NCCLGUARD_JOB_ID says",
          "[job_dir]") {
  // One NCCLGUARD_JOB_ID given to two torchrun jobs: one job id, two launches.
  const auto shared_job_id = [](const std::string& run) {
    return FakeEnvironment(
        {{"NCCLGUARD_JOB_ID", "shared"}, {"SLURM_JOB_ID", "4242"}, {"TORCHELASTIC_RUN_ID", run}});
  };
  CHECK(JobId(shared_job_id("a"), "ff") == JobId(shared_job_id("b"), "ff"));
  CHECK(LaunchId(shared_job_id("a")) == "slurm-4242_torchelastic-a");
  CHECK(LaunchId(shared_job_id("a")) != LaunchId(shared_job_id("b")));
  // torchrun keeps its run id across the restarts of its job: the same launch.
  CHECK(LaunchId(shared_job_id("a")) == LaunchId(shared_job_id("a")));
  // `ncclguard run` pins it for attempts whose own ids differ (a new srun step each).
  CHECK(LaunchId(FakeEnvironment(
            {{"NCCLGUARD_LAUNCH_ID", "slurm-4242"}, {"SLURM_JOB_ID", "4242"}, {"SLURM_STEP_ID", "7"}})) ==
        "slurm-4242");
  CHECK(LaunchId(FakeEnvironment({{"NCCLGUARD_JOB_ID", "shared"}})).empty());
  CHECK(LaunchId(nullptr).empty());
}

TEST_CASE("the job id is a safe file name", "[job_dir]") {
  CHECK(JobId(FakeEnvironment({{"NCCLGUARD_JOB_ID", "../../etc"}}), "") == "_._.._etc");
  CHECK(JobId(FakeEnvironment({{"NCCLGUARD_JOB_ID", " a b/c\n"}}), "") == "a_b_c");
  CHECK(JobId(FakeEnvironment({{"NCCLGUARD_JOB_ID", ".."}}), "") == "_.");
  CHECK(JobId(FakeEnvironment({{"NCCLGUARD_JOB_ID", std::string(300, 'x')}}), "").size() == 100);
  CHECK(JobId(FakeEnvironment({}), std::string(64, 'a')) == "nccl-" + std::string(32, 'a'));
}

TEST_CASE("the job directory", "[job_dir]") {
  Config config;
  config.dump_dir = "/shared/guard//";
  CHECK(JobDirectory(config, "slurm-1.0") == "/shared/guard/slurm-1.0");
  CHECK(JobDirectory(config, "a/b") == "/shared/guard/a_b");
  config.dump_dir = "";
  const char* previous = std::getenv("TMPDIR");
  const std::string saved = previous != nullptr ? previous : "";
  const std::string uid = std::to_string(getuid());
  setenv("TMPDIR", "/scratch/me", 1);
  CHECK(JobDirectory(config, "j") == "/scratch/me/ncclguard-" + uid + "/j");
  unsetenv("TMPDIR");
  CHECK(JobDirectory(config, "j") == "/tmp/ncclguard-" + uid + "/j");
  if (previous != nullptr) setenv("TMPDIR", saved.c_str(), 1);
}

TEST_CASE("the status interval stretches with the job's size", "[job_dir]") {
  CHECK(StatusIntervalSeconds(2, 8) == 2);
  CHECK(StatusIntervalSeconds(2, 2000) == 2);
  CHECK(StatusIntervalSeconds(2, 10000) == 10);
  CHECK(StatusIntervalSeconds(30, 10000) == 30);
}

ProcessSnapshot BusySnapshot(int communicators) {
  ProcessSnapshot snapshot;
  snapshot.time_ns = 1'700'000'000'000'000'000;
  snapshot.rank = 3;
  snapshot.in_nccl_call = "ncclAllReduce";
  for (int i = 0; i < communicators; ++i) {
    CommSnapshot comm;
    comm.id = "9f3a00000000000" + std::to_string(i);
    comm.rank = 3;
    comm.nranks = 10000;
    comm.state = "ready";
    comm.last_enqueued = 1000000 + i;
    comm.last_started = 999999;
    comm.last_completed = 999998;
    OpSnapshot done;
    done.seq = 999998;
    done.op = "AllReduce";
    done.state = "completed";
    OpSnapshot outstanding;
    outstanding.seq = 999999;
    outstanding.op = "ReduceScatter";
    outstanding.state = "started";
    outstanding.bytes = 1 << 30;
    outstanding.enqueue_ns = 1'699'999'999'000'000'000;
    outstanding.start_ns = 1'699'999'999'500'000'000;
    comm.ring = {done, outstanding, outstanding};
    snapshot.comms.push_back(comm);
  }
  snapshot.stall = StallSnapshot{.kind = "not_completed",
                                 .comm_id = snapshot.comms.empty() ? "" : snapshot.comms[0].id,
                                 .seq = 999999,
                                 .seconds = 12.5,
                                 .message = "not written to status files",
                                 .verdict = "rank_not_joined",
                                 .verdict_message = "not written to status files either"};
  return snapshot;
}

ProcessFacts Identity(const std::string& host, int pid) {
  ProcessFacts identity;
  identity.host = host;
  identity.pid = pid;
  return identity;
}

TEST_CASE("status files are small, and read back", "[job_dir]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  const absl::StatusOr<std::string> busy = WriteStatus(job_dir, BusySnapshot(4), Identity("gpu-node-1", 100));
  REQUIRE(busy.ok());
  CHECK(fs::path(*busy).filename() == "status-gpu-node-1-100.json");
  CHECK(WrittenBytes(*busy) < 4096);
  ProcessSnapshot idle;
  idle.time_ns = 5'000'000'000;
  ProcessFacts launched = Identity("gpu-node-2", 200);
  launched.launcher = {{"RANK", "9"}};
  REQUIRE(WriteStatus(job_dir, idle, launched).ok());
  // Rewriting replaces: still one file per process.
  REQUIRE(WriteStatus(job_dir, BusySnapshot(4), Identity("gpu-node-1", 100)).ok());

  const absl::StatusOr<StatusScan> scan = ReadStatuses(job_dir);
  REQUIRE(scan.ok());
  CHECK(scan->problems.empty());
  REQUIRE(scan->statuses.size() == 2);
  const PeerStatus& first = scan->statuses[0];
  CHECK(first.file == "status-gpu-node-1-100.json");
  CHECK(first.host == "gpu-node-1");
  CHECK(first.pid == 100);
  CHECK(first.snapshot.rank == 3);
  CHECK(first.snapshot.time_ns == 1'700'000'000'000'000'000);
  CHECK(first.snapshot.in_nccl_call == "ncclAllReduce");
  REQUIRE(first.snapshot.stall.has_value());
  CHECK(first.snapshot.stall->seq == 999999);
  CHECK(first.snapshot.stall->seconds == 12.5);
  REQUIRE(first.snapshot.comms.size() == 4);
  const CommSnapshot& comm = first.snapshot.comms[2];
  CHECK(comm.id == "9f3a000000000002");
  CHECK(comm.nranks == 10000);
  CHECK(comm.last_enqueued == 1000002);
  CHECK(comm.last_completed == 999998);
  // Only the last completed and the oldest outstanding operations.
  REQUIRE(comm.ring.size() == 2);
  CHECK(comm.ring[0].seq == 999998);
  CHECK(comm.ring[0].state == "completed");
  CHECK(comm.ring[1].seq == 999999);
  CHECK(comm.ring[1].op == "ReduceScatter");
  CHECK(comm.ring[1].state == "started");
  CHECK(comm.ring[1].start_ns == 1'699'999'999'500'000'000);

  const PeerStatus& second = scan->statuses[1];
  CHECK(second.host == "gpu-node-2");
  CHECK(second.snapshot.rank == 9);  // the launcher's, when no communicator gave one
  CHECK(second.snapshot.time_ns == 5'000'000'000);
  CHECK_FALSE(second.snapshot.stall.has_value());
  CHECK(second.snapshot.comms.empty());
}

TEST_CASE("a status carries each communicator's pace blocks and the fail-slow verdicts held, bounded",
          "[job_dir]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  ProcessSnapshot snapshot = BusySnapshot(1);
  CommSnapshot& comm = snapshot.comms[0];
  comm.device = 3;
  PaceBlockSnapshot& block = comm.pace.emplace_back();
  block.first_seq = 1025;
  block.collectives = 7;
  block.wait_ms = 812.5;
  block.span_ms = 2000.25;
  block.links.push_back(
      PaceLinkSnapshot{.peer = 4, .channel = 1, .bytes = 1 << 20, .steps = 8, .network_ms = 3.5});
  snapshot.fail_slow.push_back(
      FailSlowSnapshot{.kind = "slow_rank", .comm_id = comm.id, .ranks = {2}, .message = "rank 2 is late"});
  const absl::StatusOr<std::string> path = WriteStatus(job_dir, snapshot, Identity("gpu-node-1", 100));
  REQUIRE(path.ok());
  std::ifstream file(*path);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  CHECK(text.find(R"("fail_slow":[{"kind":"slow_rank")") != std::string::npos);
  // Blocks by position, not by name: a status carries a thousand of them in a large job.
  CHECK(text.find(R"("pace":[[1025,7,812.5,2000.25,[[4,1,1048576,8,3.5]]]])") != std::string::npos);

  const absl::StatusOr<StatusScan> scan = ReadStatuses(job_dir);
  REQUIRE(scan.ok());
  REQUIRE(scan->statuses.size() == 1);
  const CommSnapshot& read_comm = scan->statuses[0].snapshot.comms.at(0);
  CHECK(read_comm.device == 3);
  REQUIRE(read_comm.pace.size() == 1);
  CHECK(read_comm.pace[0].first_seq == 1025);
  CHECK(read_comm.pace[0].collectives == 7);
  CHECK(read_comm.pace[0].wait_ms == 812.5);
  CHECK(read_comm.pace[0].span_ms == 2000.25);
  REQUIRE(read_comm.pace[0].links.size() == 1);
  CHECK(read_comm.pace[0].links[0].peer == 4);
  CHECK(read_comm.pace[0].links[0].channel == 1);
  CHECK(read_comm.pace[0].links[0].bytes == 1 << 20);
  CHECK(read_comm.pace[0].links[0].steps == 8);
  CHECK(read_comm.pace[0].links[0].network_ms == 3.5);

  // A writer that claims more blocks and links than any of ours writes: the rest is not read.
  using Json = nlohmann::json;
  Json hostile = Json::parse(text.substr(0, text.rfind(",\"checksum\"")) + "}");
  Json many_links = Json::array();
  for (int i = 0; i < 1000; ++i) many_links.push_back(Json::array({i, 0, 1, 1, 1.0}));
  Json many_blocks = Json::array();
  for (int i = 0; i < 1000; ++i) many_blocks.push_back(Json::array({1 + 8 * i, 8, 1.0, 1.0, many_links}));
  hostile["communicators"][0]["pace"] = many_blocks;
  hostile.erase("checksummed");
  const absl::StatusOr<PeerStatus> bounded = ParseStatusRecord("status-x-1.json", hostile.dump());
  REQUIRE(bounded.ok());
  CHECK(bounded->snapshot.comms[0].pace.size() == kMaxPaceBlocks);
  CHECK(bounded->snapshot.comms[0].pace[0].links.size() == kMaxPaceLinks);
}

// Every process rewrites its status file every interval, in place: a reader that reads it while a
// rewrite is half done must read it again, not report the process's status as unreadable (a live
// rank would look absent). Rewritten here every 200 microseconds, ten thousand times as often as
// at the defaults, with contents of two sizes.
TEST_CASE("a status file rewritten while it is being read is read and not reported as a problem",
          "[job_dir]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  REQUIRE(WriteStatus(job_dir, BusySnapshot(2), Identity("gpu-node-1", 100)).ok());
  std::atomic<bool> stop{false};
  std::atomic<long> rewrites{0};
  std::thread rewriter([&] {
    for (int communicators = 1; !stop.load(); communicators = 3 - communicators) {
      if (WriteStatus(job_dir, BusySnapshot(communicators), Identity("gpu-node-1", 100)).ok()) ++rewrites;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  int reads = 0;
  std::vector<std::string> problems;
  std::size_t statuses = 1;
  // Enough reads to land between a look and an open a few times over (about one in 2,000 does).
  // Read in this thread: ReadStatuses would start one per read, faster than they end.
  const int directory_fd = open(job_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  for (; directory_fd >= 0 && reads < 20000 && problems.empty() && statuses == 1; ++reads) {
    const StatusScan scan = ReadStatusesAt(directory_fd, std::chrono::steady_clock::now() + kReadDeadline);
    problems = scan.problems;
    statuses = scan.statuses.size();
  }
  stop = true;
  rewriter.join();
  REQUIRE(directory_fd >= 0);
  close(directory_fd);
  INFO(rewrites.load() << " rewrites during " << reads << " reads");
  CHECK(rewrites.load() > 0);
  CHECK(statuses == 1);
  CHECK(problems == std::vector<std::string>{});
}

ino_t InodeOf(const std::string& path) {
  struct stat file {};
  REQUIRE(stat(path.c_str(), &file) == 0);
  return file.st_ino;
}

TEST_CASE("a status file is rewritten in place, and created anew only when it outgrows its size",
          "[job_dir]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  const absl::StatusOr<std::string> path = WriteStatus(job_dir, BusySnapshot(1), Identity("node-a", 7));
  REQUIRE(path.ok());
  const ino_t first = InodeOf(*path);
  // Smaller and a little larger: the same file, its size a whole number of pages.
  REQUIRE(WriteStatus(job_dir, ProcessSnapshot{}, Identity("node-a", 7)).ok());
  REQUIRE(WriteStatus(job_dir, BusySnapshot(2), Identity("node-a", 7)).ok());
  CHECK(InodeOf(*path) == first);
  CHECK(fs::file_size(*path) % 4096 == 0);
  absl::StatusOr<StatusScan> scan = ReadStatuses(job_dir);
  REQUIRE(scan.ok());
  CHECK(scan->problems.empty());
  REQUIRE(scan->statuses.size() == 1);
  CHECK(scan->statuses[0].snapshot.comms.size() == 2);
  // Much larger: created anew, renamed over the old one.
  REQUIRE(WriteStatus(job_dir, BusySnapshot(40), Identity("node-a", 7)).ok());
  CHECK(InodeOf(*path) != first);
  scan = ReadStatuses(job_dir);
  REQUIRE(scan.ok());
  REQUIRE(scan->statuses.size() == 1);
  CHECK(scan->statuses[0].snapshot.comms.size() == 40);
  for (const auto& entry : fs::directory_iterator(job_dir))
    CHECK(entry.path().filename().string().rfind(".tmp-", 0) == std::string::npos);
}

TEST_CASE("a status file that a crash cut off in a rewrite is not read as a status", "[job_dir]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  const absl::StatusOr<std::string> path = WriteStatus(job_dir, BusySnapshot(3), Identity("node-a", 7));
  REQUIRE(path.ok());
  // The first bytes of another version written, the rest not: still valid JSON, a different rank.
  std::string content = testing::ReadFile(*path);
  const std::size_t rank = content.find("\"rank\":3");
  REQUIRE(rank != std::string::npos);
  content[rank + 7] = '5';
  std::ofstream(*path, std::ios::binary | std::ios::trunc) << content;
  const absl::StatusOr<StatusScan> scan = ReadStatuses(job_dir);
  REQUIRE(scan.ok());
  CHECK(scan->statuses.empty());
  REQUIRE(scan->problems.size() == 1);
  CHECK_THAT(scan->problems[0], Catch::Contains("status-node-a-7.json") && Catch::Contains("checksum"));
}

TEST_CASE("a status file of this build read by itself: a checksum, then spaces to the file's size",
          "[job_dir]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  const absl::StatusOr<std::string> path = WriteStatus(job_dir, BusySnapshot(1), Identity("node-a", 7));
  REQUIRE(path.ok());
  const std::string content = testing::ReadFile(*path);
  const nlohmann::json document = nlohmann::json::parse(content);  // trailing spaces are JSON
  CHECK(document.at("checksum").get<std::string>().size() == 16);
  CHECK(content.find_last_not_of(' ') < content.size() - 1);
}

// A process writes one status file; a tool writing a synthetic job of 100,000 writes as many, and
// the table of files kept open for rewriting drops the old ones: their descriptors go with them.
TEST_CASE("status files dropped from the table of open files are closed", "[job_dir]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  auto open_descriptors = [] {
    return std::distance(fs::directory_iterator("/proc/self/fd"), fs::directory_iterator());
  };
  REQUIRE(WriteStatus(job_dir, ProcessSnapshot{}, Identity("warm-up", 1)).ok());
  const auto before = open_descriptors();
  for (int pid = 2; pid < 200; ++pid)
    REQUIRE(WriteStatus(job_dir, ProcessSnapshot{}, Identity("node", pid)).ok());
  CHECK(open_descriptors() < before + 20);
}

// A tool writing many processes' statuses side by side (the synthetic job): one thread's new
// file drops the table's entries while another thread still writes through one of them, which
// must stay alive until that write ends (a use after free that the sanitizer builds catch).
TEST_CASE("status files written side by side by several threads", "[job_dir]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  constexpr int kThreads = 3;
  constexpr int kFilesEach = 60;
  std::atomic<int> failures{0};
  std::vector<std::thread> writers;
  for (int thread = 0; thread < kThreads; ++thread) {
    writers.emplace_back([&, thread] {
      for (int i = 0; i < kFilesEach; ++i) {
        if (!WriteStatus(job_dir, BusySnapshot(1), Identity("node", thread * kFilesEach + i + 1)).ok())
          failures.fetch_add(1);
      }
    });
  }
  for (std::thread& writer : writers) writer.join();
  CHECK(failures.load() == 0);
  const absl::StatusOr<StatusScan> scan = ReadStatuses(job_dir);
  REQUIRE(scan.ok());
  CHECK(scan->statuses.size() == kThreads * kFilesEach);
  CHECK(scan->problems.empty());
}

TEST_CASE("a status file whose directory was removed under the job is written again", "[job_dir]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  REQUIRE(WriteStatus(job_dir, BusySnapshot(1), Identity("node-a", 8)).ok());
  fs::remove_all(job_dir);
  // Written into the removed file until the look every kInPlaceChecks writes finds it gone.
  for (int write = 0; write < kInPlaceChecks; ++write)
    (void)WriteStatus(job_dir, BusySnapshot(1), Identity("node-a", 8));
  CHECK(fs::exists(job_dir + "/status-node-a-8.json"));
}

// What the P2P evidence and the known-bad entries match on, for a process that has not dumped.
ProcessFacts FactsOfAGeForceNode(const std::string& host, int pid) {
  ProcessFacts facts = Identity(host, pid);
  facts.environment = {{"NCCL_P2P_LEVEL", "SYS"}, {"NCCLGUARD_ACTION", "reinit"}};
  facts.kernel_release = "5.4.0-150-generic";
  facts.driver_version = "545.23.08";
  facts.cuda.driver_version = 12030;
  facts.cuda.device_count = 8;
  facts.cuda.peer_access.assign(8, std::vector<int>(8, 1));
  for (int device = 0; device < 8; ++device) {
    facts.cuda.peer_access[device][device] = 0;
    facts.cuda.gpus.push_back(GpuFacts{.device = device,
                                       .name = "NVIDIA GeForce RTX 4090",
                                       .pci_bus_id = "0000:1" + std::to_string(device) + ":00.0",
                                       .memory_free_bytes = 1 << 30,
                                       .memory_total_bytes = 1 << 30});
  }
  return facts;
}

TEST_CASE("status files carry the facts that do not change, and the job view uses them without a dump",
          "[job_dir]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  const ProcessFacts written = FactsOfAGeForceNode("gpu-node-1", 100);
  const absl::StatusOr<std::string> path = WriteStatus(job_dir, BusySnapshot(4), written);
  REQUIRE(path.ok());
  CHECK(WrittenBytes(*path) < 4096);
  // Memory changes while the process runs: a status file does not pretend to know it.
  CHECK(testing::ReadFile(*path).find("memory") == std::string::npos);

  const absl::StatusOr<StatusScan> scan = ReadStatuses(job_dir);
  REQUIRE(scan.ok());
  REQUIRE(scan->statuses.size() == 1);
  const ProcessFacts& read = scan->statuses[0].facts;
  CHECK(read.host == "gpu-node-1");
  CHECK(read.pid == 100);
  EnvironmentVariables sorted_environment = written.environment;  // as collected facts are
  std::sort(sorted_environment.begin(), sorted_environment.end());
  CHECK(read.environment == sorted_environment);
  CHECK(read.kernel_release == "5.4.0-150-generic");
  CHECK(read.driver_version == "545.23.08");
  CHECK(read.cuda.driver_version == 12030);
  CHECK(read.cuda.device_count == 8);
  CHECK(read.cuda.peer_access == written.cuda.peer_access);
  REQUIRE(read.cuda.gpus.size() == 8);
  CHECK(read.cuda.gpus[7].device == 7);
  CHECK(read.cuda.gpus[7].name == "NVIDIA GeForce RTX 4090");
  CHECK(read.cuda.gpus[7].pci_bus_id == "0000:17:00.0");
  CHECK(read.cuda.gpus[7].memory_total_bytes == -1);

  const absl::StatusOr<JobView> job = ReadJobDirectory(job_dir, 1'700'000'001'000'000'000, 2);
  REQUIRE(job.ok());
  REQUIRE(job->processes.size() == 1);
  CHECK(job->processes[0].dump_file.empty());
  CHECK(job->processes[0].facts.driver_version == "545.23.08");
  REQUIRE(job->processes[0].facts.cuda.gpus.size() == 8);
  CHECK(job->processes[0].facts.cuda.gpus[0].name == "NVIDIA GeForce RTX 4090");
}

TEST_CASE("a job's processes come out in rank order whatever ranks their statuses and dumps claim",
          "[job_dir]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  auto snapshot_of_rank = [](int rank, std::int64_t time_ns) {
    ProcessSnapshot snapshot;
    snapshot.time_ns = time_ns;
    snapshot.rank = rank;
    return snapshot;
  };
  constexpr std::int64_t kStatusTime = 1'700'000'000'000'000'000;
  // Two processes claim rank 1, one a rank past the job's size, one none; rank 2 left only a dump,
  // and the process of rank 3 a newer dump that says rank 5.
  const std::vector<std::pair<std::string, int>> statuses = {{"node-a", 3}, {"node-c", 1},  {"node-b", 1},
                                                             {"node-d", 9}, {"node-e", -1}, {"node-f", 0}};
  for (std::size_t writer = 0; writer < statuses.size(); ++writer) {
    const auto& [host, rank] = statuses[writer];
    REQUIRE(WriteStatus(job_dir, snapshot_of_rank(rank, kStatusTime),
                        Identity(host, 10 + static_cast<int>(writer)))
                .ok());
  }
  REQUIRE(WriteDump(job_dir, snapshot_of_rank(2, kStatusTime), Identity("node-g", 16)).ok());
  REQUIRE(WriteDump(job_dir, snapshot_of_rank(5, kStatusTime + 1), Identity("node-a", 10)).ok());

  const absl::StatusOr<JobView> job = ReadJobDirectory(job_dir, kStatusTime, 2);
  REQUIRE(job.ok());
  CHECK(job->problems.empty());
  std::vector<std::string> order;
  for (const ProcessView& process : job->processes) {
    order.push_back(absl::StrCat(process.snapshot.rank, " ", process.host, " ", process.pid));
    // Each view holds its own process's files.
    const std::string writer = absl::StrCat(process.host, "-", process.pid);
    CHECK((process.status_file.empty() || absl::StrContains(process.status_file, writer)));
    CHECK((process.dump_file.empty() || absl::StrContains(process.dump_file, writer)));
  }
  CHECK(order == std::vector<std::string>{"-1 node-e 14", "0 node-f 15", "1 node-b 12", "1 node-c 11",
                                          "2 node-g 16", "5 node-a 10", "9 node-d 13"});
  CHECK(job->processes[4].status_file.empty());
  CHECK_FALSE(job->processes[5].dump_file.empty());
}

TEST_CASE("a status file of an earlier build, without facts, reads with unknown facts", "[job_dir]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  REQUIRE(fs::create_directory(job_dir));
  std::ofstream(job_dir + "/status-old-9.json")
      << R"({"format": "ncclguard-status", "format_version": 1, "host": "old", "pid": 9, "rank": 2,)"
      << R"( "time_ns": 5, "in_nccl_call": "", "stall": null, "communicators": []})";
  const absl::StatusOr<StatusScan> scan = ReadStatuses(job_dir);
  REQUIRE(scan.ok());
  INFO(absl::StrJoin(scan->problems, "\n"));
  REQUIRE(scan->statuses.size() == 1);
  const ProcessFacts& facts = scan->statuses[0].facts;
  CHECK(facts.host == "old");
  CHECK(facts.environment.empty());
  CHECK(facts.driver_version == "unknown");
  CHECK(facts.cuda.device_count == -1);
  CHECK(facts.cuda.gpus.empty());
}

TEST_CASE("unreadable status files are reported and skipped", "[job_dir]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  REQUIRE(WriteStatus(job_dir, ProcessSnapshot{}, Identity("a", 1)).ok());
  std::ofstream(job_dir + "/status-broken-2.json") << "{\"format\": \"ncclguard-status\", ";
  std::ofstream(job_dir + "/status-wrong-3.json") << R"({"format": "something-else"})";
  std::ofstream(job_dir + "/status-future-4.json")
      << R"({"format": "ncclguard-status", "format_version": 2})";
  std::ofstream(job_dir + "/status-shape-5.json")
      << R"({"format": "ncclguard-status", "format_version": 1, "host": 5})";
  std::ofstream(job_dir + "/.tmp-status-c-6.json.6.0") << "partial";
  std::ofstream(temporary.path() + "/outside.json") << "{}";
  fs::create_symlink(temporary.path() + "/outside.json", job_dir + "/status-link-7.json");

  const absl::StatusOr<StatusScan> scan = ReadStatuses(job_dir);
  REQUIRE(scan.ok());
  REQUIRE(scan->statuses.size() == 1);
  CHECK(scan->statuses[0].host == "a");
  REQUIRE(scan->problems.size() == 5);
  const std::string problems = absl::StrJoin(scan->problems, "\n");
  for (const char* file : {"status-broken-2.json", "status-wrong-3.json", "status-future-4.json",
                           "status-shape-5.json", "status-link-7.json"}) {
    CHECK(problems.find(file) != std::string::npos);
  }
  CHECK(problems.find("version 2") != std::string::npos);
  CHECK_FALSE(ReadStatuses(temporary.path() + "/missing").ok());
}

// What a board holds may have been written by anyone: every change of type, range or shape of a
// good status is refused with a message, and never crashes or allocates by a number it claims.
TEST_CASE("a status of the wrong shape, type or range is refused, never a crash", "[job_dir]") {
  const absl::StatusOr<std::string> good =
      FormatStatus(BusySnapshot(2), FactsOfAGeForceNode("gpu-node-1", 100));
  REQUIRE(good.ok());
  REQUIRE(ParseStatusRecord("status-good", *good).ok());
  const nlohmann::json document = nlohmann::json::parse(*good);
  const std::vector<std::pair<std::string, nlohmann::json>> changes = {
      {"/format", "ncclguard-dump"},
      {"/format_version", "1"},
      {"/pid", "100"},
      {"/pid", 1e300},
      {"/rank", std::int64_t{1} << 40},
      {"/time_ns", -1.5},
      {"/stall", nlohmann::json::array()},
      {"/stall/seq", -1},
      {"/communicators", nlohmann::json::object()},
      {"/communicators/0", 7},
      {"/communicators/0/nranks", 100'000'000},
      {"/communicators/0/rank", 20000},
      {"/communicators/0/last_enqueued", -3},
      {"/communicators/0/oldest_outstanding/bytes", "huge"},
      {"/pending_inits", nlohmann::json::array({{{"rank", 0}}})},
      {"/environment/NCCL_P2P_LEVEL", 3},
      {"/system/gpus", nullptr},
      {"/system/peer_access", nlohmann::json::array({"yes"})},
      {"/communicators/0/profile", nlohmann::json::array({{{"func", 3}}})},
      {"/communicators/0/profile", nlohmann::json::object()},
  };
  for (const auto& [pointer, value] : changes) {
    nlohmann::json changed = document;
    changed[nlohmann::json::json_pointer(pointer)] = value;
    INFO(pointer << " = " << value.dump());
    const absl::StatusOr<PeerStatus> status = ParseStatusRecord("status-changed", changed.dump());
    CHECK_FALSE(status.ok());
  }
  for (const std::string& text : {std::string(), std::string("[1,2]"), std::string(100'000, '['),
                                  good->substr(0, good->size() / 2), std::string("\xff\xfe{}")}) {
    CHECK_FALSE(ParseStatusRecord("status-garbage", text).ok());
  }
  // Signatures only add evidence: unreadable ones are dropped, the status is read.
  nlohmann::json unsigned_status = document;
  unsigned_status["communicators"][0]["signatures"] = {{"first_seq", "x"}, {"hashes", 5}};
  const absl::StatusOr<PeerStatus> read = ParseStatusRecord("status-unsigned", unsigned_status.dump());
  REQUIRE(read.ok());
  CHECK(read->snapshot.comms[0].signatures.empty());
  CHECK(read->snapshot.comms[0].nranks == 10000);
}

// The reader looks members up where the last lookup ended (a writer's own order costs a step each):
// any other order, and objects of more members than it indexes, read the same.
TEST_CASE("a status reads the same whatever the order and number of its members", "[job_dir]") {
  const absl::StatusOr<std::string> good =
      FormatStatus(BusySnapshot(2), FactsOfAGeForceNode("gpu-node-1", 100));
  REQUIRE(good.ok());
  const nlohmann::ordered_json written = nlohmann::ordered_json::parse(*good);
  auto reversed = [](const nlohmann::ordered_json& object) {
    std::vector<std::pair<std::string, nlohmann::ordered_json>> members;
    for (const auto& member : object.items()) members.emplace_back(member.key(), member.value());
    nlohmann::ordered_json turned = nlohmann::ordered_json::object();
    for (auto member = members.rbegin(); member != members.rend(); ++member)
      turned[member->first] = member->second;
    return turned;
  };
  nlohmann::ordered_json backwards = reversed(written);
  for (nlohmann::ordered_json& comm : backwards["communicators"]) comm = reversed(comm);
  nlohmann::ordered_json crowded = written;
  for (int extra = 0; extra < 40; ++extra)
    crowded["communicators"][0]["extra_" + std::to_string(extra)] = extra;
  for (int extra = 0; extra < 40; ++extra) crowded["extra_" + std::to_string(extra)] = extra;

  const absl::StatusOr<PeerStatus> expected = ParseStatusRecord("status-good", *good);
  REQUIRE(expected.ok());
  for (const nlohmann::ordered_json& document : {backwards, crowded}) {
    const absl::StatusOr<PeerStatus> read = ParseStatusRecord("status-changed", document.dump());
    REQUIRE(read.ok());
    CHECK(read->pid == 100);
    CHECK(read->snapshot.rank == expected->snapshot.rank);
    CHECK(read->snapshot.time_ns == expected->snapshot.time_ns);
    REQUIRE(read->snapshot.stall.has_value());
    CHECK(read->snapshot.stall->verdict == "rank_not_joined");
    REQUIRE(read->snapshot.comms.size() == 2);
    CHECK(read->snapshot.comms[1].last_enqueued == 1000001);
    REQUIRE(read->snapshot.comms[0].ring.size() == 2);
    CHECK(read->snapshot.comms[0].ring[1].op == "ReduceScatter");
    CHECK(read->snapshot.comms[0].ring[1].start_ns == 1'699'999'999'500'000'000);
    CHECK(read->snapshot.comms[0].signatures == expected->snapshot.comms[0].signatures);
    CHECK(read->facts.environment == expected->facts.environment);
    CHECK(read->facts.cuda.gpus.size() == 8);
    CHECK(read->facts.cuda.peer_access == expected->facts.cuda.peer_access);
  }
}

// A board that keeps the facts apart (Redis): the status names a record by its digest, which the
// reader checks before it believes the record.
TEST_CASE("a status that names its facts record holds no facts; the record reads back by its digest",
          "[job_dir]") {
  const ProcessFacts facts = FactsOfAGeForceNode("gpu-node-1", 100);
  const absl::StatusOr<StatusFactsRecord> record = FormatStatusFacts(facts);
  REQUIRE(record.ok());
  CHECK(record->digest.size() == 16);
  CHECK(FormatStatusFacts(FactsOfAGeForceNode("gpu-node-2", 200))->digest == record->digest);
  const absl::StatusOr<std::string> status = FormatStatus(BusySnapshot(1), facts, record->digest);
  REQUIRE(status.ok());
  CHECK(status->find("RTX 4090") == std::string::npos);
  const absl::StatusOr<PeerStatus> read = ParseStatusRecord("status-x", *status);
  REQUIRE(read.ok());
  CHECK(read->facts_digest == record->digest);
  CHECK(read->facts.environment.empty());

  ProcessFacts from_record;
  REQUIRE(ParseStatusFacts(record->digest, record->content, from_record).ok());
  EnvironmentVariables sorted = facts.environment;  // read back by name, as a dump's are
  std::sort(sorted.begin(), sorted.end());
  CHECK(from_record.environment == sorted);
  CHECK(from_record.kernel_release == "5.4.0-150-generic");
  CHECK(from_record.driver_version == "545.23.08");
  CHECK(from_record.cuda.device_count == 8);
  REQUIRE(from_record.cuda.gpus.size() == 8);
  CHECK(from_record.cuda.gpus[7].pci_bus_id == "0000:17:00.0");

  ProcessFacts ignored;
  CHECK(absl::IsDataLoss(ParseStatusFacts("0000000000000000", record->content, ignored)));
  std::string changed = record->content;
  changed.replace(changed.find("545.23.08"), 9, "550.54.14");
  CHECK(absl::IsDataLoss(ParseStatusFacts(record->digest, changed, ignored)));
  CHECK_FALSE(ParseStatusFacts(record->digest, std::string(2 << 20, ' '), ignored).ok());
}

TEST_CASE("a status file is written through no symbolic link", "[job_dir]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  REQUIRE(mkdir(job_dir.c_str(), 0700) == 0);
  const std::string target = temporary.path() + "/precious";
  std::ofstream(target) << "keep me";
  fs::create_symlink(target, job_dir + "/status-a-1.json");
  REQUIRE(WriteStatus(job_dir, ProcessSnapshot{}, Identity("a", 1)).ok());
  CHECK(testing::ReadFile(target) == "keep me");
  CHECK_FALSE(fs::is_symlink(job_dir + "/status-a-1.json"));
}

// Requests already there at a watcher's first look are all old.
constexpr std::int64_t kNoFreshRequests = std::numeric_limits<std::int64_t>::max();

void WriteRawRequest(const std::string& job_dir, const std::string& name, const std::string& host, int pid,
                     std::int64_t time_ns = 1) {
  const std::string content =
      nlohmann::json{{"requester", "by hand"}, {"host", host}, {"pid", pid}, {"time_ns", time_ns}}.dump();
  REQUIRE(WriteFileAtomically(job_dir + "/" + kDumpRequestsDirectory, name, content, false).ok());
}

// As RequestDumps writes it: in place, since every process keeps it open.
void SetGeneration(const std::string& job_dir, const std::string& name) {
  REQUIRE(OverwriteInPlace(job_dir + "/" + kDumpRequestsDirectory, "generation", name + "\n", 256,
                           /*levels_below_job_directory=*/1)
              .ok());
}

std::vector<std::string> RequestNames(const std::vector<DumpRequest>& requests) {
  std::vector<std::string> names;
  for (const DumpRequest& request : requests) names.push_back(request.name);
  return names;
}

TEST_CASE("dump requests are seen once by every other process", "[job_dir]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  DumpRequestWatcher other(job_dir, "some-other-host", 77, kNoFreshRequests);
  DumpRequestWatcher self(job_dir, OwnHost(), static_cast<int>(getpid()), kNoFreshRequests);

  // A request left by an earlier launch with the same job id is not acted on.
  const absl::StatusOr<std::string> stale = RequestDumps(job_dir, "an earlier launch");
  REQUIRE(stale.ok());
  REQUIRE(other.Poll().ok());
  REQUIRE(self.Poll().ok());
  CHECK(other.Poll()->empty());

  const absl::StatusOr<std::string> request =
      RequestDumps(job_dir, "rank 2: AllReduce #20 stalled", {"1111222233334444", "5555666677778888"});
  REQUIRE(request.ok());
  CHECK(request->rfind("dump-request-", 0) == 0);
  CHECK(*request != *stale);
  const absl::StatusOr<std::vector<DumpRequest>> seen = other.Poll();
  REQUIRE(seen.ok());
  REQUIRE(seen->size() == 1);
  CHECK((*seen)[0].name == *request);
  CHECK((*seen)[0].requester == "rank 2: AllReduce #20 stalled");
  CHECK((*seen)[0].host == OwnHost());
  CHECK((*seen)[0].pid == getpid());
  CHECK((*seen)[0].time_ns > 0);
  // The requester's communicators, by which a process of another job sharing the id tells it apart.
  CHECK((*seen)[0].comms == std::vector<std::string>{"1111222233334444", "5555666677778888"});
  CHECK(other.Poll()->empty());  // not seen again
  CHECK(self.Poll()->empty());   // a process does not answer its own request

  const absl::StatusOr<std::vector<DumpRequest>> pending = PendingDumpRequests(job_dir, {*stale});
  REQUIRE(pending.ok());
  CHECK(RequestNames(*pending) == std::vector<std::string>{*request});
  CHECK(PendingDumpRequests(job_dir, {*stale, *request})->empty());
  CHECK(PendingDumpRequests(temporary.path() + "/no-job", {})->empty());
}

TEST_CASE("a quiet job costs no directory listing, a new generation does", "[job_dir]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  DumpRequestWatcher watcher(job_dir, "me", 1, kNoFreshRequests);
  REQUIRE(watcher.Poll()->empty());  // nothing there yet: the baseline is empty
  // A request whose generation was not announced is not found: the directory is not listed.
  WriteRawRequest(job_dir, "dump-request-x-5-1", "x", 5);
  SetGeneration(job_dir, "");
  CHECK(watcher.Poll()->empty());
  SetGeneration(job_dir, "dump-request-x-5-1");
  CHECK(RequestNames(*watcher.Poll()) == std::vector<std::string>{"dump-request-x-5-1"});
  CHECK(watcher.Poll()->empty());
}

TEST_CASE("at the first look, only requests made since this process started are new", "[job_dir]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  WriteRawRequest(job_dir, "dump-request-old-3-1", "old", 3, 100);     // an earlier launch's
  WriteRawRequest(job_dir, "dump-request-peer-4-1", "peer", 4, 2000);  // made after we started
  SetGeneration(job_dir, "dump-request-peer-4-1");
  DumpRequestWatcher watcher(job_dir, "me", 1, /*fresh_since_ns=*/1000);
  CHECK(RequestNames(*watcher.Poll()) == std::vector<std::string>{"dump-request-peer-4-1"});
  CHECK(watcher.Poll()->empty());
}

TEST_CASE("requests older than the one the first look found are old, though never listed", "[job_dir]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  WriteRawRequest(job_dir, "dump-request-old-3-1", "old", 3, 100);
  WriteRawRequest(job_dir, "dump-request-old-3-2", "old", 3, 200);
  SetGeneration(job_dir, "dump-request-old-3-2");
  DumpRequestWatcher watcher(job_dir, "me", 1, /*fresh_since_ns=*/1000);
  CHECK(watcher.Poll()->empty());
  WriteRawRequest(job_dir, "dump-request-peer-4-1", "peer", 4, 2000);
  SetGeneration(job_dir, "dump-request-peer-4-1");
  CHECK(RequestNames(*watcher.Poll()) == std::vector<std::string>{"dump-request-peer-4-1"});
  CHECK(watcher.Poll()->empty());
}

TEST_CASE("a listing older than the generation is listed again", "[job_dir]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  DumpRequestWatcher watcher(job_dir, "me", 1, kNoFreshRequests);
  REQUIRE(watcher.Poll()->empty());
  // As a shared file system's cached directory would show: the generation names a request that
  // the listing does not hold yet.
  SetGeneration(job_dir, "dump-request-late-9-1");
  CHECK(watcher.Poll()->empty());
  WriteRawRequest(job_dir, "dump-request-late-9-1", "late", 9);
  CHECK(RequestNames(*watcher.Poll()) == std::vector<std::string>{"dump-request-late-9-1"});
  CHECK(watcher.Poll()->empty());
}

TEST_CASE("an unreadable request still asks for a dump", "[job_dir]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  DumpRequestWatcher watcher(job_dir, "me", 1, kNoFreshRequests);
  REQUIRE(watcher.Poll()->empty());
  REQUIRE(
      WriteFileAtomically(job_dir + "/" + kDumpRequestsDirectory, "dump-request-odd-1-1", "not json", false)
          .ok());
  SetGeneration(job_dir, "dump-request-odd-1-1");
  const absl::StatusOr<std::vector<DumpRequest>> seen = watcher.Poll();
  REQUIRE(seen.ok());
  REQUIRE(seen->size() == 1);
  CHECK((*seen)[0].requester == "unknown");
}

TEST_CASE("the coordination files are private", "[job_dir]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  REQUIRE(RequestDumps(job_dir, "test").ok());
  REQUIRE(WriteStatus(job_dir, ProcessSnapshot{}, Identity("h", 1)).ok());
  for (const auto& entry : fs::recursive_directory_iterator(temporary.path())) {
    INFO(entry.path());
    const fs::perms permissions = fs::symlink_status(entry.path()).permissions();
    const fs::perms expected =
        entry.is_directory() ? fs::perms::owner_all : fs::perms::owner_read | fs::perms::owner_write;
    CHECK(permissions == expected);
    CHECK(entry.path().filename().string().rfind(".tmp-", 0) == std::string::npos);
  }
}

TEST_CASE("the dump requests' generation is kept open and rewritten in place", "[job_dir]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  DumpRequestWatcher watcher(job_dir, "me", 1, kNoFreshRequests);
  REQUIRE(watcher.Poll()->empty());
  // The first poll made it, empty, to keep it open.
  const std::string generation = job_dir + "/" + kDumpRequestsDirectory + "/generation";
  REQUIRE(fs::exists(generation));
  const ino_t inode = InodeOf(generation);
  const absl::StatusOr<std::string> request = RequestDumps(job_dir, "rank 1 stalled");
  REQUIRE(request.ok());
  CHECK(InodeOf(generation) == inode);
  CHECK(RequestNames(*watcher.Poll()) == std::vector<std::string>{*request});
  // An older build renames a new generation over it: seen once the file is opened again.
  REQUIRE(WriteFileAtomically(job_dir + "/" + kDumpRequestsDirectory, "generation", "dump-request-old-1-1\n",
                              false, 1)
              .ok());
  WriteRawRequest(job_dir, "dump-request-old-1-1", "old", 1);
  std::vector<std::string> seen;
  for (int poll = 0; poll < kInPlaceChecks && seen.empty(); ++poll) seen = RequestNames(*watcher.Poll());
  CHECK(seen == std::vector<std::string>{"dump-request-old-1-1"});
}

}  // namespace
}  // namespace ncclguard
