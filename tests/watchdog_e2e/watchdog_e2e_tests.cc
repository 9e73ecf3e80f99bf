// The watchdog end to end: train_loop (and two small programs) on the emulator, with
// libncclguard.so preloaded and faults injected through NCCLEMU_FAULTS. Each test reads what a
// user would: the log lines on stderr, the launcher's report, and the files of the job directory.
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <thread>

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
using ncclguard::testing::ReadFile;
using ncclguard::testing::RunProcess;
using ncclguard::testing::SplitLines;
using ncclguard::testing::TemporaryDirectory;
using Json = nlohmann::json;
using Environment = std::map<std::string, std::optional<std::string>>;

namespace {

constexpr int kRanks = 4;
constexpr char kJobId[] = "e2e";
// The stall timeout of most tests, and how late after it a stall may be reported.
constexpr double kTimeoutSeconds = 3;
constexpr double kReportSlackSeconds = 2;
constexpr int kRestartExitCode = 75;

struct Run {
  ProcessResult result;
  double seconds = 0;
  std::string job_dir;
  std::string transcript;  // for the test's messages
};

// Runs `argv` on the emulator with a job directory of its own under `dump_dir`; with ncclguard
// preloaded unless `guarded` is false. No fault and no ncclguard setting leaks in from outside.
// Jobs that hang are stopped by train_loop's own --timeout; this limit is only the last resort.
Run RunOnEmulator(const TemporaryDirectory& dump_dir, const std::vector<std::string>& argv,
                  const Environment& settings, bool guarded = true, double timeout_seconds = 60) {
  ProcessOptions options;
  options.timeout_seconds = timeout_seconds;
  options.environment = EmulatorJobEnvironment(EMULATOR_LIBRARY_DIR, dump_dir.path(), kJobId);
  if (guarded) options.environment["LD_PRELOAD"] = PRELOAD_LIBRARY;
  for (const auto& [name, value] : settings) options.environment[name] = value;
  const auto start = std::chrono::steady_clock::now();
  Run run;
  run.result = RunProcess(argv, options);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  run.job_dir = dump_dir.path() + "/" + kJobId;
  run.transcript = argv[0] + (guarded ? " (preloaded)" : "") + ": " + std::to_string(run.seconds) +
                   " s, exit code " + std::to_string(run.result.exit_code) + ", signal " +
                   std::to_string(run.result.signal) + (run.result.timed_out ? ", timed out" : "") +
                   "\nstdout:\n" + run.result.out + "\nstderr:\n" + run.result.err;
  return run;
}

std::vector<std::string> TrainLoop(std::vector<std::string> arguments) {
  arguments.insert(arguments.begin(), TRAIN_LOOP);
  return arguments;
}

std::set<int> Values(const std::map<int, int>& map) {
  std::set<int> values;
  for (const auto& [key, value] : map) values.insert(value);
  return values;
}

struct JsonFile {
  std::string path;
  Json document;
};

// Every file of the job directory, dump requests included, parsed (nothing but JSON documents
// and the requests' generation marker belongs there once the job has ended).
std::vector<JsonFile> JobFiles(const std::string& job_dir) {
  std::vector<JsonFile> files;
  if (!std::filesystem::exists(job_dir)) return files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(job_dir)) {
    if (!entry.is_regular_file() || entry.path().filename() == "generation") continue;
    const std::string path = entry.path().string();
    INFO("file " << path);
    files.push_back({path, Json::parse(ReadFile(path))});
  }
  return files;
}

std::vector<JsonFile> Dumps(const std::string& job_dir) {
  std::vector<JsonFile> dumps;
  for (JsonFile& file : JobFiles(job_dir)) {
    if (file.document.value("format", "") == "ncclguard-dump") dumps.push_back(std::move(file));
  }
  return dumps;
}

std::vector<JsonFile> StallDumps(const std::string& job_dir) {
  std::vector<JsonFile> dumps;
  for (JsonFile& dump : Dumps(job_dir)) {
    if (!dump.document.at("stall").is_null()) dumps.push_back(std::move(dump));
  }
  return dumps;
}

// The operation `seq` in the ring of the dump's only communicator.
Json Operation(const Json& dump, std::uint64_t seq) {
  REQUIRE(dump.at("communicators").size() == 1);
  for (const Json& op : dump.at("communicators")[0].at("ops")) {
    if (op.at("seq").get<std::uint64_t>() == seq) return op;
  }
  FAIL("operation #" << seq << " is not in the ring");
  return {};
}

bool ReportsAnyStall(const std::string& err) {
  return err.find("has not completed") != std::string::npos ||
         err.find("has not started") != std::string::npos;
}

// Every rank of a job under NCCLGUARD_ACTION=exit dumped its stall and exited with the restart code.
void CheckEveryRankDumpedAndExitedForRestart(const Run& run) {
  const std::map<int, int> pids = RankPids(run.result.out);
  REQUIRE(pids.size() == kRanks);
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank);
    CHECK(run.result.out.find("train_loop: rank " + std::to_string(rank) + " failed: exit code " +
                              std::to_string(kRestartExitCode)) != std::string::npos);
  }
  std::set<int> dumped;
  for (const JsonFile& file : StallDumps(run.job_dir)) dumped.insert(file.document.at("pid").get<int>());
  CHECK(dumped == Values(pids));
}

