// A process's exit while ncclguard is busy with a stall, end to end on the emulator with
// libncclguard.so preloaded: a benchmark written as NCCL's performance tests are (one process,
// four GPUs, its own error check that calls exit() with its own code right after a failed call)
// meets a hang under every NCCLGUARD_ACTION, and leaves with its own exit status, or with the one
// ncclguard documents where ncclguard itself ends the process: never with a signal.
#include <catch2/catch.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/process.h"
#include "tests/support/train_loop_output.h"

using ncclguard::testing::EmulatorJobEnvironment;
using ncclguard::testing::ProcessOptions;
using ncclguard::testing::ProcessResult;
using ncclguard::testing::RunProcess;
using ncclguard::testing::TemporaryDirectory;

namespace {

constexpr char kJobId[] = "exit";
// The benchmark's own codes (perf_exit.cc), and ncclguard's for `exit` and `reinit`.
constexpr int kNcclFailure = 3;
constexpr int kBenchmarkTimeout = 4;
constexpr int kRestart = 75;

std::string Transcript(const ProcessResult& result) {
  return "exit code " + std::to_string(result.exit_code) + ", signal " + std::to_string(result.signal) +
         (result.timed_out ? ", timed out" : "") + "\nstdout:\n" + result.out + "\nstderr:\n" + result.err;
}

// Rank 1 hangs in its 30th AllReduce; ncclguard finds the stall after 2 s, reads the job (the
// statuses, the dumps) for its verdict, acts, and reads it again one status interval later.
// `benchmark_timeout` is the benchmark's own bound on one iteration, after which it aborts and
// exits with kBenchmarkTimeout.
ProcessResult RunBenchmark(const std::string& action, bool group, double benchmark_timeout) {
  TemporaryDirectory dump_dir;
  ProcessOptions options;
  options.timeout_seconds = 60;
  options.environment = EmulatorJobEnvironment(EMULATOR_LIBRARY_DIR, dump_dir.path(), kJobId);
  options.environment["LD_PRELOAD"] = PRELOAD_LIBRARY;
  options.environment["NCCLEMU_FAULTS"] = "hang:rank=1,seq=30";
  options.environment["NCCLGUARD_TIMEOUT"] = "2";
  options.environment["NCCLGUARD_ACTION"] = action;
  std::vector<std::string> argv = {PERF_EXIT_PROGRAM, "--timeout", std::to_string(benchmark_timeout)};
  if (group) argv.emplace_back("--group");
  return RunProcess(argv, options);
}

// `runs` runs: the crash this guards against is a race, which a run escapes about half the time.
void RequireExitCode(const std::string& action, bool group, double benchmark_timeout, int expected,
                     const std::string& output, int runs) {
  for (int run = 1; run <= runs; ++run) {
    const ProcessResult result = RunBenchmark(action, group, benchmark_timeout);
    INFO("NCCLGUARD_ACTION=" << action << (group ? ", grouped init" : ", ncclCommInitAll") << ", run " << run
                             << ": " << Transcript(result));
    REQUIRE_FALSE(result.timed_out);
    REQUIRE(result.signal == 0);
    REQUIRE(result.exit_code == expected);
    CHECK((result.out + result.err).find(output) != std::string::npos);
    CHECK(result.err.find("pure virtual") == std::string::npos);
  }
}

}  // namespace

TEST_CASE("a benchmark that exits right after ncclguard aborted its communicator exits with its own code",
          "[exit][abort]") {
  const bool group = GENERATE(false, true);
  RequireExitCode("abort", group, 30, kNcclFailure, "Test NCCL failure", 5);
}

TEST_CASE("a benchmark that gives up on a hang ncclguard only reports exits with its own code", "[exit][warn]") {
  const bool group = GENERATE(false, true);
  // Its own bound ends the iteration while ncclguard, past the stall, reads the job.
  RequireExitCode("warn", group, 3, kBenchmarkTimeout, "Test timeout", 3);
}

TEST_CASE("under NCCLGUARD_ACTION=exit and reinit ncclguard ends a hung benchmark with its documented code",
          "[exit][restart]") {
  const std::string action = GENERATE(as<std::string>{}, "exit", "reinit");
  const bool group = GENERATE(false, true);
  RequireExitCode(action, group, 30, kRestart, "exiting with code 75", 2);
}
