// The beginning and the end of a process's communicators, end to end on the emulator with
// libncclguard.so preloaded: communicators created inside groups (one thread or several,
// blocking or not), an asynchronous error that the application itself sees just before it exits,
// and a rank that dies before its first status interval. Each test reads what a user would: the
// program's own output, the log, the job directory and `ncclguard analyze`.
#include <catch2/catch.hpp>

#include <csignal>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/process.h"
#include "tests/support/train_loop_output.h"

using ncclguard::testing::EmulatorJobEnvironment;
using ncclguard::testing::ProcessOptions;
using ncclguard::testing::ProcessResult;
using ncclguard::testing::RankPids;
using ncclguard::testing::ReadFile;
using ncclguard::testing::RunProcess;
using ncclguard::testing::SplitLines;
using ncclguard::testing::TemporaryDirectory;
using Json = nlohmann::json;
using Environment = std::map<std::string, std::optional<std::string>>;

namespace {

constexpr char kJobId[] = "lifecycle";

struct Run {
  ProcessResult result;
  std::string job_dir;
  std::string transcript;  // for the test's messages
};

// Runs `argv` on the emulator with a job directory of its own under `dump_dir`; with ncclguard
// preloaded unless `guarded` is false. No fault and no ncclguard setting leaks in from outside.
Run RunOnEmulator(const TemporaryDirectory& dump_dir, const std::vector<std::string>& argv,
                  const Environment& settings, bool guarded = true, double timeout_seconds = 60) {
  ProcessOptions options;
  options.timeout_seconds = timeout_seconds;
  options.environment = EmulatorJobEnvironment(EMULATOR_LIBRARY_DIR, dump_dir.path(), kJobId);
  if (guarded) options.environment["LD_PRELOAD"] = PRELOAD_LIBRARY;
  for (const auto& [name, value] : settings) options.environment[name] = value;
  Run run;
  run.result = RunProcess(argv, options);
  run.job_dir = dump_dir.path() + "/" + kJobId;
  run.transcript = argv[0] + (guarded ? " (preloaded)" : "") + ": exit code " + std::to_string(run.result.exit_code) +
                   (run.result.timed_out ? ", timed out" : "") + "\nstdout:\n" + run.result.out + "\nstderr:\n" +
                   run.result.err;
  return run;
}

// The JSON documents of the job directory whose name starts with `prefix` ("dump-", "status-").
std::vector<Json> JobDocuments(const std::string& job_dir, const std::string& prefix) {
  std::vector<Json> documents;
  if (!std::filesystem::exists(job_dir)) return documents;
  for (const auto& entry : std::filesystem::directory_iterator(job_dir)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || !name.starts_with(prefix) || !name.ends_with(".json")) continue;
    INFO("file " << entry.path());
    documents.push_back(Json::parse(ReadFile(entry.path().string())));
  }
  return documents;
}

bool Contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// NCCL's WARN lines as the program printed them, without the "host:pid:tid [device]" prefix.
std::vector<std::string> NcclWarnings(const std::string& out) {
  std::vector<std::string> warnings;
  for (const std::string& line : SplitLines(out)) {
    if (const size_t at = line.find(" NCCL WARN "); at != std::string::npos) warnings.push_back(line.substr(at));
  }
  return warnings;
}

// "rank R: rank R of N on device D" as the program itself read them from NCCL.
std::vector<std::string> RankLines(const std::string& out) {
  std::vector<std::string> lines;
  for (const std::string& line : SplitLines(out)) {
    if (line.starts_with("rank ")) lines.push_back(line);
  }
  return lines;
}

// The first verdict of `ncclguard analyze --json` on the job directory, which must say "not healthy".
Json FirstVerdict(const std::string& job_dir) {
  ProcessOptions options;
  options.timeout_seconds = 30;
  const ProcessResult analysis = RunProcess({NCCLGUARD_CLI, "analyze", job_dir, "--json"}, options);
  INFO("analyze: exit code " << analysis.exit_code << "\n" << analysis.out << analysis.err);
  REQUIRE(analysis.exit_code == 1);
  return Json::parse(analysis.out).at("verdicts").at(0);
}

}  // namespace