// Every metrics file in `directory` as Prometheus's client parses it: its path → the sample
// `name{label=value,...}` (labels sorted, without job, host, pid and rank, which every sample of a
// file shares) → its value. `identities` gets each file's job, host, pid and rank labels.
std::map<std::string, std::map<std::string, double>> ParsedMetrics(
    const std::string& directory, std::map<std::string, std::string>& identities) {
  std::vector<std::string> argv = {"/usr/bin/python3", READ_PROMETHEUS_SCRIPT};
  for (const auto& entry : std::filesystem::directory_iterator(directory))
    argv.push_back(entry.path().string());
  const ProcessResult parsed = RunProcess(argv, {});
  INFO(parsed.err);
  REQUIRE(parsed.exit_code == 0);
  std::map<std::string, std::map<std::string, double>> metrics;
  static const std::regex identity(R"(job=([^,}]*),?|host=([^,}]*),?|pid=([^,}]*),?|rank=([^,}]*),?)");
  for (const std::string& line : SplitLines(parsed.out)) {
    const size_t tab = line.find('\t');
    const size_t value_tab = line.rfind('\t');
    const std::string path = line.substr(0, tab);
    const std::string sample = line.substr(tab + 1, value_tab - tab - 1);
    std::string labels_seen;
    for (std::sregex_iterator it(sample.begin(), sample.end(), identity), end; it != end; ++it) {
      labels_seen += it->str();
    }
    identities[path] = labels_seen;
    std::string stripped = std::regex_replace(sample, identity, "");
    if (stripped.ends_with(",}")) stripped.erase(stripped.size() - 2, 1);
    metrics[path][stripped] = std::stod(line.substr(value_tab + 1));
  }
  return metrics;
}

// The pid in a file name of the job directory: dump-HOST-PID-RANK-N.json, status-HOST-PID.json,
// dump-request-HOST-PID-N. Host names may contain dashes, so it is counted from the end.
int PidInFileName(const std::string& path) {
  std::string name = std::filesystem::path(path).filename().string();
  if (name.size() > 5 && name.ends_with(".json")) name.resize(name.size() - 5);
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t dash = name.find('-', start);
    parts.push_back(name.substr(start, dash - start));
    if (dash == std::string::npos) break;
    start = dash + 1;
  }
  size_t from_end = 0;  // status-HOST-PID
  if (name.starts_with("dump-request-")) {
    from_end = 1;
  } else if (name.starts_with("dump-")) {
    from_end = 2;
  }
  REQUIRE(parts.size() > from_end);
  return std::stoi(parts[parts.size() - 1 - from_end]);
}

std::string RegexEscape(const std::string& text) {
  static const std::regex special(R"([.^$|()\[\]{}*+?\\])");
  return std::regex_replace(text, special, R"(\$&)");
}

const std::vector<std::string> kLoaders = {"linked", "dlopen", "rtld-local"};

}  // namespace

TEST_CASE("a hung AllReduce is reported by every rank within the timeout, with one dump each", "[stall]") {
  TemporaryDirectory dump_dir;
  const Run run = RunOnEmulator(dump_dir, TrainLoop({"--ranks", "4", "--steps", "50", "--timeout", "9"}),
                                {{"NCCLEMU_FAULTS", "hang:rank=2,seq=20"}, {"NCCLGUARD_TIMEOUT", "3"}});
  INFO(run.transcript);
  REQUIRE_FALSE(run.result.timed_out);
  // The job hangs (the default action only reports) until the launcher stops it.
  CHECK(run.result.out.find("ranks not finished: 0,1,2,3") != std::string::npos);
  const std::map<int, int> pids = RankPids(run.result.out);
  REQUIRE(pids.size() == kRanks);

  static const std::regex stall_line(
      R"(ncclguard WARN rank (\d) comm ([0-9a-f]{16}): AllReduce #20 \(float32 × 1024, sum\) started on )"
      R"(the GPU ([0-9.]+) s ago and has not completed — verdict: stuck_inside_nccl: .* — dump: (\S+)$)");
  std::set<std::string> comm_ids;
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank << ", pid " << pid);
    const std::vector<std::string> lines = LogLinesOf(run.result.err, pid, "has not completed");
    REQUIRE(lines.size() == 1);
    std::smatch match;
    REQUIRE(std::regex_search(lines[0], match, stall_line));
    CHECK(std::stoi(match[1]) == rank);
    comm_ids.insert(match[2]);
    CHECK(std::stod(match[3]) >= kTimeoutSeconds);
    CHECK(std::stod(match[3]) <= kTimeoutSeconds + kReportSlackSeconds);
    CHECK(std::filesystem::exists(match[4].str()));
  }
  CHECK(comm_ids.size() == 1);  // the same communicator id on every rank

  const std::vector<JsonFile> dumps = StallDumps(run.job_dir);
  std::map<int, int> stall_dumps_per_pid;
  for (const JsonFile& file : dumps) ++stall_dumps_per_pid[file.document.at("pid").get<int>()];
  for (const int pid : Values(pids)) CHECK(stall_dumps_per_pid[pid] == 1);
  CHECK(stall_dumps_per_pid.size() == kRanks);

  for (const JsonFile& file : dumps) {
    INFO("dump " << file.path);
    const Json& dump = file.document;
    CHECK(dump.at("format") == "ncclguard-dump");
    CHECK(dump.at("format_version") == 2);
    CHECK(dump.at("reason") == "stall");
    const int rank = dump.at("rank").get<int>();
    CHECK(pids.at(rank) == dump.at("pid").get<int>());
    const Json& stall = dump.at("stall");
    CHECK(stall.at("seq") == 20);
    CHECK(stall.at("comm_id") == *comm_ids.begin());
    CHECK(stall.at("seconds").get<double>() >= kTimeoutSeconds);
    const Json op = Operation(dump, 20);
    CHECK(op.at("op") == "AllReduce");
    // Its stream was idle when it was issued: it started at once and never completed.
    CHECK(op.at("state") == "started");
    CHECK(stall.at("kind") == "not_completed");
    CHECK(Operation(dump, 19).at("state") == "completed");
    // Every thread's stack: the thread that issued the stalled AllReduce is listed, with its frames
    // (it waits in cuStreamSynchronize, which a signal does not cut short).
    const Json& threads = dump.at("threads").at("threads");
    const auto issuer = std::find_if(threads.begin(), threads.end(), [&op](const Json& thread) {
      return thread.at("tid") == op.at("host_thread");
    });
    REQUIRE(issuer != threads.end());
    CHECK_FALSE(issuer->at("native").empty());
    const Json& progress = dump.at("watchdog").at("progress")[0];
    CHECK(progress.at("last_completed") == 19);
    CHECK(progress.at("last_enqueued") == 20);
    // Reported within the timeout and the slack after the operation was issued, by the
    // process's own wall clock (the dump is written just before the log line).
    const double seconds_after_issue = static_cast<double>(dump.at("time_ns").get<std::int64_t>() -
                                                           op.at("enqueue_ns").get<std::int64_t>()) /
                                       1e9;
    CHECK(seconds_after_issue >= kTimeoutSeconds);
    CHECK(seconds_after_issue <= kTimeoutSeconds + kReportSlackSeconds);
  }
}

