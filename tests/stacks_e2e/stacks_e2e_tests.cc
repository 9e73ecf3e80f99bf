// Where the late rank is, end to end: four ranks all-reduce in a loop on the emulator under
// libncclguard.so; after step 10 rank 1 goes into a function of the program's own and blocks
// there (a read() that never returns in C, a save that sleeps in Python through ctypes). Its
// peers' stall makes it dump its stacks; the online verdict and `ncclguard analyze` name the
// function and what it is blocked on. Then the launcher kills the whole job at once, as a
// scheduler does at its time limit: the post-mortem keeps what the ranks saw alive.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/support/process.h"
#include "tests/support/redis_server.h"
#include "tests/support/train_loop_output.h"

using ncclguard::testing::EmulatorJobEnvironment;
using ncclguard::testing::ProcessOptions;
using ncclguard::testing::ProcessResult;
using ncclguard::testing::RunProcess;
using ncclguard::testing::SplitLines;
using ncclguard::testing::TemporaryDirectory;
using Json = nlohmann::json;

namespace {

constexpr char kJobId[] = "stacks";
// The job is killed whole this long after it starts: long after the stall (2 s after step 10).
constexpr char kJobSeconds[] = "9";

bool Contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

struct Job {
  ProcessResult result;
  std::string job_dir;
};

Job RunLateRankJob(const TemporaryDirectory& dump_dir, std::vector<std::string> program, int port_offset,
                   const std::map<std::string, std::string>& settings = {}) {
  std::vector<std::string> argv = {"bash", LAUNCHER, "4", kJobSeconds};
  argv.insert(argv.end(), program.begin(), program.end());
  ProcessOptions options;
  options.timeout_seconds = 60;
  options.environment = EmulatorJobEnvironment(EMULATOR_LIBRARY_DIR, dump_dir.path(), kJobId);
  options.environment["LD_PRELOAD"] = PRELOAD_LIBRARY;
  options.environment["NCCL_COMM_ID"] =
      "127.0.0.1:" + std::to_string(20000 + (getpid() % 20000) + port_offset);
  options.environment["LATE_RANK"] = "1";
  options.environment["LATE_STEP"] = "10";
  options.environment["NCCLGUARD_TIMEOUT"] = "2";
  options.environment["NCCLGUARD_STATUS_INTERVAL"] = "0.2";
  for (const auto& [name, value] : settings) options.environment[name] = value;
  Job job{RunProcess(argv, options), dump_dir.path() + "/" + kJobId};
  return job;
}

// `ncclguard analyze` of the job whose directory is `job_dir`, on whichever board it ran.
std::vector<std::string> AnalyzeCommand(const std::string& job_dir, const std::vector<std::string>& options) {
  std::vector<std::string> argv = {NCCLGUARD_CLI, "analyze"};
  for (const std::string& argument : ncclguard::testing::AnalyzeTarget(job_dir)) argv.push_back(argument);
  argv.insert(argv.end(), options.begin(), options.end());
  return argv;
}

Json Analyze(const std::string& job_dir) {
  ProcessOptions options;
  options.timeout_seconds = 30;
  const ProcessResult result = RunProcess(AnalyzeCommand(job_dir, {"--json"}), options);
  INFO("analyze: " << result.exit_code << "\n" << result.out << "\n" << result.err);
  REQUIRE_FALSE(result.timed_out);
  return Json::parse(result.out);
}

std::string AnalyzeText(const std::string& job_dir) {
  ProcessOptions options;
  options.timeout_seconds = 30;
  return RunProcess(AnalyzeCommand(job_dir, {}), options).out;
}

Json FindVerdict(const Json& document, const std::string& kind) {
  for (const Json& verdict : document.at("verdicts")) {
    if (verdict.at("kind") == kind) return verdict;
  }
  return nullptr;
}

// The line of the first line of `path` that holds `text` (1-based), 0 when none.
int LineOf(const std::string& path, const std::string& text) {
  std::ifstream file(path);
  std::string line;
  for (int number = 1; std::getline(file, line); ++number) {
    if (Contains(line, text)) return number;
  }
  return 0;
}

// What a peer logged once the late rank's dump was in: "— still waiting; verdict: ...".
std::string OnlineVerdictNaming(const std::string& err, const std::string& function) {
  for (const std::string& line : SplitLines(err)) {
    if (Contains(line, "verdict: rank_not_joined") && Contains(line, function)) return line;
  }
  return "";
}

void CheckLateRank(const Job& job, const std::string& function, const std::string& where,
                   const std::string& waiting) {
  const std::string transcript = "stdout:\n" + job.result.out + "\nstderr:\n" + job.result.err;
  INFO(transcript);
  REQUIRE(Contains(job.result.out, "killed the job"));

  // Online: a waiting rank's log names the function, once rank 1's dump was in.
  const std::string online = OnlineVerdictNaming(job.result.err, function);
  CHECK(Contains(online, "rank 1 completed AllReduce #10"));
  CHECK(Contains(online, where));
  CHECK(Contains(online, waiting));

  // Offline, after the whole job was killed: rank 1 is still the late rank, alive when the job
  // ended, with where it was.
  const Json document = Analyze(job.job_dir);
  INFO(document.dump(2));
  const Json verdict = FindVerdict(document, "rank_not_joined");
  REQUIRE(verdict != nullptr);
  CHECK(verdict.at("ranks") == Json::array({1}));
  CHECK(Contains(verdict.at("message").get<std::string>(), where));
  CHECK(Contains(verdict.at("message").get<std::string>(), waiting));
  CHECK(FindVerdict(document, "rank_dead") == nullptr);
  const Json& late = verdict.at("evidence").at("late_ranks").at(0);
  CHECK(late.at("location").at("function") == function);
  CHECK_FALSE(late.at("location").at("stack").empty());
  // The text output prints the late rank's stack under the verdict.
  const std::string text = AnalyzeText(job.job_dir);
  CHECK(Contains(text, "stack of rank 1"));
  CHECK(Contains(text, function));
  // The trace marks where it was, on a track of its own, with its stack.
  const std::string trace_path = job.job_dir + "/../trace.json";
  ProcessOptions options;
  options.timeout_seconds = 30;
  REQUIRE(RunProcess(AnalyzeCommand(job.job_dir, {"--trace", trace_path}), options).exit_code == 1);
  std::ifstream trace_file(trace_path);
  const Json trace = Json::parse(trace_file);
  bool marked = false;
  for (const Json& event : trace.at("traceEvents")) {
    if (event.at("ph") == "X" && Contains(event.at("name").get<std::string>(), where) &&
        event.at("pid") == 2) {
      marked = Contains(event.at("args").at("stack").dump(), function);
    }
  }
  CHECK(marked);
}

}  // namespace

