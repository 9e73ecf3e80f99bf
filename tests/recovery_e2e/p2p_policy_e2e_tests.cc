// The P2P decision end to end: train_loop jobs on the emulator with libncclguard.so preloaded. The
// emulator, like NCCL, reads NCCL_P2P_DISABLE once at its first communicator init and says which
// transport each channel uses (NCCL_DEBUG=INFO): "via P2P/..." or "via SHM/...". So a variable
// set too late, or not at all, shows.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/support/board.h"
#include "tests/support/process.h"
#include "tests/support/train_loop_output.h"
#include "watchdog/recover/p2p_verdict.h"
#include "watchdog/report/dump.h"

using ncclguard::testing::Checksums;
using ncclguard::testing::CountOccurrences;
using ncclguard::testing::EmulatorJobEnvironment;
using ncclguard::testing::LogLinesOf;
using ncclguard::testing::ProcessOptions;
using ncclguard::testing::ProcessResult;
using ncclguard::testing::RankPids;
using ncclguard::testing::RunProcess;
using ncclguard::testing::TemporaryDirectory;
using Environment = std::map<std::string, std::optional<std::string>>;

namespace {

constexpr char kJobId[] = "p2p-policy";

struct Job {
  ProcessResult result;
  std::map<int, int> pids;  // rank → pid
  std::string transcript;
};

// A healthy two-rank job on the emulator under ncclguard, with NCCL's INFO lines on stdout.
Job RunTrainLoop(const TemporaryDirectory& dump_dir, const Environment& settings,
                 std::vector<std::string> extra_arguments = {}) {
  std::vector<std::string> argv = {TRAIN_LOOP, "--ranks", "2", "--steps", "5", "--timeout", "30"};
  argv.insert(argv.end(), extra_arguments.begin(), extra_arguments.end());
  ProcessOptions options;
  options.timeout_seconds = 50;
  options.environment = EmulatorJobEnvironment(EMULATOR_LIBRARY_DIR, dump_dir.path(), kJobId);
  options.environment["LD_PRELOAD"] = PRELOAD_LIBRARY;
  options.environment["NCCL_DEBUG"] = "INFO";
  options.environment["NCCLGUARD_LOG_LEVEL"] = "info";
  for (const auto& [name, value] : settings) options.environment[name] = value;
  Job job;
  job.result = RunProcess(argv, options);
  job.pids = RankPids(job.result.out);
  job.transcript = "train_loop: exit code " + std::to_string(job.result.exit_code) + "\nstdout:\n" +
                   job.result.out + "\nstderr:\n" + job.result.err;
  return job;
}

// Both ranks finished with the same checksum, over the transport the emulator reported.
void RequireCompleted(const Job& job) {
  REQUIRE_FALSE(job.result.timed_out);
  REQUIRE(job.result.exit_code == 0);
  REQUIRE(job.pids.size() == 2);
  const std::map<int, std::string> checksums = Checksums(job.result.out);
  REQUIRE(checksums.size() == 2);
  CHECK(checksums.at(0) == checksums.at(1));
}

bool UsedP2p(const Job& job) { return CountOccurrences(job.result.out, " via P2P/") > 0; }
bool UsedShm(const Job& job) { return CountOccurrences(job.result.out, " via SHM/") > 0; }

// The one log line of each rank's process that contains `needle`.
void RequireOneLinePerRank(const Job& job, const std::string& needle) {
  for (const auto& [rank, pid] : job.pids) {
    INFO("rank " << rank << ", looking for: " << needle);
    CHECK(LogLinesOf(job.result.err, pid, needle).size() == 1);
  }
}

}  // namespace

TEST_CASE("a known-bad driver is reported at the first NCCL call, and P2P stays on", "[p2p_policy_e2e]") {
  TemporaryDirectory dump_dir;
  const Job job = RunTrainLoop(dump_dir, {{"NCCLEMU_DRIVER_VERSION", "545.23.08"}});
  INFO(job.transcript);
  RequireCompleted(job);
  RequireOneLinePerRank(job,
                        "WARN known-bad configuration: [driver-545.23.08-p2p] driver 545.23.08, P2P not "
                        "disabled: ");
  RequireOneLinePerRank(job, "set NCCL_P2P_DISABLE=1, or change the driver");
  CHECK(UsedP2p(job));
  CHECK_FALSE(UsedShm(job));
  CHECK(CountOccurrences(job.result.err, "NCCL_P2P_DISABLE=1 set before") == 0);
}

TEST_CASE("a sound machine gets no known-bad line", "[p2p_policy_e2e]") {
  TemporaryDirectory dump_dir;
  const Job job = RunTrainLoop(dump_dir, {});
  INFO(job.transcript);
  RequireCompleted(job);
  CHECK(CountOccurrences(job.result.err, " known-bad") == 0);
  CHECK(UsedP2p(job));
}