TEST_CASE("communicators created inside a group are described once NCCL has created them, and NCCL never "
          "hears of them before",
          "[init][group]") {
  const std::string mode = GENERATE(as<std::string>{}, "group", "threads", "nonblocking");
  INFO("mode " << mode);
  const Environment settings = {{"NCCL_DEBUG", "WARN"}, {"NCCLGUARD_LOG_LEVEL", "info"},
                                {"NCCLGUARD_DUMP_ON_EXIT", "1"}};
  TemporaryDirectory bare_dir;
  const Run bare = RunOnEmulator(bare_dir, {GROUPED_INIT_PROGRAM, mode}, settings, /*guarded=*/false);
  INFO(bare.transcript);
  REQUIRE(bare.result.exit_code == 0);
  TemporaryDirectory dump_dir;
  const Run run = RunOnEmulator(dump_dir, {GROUPED_INIT_PROGRAM, mode}, settings);
  INFO(run.transcript);
  REQUIRE(run.result.exit_code == 0);

  // What the application sees is what it sees without ncclguard: NCCL's output and last error.
  CHECK(Contains(run.result.out, "allreduce ok"));
  CHECK(RankLines(run.result.out) == RankLines(bare.result.out));
  CHECK(NcclWarnings(run.result.out) == NcclWarnings(bare.result.out));
  CHECK_FALSE(Contains(run.result.out + run.result.err, "Attempt to use communicator"));
  const std::regex last_error_line("^last error: \".*\"$");
  std::vector<std::string> last_errors, bare_last_errors;
  for (const std::string& line : SplitLines(run.result.out)) {
    if (std::regex_match(line, last_error_line)) last_errors.push_back(line);
  }
  for (const std::string& line : SplitLines(bare.result.out)) {
    if (std::regex_match(line, last_error_line)) bare_last_errors.push_back(line);
  }
  REQUIRE(bare_last_errors.size() == 1);
  CHECK(last_errors == bare_last_errors);

  // Every rank described right in the log, the status file and the dump.
  for (int rank = 0; rank < 4; ++rank) {
    INFO("rank " << rank);
    const std::regex created("ncclguard INFO comm [0-9a-f]{16} rank " + std::to_string(rank) + "/4 on device " +
                             std::to_string(rank) + " created by ncclCommInitRank");
    CHECK(std::regex_search(run.result.err, created));
  }
  CHECK_FALSE(Contains(run.result.err, "rank -1/0"));
  const std::vector<Json> statuses = JobDocuments(run.job_dir, "status-");
  REQUIRE(statuses.size() == 1);
  std::set<int> status_ranks;
  for (const Json& comm : statuses[0].at("communicators")) {
    CHECK(comm.at("nranks") == 4);
    status_ranks.insert(comm.at("rank").get<int>());
  }
  CHECK(status_ranks == std::set<int>{0, 1, 2, 3});
  const std::vector<Json> dumps = JobDocuments(run.job_dir, "dump-");
  REQUIRE(dumps.size() == 1);
  REQUIRE(dumps[0].at("communicators").size() == 4);
  std::set<int> dump_ranks;
  for (const Json& comm : dumps[0].at("communicators")) {
    CHECK(comm.at("nranks") == 4);
    CHECK(comm.at("device") == comm.at("rank"));
    dump_ranks.insert(comm.at("rank").get<int>());
  }
  CHECK(dump_ranks == std::set<int>{0, 1, 2, 3});
}

TEST_CASE("a hang on communicators created inside a group names their four ranks", "[init][group]") {
  const std::string mode = GENERATE(as<std::string>{}, "group", "threads");
  INFO("mode " << mode);
  TemporaryDirectory dump_dir;
  // Rank 1's AllReduce never completes: the program hangs until the test's deadline ends it.
  const Run run = RunOnEmulator(dump_dir, {GROUPED_INIT_PROGRAM, mode},
                                {{"NCCLEMU_FAULTS", "hang:rank=1,seq=1"}, {"NCCLGUARD_TIMEOUT", "1"}},
                                /*guarded=*/true, /*timeout_seconds=*/8);
  INFO(run.transcript);
  REQUIRE(run.result.timed_out);
  const Json verdict = FirstVerdict(run.job_dir);
  CHECK(verdict.at("kind") == "stuck_inside_nccl");
  CHECK(verdict.at("ranks") == Json({0, 1, 2, 3}));
  CHECK(Contains(verdict.at("message").get<std::string>(), "all 4 ranks entered AllReduce #1"));
}

