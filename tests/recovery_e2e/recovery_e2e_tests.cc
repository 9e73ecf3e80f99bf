// NCCLGUARD_ACTION=reinit end to end, on the emulator: a job whose P2P transfers stall is
// classified p2p_suspect, records the verdict, exits with the restart code, and `ncclguard run`
// brings it back with P2P disabled, to the checksums of a healthy run. What a user reads is
// checked: the exit status, the emulator's transport report and ncclguard's own log lines.
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/recovery_e2e/job.h"
#include "tests/support/board.h"
#include "tests/support/process.h"
#include "tests/support/train_loop_output.h"

using ncclguard::testing::AnalyzeTarget;
using ncclguard::testing::Checksums;
using ncclguard::testing::Contains;
using ncclguard::testing::CountOccurrences;
using ncclguard::testing::Environment;
using ncclguard::testing::HealthyChecksums;
using ncclguard::testing::Job;
using ncclguard::testing::LogLinesOf;
using ncclguard::testing::RankPids;
using ncclguard::testing::ReadFile;
using ncclguard::testing::RunEmulatorJob;
using ncclguard::testing::TemporaryDirectory;
using ncclguard::testing::TestBoard;
using ncclguard::testing::TrainLoop;

namespace {

constexpr char kJobId[] = "recovery";
constexpr int kRestartExitCode = 75;
// The launcher's last line when a rank failed: the end of an attempt in train_loop's output.
constexpr char kJobFailed[] = "train_loop: job failed";
constexpr char kRecordFile[] = "p2p-verdict.json";

// Runs `command` on the emulator with short timeouts and NCCLGUARD_ACTION=reinit, a job directory
// of its own in `dump_dir` and NCCL's INFO log (the transport report).
Job RunJob(const TemporaryDirectory& dump_dir, const std::vector<std::string>& command,
           const Environment& settings) {
  const Environment reinit_settings{{"NCCL_DEBUG", "INFO"},
                                    {"NCCLGUARD_ACTION", "reinit"},
                                    {"NCCLGUARD_TIMEOUT", "1"},
                                    {"NCCLGUARD_POLL_INTERVAL", "0.05"},
                                    {"NCCLGUARD_STATUS_INTERVAL", "0.2"}};
  // A last resort: train_loop's --timeout ends hung attempts.
  return RunEmulatorJob(dump_dir, kJobId, command, {reinit_settings, settings}, 50);
}

std::vector<std::string> UnderNcclguardRun(std::vector<std::string> arguments) {
  arguments.insert(arguments.begin(), {NCCLGUARD_CLI, "run", "--max-restarts", "1", "--", TRAIN_LOOP});
  return arguments;
}

// Each attempt's part of the output: train_loop's launcher ends a failed attempt with one line.
std::pair<std::string, std::string> SplitAttempts(const std::string& out) {
  const size_t end = out.find(kJobFailed);
  if (end == std::string::npos) return {out, ""};
  const size_t next = out.find('\n', end);
  return {out.substr(0, next), next == std::string::npos ? "" : out.substr(next + 1)};
}

// What the first attempt of a P2P stall must show, per rank: the stall and its verdict, then the
// record (written by a rank that stalled) or the following of it; and the second attempt: P2P
// disabled because of the record, SHM instead of P2P, the healthy checksums.
void CheckRecoveredP2pStall(const Job& job, int ranks, const std::map<int, std::string>& healthy) {
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  CHECK(job.result.exit_code == 0);
  const auto [first, second] = SplitAttempts(job.result.out);
  REQUIRE_FALSE(second.empty());

  // First attempt: P2P in use, every rank ends with the restart code.
  CHECK(Contains(first, " via P2P/"));
  CHECK(Contains(
      first, "ranks failed: " + std::string(ranks == 4 ? "0,1,2,3" : "0,1") + "; ranks not finished: none"));
  CHECK(CountOccurrences(first, "failed: exit code " + std::to_string(kRestartExitCode)) == ranks);
  const std::map<int, int> first_pids = RankPids(first);
  REQUIRE(first_pids.size() == static_cast<size_t>(ranks));
  int recorders = 0;
  for (const auto& [rank, pid] : first_pids) {
    INFO("first attempt, rank " << rank << ", pid " << pid);
    const std::vector<std::string> recorded = LogLinesOf(job.result.err, pid, "recorded p2p_suspect");
    REQUIRE(recorded.size() == 1);
    if (Contains(recorded[0], "recorded p2p_suspect in " + AnalyzeTarget(job.job_dir)[0] + "/" + kRecordFile +
                                  "; exiting with 75 so that the job restarts with NCCL_P2P_DISABLE=1")) {
      ++recorders;
      const std::vector<std::string> stall = LogLinesOf(job.result.err, pid, " — verdict: p2p_suspect: ");
      CHECK(stall.size() == 1);
    } else {
      // It followed another rank's record without a stall of its own.
      CHECK(Contains(recorded[0], "exiting with 75 so that the job restarts with NCCL_P2P_DISABLE=1"));
    }
    // A few lines tell the story: no flood of warnings.
    CHECK(LogLinesOf(job.result.err, pid, " WARN ").size() +
              LogLinesOf(job.result.err, pid, " ERROR ").size() <=
          4);
  }
  CHECK(recorders >= 1);
  const absl::StatusOr<std::string> recorded = TestBoard(job.job_dir, kJobId)->Get("", kRecordFile, 1 << 16);
  REQUIRE(recorded.ok());
  const nlohmann::json record = nlohmann::json::parse(*recorded);
  CHECK(record.at("verdict") == "p2p_suspect");
  CHECK(record.at("job_id") == kJobId);
  CHECK(Contains(record.at("message"), "NCCL_P2P_DISABLE=1"));

  // Second attempt: P2P disabled before the first communicator, because of the record.
  CHECK(Contains(second, " via SHM/"));
  CHECK_FALSE(Contains(second, " via P2P/"));
  const std::map<int, int> second_pids = RankPids(second);
  REQUIRE(second_pids.size() == static_cast<size_t>(ranks));
  for (const auto& [rank, pid] : second_pids) {
    INFO("second attempt, rank " << rank << ", pid " << pid);
    CHECK(LogLinesOf(job.result.err, pid,
                     "NCCL_P2P_DISABLE=1 set before the first communicator: an earlier attempt "
                     "of job recovery found P2P at fault")
              .size() == 1);
    // The record of the first attempt does not make the second one exit.
    CHECK(LogLinesOf(job.result.err, pid, "exiting with").empty());
  }
  CHECK(Checksums(second) == healthy);
}

}  // namespace

