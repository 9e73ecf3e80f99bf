// ncclguard's own communicator handles, end to end on the emulator with libncclguard.so
// preloaded: with NCCLGUARD_RECOVER=inprocess the application holds ncclguard's handles instead
// of NCCL's communicators, on every loader and every way of creating them, and gets the same
// results; stalls are still named by operation and ranks. With the default, it holds NCCL's own.
#include <algorithm>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/support/process.h"
#include "tests/support/train_loop_output.h"

using ncclguard::testing::Checksums;
using ncclguard::testing::EmulatorJobEnvironment;
using ncclguard::testing::LogLinesOf;
using ncclguard::testing::ProcessOptions;
using ncclguard::testing::ProcessResult;
using ncclguard::testing::RankPids;
using ncclguard::testing::RunProcess;
using ncclguard::testing::SplitLines;
using ncclguard::testing::TemporaryDirectory;
using Json = nlohmann::json;
using Environment = std::map<std::string, std::optional<std::string>>;

namespace {

constexpr char kJobId[] = "handles";
const Environment kHandles = {{"NCCLGUARD_RECOVER", "inprocess"}};

struct Run {
  ProcessResult result;
  std::string job_dir;
  std::string transcript;  // for the test's messages
};

// Runs `argv` on the emulator with a job directory of its own under `dump_dir`; with ncclguard
// preloaded unless `guarded` is false. No fault and no ncclguard setting leaks in from outside.
Run RunOnEmulator(const TemporaryDirectory& dump_dir, const std::vector<std::string>& argv,
                  const Environment& settings, bool guarded = true) {
  ProcessOptions options;
  options.timeout_seconds = 60;
  options.environment = EmulatorJobEnvironment(EMULATOR_LIBRARY_DIR, dump_dir.path(), kJobId);
  if (guarded) options.environment["LD_PRELOAD"] = PRELOAD_LIBRARY;
  for (const auto& [name, value] : settings) options.environment[name] = value;
  Run run;
  run.result = RunProcess(argv, options);
  run.job_dir = dump_dir.path() + "/" + kJobId;
  run.transcript = argv[0] + (guarded ? " (preloaded)" : "") + ": exit code " +
                   std::to_string(run.result.exit_code) + (run.result.timed_out ? ", timed out" : "") +
                   "\nstdout:\n" + run.result.out + "\nstderr:\n" + run.result.err;
  return run;
}

bool Contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// The program's lines that do not depend on addresses.
std::vector<std::string> ResultLines(const std::string& out) {
  std::vector<std::string> lines;
  for (const std::string& line : SplitLines(out)) {
    if (!line.starts_with("comm ") &&
        (line.starts_with("rank ") || line.starts_with("split ") || line.starts_with("shrink ") ||
         Contains(line, "allreduce") || line == "closed")) {
      lines.push_back(line);
    }
  }
  return lines;
}

// The addresses the application printed ("comm ...: 0x..."), and those the NCCL library was
// given by ncclCommUserRank's wrapper (NCCLGUARD_LOG_LEVEL=trace logs each call with the arguments
// it passed on).
std::set<std::string> ApplicationComms(const std::string& out) {
  std::set<std::string> comms;
  const std::regex line("^comm [a-z0-9 ]+: (0x[0-9a-f]+)$");
  for (const std::string& text : SplitLines(out)) {
    std::smatch match;
    if (std::regex_match(text, match, line)) comms.insert(match[1]);
  }
  return comms;
}

std::set<std::string> NcclComms(const std::string& output) {
  std::set<std::string> comms;
  const std::regex line(" ncclCommUserRank\\(comm=(0x[0-9a-f]+),");
  for (const std::string& text : SplitLines(output)) {
    std::smatch match;
    if (std::regex_search(text, match, line)) comms.insert(match[1]);
  }
  return comms;
}

}  // namespace

TEST_CASE("checksums are bit-identical on every loader when the application holds ncclguard's handles",
          "[handles]") {
  const std::string loader = GENERATE(as<std::string>{}, "linked", "dlopen", "rtld-local");
  INFO("loader " << loader);
  TemporaryDirectory dump_dir;
  const std::vector<std::string> argv = {TRAIN_LOOP,      "--ranks", "4",         "--steps", "50",
                                         "--nccl-loader", loader,    "--timeout", "60"};
  const Run plain = RunOnEmulator(dump_dir, argv, {}, /*guarded=*/false);
  INFO(plain.transcript);
  REQUIRE(plain.result.exit_code == 0);
  Environment settings = kHandles;
  settings["NCCLGUARD_DUMP_ON_EXIT"] = "1";
  const Run guarded = RunOnEmulator(dump_dir, argv, settings);
  INFO(guarded.transcript);
  REQUIRE(guarded.result.exit_code == 0);
  const std::map<int, std::string> checksums = Checksums(plain.result.out);
  REQUIRE(checksums.size() == 4);
  CHECK(Checksums(guarded.result.out) == checksums);
  CHECK_FALSE(Contains(guarded.result.err, "ncclguard WARN"));
  CHECK_FALSE(Contains(guarded.result.err, "ncclguard ERROR"));
}

