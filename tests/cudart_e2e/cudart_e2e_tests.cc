// An NCCL program written against the CUDA runtime and built by nvcc, run on the emulator's
// libcudart: one process, four devices, one thread driving them all through a group or one
// thread per device; with and without ncclguard, healthy and with an injected hang.
#include <catch2/catch.hpp>

#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/support/process.h"
#include "tests/support/train_loop_output.h"

using ncclguard::testing::EmulatorJobEnvironment;
using ncclguard::testing::ProcessOptions;
using ncclguard::testing::ProcessResult;
using ncclguard::testing::RunProcess;
using ncclguard::testing::SplitLines;
using ncclguard::testing::TemporaryDirectory;

namespace {

constexpr int kHangExitCode = 3;
const char* const kModes[] = {"group", "threads"};

struct Job {
  std::string mode;
  bool guarded = false;
  std::string faults;  // NCCLEMU_FAULTS, none when empty
  bool in_process = false;  // NCCLGUARD_RECOVER=inprocess, with S2's driver and a queued warm-up
};

ProcessResult Run(const TemporaryDirectory& dump_dir, const Job& job) {
  ProcessOptions options;
  options.timeout_seconds = 90;
  options.environment = EmulatorJobEnvironment(EMULATOR_LIBRARY_DIR, dump_dir.path(), "cudart");
  options.environment["NCCLEMU_DEVICES"] = "4";
  if (!job.faults.empty()) options.environment["NCCLEMU_FAULTS"] = job.faults;
  if (job.guarded) {
    options.environment["LD_PRELOAD"] = PRELOAD_LIBRARY;
    options.environment["NCCLGUARD_TIMEOUT"] = "1";
  }
  std::vector<std::string> arguments{NCCL_PROGRAM, job.mode};
  if (job.in_process) {
    options.environment["NCCLGUARD_RECOVER"] = "inprocess";
    options.environment["NCCLEMU_DRIVER_VERSION"] = "545.23.08";
    arguments.insert(arguments.end(), {"--warmup", "4"});
  }
  // A hung job ends by the program's own timeout, long after ncclguard's (1 s) even on a loaded
  // machine; a recovered one within ncclguard's timeout and the recovery's.
  arguments.insert(arguments.end(), {"--timeout", job.faults.empty() || job.in_process ? "60" : "10"});
  return RunProcess(arguments, options);
}

std::string Transcript(const Job& job, const ProcessResult& result) {
  return job.mode + (job.guarded ? " (preloaded)" : "") + (job.in_process ? " (in-process recovery)" : "") +
         ": exit code " + std::to_string(result.exit_code) +
         ", signal " + std::to_string(result.signal) + (result.timed_out ? ", timed out" : "") + "\nstdout:\n" +
         result.out + "\nstderr:\n" + result.err;
}

std::vector<std::string> StallLines(const std::string& err) {
  static const std::regex stall(
      R"(ncclguard WARN .*AllReduce #4 \(float32 × 1024, sum\) (started on the GPU [0-9.]+ s ago and has not completed|.*has not started))");
  std::vector<std::string> lines;
  for (const std::string& line : SplitLines(err)) {
    if (std::regex_search(line, stall)) lines.push_back(line);
  }
  return lines;
}

}  // namespace

TEST_CASE("an nvcc-built NCCL program runs on the CPU runtime, with and without ncclguard", "[cudart]") {
  for (const char* mode : kModes) {
    for (bool guarded : {false, true}) {
      TemporaryDirectory dump_dir;
      const Job job{mode, guarded, ""};
      const ProcessResult result = Run(dump_dir, job);
      INFO(Transcript(job, result));
      REQUIRE_FALSE(result.timed_out);
      CHECK(result.exit_code == 0);
      CHECK(result.out.find("4 devices, CUDA runtime 13000") != std::string::npos);
      CHECK(result.out.find("\nok\n") != std::string::npos);
      // The stand-in runtime ran it: the kernel launch is refused, saying why.
      CHECK(result.out.find("kernel launch refused: cudaErrorNotSupported") != std::string::npos);
      CHECK(result.err.find("device code cannot run on the CPU emulator") != std::string::npos);
      CHECK(result.err.find("ncclguard WARN") == std::string::npos);
    }
  }
}

TEST_CASE("a hang in an nvcc-built NCCL program: ncclguard reports the stalled AllReduce", "[cudart]") {
  for (const char* mode : kModes) {
    TemporaryDirectory dump_dir;
    // Rank 2's fourth operation (the second step's AllReduce) never completes.
    const Job job{mode, true, "hang:rank=2,seq=4"};
    const ProcessResult result = Run(dump_dir, job);
    INFO(Transcript(job, result));
    REQUIRE_FALSE(result.timed_out);
    CHECK(result.exit_code == kHangExitCode);
    const std::vector<std::string> lines = StallLines(result.err);
    CHECK_FALSE(lines.empty());
    if (std::string(mode) == "threads") {
      // Ranks initialised by their own threads: every rank names itself.
      std::set<std::string> ranks;
      for (const std::string& line : lines) {
        std::smatch match;
        if (std::regex_search(line, match, std::regex(R"(WARN rank (\d+) comm )"))) ranks.insert(match[1]);
      }
      CHECK(ranks == std::set<std::string>{"0", "1", "2", "3"});
    }
  }
}

TEST_CASE("a hang in an nvcc-built NCCL program without ncclguard: no report, only the program's timeout", "[cudart]") {
  TemporaryDirectory dump_dir;
  const Job job{"group", false, "hang:rank=2,seq=4"};
  const ProcessResult result = Run(dump_dir, job);
  INFO(Transcript(job, result));
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.exit_code == kHangExitCode);
  CHECK(StallLines(result.err).empty());
}

// S2 in the shape of NCCL's benchmarks (-g 4: one thread, a group per iteration; -t 4: a thread
// per GPU), warm-up iterations queued back to back: the process's four ranks of the communicator
// are recovered together, in one attempt, and every result is right.
TEST_CASE("S2 in a process driving four GPUs: its ranks recover in-process together", "[cudart][recovery]") {
  for (const char* mode : kModes) {
    TemporaryDirectory dump_dir;
    const Job job{mode, true, "p2p_stall:after=0", true};
    const ProcessResult result = Run(dump_dir, job);
    INFO(Transcript(job, result));
    REQUIRE_FALSE(result.timed_out);
    CHECK(result.exit_code == 0);
    CHECK(result.out.find("\nok\n") != std::string::npos);
    const std::regex recovered(
        R"(ncclguard WARN comm [0-9a-f]{16} #1 AllReduce: re-created with P2P disabled on a private NCCL instance and replayed \(all 4 ranks are ready; this process's 4 ranks of it together\))");
    std::vector<std::string> warnings;
    int recoveries = 0;
    for (const std::string& line : SplitLines(result.err)) {
      if (line.find("ncclguard WARN") == std::string::npos) continue;
      warnings.push_back(line);
      if (std::regex_search(line, recovered)) ++recoveries;
    }
    CHECK(recoveries == 1);
    CHECK(result.err.find("falls back") == std::string::npos);
    // The known-bad driver, the stall, the recovery begun and done: nothing about the warm-up
    // iterations queued behind it.
    CHECK(warnings.size() <= 4);
  }
}