TEST_CASE("S2: the first collective hangs with driver 545.23.08 and the job restarts with P2P disabled",
          "[reinit][p2p_suspect]") {
  const std::vector<std::string> arguments = {"--ranks", "4", "--steps", "20", "--timeout", "15"};
  const std::map<int, std::string> healthy = HealthyChecksums(arguments);
  REQUIRE(healthy.size() == 4);
  TemporaryDirectory dump_dir;
  const Job job = RunJob(dump_dir, UnderNcclguardRun(arguments),
                         {{"NCCLEMU_FAULTS", "p2p_stall:after=0"}, {"NCCLEMU_DRIVER_VERSION", "545.23.08"}});
  CheckRecoveredP2pStall(job, 4, healthy);
}

TEST_CASE(
    "S1: P2P stalls on GeForce RTX 4090s after 50 collectives (dlopen loader and forked workers) and "
    "the job restarts with P2P disabled",
    "[reinit][p2p_suspect]") {
  const std::vector<std::string> arguments = {"--ranks", "2",         "--steps", "80",        "--nccl-loader",
                                              "dlopen",  "--workers", "2",       "--timeout", "15"};
  const std::map<int, std::string> healthy = HealthyChecksums(arguments);
  REQUIRE(healthy.size() == 2);
  TemporaryDirectory dump_dir;
  const Job job =
      RunJob(dump_dir, UnderNcclguardRun(arguments),
             {{"NCCLEMU_FAULTS", "p2p_stall:after=50"}, {"NCCLEMU_GPU_NAME", "NVIDIA GeForce RTX 4090"}});
  CheckRecoveredP2pStall(job, 2, healthy);
  INFO(job.transcript);
  CHECK(CountOccurrences(SplitAttempts(job.result.out).second, "2 data loader workers finished") == 2);
}

TEST_CASE("S2 under `ncclguard run --redis`: the board run starts carries the P2P verdict to the restart",
          "[reinit][p2p_suspect][one-board]") {
  const std::vector<std::string> arguments = {"--ranks", "4", "--steps", "20", "--timeout", "15"};
  const std::map<int, std::string> healthy = HealthyChecksums(arguments);
  REQUIRE(healthy.size() == 4);
  TemporaryDirectory dump_dir;
  std::vector<std::string> command = UnderNcclguardRun(arguments);
  command.insert(command.begin() + 2, "--redis");
  const Job job = RunJob(dump_dir, command,
                         {{"NCCLEMU_FAULTS", "p2p_stall:after=0"}, {"NCCLEMU_DRIVER_VERSION", "545.23.08"}});
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  CHECK(job.result.exit_code == 0);
  CHECK(Contains(job.result.err, ", NCCLGUARD_STORE=redis://"));
  const auto [first, second] = SplitAttempts(job.result.out);
  CHECK(Contains(first, " via P2P/"));
  // The verdict went on the Redis board, not into the job directory, and the restart read it there.
  CHECK(Contains(job.result.err, "recorded p2p_suspect in redis://"));
  CHECK_FALSE(std::filesystem::exists(job.job_dir + "/" + kRecordFile));
  CHECK(Contains(second, " via SHM/"));
  CHECK(CountOccurrences(job.result.err, "an earlier attempt of job recovery found P2P at fault") == 4);
  CHECK(Checksums(second) == healthy);
}

