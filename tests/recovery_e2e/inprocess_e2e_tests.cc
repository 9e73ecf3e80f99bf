// NCCLGUARD_RECOVER=inprocess end to end, on the emulator: the P2P stalls of the field cases hit
// a communicator's first operations, and every rank re-creates the communicator with P2P disabled
// and replays the operation inside its running process. The job finishes in one attempt, with the
// checksums of a healthy run; when one rank cannot recover, no rank does. What a user reads is
// checked: exit statuses, results, ncclguard's log lines and the emulator's transport report.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/recovery_e2e/job.h"
#include "tests/support/process.h"
#include "tests/support/redis_server.h"
#include "tests/support/train_loop_output.h"

using ncclguard::testing::Checksums;
using ncclguard::testing::Contains;
using ncclguard::testing::CountOccurrences;
using ncclguard::testing::Environment;
using ncclguard::testing::HealthyChecksums;
using ncclguard::testing::HealthyRun;
using ncclguard::testing::Job;
using ncclguard::testing::LogLinesOf;
using ncclguard::testing::RankPids;
using ncclguard::testing::ReadFile;
using ncclguard::testing::RunEmulatorJob;
using ncclguard::testing::RunHealthy;
using ncclguard::testing::TemporaryDirectory;
using ncclguard::testing::TrainLoop;

namespace {

constexpr char kJobId[] = "inprocess";
constexpr char kRecovering[] = "stalled on probation: recovering it in-process";
constexpr char kRecovered[] = ": re-created with P2P disabled on a private NCCL instance and replayed";

// Runs `command` on the emulator under ncclguard with in-process recovery, short timeouts, NCCL's
// INFO log (the transport report) and a job directory of its own in `dump_dir`.
Job RunJob(const TemporaryDirectory& dump_dir, const std::vector<std::string>& command,
           const Environment& settings) {
  const Environment recover_settings{{"LD_PRELOAD", PRELOAD_LIBRARY},     {"NCCL_DEBUG", "INFO"},
                                     {"NCCLGUARD_RECOVER", "inprocess"},  {"NCCLGUARD_ACTION", "exit"},
                                     {"NCCLGUARD_TIMEOUT", "1"},          {"NCCLGUARD_POLL_INTERVAL", "0.05"},
                                     {"NCCLGUARD_STATUS_INTERVAL", "0.2"}};
  // A last resort: the programs' own timeouts end hung jobs.
  return RunEmulatorJob(dump_dir, kJobId, command, {recover_settings, settings}, 80);
}

std::vector<std::string> TwoComms(std::vector<std::string> arguments) {
  arguments.insert(arguments.begin(), TWO_COMMS);
  return arguments;
}

// Ranks -> pids of two_comms' ranks ("rank R/N: pid P").
std::map<int, int> TwoCommsPids(const std::string& out) {
  std::map<int, int> pids;
  for (const std::string& line : ncclguard::testing::SplitLines(out)) {
    int rank = -1;
    int ranks = 0;
    int pid = 0;
    if (std::sscanf(line.c_str(), "rank %d/%d: pid %d", &rank, &ranks, &pid) == 3) pids[rank] = pid;
  }
  return pids;
}

// A job whose first operations stall on P2P: one attempt, every rank recovered once in a few log
// lines, P2P before and SHM after, the healthy checksums, and the meeting's decision. The job is
// train_loop or another `program` that prints train_loop's lines (start-up, checksums, and
// "<program>: all N ranks finished").
void CheckRecoveredInOneAttempt(const Job& job, int ranks, const std::map<int, std::string>& healthy,
                                const std::string& operation, const std::string& program = "train_loop") {
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  CHECK(job.result.exit_code == 0);
  CHECK(Contains(job.result.out, program + ": all " + std::to_string(ranks) + " ranks finished"));
  CHECK(CountOccurrences(job.result.out, program + ": job failed") == 0);
  CHECK(Checksums(job.result.out) == healthy);
  // The first communicator used P2P; the one re-created on the private instance, shared memory.
  CHECK(Contains(job.result.out + job.result.err, " via P2P/"));
  CHECK(Contains(job.result.out + job.result.err, " via SHM/"));
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == static_cast<size_t>(ranks));
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank << ", pid " << pid);
    CHECK(LogLinesOf(job.result.err, pid, operation + " " + kRecovering).size() == 1);
    const std::vector<std::string> recovered = LogLinesOf(job.result.err, pid, operation + kRecovered);
    REQUIRE(recovered.size() == 1);
    CHECK(Contains(recovered[0],
                   "(all " + std::to_string(ranks) + " ranks are ready); the application goes on"));
    CHECK(LogLinesOf(job.result.err, pid, "exiting with").empty());
    // The recovery in a few lines: the stall with its verdict, then the two above (and, for S2, the
    // known-bad driver at init).
    CHECK(LogLinesOf(job.result.err, pid, " WARN ").size() +
              LogLinesOf(job.result.err, pid, " ERROR ").size() <=
          4);
  }
  // The private copy of libnccl was removed by the last process that used it.
  CHECK(std::filesystem::is_empty(job.job_dir + "/nccl-instances"));
  // One meeting, one decision: recover. (On a Redis board the meeting's records are not files;
  // each rank's "all N ranks are ready" above is its decision's reason.)
  if (!ncclguard::testing::TestStore().empty()) return;
  std::vector<std::string> decisions;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(job.job_dir + "/recovery")) {
    if (entry.path().filename() == "decision.json") decisions.push_back(entry.path());
  }
  REQUIRE(decisions.size() == 1);
  CHECK(nlohmann::json::parse(ReadFile(decisions[0])).at("decision") == "recover");
}