TEST_CASE("a C program's late rank: named in its function, blocked in read() on a pipe") {
  TemporaryDirectory dump_dir;
  const Job job = RunLateRankJob(dump_dir, {LATE_RANK_PROGRAM}, 0);
  CheckLateRank(job, "write_checkpoint_shard",
                "in `write_checkpoint_shard` (late_rank.c:", "blocked in read() on pipe:[");
}

TEST_CASE("a Python program's late rank (ctypes): named in its function, sleeping") {
  std::vector<std::string> interpreters;
  for (const std::string candidate : {"python3", "/usr/bin/python3"}) {
    ProcessOptions options;
    options.timeout_seconds = 20;
    const ProcessResult probe = RunProcess({candidate, "-c", "import sys; print(sys.executable)"}, options);
    if (probe.exit_code == 0) interpreters.push_back(candidate);
  }
  REQUIRE_FALSE(interpreters.empty());
  const int line = LineOf(LATE_RANK_SCRIPT, "time.sleep(600)");
  REQUIRE(line > 0);
  int offset = 1;
  for (const std::string& interpreter : interpreters) {
    DYNAMIC_SECTION(interpreter) {
      TemporaryDirectory dump_dir;
      const Job job = RunLateRankJob(dump_dir, {interpreter, LATE_RANK_SCRIPT}, offset++);
      CheckLateRank(
          job, "save_checkpoint",
          "in `save_checkpoint` (" + std::string(LATE_RANK_SCRIPT) + ":" + std::to_string(line) + ")",
          "sleeping for ");
    }
  }
}

// The same Python program (ctypes), no rank late, over the network: rank 1's link to rank 2 stops
// in AllReduce #10. NCCL's profiler, which ncclguard serves to the libnccl that ctypes loaded,
// names the link online on every rank and in analyze.
TEST_CASE("a link that stops under a Python program (ctypes) is named: link_stalled") {
  TemporaryDirectory dump_dir;
  const Job job = RunLateRankJob(dump_dir, {"python3", LATE_RANK_SCRIPT}, 7,
                                 {{"LATE_RANK", "-1"},
                                  {"NCCLEMU_FAULTS", "hang:rank=1,peer=2,seq=10"},
                                  {"NCCL_P2P_DISABLE", "1"},
                                  {"NCCL_SHM_DISABLE", "1"}});
  INFO(job.result.out << job.result.err);
  int named = 0;
  for (const std::string& line : SplitLines(job.result.err)) {
    if (!Contains(line, "verdict: link_stalled: AllReduce #10 ")) continue;
    CHECK(Contains(line, "stopped on the link from rank 1 (host "));
    CHECK(Contains(line, "to rank 2 (host "));
    ++named;
  }
  CHECK(named == 4);
  const Json document = Analyze(job.job_dir);
  const Json& verdict = document.at("verdicts").at(0);
  CHECK(verdict.at("kind") == "link_stalled");
  CHECK(verdict.at("ranks") == Json::array({1, 2}));
}