TEST_CASE("a stall that is not P2P exits with the restart code and records no P2P verdict", "[reinit]") {
  TemporaryDirectory dump_dir;
  const Job job = RunJob(dump_dir, TrainLoop({"--ranks", "4", "--steps", "20", "--timeout", "15"}),
                         {{"NCCLEMU_FAULTS", "hang:rank=1,seq=5"}, {"LD_PRELOAD", PRELOAD_LIBRARY}});
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  CHECK(Contains(job.result.out, "ranks failed: 0,1,2,3; ranks not finished: none"));
  CHECK(CountOccurrences(job.result.out, "failed: exit code 75") == 4);
  CHECK(absl::IsNotFound(TestBoard(job.job_dir, kJobId)->Get("", kRecordFile, 1 << 16).status()));
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 4);
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank);
    CHECK(LogLinesOf(job.result.err, pid,
                     "exiting with code 75 after the stall (NCCLGUARD_ACTION=reinit; verdict "
                     "stuck_inside_nccl: the restarted job keeps its P2P setting)")
              .size() == 1);
  }
}

TEST_CASE(
    "a p2p_suspect verdict while the user set NCCL_P2P_LEVEL exits with the restart code and records nothing",
    "[reinit][p2p_suspect]") {
  TemporaryDirectory dump_dir;
  const Job job = RunJob(dump_dir, TrainLoop({"--ranks", "2", "--steps", "20", "--timeout", "15"}),
                         {{"NCCLEMU_FAULTS", "p2p_stall:after=3"},
                          {"NCCLEMU_GPU_NAME", "NVIDIA GeForce RTX 4090"},
                          {"NCCL_P2P_LEVEL", "SYS"},
                          {"LD_PRELOAD", PRELOAD_LIBRARY}});
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  CHECK(CountOccurrences(job.result.out, "failed: exit code 75") == 2);
  CHECK(absl::IsNotFound(TestBoard(job.job_dir, kJobId)->Get("", kRecordFile, 1 << 16).status()));
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 2);
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank);
    CHECK(LogLinesOf(job.result.err, pid,
                     "p2p_suspect, but NCCL_P2P_LEVEL=SYS is set explicitly: a restart would not "
                     "change P2P, so no P2P verdict is recorded")
              .size() == 1);
    CHECK(LogLinesOf(job.result.err, pid,
                     "exiting with code 75 after the stall (NCCLGUARD_ACTION=reinit; verdict "
                     "p2p_suspect")
              .size() == 1);
  }
}

namespace {

// Two torchrun jobs in one Slurm allocation: the batch step's SLURM_JOB_ID, no SLURM_STEP_ID, a
// TORCHELASTIC_RUN_ID each (torchrun keeps it across the restarts of its job). Given one
// NCCLGUARD_JOB_ID, they share the job directory (or the keys of a Redis board).
// `settings` are added.
Environment AllocationJob(const std::string& run_id, const Environment& settings = {}) {
  Environment environment = {{"SLURM_JOB_ID", "4242"},
                             {"SLURM_STEP_ID", std::nullopt},
                             {"TORCHELASTIC_RUN_ID", run_id},
                             {"LD_PRELOAD", PRELOAD_LIBRARY}};
  environment.insert(settings.begin(), settings.end());
  return environment;
}

constexpr char kOtherJobIgnored[] = "P2P verdict of another job ignored: ";

}  // namespace