// ddp_habits' job in these tests: 4 ranks, its defaults otherwise (6 parameters broadcast, 5 steps
// of 4 buckets). Its own watchdog gives up on a collective after 20 s, well before the test's
// limits.
constexpr int kDdpRanks = 4;
constexpr int kDdpCollectives = 6 + 5 * 4;

std::vector<std::string> DdpHabits(bool nonblocking) {
  std::vector<std::string> command = {DDP_HABITS, "--ranks", std::to_string(kDdpRanks), "--framework-timeout",
                                      "20"};
  if (nonblocking) command.emplace_back("--nonblocking");
  return command;
}

// The framework's own watchdog never gave up, and saw every collective of every rank complete.
void CheckFrameworkWatchdogSatisfied(const std::string& out) {
  CHECK_FALSE(Contains(out, "framework watchdog: "));
  for (int rank = 0; rank < kDdpRanks; ++rank) {
    const std::string count = std::to_string(kDdpCollectives);
    CHECK(CountOccurrences(out, "rank " + std::to_string(rank) + ": framework watchdog saw " + count +
                                    " of " + count + " collectives complete\n") == 1);
  }
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST_CASE(
    "S2: the first Broadcast hangs with driver 545.23.08 and every rank recovers in-process, in one attempt",
    "[inprocess][p2p_suspect]") {
  const std::vector<std::string> arguments = {"--ranks", "4", "--steps", "20", "--timeout", "40"};
  const std::map<int, std::string> healthy = HealthyChecksums(arguments);
  REQUIRE(healthy.size() == 4);
  TemporaryDirectory dump_dir;
  const Job job = RunJob(dump_dir, TrainLoop(arguments),
                         {{"NCCLEMU_FAULTS", "p2p_stall:after=0"}, {"NCCLEMU_DRIVER_VERSION", "545.23.08"}});
  CheckRecoveredInOneAttempt(job, 4, healthy, "#1 Broadcast");
  // The stall line says why: P2P with a known-bad driver.
  for (const auto& [rank, pid] : RankPids(job.result.out)) {
    INFO("rank " << rank);
    CHECK(LogLinesOf(job.result.err, pid, "verdict: p2p_suspect").size() == 1);
  }
}

TEST_CASE("S3: a large Broadcast from root 0 stalls on three RTX A6000s and every rank recovers in-process",
          "[inprocess]") {
  // 16 MB of parameters: the broadcast of a model being created, as in the field case.
  const std::vector<std::string> arguments = {"--ranks", "3",       "--steps", "5",         "--model-count",
                                              "4000000", "--count", "4096",    "--timeout", "60"};
  const std::map<int, std::string> healthy = HealthyChecksums(arguments);
  REQUIRE(healthy.size() == 3);
  TemporaryDirectory dump_dir;
  const Job job = RunJob(dump_dir, TrainLoop(arguments),
                         {{"NCCLEMU_FAULTS", "p2p_stall:after=0"}, {"NCCLEMU_GPU_NAME", "NVIDIA RTX A6000"}});
  CheckRecoveredInOneAttempt(job, 3, healthy, "#1 Broadcast");
}

TEST_CASE("an in-place AllReduce that stalls is replayed from the copy of its input taken on probation",
          "[inprocess]") {
  // The Broadcast goes through; the first AllReduce (#2, in place) stalls.
  const std::vector<std::string> arguments = {"--ranks", "2", "--steps", "10", "--timeout", "40"};
  const std::map<int, std::string> healthy = HealthyChecksums(arguments);
  TemporaryDirectory dump_dir;
  const Job job = RunJob(dump_dir, TrainLoop(arguments), {{"NCCLEMU_FAULTS", "p2p_stall:after=1"}});
  CheckRecoveredInOneAttempt(job, 2, healthy, "#2 AllReduce");
}

TEST_CASE("in-process recovery works on every way of loading NCCL", "[inprocess]") {
  for (const std::string loader : {"dlopen", "rtld-local"}) {
    SECTION(loader) {
      const std::vector<std::string> arguments = {"--ranks",       "2",    "--steps",   "10",
                                                  "--nccl-loader", loader, "--timeout", "40"};
      const std::map<int, std::string> healthy = HealthyChecksums(arguments);
      TemporaryDirectory dump_dir;
      const Job job = RunJob(dump_dir, TrainLoop(arguments), {{"NCCLEMU_FAULTS", "p2p_stall:after=0"}});
      CheckRecoveredInOneAttempt(job, 2, healthy, "#1 Broadcast");
    }
  }
}

TEST_CASE(
    "two communicators whose first operations were issued in different orders on different streams are "
    "both recovered, and a split and a communicator made afterwards work, on the private instance",
    "[inprocess]") {
  TemporaryDirectory dump_dir;
  const Job job =
      RunJob(dump_dir, TwoComms({"--ranks", "2", "--crossed", "--split", "--late", "--steps", "3"}),
             {{"NCCLEMU_FAULTS", "p2p_stall:after=0"}, {"NCCLGUARD_LOG_LEVEL", "info"}});
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  CHECK(job.result.exit_code == 0);
  CHECK(CountOccurrences(job.result.out, "3 steps on comms A and B (crossed) correct") == 2);
  CHECK(CountOccurrences(job.result.out, "split of comm A correct") == 2);
  CHECK(CountOccurrences(job.result.out, "comm C, created afterwards, correct") == 2);
  const std::map<int, int> pids = TwoCommsPids(job.result.out);
  REQUIRE(pids.size() == 2);
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank);
    // Each communicator on its own: two meetings, two recoveries.
    CHECK(LogLinesOf(job.result.err, pid, "#1 AllReduce" + std::string(kRecovered)).size() == 2);
    CHECK(LogLinesOf(job.result.err, pid, "exiting with").empty());
    // The split of a recovered communicator, and a communicator created later, are made by the
    // private instance (its copy of libnccl), with P2P off.
    for (const char* creation : {"created by ncclCommSplit", "created by ncclCommInitRank"}) {
      const std::vector<std::string> created = LogLinesOf(job.result.err, pid, std::string(creation));
      REQUIRE_FALSE(created.empty());
      CHECK(Contains(created.back(), job.job_dir + "/nccl-instances/libnccl-"));
    }
  }
}

