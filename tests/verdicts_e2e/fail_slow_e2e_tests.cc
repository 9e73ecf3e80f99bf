// Fail-slow end to end: 8-rank train_loop jobs (and a 4-rank ddp_habits one, PyTorch's way of
// calling NCCL) on the emulator with libncclguard.so preloaded, a link made slower (NCCLEMU_FAULTS
// slow_link) or a rank that computes longer (--slow), and a healthy job with jitter and a
// checkpoint pause. Each test checks what a user reads while the
// job runs (the judge's WARN lines, its status's `fail_slow`) and what `ncclguard analyze --json`
// says on the job directory afterwards. Only the online delay is timed (the 60 s bound);
// everything else is asserted on lines, so that a loaded machine slows the tests, never fails them.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/support/process.h"
#include "tests/support/train_loop_output.h"
#include "tests/verdicts_e2e/analysis.h"

using ncclguard::testing::Analysis;
using ncclguard::testing::Analyze;
using ncclguard::testing::EmulatorJobEnvironment;
using ncclguard::testing::FindVerdict;
using ncclguard::testing::ProcessOptions;
using ncclguard::testing::ProcessResult;
using ncclguard::testing::RankPids;
using ncclguard::testing::ReadFile;
using ncclguard::testing::RunProcess;
using ncclguard::testing::SplitLines;
using ncclguard::testing::TemporaryDirectory;
using Json = nlohmann::json;
using Environment = std::map<std::string, std::optional<std::string>>;
using Clock = std::chrono::steady_clock;