TEST_CASE(
    "a job's P2P verdict acts only on that job: a healthy job of the same allocation sharing its job id runs "
    "on with P2P, a later one starts with P2P, and the faulty job's restart comes back without P2P",
    "[reinit][p2p_suspect][scope]") {
  const std::vector<std::string> faulty_arguments = {"--ranks", "2", "--steps", "20", "--timeout", "15"};
  const std::map<int, std::string> faulty_healthy = HealthyChecksums(faulty_arguments);
  // Long enough (250 steps of at least 60 ms) to be running when the faulty job records its verdict
  // and asks every process of the job id for a dump.
  const std::vector<std::string> healthy_arguments = {"--ranks", "2",    "--steps",   "250",
                                                      "--slow",  "0:60", "--timeout", "40"};
  const std::map<int, std::string> healthy_checksums = HealthyChecksums(healthy_arguments);
  REQUIRE(healthy_checksums.size() == 2);
  TemporaryDirectory dump_dir;
  // A timeout that a loaded machine does not reach: this job has no fault.
  const Environment healthy_settings = AllocationJob("job-b", {{"NCCLGUARD_TIMEOUT", "10"}});

  Job healthy;
  std::thread healthy_job([&] {
    healthy = RunJob(dump_dir, TrainLoop(healthy_arguments), healthy_settings);
  });
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const Environment faulty_settings = AllocationJob(
      "job-a", {{"NCCLEMU_FAULTS", "p2p_stall:after=0"}, {"NCCLEMU_DRIVER_VERSION", "545.23.08"}});
  const Job faulty = RunJob(dump_dir, TrainLoop(faulty_arguments), faulty_settings);
  healthy_job.join();

  {
    INFO(faulty.transcript);
    REQUIRE_FALSE(faulty.result.timed_out);
    CHECK(Contains(faulty.result.out, " via P2P/"));
    CHECK(CountOccurrences(faulty.result.out, "failed: exit code 75") == 2);
    CHECK(Contains(faulty.result.err, "recorded p2p_suspect in "));
  }
  {
    INFO(healthy.transcript);
    REQUIRE_FALSE(healthy.result.timed_out);
    CHECK(healthy.result.exit_code == 0);
    CHECK(Contains(healthy.result.out, "train_loop: all 2 ranks finished"));
    CHECK(Checksums(healthy.result.out) == healthy_checksums);
    CHECK(Contains(healthy.result.out, " via P2P/"));
    CHECK_FALSE(Contains(healthy.result.out, " via SHM/"));
    const std::map<int, int> pids = RankPids(healthy.result.out);
    REQUIRE(pids.size() == 2);
    for (const auto& [rank, pid] : pids) {
      INFO("healthy job, rank " << rank << ", pid " << pid);
      CHECK(LogLinesOf(healthy.result.err, pid, "exiting with").empty());
      // What was ignored and why: the other job's requests (its record comes with them), once per
      // process that asked.
      const std::vector<std::string> ignored =
          LogLinesOf(healthy.result.err, pid, "dump request of another job ignored: ");
      CHECK(ignored.size() >= 1);
      CHECK(ignored.size() <= 2);
      for (const std::string& line : ignored) {
        CHECK(Contains(line, " WARN "));
        CHECK(Contains(line, "and this process has none of them"));
      }
      CHECK(LogLinesOf(healthy.result.err, pid, "dumped state at another process's request").empty());
    }
  }

  // A job of the allocation started after the record is another job too: it starts with P2P.
  const Job later = RunJob(dump_dir, TrainLoop(faulty_arguments), {AllocationJob("job-c")});
  {
    INFO(later.transcript);
    REQUIRE_FALSE(later.result.timed_out);
    CHECK(later.result.exit_code == 0);
    CHECK(Contains(later.result.out, " via P2P/"));
    CHECK_FALSE(Contains(later.result.out, " via SHM/"));
    CHECK(Checksums(later.result.out) == faulty_healthy);
    CHECK(CountOccurrences(later.result.err,
                           std::string(kOtherJobIgnored) +
                               "job id recovery holds a record of launch 'slurm-4242_torchelastic-job-a'") ==
          2);
    CHECK_FALSE(Contains(later.result.err, "NCCL_P2P_DISABLE=1 set"));
  }

  // torchrun restarts the faulty job with the same run id: that is the same job, and P2P is off.
  const Job restarted = RunJob(dump_dir, TrainLoop(faulty_arguments), faulty_settings);
  INFO(restarted.transcript);
  REQUIRE_FALSE(restarted.result.timed_out);
  CHECK(restarted.result.exit_code == 0);
  CHECK(Contains(restarted.result.out, " via SHM/"));
  CHECK_FALSE(Contains(restarted.result.out, " via P2P/"));
  CHECK(Checksums(restarted.result.out) == faulty_healthy);
  CHECK(CountOccurrences(restarted.result.err,
                         "NCCL_P2P_DISABLE=1 set before the first communicator: an earlier attempt of job "
                         "recovery found P2P at fault") == 2);
  CHECK_FALSE(Contains(restarted.result.err, kOtherJobIgnored));
}