TEST_CASE("NCCLGUARD_ACTION=abort turns a hang into NCCL errors on every rank", "[stall][action]") {
  TemporaryDirectory dump_dir;
  const Run run = RunOnEmulator(
      dump_dir, TrainLoop({"--ranks", "4", "--steps", "50", "--timeout", "40"}),
      {{"NCCLEMU_FAULTS", "hang:rank=2,seq=20"}, {"NCCLGUARD_TIMEOUT", "3"}, {"NCCLGUARD_ACTION", "abort"}});
  INFO(run.transcript);
  REQUIRE_FALSE(run.result.timed_out);
  CHECK(run.result.exit_code != 0);
  // Promptly: the stall timeout and some slack, far from the launcher's own 40 s.
  CHECK(run.seconds < kTimeoutSeconds + 10);
  CHECK(run.result.out.find("did not finish") == std::string::npos);
  const std::map<int, int> pids = RankPids(run.result.out);
  REQUIRE(pids.size() == kRanks);
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank);
    CHECK(LogLinesOf(run.result.err, pid, "AllReduce #20 (float32 × 1024, sum) started on the GPU").size() ==
          1);
    CHECK(LogLinesOf(run.result.err, pid, "aborting comm").size() == 1);
    // The application's next NCCL call failed, and it said so.
    const std::regex nccl_failure("(^|\n)rank " + std::to_string(rank) + ": nccl[A-Za-z]+ failed: ");
    CHECK(std::regex_search(run.result.err, nccl_failure));
    CHECK(run.result.out.find("train_loop: rank " + std::to_string(rank) + " failed: exit code 1") !=
          std::string::npos);
  }
}

// The exit action aborts the communicators before it exits: the application thread that the abort
// releases must not get to end the process with an exit code of its own first.
TEST_CASE("NCCLGUARD_ACTION=exit ends every rank with the restart exit code", "[stall][action]") {
  TemporaryDirectory dump_dir;
  const Run run = RunOnEmulator(
      dump_dir, TrainLoop({"--ranks", "4", "--steps", "50", "--timeout", "40"}),
      {{"NCCLEMU_FAULTS", "hang:rank=2,seq=20"}, {"NCCLGUARD_TIMEOUT", "3"}, {"NCCLGUARD_ACTION", "exit"}});
  INFO(run.transcript);
  REQUIRE_FALSE(run.result.timed_out);
  CHECK(run.seconds < kTimeoutSeconds + 10);
  CheckEveryRankDumpedAndExitedForRestart(run);
}