TEST_CASE("a grouped ring exchange of Sends and Recvs that stalls is replayed as a group", "[inprocess]") {
  TemporaryDirectory dump_dir;
  const Job job = RunJob(dump_dir, TwoComms({"--ranks", "3", "--exchange", "--steps", "3"}),
                         {{"NCCLEMU_FAULTS", "p2p_stall:after=0"}});
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  CHECK(job.result.exit_code == 0);
  CHECK(CountOccurrences(job.result.out, "3 steps on comms A and B correct") == 3);
  const std::map<int, int> pids = TwoCommsPids(job.result.out);
  REQUIRE(pids.size() == 3);
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank);
    CHECK(LogLinesOf(job.result.err, pid, "#1 AllReduce" + std::string(kRecovered)).size() == 1);
    // The exchange's Send (#1) and Recv (#2) are one group: whichever the watchdog saw stall first,
    // one recovery replays both.
    CHECK(LogLinesOf(job.result.err, pid, std::string(kRecovered)).size() == 2);
    CHECK(LogLinesOf(job.result.err, pid, "exiting with").empty());
  }
}

TEST_CASE(
    "probation never blocks a thread: first operations issued in different orders on two communicators "
    "complete without a fault",
    "[inprocess]") {
  TemporaryDirectory dump_dir;
  const Job job = RunJob(dump_dir, TwoComms({"--ranks", "4", "--crossed", "--steps", "5"}), {});
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  CHECK(job.result.exit_code == 0);
  CHECK(CountOccurrences(job.result.out, "5 steps on comms A and B (crossed) correct") == 4);
  CHECK_FALSE(Contains(job.result.err, "stalled"));
  CHECK_FALSE(Contains(job.result.err, "in-process"));
}