namespace {

constexpr char kJobId[] = "failslow";
// How often the judge looks at the job's pace in these tests; the default (15 s) in the test of
// the 60 s bound. At 2 s (the status interval) no slow_link is ever said online, though analyze
// names it afterwards.
constexpr char kSlowInterval[] = "5";
constexpr int kAnalyzeUnhealthy = 1;
// The bound on naming a slowness, from the job's start (later than its first step).
constexpr double kOnlineBoundSeconds = 60;

struct Job {
  ProcessResult result;
  std::string job_dir;
  std::map<int, int> pids;       // rank -> pid
  std::string judge_log;         // the log of the process of rank 0, which judges the pace
  std::string all_logs;          // every process's log
  std::optional<double> seen_s;  // when `watch_for` first appeared in a log, from the launch
  std::string transcript;
};

std::string AllLogs(const std::string& dump_dir) {
  std::string text;
  for (const auto& entry : std::filesystem::directory_iterator(dump_dir)) {
    if (entry.path().filename().string().starts_with("log-")) text += ReadFile(entry.path().string());
  }
  return text;
}

// Runs `program` (train_loop unless said) with `arguments` on the emulator over the NET transport
// (the only one whose proxy steps time each link), every process logging to a file of its own;
// meanwhile watches the logs for `watch_for` and notes when it first appears.
Job RunJob(const TemporaryDirectory& dump_dir, std::vector<std::string> arguments,
           const Environment& settings, const std::string& watch_for,
           const std::string& program = TRAIN_LOOP) {
  ProcessOptions options;
  options.timeout_seconds = 150;
  options.environment = EmulatorJobEnvironment(EMULATOR_LIBRARY_DIR, dump_dir.path(), kJobId);
  options.environment["LD_PRELOAD"] = PRELOAD_LIBRARY;
  options.environment["NCCL_P2P_DISABLE"] = "1";
  options.environment["NCCL_SHM_DISABLE"] = "1";
  options.environment["NCCLGUARD_LOG_FILE"] = dump_dir.path() + "/log-%p.txt";
  options.environment["NCCLGUARD_LOG_LEVEL"] = "info";  // why no pace was judged, if none was
  for (const auto& [name, value] : settings) options.environment[name] = value;
  arguments.insert(arguments.begin(), program);

  Job job;
  const Clock::time_point launch = Clock::now();
  std::atomic<bool> finished = false;
  std::thread runner([&] {
    job.result = RunProcess(arguments, options);
    finished = true;
  });
  bool done = false;
  while (!done) {
    done = finished;  // one more look at the logs after the job ended
    if (!job.seen_s && !watch_for.empty() && AllLogs(dump_dir.path()).find(watch_for) != std::string::npos) {
      job.seen_s = std::chrono::duration<double>(Clock::now() - launch).count();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  runner.join();
  job.job_dir = dump_dir.path() + "/" + kJobId;
  job.pids = RankPids(job.result.out);
  job.all_logs = AllLogs(dump_dir.path());
  if (job.pids.contains(0)) {
    const std::string path = dump_dir.path() + "/log-" + std::to_string(job.pids.at(0)) + ".txt";
    if (std::filesystem::exists(path)) job.judge_log = ReadFile(path);
  }
  job.transcript = std::filesystem::path(program).filename().string() + ": exit code " +
                   std::to_string(job.result.exit_code) + (job.result.timed_out ? ", timed out" : "") +
                   "\nstdout:\n" + job.result.out + "\nstderr:\n" + job.result.err + "\nlogs:\n" +
                   job.all_logs;
  return job;
}

}  // namespace

namespace {

// The lines of `log` that contain `needle`.
std::vector<std::string> LinesWith(const std::string& log, const std::string& needle) {
  std::vector<std::string> lines;
  for (const std::string& line : SplitLines(log)) {
    if (line.find(needle) != std::string::npos) lines.push_back(line);
  }
  return lines;
}

bool Contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// The `fail_slow` list of the last status the process of `pid` wrote (empty when it has none).
Json StatusFailSlow(const Job& job, int pid) {
  const std::string suffix = "-" + std::to_string(pid) + ".json";
  for (const auto& entry : std::filesystem::directory_iterator(job.job_dir)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("status-") || !name.ends_with(suffix)) continue;
    const Json status = Json::parse(ReadFile(entry.path().string()));
    return status.value("fail_slow", Json::array());
  }
  FAIL("no status file of pid " << pid << " in " << job.job_dir);
  return Json::array();
}

// Links that take time (1 Gb/s, each use 10 % faster or slower at random), so that a step of
// 262,144 floats takes tens of milliseconds and the link's factor shows in its network steps.
constexpr char kLinks[] = "gbps=1,jitter=0.1";
constexpr char kCount[] = "262144";
constexpr char kSlowLink[] = "slow_link: the link from rank 3 (";

// The slow_link line, status entry and analysis of the link from rank 3 to rank 4, both channels.
void CheckSlowLinkNamed(const Job& job, const std::string& line) {
  CHECK(Contains(line, " to rank 4 ("));
  CHECK(Contains(line, "on channels 0,1 is "));
  CHECK(Contains(line, "x slower than the communicator's median link"));
  const Json fail_slow = StatusFailSlow(job, job.pids.at(0));
  REQUIRE(fail_slow.size() == 1);
  CHECK(fail_slow[0].at("kind") == "slow_link");
  CHECK(fail_slow[0].at("ranks") == Json({3, 4}));
  CHECK(Contains(fail_slow[0].at("message"), "the link from rank 3 ("));
}

}  // namespace

// With the default interval of the judge (15 s): the bound is one minute.
TEST_CASE("a link 3x slower is named while the job runs, within a minute, and by analyze",
          "[fail_slow][slow_link]") {
  TemporaryDirectory dump_dir;
  const Job job =
      RunJob(dump_dir, {"--ranks", "8", "--steps", "800", "--count", kCount, "--timeout", "140"},
             {{"NCCLEMU_LINKS", kLinks}, {"NCCLEMU_FAULTS", "slow_link:rank=3,peer=4,factor=3"}}, kSlowLink);
  INFO(job.transcript);
  REQUIRE(job.result.exit_code == 0);
  REQUIRE(job.pids.size() == 8);
  REQUIRE(job.seen_s.has_value());
  CHECK(*job.seen_s < kOnlineBoundSeconds);
  // Said once, by the judge alone, and never said to end.
  const std::vector<std::string> lines = LinesWith(job.judge_log, kSlowLink);
  REQUIRE(lines.size() == 1);
  CHECK(Contains(lines[0], "[0] ncclguard WARN slow_link: "));
  CHECK(LinesWith(job.all_logs, "slow_link").size() == 1);
  CHECK(LinesWith(job.all_logs, "slow_rank").empty());
  CheckSlowLinkNamed(job, lines[0]);

  const Analysis analysis = Analyze(job.job_dir);
  CHECK(analysis.result.exit_code == kAnalyzeUnhealthy);
  const Json verdict = FindVerdict(analysis.document, "slow_link");
  INFO(analysis.result.out);
  REQUIRE(verdict != nullptr);
  CHECK(verdict.at("ranks") == Json({3, 4}));
  const Json& evidence = verdict.at("evidence");
  CHECK(evidence.at("rank") == 3);
  CHECK(evidence.at("peer") == 4);
  CHECK(evidence.at("channels") == Json({0, 1}));
  CHECK(evidence.at("ratio_to_median").get<double>() > 2);
  CHECK(evidence.at("gbps").get<double>() < evidence.at("median_gbps").get<double>());
  CHECK(FindVerdict(analysis.document, "slow_rank") == nullptr);
}

// PyTorch's way (ddp_habits): every collective on a split communicator, non-blocking, on a stream of
// its own, four buckets a step back to back: hundreds of operations a second, far more than the
// profile of each communicator holds between two of the watchdog's looks. Small buckets are mostly
// latency: a link 3x slower per byte measures about 2.2x its peers' time per byte and one 5x slower
// about 3.5x on a quiet machine. The machine's own delays add to every link alike: on a loaded one
// (CI) 3x was once not named at all and 5x once named online but not in the job's last blocks,
// which analyze judges. 10x measures about 7x quiet, and stays above the 2x threshold until those
// delays reach eight times the link's own time.
TEST_CASE("a link 10x slower under a DDP-like job of hundreds of operations a second is named",
          "[fail_slow][slow_link][ddp]") {
  TemporaryDirectory dump_dir;
  const Job job = RunJob(dump_dir, {"--ranks", "4", "--steps", "4000", "--buckets", "4", "--nonblocking"},
                         {{"NCCLEMU_LINKS", kLinks},
                          {"NCCLEMU_FAULTS", "slow_link:rank=1,peer=2,factor=10"},
                          {"NCCLGUARD_SLOW_INTERVAL", kSlowInterval}},
                         "slow_link: ", DDP_HABITS);
  INFO(job.transcript);
  REQUIRE(job.result.exit_code == 0);
  REQUIRE(job.pids.size() == 4);
  // Named, and only that link. On a machine loaded by other tests a slowness of a few milliseconds
  // a block may dip below the threshold for two looks: it is then said to end and said again,
  // which is what the judge is for; so the test counts the links named, not the lines.
  const std::vector<std::string> lines = LinesWith(job.judge_log, "WARN slow_link: ");
  REQUIRE_FALSE(lines.empty());
  for (const std::string& line : lines) {
    CHECK(Contains(line, "slow_link: the link from rank 1 ("));
    CHECK(Contains(line, " to rank 2 ("));
  }
  CHECK(LinesWith(job.all_logs, "slow_rank").empty());

  const Analysis analysis = Analyze(job.job_dir);
  INFO(analysis.result.out);
  CHECK(analysis.result.exit_code == kAnalyzeUnhealthy);
  const Json verdict = FindVerdict(analysis.document, "slow_link");
  REQUIRE(verdict != nullptr);
  CHECK(verdict.at("ranks") == Json({1, 2}));
  CHECK(verdict.at("evidence").at("rank") == 1);
  CHECK(verdict.at("evidence").at("peer") == 2);
}

TEST_CASE("a slow link that heals mid-job is said to end, and analyze finds the job healthy",
          "[fail_slow][slow_link]") {
  TemporaryDirectory dump_dir;
  // The judge's first look is an interval after the start, and it says a verdict, as its end, after
  // two looks in a row: at 3 s, about 18 s slow then 12 s fast leave room for both.
  const Job job = RunJob(dump_dir, {"--ranks", "8", "--steps", "900", "--count", kCount, "--timeout", "140"},
                         {{"NCCLEMU_LINKS", kLinks},
                          {"NCCLEMU_FAULTS", "slow_link:rank=3,peer=4,factor=3,until=300"},
                          {"NCCLGUARD_SLOW_INTERVAL", "3"}},
                         kSlowLink);
  INFO(job.transcript);
  REQUIRE(job.result.exit_code == 0);
  REQUIRE(job.pids.size() == 8);
  const std::vector<std::string> lines = LinesWith(job.judge_log, "slow_link");
  REQUIRE(lines.size() == 2);
  CHECK(Contains(lines[0], "WARN slow_link: the link from rank 3 ("));
  CHECK(Contains(lines[0], " to rank 4 ("));
  CHECK(Contains(lines[1], "WARN slow_link ended: "));
  CHECK(Contains(lines[1], "the link from rank 3 ("));
  CHECK(StatusFailSlow(job, job.pids.at(0)).empty());
  const Analysis analysis = Analyze(job.job_dir);
  INFO(analysis.result.out);
  CHECK(analysis.result.exit_code == 0);
  CHECK(analysis.document.at("healthy") == true);
}

TEST_CASE("a rank that computes longer is named slow_rank with its cost, online and by analyze",
          "[fail_slow][slow_rank]") {
  TemporaryDirectory dump_dir;
  const Job job = RunJob(dump_dir, {"--ranks", "8", "--steps", "80", "--slow", "5:150", "--timeout", "140"},
                         {{"NCCLGUARD_SLOW_INTERVAL", kSlowInterval}}, "slow_rank: rank 5 (");
  INFO(job.transcript);
  REQUIRE(job.result.exit_code == 0);
  REQUIRE(job.pids.size() == 8);
  REQUIRE(job.seen_s.has_value());
  CHECK(*job.seen_s < kOnlineBoundSeconds);
  const std::vector<std::string> lines = LinesWith(job.judge_log, "slow_rank");
  REQUIRE(lines.size() == 1);
  const std::string pid = std::to_string(job.pids.at(5));
  CHECK(Contains(lines[0], "[0] ncclguard WARN slow_rank: rank 5 (pid " + pid + " on host "));
  CHECK(Contains(lines[0], "is late into the collectives: its peers wait for it "));
  CHECK(Contains(lines[0], " ms in every 8 operations, "));
  CHECK(Contains(lines[0], " % of the job's time"));
  CHECK(LinesWith(job.all_logs, "slow_link").empty());
  const Json fail_slow = StatusFailSlow(job, job.pids.at(0));
  REQUIRE(fail_slow.size() == 1);
  CHECK(fail_slow[0].at("kind") == "slow_rank");
  CHECK(fail_slow[0].at("ranks") == Json({5}));

  const Analysis analysis = Analyze(job.job_dir);
  INFO(analysis.result.out);
  CHECK(analysis.result.exit_code == kAnalyzeUnhealthy);
  const Json verdict = FindVerdict(analysis.document, "slow_rank");
  REQUIRE(verdict != nullptr);
  CHECK(verdict.at("ranks") == Json({5}));
  const Json& evidence = verdict.at("evidence");
  CHECK(evidence.at("rank") == 5);
  CHECK(evidence.at("pid") == job.pids.at(5));
  // 150 ms a step, 8 steps a block: the others wait about 1.2 s in every block, most of the time.
  CHECK(evidence.at("waited_ms_per_block").get<double>() > 600);
  CHECK(evidence.at("waited_ms_per_block").get<double>() < 2400);
  CHECK(evidence.at("share_of_time").get<double>() > 0.5);
  CHECK(FindVerdict(analysis.document, "slow_link") == nullptr);
}

TEST_CASE("a rank slow for a while is said to end after its last slow step", "[fail_slow][slow_rank]") {
  TemporaryDirectory dump_dir;
  const Job job = RunJob(
      dump_dir,
      {"--ranks", "8", "--steps", "600", "--count", kCount, "--slow", "5:150:1-100", "--timeout", "140"},
      {{"NCCLEMU_LINKS", kLinks}, {"NCCLGUARD_SLOW_INTERVAL", kSlowInterval}}, "slow_rank: rank 5 (");
  INFO(job.transcript);
  REQUIRE(job.result.exit_code == 0);
  REQUIRE(job.pids.size() == 8);
  const std::vector<std::string> lines = LinesWith(job.judge_log, "slow_rank");
  REQUIRE(lines.size() == 2);
  CHECK(Contains(lines[0], "WARN slow_rank: rank 5 (pid " + std::to_string(job.pids.at(5))));
  CHECK(Contains(lines[1], "WARN slow_rank ended: "));
  CHECK(Contains(lines[1], "rank 5 (pid "));
  CHECK(StatusFailSlow(job, job.pids.at(0)).empty());
  const Analysis analysis = Analyze(job.job_dir);
  INFO(analysis.result.out);
  CHECK(analysis.result.exit_code == 0);
  CHECK(analysis.document.at("healthy") == true);
}

// About a minute of a healthy job judged every 5 s: links with 20 % jitter and a 4 s checkpoint
// save on one rank, which every other rank waits for once. Steps of 524,288 floats: a status's 8
// blocks of 8 operations span several seconds, more than the ranks' statuses differ in time, so
// that the judge finds blocks every rank completed and judges them.
TEST_CASE("a healthy job with jitter and a checkpoint pause has no fail-slow line", "[fail_slow][healthy]") {
  TemporaryDirectory dump_dir;
  const Job job = RunJob(
      dump_dir,
      {"--ranks", "8", "--steps", "600", "--count", "524288", "--sleep", "2:300:4", "--timeout", "140"},
      {{"NCCLEMU_LINKS", "gbps=1,jitter=0.2,seed=7"}, {"NCCLGUARD_SLOW_INTERVAL", kSlowInterval}}, "slow_");
  INFO(job.transcript);
  REQUIRE(job.result.exit_code == 0);
  REQUIRE(job.pids.size() == 8);
  CHECK(Contains(job.result.out, "saving a checkpoint for 4 s after step 300"));
  CHECK_FALSE(job.seen_s.has_value());
  CHECK(LinesWith(job.all_logs, "slow_link").empty());
  CHECK(LinesWith(job.all_logs, "slow_rank").empty());
  CHECK(StatusFailSlow(job, job.pids.at(0)).empty());
  const Analysis analysis = Analyze(job.job_dir);
  INFO(analysis.result.out);
  CHECK(analysis.result.exit_code == 0);
  CHECK(analysis.document.at("healthy") == true);
}