TEST_CASE("NCCLGUARD_METRICS_DIR: each rank's file counts its stall, dump and exit, as Prometheus reads it",
          "[metrics]") {
  TemporaryDirectory dump_dir;
  const std::string metrics_dir = dump_dir.path() + "/metrics";
  REQUIRE(mkdir(metrics_dir.c_str(), 0755) == 0);
  const Run run = RunOnEmulator(dump_dir, TrainLoop({"--ranks", "4", "--steps", "50", "--timeout", "40"}),
                                {{"NCCLEMU_FAULTS", "hang:rank=2,seq=20"},
                                 {"NCCLGUARD_TIMEOUT", "3"},
                                 {"NCCLGUARD_ACTION", "exit"},
                                 {"NCCLGUARD_METRICS_DIR", metrics_dir}});
  INFO(run.transcript);
  REQUIRE_FALSE(run.result.timed_out);
  const std::map<int, int> pids = RankPids(run.result.out);
  REQUIRE(pids.size() == kRanks);
  std::map<std::string, std::string> identities;
  const auto metrics = ParsedMetrics(metrics_dir, identities);
  REQUIRE(metrics.size() == kRanks);  // one file per process, nothing else left in the directory
  std::set<std::string> ranks;
  for (const auto& [path, samples] : metrics) {
    INFO(path);
    const std::string name = std::filesystem::path(path).filename();
    CHECK(std::regex_match(name, std::regex(R"(ncclguard_e2e_.+_\d+\.prom)")));
    CHECK(identities[path].find("job=e2e") != std::string::npos);
    struct stat status {};
    REQUIRE(stat(path.c_str(), &status) == 0);
    CHECK((status.st_mode & 0777) == 0644);  // for the node exporter, another user
    CHECK(samples.at("ncclguard_stalls_total{kind=operation}") == 1);
    CHECK(samples.at("ncclguard_stalls_total{kind=init}") == 0);
    double verdicts = 0;
    for (const auto& [sample, value] : samples) {
      if (sample.starts_with("ncclguard_stall_verdicts_total{")) verdicts += value;
    }
    const std::smatch rank = [&] {
      std::smatch match;
      std::regex_search(identities[path], match, std::regex("rank=(\\d+)"));
      return match;
    }();
    REQUIRE_FALSE(rank.empty());
    ranks.insert(rank[1]);
    CHECK(samples.at("ncclguard_up{}") == 0);  // written last at its exit
    CHECK(verdicts == 1);
    CHECK(samples.at("ncclguard_dumps_total{outcome=written}") >= 1);
    CHECK(samples.at("ncclguard_actions_total{action=exit}") == 1);
    CHECK(samples.at("ncclguard_operations_total{}") >= 20);
    CHECK(samples.at("ncclguard_watchdog_rounds_total{}") > 0);
  }
  CHECK(ranks == std::set<std::string>{"0", "1", "2", "3"});  // each labelled with its own rank
}

TEST_CASE("NCCLGUARD_METRICS_DIR: a healthy job's files count its operations and no stall", "[metrics]") {
  TemporaryDirectory dump_dir;
  const std::string metrics_dir = dump_dir.path() + "/metrics";
  REQUIRE(mkdir(metrics_dir.c_str(), 0755) == 0);
  const Run run = RunOnEmulator(dump_dir, TrainLoop({"--ranks", "2", "--steps", "30"}),
                                {{"NCCLGUARD_METRICS_DIR", metrics_dir}});
  INFO(run.transcript);
  REQUIRE(run.result.exit_code == 0);
  std::map<std::string, std::string> identities;
  const auto metrics = ParsedMetrics(metrics_dir, identities);
  REQUIRE(metrics.size() == 2);
  for (const auto& [path, samples] : metrics) {
    INFO(path);
    CHECK(samples.at("ncclguard_stalls_total{kind=operation}") == 0);
    CHECK(samples.at("ncclguard_dumps_total{outcome=written}") == 0);
    CHECK(samples.at("ncclguard_operations_total{}") >= 30);
    CHECK(samples.at("ncclguard_stalled{}") == 0);
  }
}

// Another local user plants FIFOs under the names the watchdog reads at a stall: the ranks still
// report, dump and act, and the FIFOs cost no thread (more than four would stop every write).
TEST_CASE("FIFOs planted in the job directory neither block the watchdog nor stop its writes",
          "[stall][hostile]") {
  TemporaryDirectory dump_dir;
  const std::string job_dir = dump_dir.path() + "/" + kJobId;
  REQUIRE(mkdir(job_dir.c_str(), 0700) == 0);
  for (int i = 0; i < 6; ++i) {
    for (const char* prefix : {"dump-planted-", "status-planted-"}) {
      const std::string fifo = job_dir + "/" + prefix + std::to_string(i) + "-0-1.json";
      REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
    }
  }
  const Run run = RunOnEmulator(
      dump_dir, TrainLoop({"--ranks", "4", "--steps", "50", "--timeout", "40"}),
      {{"NCCLEMU_FAULTS", "hang:rank=2,seq=20"}, {"NCCLGUARD_TIMEOUT", "3"}, {"NCCLGUARD_ACTION", "exit"}});
  INFO(run.transcript);
  REQUIRE_FALSE(run.result.timed_out);
  CHECK(ReportsAnyStall(run.result.err));
  CheckEveryRankDumpedAndExitedForRestart(run);
}