TEST_CASE(
    "operations queued back to back on two communicators, in crossed orders on different ranks, are held "
    "and issued in order: the job completes without a fault, and recovers both communicators after a stall",
    "[inprocess]") {
  for (const bool exchange : {false, true}) {
    for (const bool fault : {false, true}) {
      DYNAMIC_SECTION((exchange ? "a grouped ring exchange on B" : "AllReduces")
                      << (fault ? ", P2P stall" : ", healthy")) {
        std::vector<std::string> arguments = {"--ranks", "4", "--crossed", "--queued", "--steps", "6"};
        if (exchange) arguments.push_back("--exchange");
        TemporaryDirectory dump_dir;
        Environment settings;
        if (fault) settings["NCCLEMU_FAULTS"] = "p2p_stall:after=0";
        const Job job = RunJob(dump_dir, TwoComms(arguments), settings);
        INFO(job.transcript);
        REQUIRE_FALSE(job.result.timed_out);
        CHECK(job.result.exit_code == 0);
        CHECK(CountOccurrences(job.result.out, "6 steps on comms A and B (crossed) (queued) correct") == 4);
        const std::map<int, int> pids = TwoCommsPids(job.result.out);
        REQUIRE(pids.size() == 4);
        for (const auto& [rank, pid] : pids) {
          INFO("rank " << rank);
          // Each communicator's first operation is the one that stalls; the five queued behind it
          // follow on the new communicator.
          CHECK(LogLinesOf(job.result.err, pid, std::string(kRecovered)).size() == (fault ? 2U : 0U));
          CHECK(LogLinesOf(job.result.err, pid, "falls back").empty());
          CHECK(LogLinesOf(job.result.err, pid, "exiting with").empty());
        }
      }
    }
  }
}

TEST_CASE(
    "when frees wait for every stream of the device, as cudaFree does, the recovery does not wait for the "
    "abort: S2 under PyTorch's habits still recovers in one attempt",
    "[inprocess][frameworks]") {
  const std::vector<std::string> arguments = {DDP_HABITS, "--ranks", "4", "--framework-timeout", "20"};
  const std::map<int, std::string> healthy = ncclguard::testing::RunHealthy(arguments).checksums;
  REQUIRE(healthy.size() == 4);
  TemporaryDirectory dump_dir;
  const Job job = RunJob(dump_dir, arguments,
                         {{"NCCLEMU_FAULTS", "p2p_stall:after=0"},
                          {"NCCLEMU_DRIVER_VERSION", "545.23.08"},
                          {"NCCLEMU_FREES_WAIT", "1"}});
  CheckRecoveredInOneAttempt(job, 4, healthy, "#1 Broadcast", "ddp_habits");
}