TEST_CASE("an asynchronous error the application sees itself just before it exits is logged and dumped",
          "[error][exit]") {
  TemporaryDirectory dump_dir;
  // The watchdog looks only every 10 s: the program has aborted and exited long before.
  const Run run = RunOnEmulator(dump_dir, {ASYNC_ERROR_EXIT_PROGRAM},
                                {{"NCCLEMU_FAULTS", "async_error:rank=0,seq=3,code=ncclRemoteError"},
                                 {"NCCLGUARD_POLL_INTERVAL", "10"}});
  INFO(run.transcript);
  REQUIRE(run.result.exit_code == 3);
  REQUIRE(Contains(run.result.out, "asynchronous error"));
  CHECK(Contains(run.result.err, "NCCL reports an asynchronous error: ncclRemoteError"));

  const std::vector<Json> dumps = JobDocuments(run.job_dir, "dump-");
  REQUIRE(dumps.size() == 1);
  CHECK(dumps[0].at("reason") == "async_error");
  REQUIRE(dumps[0].at("communicators").size() == 1);
  CHECK(dumps[0].at("communicators")[0].at("async_error") == "ncclRemoteError");
  const std::vector<Json> statuses = JobDocuments(run.job_dir, "status-");
  REQUIRE(statuses.size() == 1);
  REQUIRE(statuses[0].at("communicators").size() == 1);
  CHECK(statuses[0].at("communicators")[0].at("async_error") == "ncclRemoteError");

  CHECK(FirstVerdict(run.job_dir).at("kind") == "async_error");
}

TEST_CASE("a failed call just before exit is dumped before the process is gone", "[error][exit]") {
  TemporaryDirectory dump_dir;
  // An AllReduce with an invalid datatype fails at once; the program then exits.
  const Run run = RunOnEmulator(dump_dir, {ASYNC_ERROR_EXIT_PROGRAM, "--invalid-call"},
                                {{"NCCLGUARD_POLL_INTERVAL", "10"}});
  INFO(run.transcript);
  REQUIRE(run.result.exit_code == 4);
  const std::vector<Json> dumps = JobDocuments(run.job_dir, "dump-");
  REQUIRE(dumps.size() == 1);
  CHECK(dumps[0].at("reason") == "error_return");
}

// abort() runs no atexit handler: what the application was told must be on disk before it returns.
TEST_CASE("an asynchronous error the application sees itself just before it calls abort() is logged and dumped",
          "[error][exit]") {
  TemporaryDirectory dump_dir;
  const Run run = RunOnEmulator(dump_dir, {ASYNC_ERROR_EXIT_PROGRAM, "--abort"},
                                {{"NCCLEMU_FAULTS", "async_error:rank=0,seq=3,code=ncclRemoteError"},
                                 {"NCCLGUARD_POLL_INTERVAL", "10"}});
  INFO(run.transcript);
  REQUIRE(run.result.signal == SIGABRT);
  REQUIRE(Contains(run.result.out, "asynchronous error"));
  CHECK(Contains(run.result.err, "NCCL reports an asynchronous error: ncclRemoteError"));
  const std::vector<Json> dumps = JobDocuments(run.job_dir, "dump-");
  REQUIRE(dumps.size() == 1);
  CHECK(dumps[0].at("reason") == "async_error");

  CHECK(FirstVerdict(run.job_dir).at("kind") == "async_error");
}