TEST_CASE("slow collectives well within the timeout are not stalls", "[stall]") {
  TemporaryDirectory dump_dir;
  const Run run = RunOnEmulator(dump_dir, TrainLoop({"--ranks", "4", "--steps", "20", "--timeout", "60"}),
                                {{"NCCLEMU_FAULTS", "slow:ms=200"}, {"NCCLGUARD_TIMEOUT", "3"}});
  INFO(run.transcript);
  REQUIRE_FALSE(run.result.timed_out);
  CHECK(run.result.exit_code == 0);
  // The fault took effect: 21 operations, each 200 ms late.
  CHECK(run.seconds >= 4);
  CHECK(Checksums(run.result.out).size() == kRanks);
  CHECK_FALSE(ReportsAnyStall(run.result.err));
  CHECK(Dumps(run.job_dir).empty());
}

TEST_CASE("checksums are bit-identical with and without ncclguard, on every loader", "[transparency]") {
  for (const std::string& loader : kLoaders) {
    SECTION(loader) {
      TemporaryDirectory dump_dir;
      const std::vector<std::string> argv =
          TrainLoop({"--ranks", "4", "--steps", "100", "--nccl-loader", loader, "--timeout", "60"});
      const Run plain = RunOnEmulator(dump_dir, argv, {}, /*guarded=*/false);
      INFO(plain.transcript);
      REQUIRE_FALSE(plain.result.timed_out);
      const Run guarded = RunOnEmulator(dump_dir, argv, {{"NCCLGUARD_DUMP_ON_EXIT", "1"}});
      INFO(guarded.transcript);
      REQUIRE_FALSE(guarded.result.timed_out);
      REQUIRE(plain.result.exit_code == 0);
      REQUIRE(guarded.result.exit_code == 0);
      const std::map<int, std::string> checksums = Checksums(plain.result.out);
      REQUIRE(checksums.size() == kRanks);
      std::set<std::string> distinct;
      for (const auto& [rank, checksum] : checksums) distinct.insert(checksum);
      CHECK(distinct.size() == 1);
      CHECK(Checksums(guarded.result.out) == checksums);
      // ncclguard was really there: every rank's exit dump counts the broadcast and 100 AllReduces.
      std::set<int> dumped_pids;
      for (const JsonFile& file : Dumps(guarded.job_dir)) {
        INFO("dump " << file.path);
        CHECK(file.document.at("reason") == "exit");
        CHECK(file.document.at("watchdog").at("progress")[0].at("last_enqueued") == 101);
        dumped_pids.insert(file.document.at("pid").get<int>());
      }
      CHECK(dumped_pids == Values(RankPids(guarded.result.out)));
    }
  }
}

// The exit dump runs in an atexit handler, when the libraries' own clean-up may have begun.
TEST_CASE("a process that exits with its communicator and context still open dumps at exit", "[exit]") {
  TemporaryDirectory dump_dir;
  // A single rank that runs out of data after step 3 and leaves everything to the exit.
  const Run run = RunOnEmulator(
      dump_dir, TrainLoop({"--ranks", "1", "--steps", "10", "--stop-early", "0:3", "--timeout", "60"}),
      {{"NCCLGUARD_DUMP_ON_EXIT", "1"}});
  INFO(run.transcript);
  REQUIRE_FALSE(run.result.timed_out);
  CHECK(run.result.exit_code == 0);
  const std::vector<JsonFile> dumps = Dumps(run.job_dir);
  REQUIRE(dumps.size() == 1);
  const Json& dump = dumps[0].document;
  CHECK(dump.at("reason") == "exit");
  CHECK(dump.at("communicators")[0].at("state") == "ready");
  CHECK(dump.at("watchdog").at("progress")[0].at("last_enqueued") == 4);
}

TEST_CASE("a communicator initialisation that never completes is reported by every rank", "[stall][init]") {
  TemporaryDirectory dump_dir;
  const Run run = RunOnEmulator(dump_dir, TrainLoop({"--ranks", "4", "--steps", "10", "--timeout", "7"}),
                                {{"NCCLEMU_FAULTS", "init_hang:rank=1"}, {"NCCLGUARD_INIT_TIMEOUT", "2"}});
  INFO(run.transcript);
  REQUIRE_FALSE(run.result.timed_out);
  CHECK(run.result.out.find("ranks not finished: 0,1,2,3") != std::string::npos);
  const std::map<int, int> pids = RankPids(run.result.out);
  REQUIRE(pids.size() == kRanks);
  std::map<int, int> init_dumps_per_pid;
  for (const JsonFile& file : StallDumps(run.job_dir)) {
    if (file.document.at("stall").at("kind") == "init")
      ++init_dumps_per_pid[file.document.at("pid").get<int>()];
  }
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank);
    const std::string rank_text = std::to_string(rank);
    const std::regex init_line(
        "ncclguard WARN rank " + rank_text + " comm [0-9a-f]{16}: ncclCommInitRank \\(rank " + rank_text +
        " of 4\\) has not completed after ([0-9.]+) s — verdict: stuck_in_init: .* — dump: /");
    const std::vector<std::string> lines = LogLinesOf(run.result.err, pid, "has not completed after");
    REQUIRE(lines.size() == 1);
    std::smatch match;
    REQUIRE(std::regex_search(lines[0], match, init_line));
    CHECK(std::stod(match[1]) >= 2);
    CHECK(std::stod(match[1]) <= 2 + kReportSlackSeconds);
    CHECK(init_dumps_per_pid[pid] == 1);
  }
}