TEST_CASE("a disable entry turns P2P off before the first init", "[p2p_policy_e2e]") {
  TemporaryDirectory dump_dir;
  const std::string entries =
      R"({"format": "ncclguard-known-bad", "format_version": 1, "entries": [{"id": "test-h100-no-p2p",
          "match": {"gpu_name": "H100", "p2p_enabled": true}, "action": "disable",
          "summary": "a test entry", "remedy": "none needed", "source": "https://example.org/test"}]})";
  REQUIRE(ncclguard::WriteFileAtomically(dump_dir.path(), "test-known-bad.json", entries, false).ok());
  const Job job =
      RunTrainLoop(dump_dir, {{"NCCLGUARD_KNOWN_BAD_FILE", dump_dir.path() + "/test-known-bad.json"}});
  INFO(job.transcript);
  RequireCompleted(job);
  RequireOneLinePerRank(job,
                        "WARN known-bad configuration: [test-h100-no-p2p] GPU NVIDIA H100 80GB HBM3, P2P not "
                        "disabled: a test entry — none needed");
  RequireOneLinePerRank(job,
                        "WARN NCCL_P2P_DISABLE=1 set before the first communicator: known-bad configuration "
                        "test-h100-no-p2p");
  CHECK(UsedShm(job));
  CHECK_FALSE(UsedP2p(job));

  SECTION("not on other GPUs") {
    TemporaryDirectory other_dump_dir;
    const Job other =
        RunTrainLoop(other_dump_dir, {{"NCCLGUARD_KNOWN_BAD_FILE", dump_dir.path() + "/test-known-bad.json"},
                                      {"NCCLEMU_GPU_NAME", "NVIDIA A100-SXM4-80GB"}});
    INFO(other.transcript);
    RequireCompleted(other);
    CHECK(CountOccurrences(other.result.err, "WARN known-bad") == 0);
    CHECK(UsedP2p(other));
  }
}

TEST_CASE("NCCLGUARD_P2P=off disables P2P before the first init, on every loading path", "[p2p_policy_e2e]") {
  const std::string loader = GENERATE(as<std::string>{}, "linked", "dlopen");
  INFO("--nccl-loader " << loader);
  TemporaryDirectory dump_dir;
  const Job job = RunTrainLoop(dump_dir, {{"NCCLGUARD_P2P", "off"}}, {"--nccl-loader", loader});
  INFO(job.transcript);
  RequireCompleted(job);
  RequireOneLinePerRank(job, "WARN NCCL_P2P_DISABLE=1 set before the first communicator: NCCLGUARD_P2P=off");
  CHECK(UsedShm(job));
  CHECK_FALSE(UsedP2p(job));
}

TEST_CASE("the user's NCCL_P2P_DISABLE=0 is respected and reported", "[p2p_policy_e2e]") {
  TemporaryDirectory dump_dir;
  SECTION("in the environment") {
    const Job job = RunTrainLoop(dump_dir, {{"NCCLGUARD_P2P", "off"}, {"NCCL_P2P_DISABLE", "0"}});
    INFO(job.transcript);
    RequireCompleted(job);
    RequireOneLinePerRank(job,
                          "WARN P2P left as the user set it (NCCL_P2P_DISABLE=0 in the environment) although "
                          "NCCLGUARD_P2P=off");
    CHECK(UsedP2p(job));
    CHECK_FALSE(UsedShm(job));
  }
  SECTION("in NCCL's config file") {
    REQUIRE(ncclguard::WriteFileAtomically(dump_dir.path(), "nccl.conf", "NCCL_P2P_DISABLE=0\n", false).ok());
    const std::string conf = dump_dir.path() + "/nccl.conf";
    const Job job = RunTrainLoop(dump_dir, {{"NCCLGUARD_P2P", "off"}, {"NCCL_CONF_FILE", conf}});
    INFO(job.transcript);
    RequireCompleted(job);
    RequireOneLinePerRank(job, "WARN P2P left as the user set it (NCCL_P2P_DISABLE=0 in " + conf +
                                   ") although NCCLGUARD_P2P=off");
    CHECK(UsedP2p(job));
  }
}

TEST_CASE("a verdict of an earlier attempt disables P2P, and a corrupt one is named and ignored",
          "[p2p_policy_e2e]") {
  TemporaryDirectory dump_dir;
  const std::string job_dir = dump_dir.path() + "/" + kJobId;
  SECTION("the verdict") {
    ncclguard::P2pVerdictRecord record;
    record.job_id = kJobId;
    record.message = "stuck inside NCCL with P2P in use";
    record.comm = "00000000000000aa";
    record.seq = 6;
    record.ranks = {0, 1};
    record.host = "node0";
    record.pid = 100;
    record.rank = 0;
    REQUIRE(ncclguard::WriteP2pVerdict(ncclguard::testing::TestBoard(job_dir, kJobId), record).ok());
    const Job job = RunTrainLoop(dump_dir, {});
    INFO(job.transcript);
    RequireCompleted(job);
    RequireOneLinePerRank(
        job,
        "WARN NCCL_P2P_DISABLE=1 set before the first communicator: an earlier attempt of "
        "job p2p-policy found P2P at fault (00000000000000aa: stuck inside NCCL with P2P in use");
    CHECK(UsedShm(job));
    CHECK_FALSE(UsedP2p(job));
  }
  SECTION("a corrupt file") {
    REQUIRE(ncclguard::testing::TestBoard(job_dir, kJobId)
                ->Put("", ncclguard::kP2pVerdictFile, "{\"format\": \"ncclguard-p2p", false)
                .ok());
    const Job job = RunTrainLoop(dump_dir, {});
    INFO(job.transcript);
    RequireCompleted(job);
    RequireOneLinePerRank(job, "WARN P2P verdict of an earlier attempt not used: ");
    RequireOneLinePerRank(job, std::string(ncclguard::kP2pVerdictFile));
    CHECK(UsedP2p(job));
  }
}