TEST_CASE("when one rank cannot replay its operation, no rank recovers: every rank falls back to exit 75",
          "[inprocess]") {
  // Only rank 0 of an in-place Reduce has its input overwritten; with a copy budget of one byte it
  // is the one rank that cannot replay it.
  TemporaryDirectory dump_dir;
  const Job job = RunJob(dump_dir, TwoComms({"--ranks", "3", "--reduce", "--steps", "2"}),
                         {{"NCCLEMU_FAULTS", "p2p_stall:after=0"}, {"NCCLGUARD_PROBATION_MAX_BYTES", "1"}});
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  const std::map<int, int> pids = TwoCommsPids(job.result.out);
  REQUIRE(pids.size() == 3);
  CHECK(CountOccurrences(job.result.out, "exited with code 75") == 3);
  CHECK_FALSE(Contains(job.result.err, kRecovered));
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank);
    const std::vector<std::string> fell_back =
        LogLinesOf(job.result.err, pid, "#1 Reduce: in-process recovery falls back: ");
    REQUIRE(fell_back.size() == 1);
    CHECK(Contains(fell_back[0], "rank 0 cannot recover"));
    CHECK(Contains(fell_back[0], "its input is its output, and larger than NCCLGUARD_PROBATION_MAX_BYTES"));
    CHECK(LogLinesOf(job.result.err, pid, "exiting with code 75").size() == 1);
  }
}

TEST_CASE("without NCCLGUARD_RECOVER nothing is held or recovered: the stall ends as NCCLGUARD_ACTION says",
          "[inprocess]") {
  TemporaryDirectory dump_dir;
  const Job job = RunJob(dump_dir, TrainLoop({"--ranks", "2", "--steps", "10", "--timeout", "40"}),
                         {{"NCCLEMU_FAULTS", "p2p_stall:after=0"}, {"NCCLGUARD_RECOVER", std::nullopt}});
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  CHECK(CountOccurrences(job.result.out, "failed: exit code 75") == 2);
  CHECK_FALSE(Contains(job.result.err, "in-process"));
  CHECK_FALSE(std::filesystem::exists(job.job_dir + "/recovery"));
}

// PyTorch's habits: a config'd (optionally non-blocking) init, a split, a dedicated NCCL stream
// behind an event of the compute stream, back-to-back operations waited for once, end events
// polled by the framework's own watchdog thread.
TEST_CASE(
    "a job calling NCCL as PyTorch's ProcessGroupNCCL and DDP do runs unchanged under in-process recovery "
    "without a fault",
    "[inprocess][frameworks]") {
  const HealthyRun blocking = RunHealthy(DdpHabits(false));
  const HealthyRun nonblocking = RunHealthy(DdpHabits(true));
  REQUIRE(blocking.checksums.size() == static_cast<size_t>(kDdpRanks));
  CHECK(nonblocking.checksums == blocking.checksums);
  CheckFrameworkWatchdogSatisfied(blocking.result.out);
  CheckFrameworkWatchdogSatisfied(nonblocking.result.out);
  for (const std::string mode : {"blocking", "nonblocking"}) {
    SECTION(mode) {
      TemporaryDirectory dump_dir;
      const Job job = RunJob(dump_dir, DdpHabits(mode == "nonblocking"), {});
      INFO(job.transcript);
      REQUIRE_FALSE(job.result.timed_out);
      CHECK(job.result.exit_code == 0);
      CHECK(Contains(job.result.out, "ddp_habits: all " + std::to_string(kDdpRanks) + " ranks finished"));
      CHECK(Checksums(job.result.out) == blocking.checksums);
      CheckFrameworkWatchdogSatisfied(job.result.out);
      CHECK(CountOccurrences(job.result.err, "ncclguard WARN") == 0);
    }
  }
}