namespace {

// The emulator's WARN for async_error (transport/p2p.cc), without the device that varies by rank.
constexpr char kAsyncWarning[] = "217 peer access is not supported between these two devices";

Run RunWithAsyncError(const TemporaryDirectory& dump_dir) {
  return RunOnEmulator(dump_dir, TrainLoop({"--ranks", "4", "--steps", "20", "--timeout", "5"}),
                       {{"NCCLEMU_FAULTS", "async_error:rank=1,seq=5,code=6"}});
}

}  // namespace

TEST_CASE("an asynchronous error is reported with NCCL's warning text", "[error]") {
  TemporaryDirectory dump_dir;
  const Run run = RunWithAsyncError(dump_dir);
  INFO(run.transcript);
  REQUIRE_FALSE(run.result.timed_out);
  const std::map<int, int> pids = RankPids(run.result.out);
  REQUIRE(pids.size() == kRanks);
  const std::vector<std::string> lines = LogLinesOf(run.result.err, pids.at(1), "asynchronous error");
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("ncclguard WARN rank 1 comm ") != std::string::npos);
  CHECK(lines[0].find("ncclRemoteError") != std::string::npos);
  CHECK(lines[0].find(kAsyncWarning) != std::string::npos);
  for (const int rank : {0, 2, 3})
    CHECK(LogLinesOf(run.result.err, pids.at(rank), "asynchronous error").empty());

  std::vector<JsonFile> rank1_dumps;
  for (JsonFile& file : Dumps(run.job_dir)) {
    if (file.document.at("pid") == pids.at(1)) rank1_dumps.push_back(std::move(file));
  }
  REQUIRE(rank1_dumps.size() == 1);
  const Json& dump = rank1_dumps[0].document;
  CHECK(dump.at("reason") == "async_error");
  CHECK(dump.at("rank") == 1);
  CHECK(dump.at("last_nccl_warning").get<std::string>().find(kAsyncWarning) != std::string::npos);
  const std::string async_error = dump.at("communicators")[0].at("async_error");
  CHECK((async_error == "6" || async_error == "ncclRemoteError"));
  CHECK(Operation(dump, 5).at("state") != "completed");
}

// A request this early can come before a peer's first look at the job directory: it must still
// count as new for every process that started before it.
TEST_CASE("a peer's asynchronous error makes every process of the job dump", "[error]") {
  TemporaryDirectory dump_dir;
  const Run run = RunWithAsyncError(dump_dir);
  INFO(run.transcript);
  REQUIRE_FALSE(run.result.timed_out);
  const std::map<int, int> pids = RankPids(run.result.out);
  REQUIRE(pids.size() == kRanks);
  std::set<int> dumped;
  for (const JsonFile& file : Dumps(run.job_dir)) dumped.insert(file.document.at("pid").get<int>());
  CHECK(dumped == Values(pids));
}