TEST_CASE("a failed call just before abort() is dumped before the process is gone", "[error][exit]") {
  TemporaryDirectory dump_dir;
  const Run run = RunOnEmulator(dump_dir, {ASYNC_ERROR_EXIT_PROGRAM, "--invalid-call", "--abort"},
                                {{"NCCLGUARD_POLL_INTERVAL", "10"}});
  INFO(run.transcript);
  REQUIRE(run.result.signal == SIGABRT);
  const std::vector<Json> dumps = JobDocuments(run.job_dir, "dump-");
  REQUIRE(dumps.size() == 1);
  CHECK(dumps[0].at("reason") == "error_return");
}

// Emulated steps take microseconds: rank 1 exits long before its first status interval.
TEST_CASE("a rank that dies before its first status interval is named as dead, with its last completed "
          "operation",
          "[init][rank_dead]") {
  TemporaryDirectory dump_dir;
  const Run run = RunOnEmulator(dump_dir,
                                {TRAIN_LOOP, "--ranks", "4", "--steps", "50", "--exit", "1:30", "--timeout", "7"},
                                {{"NCCLGUARD_TIMEOUT", "2"}});
  INFO(run.transcript);
  REQUIRE_FALSE(run.result.timed_out);
  REQUIRE(Contains(run.result.out, "rank 1 failed: exit code 3"));
  const std::map<int, int> pids = RankPids(run.result.out);
  REQUIRE(pids.size() == 4);

  const Json verdict = FirstVerdict(run.job_dir);
  REQUIRE(verdict.at("kind") == "rank_dead");
  CHECK(verdict.at("ranks") == Json({1}));
  // Step 30 is AllReduce #31 (the broadcast is #1): rank 1 completed it, its peers wait in #32.
  CHECK(verdict.at("seq") == 32);
  const std::string message = verdict.at("message");
  CHECK(Contains(message, "rank 1 (pid " + std::to_string(pids.at(1)) + " on host "));
  CHECK(Contains(message, "completed AllReduce #31 and never entered #32"));
}

// NCCLGUARD_FLIGHT_RECORDER_DIR: each process's exit dump also leaves PyTorch's Flight Recorder
// file, which python3 reads as PyTorch's analyzer does.
TEST_CASE("with NCCLGUARD_FLIGHT_RECORDER_DIR every rank's dump leaves a Flight Recorder file",
          "[exit][fr]") {
  TemporaryDirectory dump_dir;
  const std::string fr_dir = dump_dir.path() + "/fr";
  const Run run = RunOnEmulator(dump_dir, {TRAIN_LOOP, "--ranks", "4", "--steps", "10", "--timeout", "30"},
                                {{"NCCLGUARD_DUMP_ON_EXIT", "1"}, {"NCCLGUARD_FLIGHT_RECORDER_DIR", fr_dir}});
  INFO(run.transcript);
  REQUIRE(run.result.exit_code == 0);
  const std::string script = R"py(
import ast, json, os, pickle, sys
result = {}
for name in sorted(os.listdir(sys.argv[1])):
    dump = pickle.load(open(os.path.join(sys.argv[1], name), "rb"))
    result[name] = {"version": dump["version"],
                    "members": [ast.literal_eval(g["ranks"]) for g in dump["pg_config"].values()],
                    "last": [dump["entries"][-1]["profiling_name"], dump["entries"][-1]["state"]],
                    "entries": len(dump["entries"])}
print(json.dumps(result))
)py";
  ProcessOptions options;
  options.timeout_seconds = 30;
  const ProcessResult read = RunProcess({"python3", "-c", script, fr_dir}, options);
  INFO(read.out << read.err);
  REQUIRE(read.exit_code == 0);
  const Json files = Json::parse(read.out);
  REQUIRE(files.size() == 4);
  for (int rank = 0; rank < 4; ++rank) {
    const Json& file = files.at("nccl_trace_rank_" + std::to_string(rank));
    CHECK(file.at("version") == "2.10");
    CHECK(file.at("members") == Json::parse("[[0, 1, 2, 3]]"));
    // The broadcast of the initial weights and ten AllReduces, all completed.
    CHECK(file.at("entries") == 11);
    CHECK(file.at("last") == Json::parse(R"(["nccl:all_reduce", "completed"])"));
  }
}