TEST_CASE(
    "S2 under PyTorch's habits: the first of the Broadcasts queued back to back hangs, and every rank "
    "recovers in-process, in one attempt, unseen by the framework's watchdog",
    "[inprocess][frameworks]") {
  for (const std::string mode : {"blocking", "nonblocking"}) {
    SECTION(mode) {
      const HealthyRun healthy = RunHealthy(DdpHabits(mode == "nonblocking"));
      REQUIRE(healthy.checksums.size() == static_cast<size_t>(kDdpRanks));
      TemporaryDirectory dump_dir;
      const auto start = std::chrono::steady_clock::now();
      const Job job =
          RunJob(dump_dir, DdpHabits(mode == "nonblocking"),
                 {{"NCCLEMU_FAULTS", "p2p_stall:after=0"}, {"NCCLEMU_DRIVER_VERSION", "545.23.08"}});
      const double wall_seconds = SecondsSince(start);
      CheckRecoveredInOneAttempt(job, kDdpRanks, healthy.checksums, "#1 Broadcast", "ddp_habits");
      INFO(job.transcript);
      CheckFrameworkWatchdogSatisfied(job.result.out);
      for (const auto& [rank, pid] : RankPids(job.result.out)) {
        INFO("rank " << rank);
        CHECK(LogLinesOf(job.result.err, pid, "verdict: p2p_suspect").size() == 1);
      }
      // The recovery costs the stall's detection (NCCLGUARD_TIMEOUT=1 s) and a few seconds more.
      // The healthy run's time counts twice: on a loaded machine the recovered run's own work can
      // take as long again, and a bound in absolute seconds alone would then fail for nothing.
      INFO("healthy run " << healthy.wall_seconds << " s, recovered run " << wall_seconds << " s");
      CHECK(wall_seconds < 2 * healthy.wall_seconds + 1 + 5);
    }
  }
}

TEST_CASE(
    "a process that holds the private copy's lock and does not run costs the recovery no more than the "
    "meeting's deadline",
    "[inprocess]") {
  TemporaryDirectory dump_dir;
  // The copies' directory, made as ncclguard makes it, locked as a process of the node that was
  // stopped (SIGSTOP, a debugger) while it copied the library would hold it.
  const std::string copies = dump_dir.path() + "/" + kJobId + "/nccl-instances";
  REQUIRE(mkdir((dump_dir.path() + "/" + kJobId).c_str(), 0700) == 0);
  REQUIRE(mkdir(copies.c_str(), 0700) == 0);
  const int lock_fd = open(copies.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  REQUIRE(lock_fd >= 0);
  REQUIRE(flock(lock_fd, LOCK_EX) == 0);
  const auto start = std::chrono::steady_clock::now();
  const Job job = RunJob(dump_dir, TrainLoop({"--ranks", "2", "--steps", "10", "--timeout", "45"}),
                         {{"NCCLEMU_FAULTS", "p2p_stall:after=0"}});
  const double wall_seconds = SecondsSince(start);
  close(lock_fd);
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  // Every rank falls back at the meeting's deadline (5 s: NCCLGUARD_TIMEOUT=1 s is below its
  // least) and the stall ends as NCCLGUARD_ACTION=exit says, long before train_loop's 45 s.
  CHECK(CountOccurrences(job.result.out, "failed: exit code 75") == 2);
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 2);
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank << ", pid " << pid);
    const std::vector<std::string> fell_back =
        LogLinesOf(job.result.err, pid, "#1 Broadcast: in-process recovery falls back: ");
    REQUIRE(fell_back.size() == 1);
    CHECK(Contains(fell_back[0], "locked while copying NCCL"));
    CHECK(LogLinesOf(job.result.err, pid, "exiting with code 75").size() == 1);
  }
  // The watchdog waited no longer than the meeting: it never looked stuck.
  CHECK_FALSE(Contains(job.result.err, "stalls are not being detected"));
  // Detection (1 s), the meeting (5 s) and the exit, with room for a loaded machine; waiting for
  // the lock as long as a 300 MB copy may take (60 s) would not end before train_loop's timeout.
  CHECK(wall_seconds < 25);
}