namespace {

// The pid of the process of `rank`, once its status file appears in the job directory.
std::optional<int> WaitForStatusOfRank(const std::string& job_dir, int rank, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(job_dir, error)) {
      if (!entry.path().filename().string().starts_with("status-")) continue;
      try {
        const Json status = Json::parse(ReadFile(entry.path().string()));
        if (status.at("rank") == rank) return status.at("pid").get<int>();
      } catch (const std::exception&) {
        // Not there any more, or not for us: look again.
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("the dump signal dumps a healthy process, which carries on", "[signal]") {
  TemporaryDirectory dump_dir;
  const std::string job_dir = dump_dir.path() + "/" + kJobId;
  // Rank 0 pauses after step 2, so the job is still running when the signal comes.
  std::optional<Run> run;
  std::thread job([&] {
    run = RunOnEmulator(dump_dir,
                        TrainLoop({"--ranks", "2", "--steps", "20", "--sleep", "0:2:4", "--timeout", "40"}),
                        {{"NCCLGUARD_STATUS_INTERVAL", "0.2"}});
  });
  const std::optional<int> rank1_pid = WaitForStatusOfRank(job_dir, 1, 30);
  if (rank1_pid) kill(*rank1_pid, SIGUSR2);
  job.join();
  REQUIRE(run);
  INFO(run->transcript);
  REQUIRE_FALSE(run->result.timed_out);
  REQUIRE(rank1_pid);
  CHECK(run->result.exit_code == 0);
  CHECK(Checksums(run->result.out).size() == 2);
  const std::map<int, int> pids = RankPids(run->result.out);
  REQUIRE(pids.size() == 2);
  CHECK(pids.at(1) == *rank1_pid);
  const std::vector<JsonFile> dumps = Dumps(run->job_dir);
  REQUIRE(dumps.size() == 1);
  const Json& dump = dumps[0].document;
  CHECK(dump.at("pid") == *rank1_pid);
  CHECK(dump.at("reason") == "signal");
  CHECK(dump.at("stall").is_null());
  CHECK(dump.at("communicators").size() == 1);
  CHECK_FALSE(ReportsAnyStall(run->result.err));
}

TEST_CASE("forked data loader workers neither hang nor write into the job directory", "[fork]") {
  TemporaryDirectory dump_dir;
  const Run run = RunOnEmulator(
      dump_dir, TrainLoop({"--ranks", "4", "--steps", "20", "--workers", "2", "--timeout", "60"}),
      {{"NCCLGUARD_STATUS_INTERVAL", "0.2"}, {"NCCLGUARD_DUMP_ON_EXIT", "1"}});
  INFO(run.transcript);
  REQUIRE_FALSE(run.result.timed_out);
  CHECK(run.result.exit_code == 0);
  CHECK(Checksums(run.result.out).size() == kRanks);
  for (int rank = 0; rank < kRanks; ++rank) {
    CHECK(run.result.out.find("rank " + std::to_string(rank) + ": 2 data loader workers finished") !=
          std::string::npos);
  }
  const std::set<int> rank_pids = Values(RankPids(run.result.out));
  REQUIRE(rank_pids.size() == kRanks);
  const std::vector<JsonFile> files = JobFiles(run.job_dir);
  CHECK_FALSE(files.empty());
  std::map<int, int> exit_dumps_per_pid;
  for (const JsonFile& file : files) {
    INFO("file " << file.path);
    const int pid = file.document.at("pid").get<int>();
    CHECK(rank_pids.contains(pid));
    CHECK(PidInFileName(file.path) == pid);
    if (file.document.value("reason", "") == "exit") ++exit_dumps_per_pid[pid];
  }
  for (const int pid : rank_pids) CHECK(exit_dumps_per_pid[pid] == 1);
  CHECK_FALSE(ReportsAnyStall(run.result.err));
}

TEST_CASE("a forked child that uses NCCL itself gets its own watchdog", "[fork]") {
  TemporaryDirectory dump_dir;
  const Run run = RunOnEmulator(dump_dir, {FORK_CHILD_PROGRAM},
                                {{"NCCLEMU_FAULTS", "hang:rank=0,seq=2"},
                                 {"NCCLGUARD_TIMEOUT", "2"},
                                 {"NCCLGUARD_ACTION", "abort"},
                                 {"NCCLGUARD_STATUS_INTERVAL", "0.2"}});
  INFO(run.transcript);
  REQUIRE_FALSE(run.result.timed_out);
  REQUIRE(run.result.exit_code == 0);
  static const std::regex parent_line(R"((^|\n)parent pid (\d+)\n)");
  static const std::regex child_line(R"((^|\n)child pid (\d+)\n)");
  std::smatch match;
  REQUIRE(std::regex_search(run.result.out, match, parent_line));
  const int parent = std::stoi(match[2]);
  REQUIRE(std::regex_search(run.result.out, match, child_line));
  const int child = std::stoi(match[2]);
  // The watchdog's abort ended the child's hang; nothing killed it.
  CHECK(run.result.out.find("child exited with code 0") != std::string::npos);

  const std::vector<std::string> stall_lines = LogLinesOf(run.result.err, child, "has not completed");
  REQUIRE(stall_lines.size() == 1);
  CHECK(stall_lines[0].find("AllReduce #2 (float32 × 256, sum) started on the GPU") != std::string::npos);
  CHECK(stall_lines[0].find("-" + std::to_string(child) + "-0-") != std::string::npos);  // its own dump
  // The parent reports no stall of its own. (It may say that it ignores the child's dump request,
  // which quotes the child's stall, when it looks at the board before it ends.)
  CHECK(LogLinesOf(run.result.err, parent, "ncclguard WARN rank ").empty());

  std::string parent_comm;
  const std::vector<JsonFile> files = JobFiles(run.job_dir);
  for (const JsonFile& file : files) {
    INFO("file " << file.path);
    // Every file is written under the name of the process that wrote it.
    CHECK(PidInFileName(file.path) == file.document.at("pid").get<int>());
    if (file.document.at("pid") == parent && file.document.value("format", "") == "ncclguard-status") {
      parent_comm = file.document.at("communicators")[0].at("id");
    }
  }
  REQUIRE_FALSE(parent_comm.empty());
  const std::vector<JsonFile> stall_dumps = StallDumps(run.job_dir);
  REQUIRE(stall_dumps.size() == 1);
  const Json& dump = stall_dumps[0].document;
  CHECK(dump.at("pid") == child);
  CHECK(dump.at("stall").at("seq") == 2);
  // The child reports its own communicator only, never the parent's.
  REQUIRE(dump.at("communicators").size() == 1);
  CHECK(dump.at("communicators")[0].at("id") != parent_comm);
  CHECK(dump.at("stall").at("comm_id") == dump.at("communicators")[0].at("id"));
}

// Under NCCLGUARD_RECOVER=inprocess too: a captured operation is never put on probation (a gate
// would be captured into the graph and replayed with every launch), so its launches run as
// without ncclguard.
TEST_CASE("a collective captured into a CUDA graph is recorded as captured, never as a stall", "[capture]") {
  TemporaryDirectory dump_dir;
  // The program launches its graph several times and checks every result, with and without ncclguard.
  const Run unguarded = RunOnEmulator(dump_dir, {CAPTURE_PROGRAM, "0", "0"}, {}, false);
  INFO(unguarded.transcript);
  REQUIRE(unguarded.result.exit_code == 0);
  CHECK(unguarded.result.out.find("capture ok") != std::string::npos);
  for (const std::string recover : {"off", "inprocess"}) {
    SECTION("NCCLGUARD_RECOVER=" + recover) {
      // The capture stays open for several watchdog rounds; the program outlives the timeout.
      const Run run = RunOnEmulator(
          dump_dir, {CAPTURE_PROGRAM, "0.5", "1.5"},
          {{"NCCLGUARD_TIMEOUT", "1"}, {"NCCLGUARD_DUMP_ON_EXIT", "1"}, {"NCCLGUARD_RECOVER", recover}});
      INFO(run.transcript);
      REQUIRE_FALSE(run.result.timed_out);
      REQUIRE(run.result.exit_code == 0);
      CHECK(run.result.out.find("capture ok") != std::string::npos);
      CHECK_FALSE(ReportsAnyStall(run.result.err));
      const std::vector<JsonFile> dumps = Dumps(run.job_dir);
      REQUIRE(dumps.size() == 1);
      const Json& dump = dumps[0].document;
      CHECK(dump.at("reason") == "exit");
      CHECK(dump.at("stall").is_null());
      const Json op = Operation(dump, 1);
      CHECK(op.at("op") == "AllReduce");
      CHECK(op.at("state") == "captured");
      CHECK(op.at("count") == 1024);
    }
  }
}

TEST_CASE("the log names the NCCL library behind every communicator, on every loader", "[transparency]") {
  for (const std::string& loader : kLoaders) {
    SECTION(loader) {
      TemporaryDirectory dump_dir;
      const Run run = RunOnEmulator(
          dump_dir, TrainLoop({"--ranks", "4", "--steps", "5", "--nccl-loader", loader, "--timeout", "60"}),
          {{"NCCLGUARD_LOG_LEVEL", "info"}});
      INFO(run.transcript);
      REQUIRE_FALSE(run.result.timed_out);
      REQUIRE(run.result.exit_code == 0);
      const std::map<int, int> pids = RankPids(run.result.out);
      REQUIRE(pids.size() == kRanks);
      for (const auto& [rank, pid] : pids) {
        INFO("rank " << rank);
        const std::string rank_text = std::to_string(rank);
        const std::regex created("ncclguard INFO comm [0-9a-f]{16} rank " + rank_text + "/4 on device " +
                                 rank_text +
                                 " created by ncclCommInitRank in [0-9.]+ ms through NCCL 2\\.28\\.9 at " +
                                 RegexEscape(EMULATOR_LIBRARY_DIR "/libnccl.so.2") + "$");
        const std::vector<std::string> lines = LogLinesOf(run.result.err, pid, "created by");
        REQUIRE(lines.size() == 1);
        CHECK(std::regex_search(lines[0], created));
      }
    }
  }
}

// The program's resident memory after 1,000 and after 10,000 cycles, in KiB.
std::pair<long, long> CycleMemory(const Run& run) {
  INFO(run.transcript);
  REQUIRE_FALSE(run.result.timed_out);
  REQUIRE(run.result.exit_code == 0);
  static const std::regex rss_line(R"(rss_kb after (\d+) cycles: (\d+))");
  std::map<int, long> rss_kb;
  for (auto it = std::sregex_iterator(run.result.out.begin(), run.result.out.end(), rss_line);
       it != std::sregex_iterator(); ++it) {
    rss_kb[std::stoi((*it)[1])] = std::stol((*it)[2]);
  }
  REQUIRE(rss_kb.count(1000) == 1);
  REQUIRE(rss_kb.count(10000) == 1);
  return {rss_kb[1000], rss_kb[10000]};
}

TEST_CASE("destroyed communicators are freed: 10,000 create/destroy cycles keep memory flat", "[resources]") {
  TemporaryDirectory dump_dir;
  // Half a millisecond between cycles: still far more communicators a second than any real job
  // makes. The program measures after a second's pause: more than a poll and a status interval,
  // after which every closed communicator is released.
  const std::vector<std::string> program{COMM_CYCLES_PROGRAM, "10000", "500"};
  const Environment settings{{"NCCLGUARD_STATUS_INTERVAL", "0.2"}, {"NCCLGUARD_POLL_INTERVAL", "0.05"}};
  // About 25 s preloaded on an idle 2-core machine (a status file written at every creation), and
  // twice that with other tests running beside it: the bound is for a hang, not for speed.
  const Run guarded = RunOnEmulator(dump_dir, program, settings, true, 150);
  const auto [guarded_first, guarded_last] = CycleMemory(guarded);
  // What the emulated NCCL and CUDA themselves grow by is not ncclguard's.
  TemporaryDirectory plain_dump_dir;
  const auto [plain_first, plain_last] =
      CycleMemory(RunOnEmulator(plain_dump_dir, program, settings, false, 150));
  INFO(guarded.transcript << "\nwithout ncclguard: " << plain_first << " KiB, then " << plain_last << " KiB");
  CHECK(guarded_last - guarded_first - std::max(0L, plain_last - plain_first) <= guarded_first / 10);
  CHECK(guarded.result.err.find("communicators at once") == std::string::npos);
  // The last status file, written at exit after the pause, lists no closed communicator.
  for (const JsonFile& file : JobFiles(guarded.job_dir)) {
    if (file.document.value("format", "") != "ncclguard-status") continue;
    CHECK(file.document.at("communicators").empty());
  }
}