TEST_CASE("communicators created inside groups work as before when the application holds ncclguard's handles",
          "[handles][group]") {
  const std::string mode = GENERATE(as<std::string>{}, "group", "threads", "nonblocking");
  INFO("mode " << mode);
  TemporaryDirectory dump_dir;
  const Run bare = RunOnEmulator(dump_dir, {GROUPED_INIT_PROGRAM, mode}, {}, /*guarded=*/false);
  INFO(bare.transcript);
  REQUIRE(bare.result.exit_code == 0);
  Environment settings = kHandles;
  settings["NCCLGUARD_LOG_LEVEL"] = "info";
  const Run run = RunOnEmulator(dump_dir, {GROUPED_INIT_PROGRAM, mode}, settings);
  INFO(run.transcript);
  REQUIRE(run.result.exit_code == 0);
  CHECK(Contains(run.result.out, "allreduce ok"));
  CHECK(run.result.out == bare.result.out);
  // The core still describes the real communicators.
  for (int rank = 0; rank < 4; ++rank) {
    const std::regex created("ncclguard INFO comm [0-9a-f]{16} rank " + std::to_string(rank) +
                             "/4 on device [0-9] created by ncclCommInitRank");
    CHECK(std::regex_search(run.result.err, created));
  }
}

TEST_CASE(
    "ncclCommInitAll and ncclCommSplit and ncclCommShrink hand out ncclguard's handles and NOCOLOR stays "
    "null",
    "[handles]") {
  const Environment debug = {{"NCCLGUARD_LOG_LEVEL", "trace"}};
  TemporaryDirectory dump_dir;
  const Run bare = RunOnEmulator(dump_dir, {COMM_HANDLES_PROGRAM}, debug, /*guarded=*/false);
  INFO(bare.transcript);
  REQUIRE(bare.result.exit_code == 0);
  const std::vector<std::string> expected = ResultLines(bare.result.out);
  CHECK(std::count(expected.begin(), expected.end(), "world allreduce ok") == 1);
  CHECK(std::count(expected.begin(), expected.end(), "split allreduce ok") == 1);
  CHECK(std::count(expected.begin(), expected.end(), "split 3: none") == 1);
  CHECK(std::count(expected.begin(), expected.end(), "shrink allreduce ok") == 1);
  CHECK(std::count(expected.begin(), expected.end(), "closed") == 1);

  SECTION("NCCLGUARD_RECOVER=off: the application holds NCCL's own communicators") {
    const Run run = RunOnEmulator(dump_dir, {COMM_HANDLES_PROGRAM}, debug);
    INFO(run.transcript);
    REQUIRE(run.result.exit_code == 0);
    CHECK(ResultLines(run.result.out) == expected);
    const std::set<std::string> held = ApplicationComms(run.result.out);
    CHECK(held.size() == 10);
    CHECK(held == NcclComms(run.result.err));
  }
  SECTION("NCCLGUARD_RECOVER=inprocess: it holds ncclguard's handles, and gets the same results") {
    Environment settings = kHandles;
    settings["NCCLGUARD_LOG_LEVEL"] = "trace";
    const Run run = RunOnEmulator(dump_dir, {COMM_HANDLES_PROGRAM}, settings);
    INFO(run.transcript);
    REQUIRE(run.result.exit_code == 0);
    CHECK(ResultLines(run.result.out) == expected);
    const std::set<std::string> held = ApplicationComms(run.result.out);
    const std::set<std::string> nccl = NcclComms(run.result.err);
    CHECK(held.size() == 10);
    CHECK(nccl.size() == 10);
    for (const std::string& comm : held) CHECK(nccl.count(comm) == 0);
    CHECK(Contains(run.result.err, "created by ncclCommSplit"));
    CHECK(Contains(run.result.err, "created by ncclCommInitAll"));
    CHECK(Contains(run.result.err, "created by ncclCommShrink"));
    CHECK_FALSE(Contains(run.result.out + run.result.err, "was already destroyed or aborted"));
  }
}

TEST_CASE("a hang inside NCCL on ncclguard's handles names the operation and every rank",
          "[handles][stall]") {
  TemporaryDirectory dump_dir;
  Environment settings = kHandles;
  settings["NCCLEMU_FAULTS"] = "hang:rank=1,seq=10";
  settings["NCCLGUARD_TIMEOUT"] = "2";
  const Run run =
      RunOnEmulator(dump_dir, {TRAIN_LOOP, "--ranks", "4", "--steps", "20", "--timeout", "7"}, settings);
  INFO(run.transcript);
  REQUIRE_FALSE(run.result.timed_out);
  REQUIRE(Contains(run.result.out, "ranks not finished: 0,1,2,3"));
  ProcessOptions options;
  options.timeout_seconds = 30;
  const ProcessResult analysis = RunProcess({NCCLGUARD_CLI, "analyze", run.job_dir, "--json"}, options);
  INFO(analysis.out << analysis.err);
  REQUIRE(analysis.exit_code == 1);
  const Json verdict = Json::parse(analysis.out).at("verdicts").at(0);
  CHECK(verdict.at("kind") == "stuck_inside_nccl");
  CHECK(verdict.at("seq") == 10);
  CHECK(verdict.at("ranks") == Json({0, 1, 2, 3}));
  CHECK(Contains(verdict.at("message").get<std::string>(), "all 4 ranks entered AllReduce #10"));
  for (const auto& [rank, pid] : RankPids(run.result.out)) {
    INFO("rank " << rank);
    CHECK_FALSE(LogLinesOf(run.result.err, pid, "verdict: stuck_inside_nccl").empty());
  }
}
