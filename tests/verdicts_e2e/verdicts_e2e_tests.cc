// The cross-rank verdicts end to end: train_loop jobs on the emulator with libncclguard.so
// preloaded and the faults of the field cases, then `ncclguard analyze --json` on the job
// directory they left. Each test checks what a user reads: the verdicts, the analyzer's exit
// status, and the verdict the watchdog logged at the moment of the stall.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/support/process.h"
#include "tests/support/redis_server.h"
#include "tests/support/train_loop_output.h"
#include "tests/verdicts_e2e/analysis.h"

using ncclguard::testing::Analysis;
using ncclguard::testing::Analyze;
using ncclguard::testing::AnalyzeTarget;
using ncclguard::testing::Checksums;
using ncclguard::testing::EmulatorJobEnvironment;
using ncclguard::testing::FindVerdict;
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

constexpr char kJobId[] = "verdicts";
// Short timeouts keep the suite fast: every hung job is reported after kStallTimeout and ended by
// train_loop's own --timeout after kHungJobSeconds.
constexpr char kStallTimeout[] = "2";
constexpr char kHungJobSeconds[] = "7";
constexpr char kShortStatusInterval[] = "0.2";
constexpr int kAnalyzeUnhealthy = 1;

struct Job {
  ProcessResult result;
  std::string job_dir;
  std::string transcript;  // for the test's messages
};

// Runs train_loop with `arguments` on the emulator under ncclguard (unless `guarded` is false),
// with a job directory of its own in `dump_dir`. No fault and no setting leaks in from outside.
// After `kill_after_seconds` the launcher and every rank are killed at once (SIGKILL to their
// process group), as a scheduler ends a job at its time limit.
Job RunProgram(const TemporaryDirectory& dump_dir, const std::vector<std::string>& arguments,
               const Environment& settings, bool guarded, double kill_after_seconds) {
  ProcessOptions options;
  options.timeout_seconds =
      kill_after_seconds;  // by default a last resort: train_loop's --timeout ends hung jobs
  options.environment = EmulatorJobEnvironment(EMULATOR_LIBRARY_DIR, dump_dir.path(), kJobId);
  if (guarded) options.environment["LD_PRELOAD"] = PRELOAD_LIBRARY;
  for (const auto& [name, value] : settings) options.environment[name] = value;
  Job job;
  job.result = RunProcess(arguments, options);
  job.job_dir = dump_dir.path() + "/" + kJobId;
  job.transcript = arguments[0] + ": exit code " + std::to_string(job.result.exit_code) +
                   (job.result.timed_out ? ", timed out" : "") + "\nstdout:\n" + job.result.out +
                   "\nstderr:\n" + job.result.err;
  return job;
}

Job RunTrainLoop(const TemporaryDirectory& dump_dir, std::vector<std::string> arguments,
                 const Environment& settings, bool guarded = true, double kill_after_seconds = 50) {
  arguments.insert(arguments.begin(), TRAIN_LOOP);
  return RunProgram(dump_dir, arguments, settings, guarded, kill_after_seconds);
}

std::vector<int> Ranks(const Json& verdict) { return verdict.at("ranks").get<std::vector<int>>(); }

bool Contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// The verdict the watchdog logged with the first stall it reported ("... — verdict: KIND:
// MESSAGE — dump: PATH"), or "" when that process reported none.
std::string OnlineVerdict(const std::string& err, int pid) {
  for (const std::string& line : LogLinesOf(err, pid, " — verdict: ")) {
    const size_t start = line.find(" — verdict: ") + std::string(" — verdict: ").size();
    return line.substr(start, line.rfind(" — dump: ") - start);
  }
  return "";
}

}  // namespace

namespace {

Job RunUnevenData(const TemporaryDirectory& dump_dir, const Environment& settings) {
  return RunTrainLoop(dump_dir,
                      {"--ranks", "4", "--steps", "50", "--stop-early", "3:40", "--timeout", kHungJobSeconds},
                      settings);
}

}  // namespace

// With every rank's flight recorder (rank 3 dumps as it exits): the analysis has rank 3's ring.
TEST_CASE("uneven data: the rank that finished its loop is named, with the operation the others wait in",
          "[rank_not_joined]") {
  TemporaryDirectory dump_dir;
  const Job job =
      RunUnevenData(dump_dir, {{"NCCLGUARD_TIMEOUT", kStallTimeout}, {"NCCLGUARD_DUMP_ON_EXIT", "1"}});
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  REQUIRE(Contains(job.result.out, "ranks not finished: 0,1,2"));
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 4);

  const Analysis analysis = Analyze(job.job_dir);
  INFO(analysis.result.out);
  CHECK(analysis.result.exit_code == kAnalyzeUnhealthy);
  const Json& verdict = analysis.document.at("verdicts").at(0);
  REQUIRE(verdict.at("kind") == "rank_not_joined");
  // Step 40 is AllReduce #41 (the broadcast is #1).
  CHECK(verdict.at("seq") == 42);
  CHECK(Ranks(verdict) == std::vector<int>{3});
  const std::string message = verdict.at("message");
  CHECK(Contains(message, "rank 3 completed AllReduce #41"));
  CHECK(Contains(message, "finished its loop"));
  CHECK(Contains(message, "ranks 0,1,2 wait in AllReduce #42 (float32 × 1024, sum)"));
  const Json& evidence = verdict.at("evidence");
  CHECK(evidence.at("waiting_ranks") == Json({0, 1, 2}));
  CHECK(evidence.at("op").at("op") == "AllReduce");
  CHECK(evidence.at("op").at("count") == 1024);
  REQUIRE(evidence.at("late_ranks").size() == 1);
  CHECK(evidence.at("late_ranks")[0].at("rank") == 3);
  CHECK(evidence.at("late_ranks")[0].at("where") == "finished");
  CHECK(evidence.at("late_ranks")[0].at("last_completed") == 41);

  for (const int rank : {0, 1, 2}) {
    INFO("rank " << rank);
    // Only the peers' status files are read at the stall: how #41 is named is the next test's.
    const std::string online = OnlineVerdict(job.result.err, pids.at(rank));
    CHECK(online.starts_with("rank_not_joined: rank 3 completed "));
    CHECK(Contains(online, "#41 and issued nothing after; it finished its loop"));
    CHECK(Contains(online, "ranks 0,1,2 wait in AllReduce #42 (float32 × 1024, sum)"));
  }
}

// A late rank's ring is often not in the job directory (it exited, or was too busy to dump yet),
// but every waiting rank's ring holds the collective it completed last: the same #N everywhere.
TEST_CASE("the late rank's last completed collective is named from its peers' rings", "[rank_not_joined]") {
  TemporaryDirectory dump_dir;
  const Job job = RunUnevenData(dump_dir, {{"NCCLGUARD_TIMEOUT", kStallTimeout}});
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 4);
  const Analysis analysis = Analyze(job.job_dir);
  INFO(analysis.result.out);
  REQUIRE(analysis.document.at("verdicts").at(0).at("kind") == "rank_not_joined");
  CHECK(Contains(analysis.document.at("verdicts")[0].at("message"), "rank 3 completed AllReduce #41"));
  for (const int rank : {0, 1, 2}) {
    INFO("rank " << rank);
    CHECK(OnlineVerdict(job.result.err, pids.at(rank))
              .starts_with("rank_not_joined: rank 3 completed AllReduce #41"));
  }
}

// A status file is usually written while a collective is in flight: the killed rank's last one
// shows #30 unfinished, though its peers completed #30 and #31 (which needs every rank).
TEST_CASE("a killed rank is named as gone, with its pid", "[rank_dead]") {
  TemporaryDirectory dump_dir;
  // Emulated steps take microseconds: slowed down (every rank alike) and with frequent status
  // files, rank 1 lives long enough to leave a status file, as a rank killed in a real job has.
  const Job job = RunTrainLoop(
      dump_dir, {"--ranks", "4", "--steps", "50", "--exit", "1:30", "--timeout", kHungJobSeconds},
      {{"NCCLEMU_FAULTS", "slow:ms=20"},
       {"NCCLGUARD_STATUS_INTERVAL", kShortStatusInterval},
       {"NCCLGUARD_TIMEOUT", kStallTimeout}});
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  REQUIRE(Contains(job.result.out, "rank 1 failed: exit code 3"));
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 4);

  const Analysis analysis = Analyze(job.job_dir, {"--status-interval", kShortStatusInterval});
  INFO(analysis.result.out);
  CHECK(analysis.result.exit_code == kAnalyzeUnhealthy);
  const Json& verdict = analysis.document.at("verdicts").at(0);
  REQUIRE(verdict.at("kind") == "rank_dead");
  CHECK(verdict.at("seq") == 32);
  CHECK(Ranks(verdict) == std::vector<int>{1});
  const std::string message = verdict.at("message");
  CHECK(Contains(message, "rank 1 (pid " + std::to_string(pids.at(1)) + " on host "));
  // Its last status, from before it died, says how far it had got: not necessarily #31.
  CHECK(Contains(message, " and never entered #32"));
  CHECK(Contains(message, "wait in AllReduce #32 (float32 × 1024, sum)"));
  REQUIRE(verdict.at("evidence").at("dead_ranks").size() == 1);
  CHECK(verdict.at("evidence").at("dead_ranks")[0].at("pid") == pids.at(1));

  for (const int rank : {0, 2, 3}) {
    INFO("rank " << rank);
    CHECK(OnlineVerdict(job.result.err, pids.at(rank))
              .starts_with("rank_dead: rank 1 (pid " + std::to_string(pids.at(1))));
  }
}

namespace {

// Ends a four-rank job 8 s after its start by killing it whole: the stall was reported after
// kStallTimeout, and every process had time to rewrite its status since.
constexpr double kJobKilledAfterSeconds = 8;

Job RunKilledAsAWhole(const TemporaryDirectory& dump_dir, std::vector<std::string> extra,
                      const Environment& settings) {
  std::vector<std::string> arguments = {"--ranks", "4", "--steps", "50"};
  arguments.insert(arguments.end(), extra.begin(), extra.end());
  Environment environment = settings;
  environment["NCCLGUARD_TIMEOUT"] = kStallTimeout;
  return RunTrainLoop(dump_dir, arguments, environment, /*guarded=*/true, kJobKilledAfterSeconds);
}

}  // namespace

// What every rank saw while it lived (rank 1 alive and busy outside NCCL) stays the verdict after
// the scheduler killed the whole job: rank 1 is not dead, and the job was killed from outside.
TEST_CASE("a job killed as a whole keeps the late rank not joined, and says it was killed from outside",
          "[rank_not_joined][job_end]") {
  TemporaryDirectory dump_dir;
  const Job job = RunKilledAsAWhole(dump_dir, {"--sleep", "1:10:600"}, {});
  INFO(job.transcript);
  REQUIRE(job.result.timed_out);
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 4);
  for (const int rank : {0, 2, 3}) {
    INFO("rank " << rank);
    REQUIRE(OnlineVerdict(job.result.err, pids.at(rank)).starts_with("rank_not_joined: rank 1 completed "));
  }

  const Analysis analysis = Analyze(job.job_dir);
  INFO(analysis.result.out);
  CHECK(analysis.result.exit_code == kAnalyzeUnhealthy);
  CHECK(FindVerdict(analysis.document, "rank_dead").is_null());
  const Json& verdict = analysis.document.at("verdicts").at(0);
  REQUIRE(verdict.at("kind") == "rank_not_joined");
  CHECK(Ranks(verdict) == std::vector<int>{1});
  // Step 10 is AllReduce #11 (the broadcast is #1).
  CHECK(verdict.at("seq") == 12);
  CHECK(Contains(verdict.at("message"), "it is alive and busy outside NCCL"));
  CHECK(verdict.at("evidence").at("late_ranks").at(0).at("where") == "busy_outside_nccl");
  const Json& end = analysis.document.at("job_end");
  REQUIRE(end.is_object());
  CHECK(end.at("processes") == 4);
  CHECK(end.at("killed_from_outside") == true);
  CHECK(end.at("within_seconds").get<double>() <= 3);  // the 2 s status interval and a second
  CHECK(Contains(end.at("message"), "all 4 processes ended within "));
  CHECK(Contains(end.at("message"), "killed from outside"));
  for (const Json& process : analysis.document.at("processes")) CHECK(process.at("liveness") == "gone");

  ProcessOptions options;
  options.timeout_seconds = 30;
  std::vector<std::string> argv = {NCCLGUARD_CLI, "analyze"};
  for (const std::string& argument : AnalyzeTarget(job.job_dir)) argv.push_back(argument);
  const ProcessResult text = RunProcess(argv, options);
  INFO(text.out);
  CHECK(text.exit_code == kAnalyzeUnhealthy);
  CHECK(Contains(text.out, "\nJob end: all 4 processes ended within "));
  CHECK(Contains(text.out, "\nRANK_NOT_JOINED  comm "));
  CHECK_FALSE(Contains(text.out, "RANK_DEAD"));
}

// The emulator's crash fault kills rank 1 alone as it starts its 12th operation; the others wait
// until the whole job is killed seconds later: rank 1 vanished while its peers lived.
TEST_CASE("a rank killed alone is dead, even when the rest of the job was killed later",
          "[rank_dead][job_end]") {
  TemporaryDirectory dump_dir;
  const Job job = RunKilledAsAWhole(dump_dir, {}, {{"NCCLEMU_FAULTS", "crash:rank=1,seq=12"}});
  INFO(job.transcript);
  REQUIRE(job.result.timed_out);
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 4);

  const Analysis analysis = Analyze(job.job_dir);
  INFO(analysis.result.out);
  CHECK(analysis.result.exit_code == kAnalyzeUnhealthy);
  CHECK(analysis.document.at("job_end").is_null());
  const Json& verdict = analysis.document.at("verdicts").at(0);
  REQUIRE(verdict.at("kind") == "rank_dead");
  CHECK(Ranks(verdict) == std::vector<int>{1});
  CHECK(verdict.at("seq") == 12);
  CHECK(Contains(verdict.at("message"), "rank 1 (pid " + std::to_string(pids.at(1)) + " on host "));
}

// A malformed NCCLEMU_FAULTS makes the emulated ncclCommInitRank of every rank return
// ncclInvalidArgument with a WARN naming the bad part, as NCCL refuses a bad setting.
TEST_CASE("every rank's failed ncclCommInitRank is one failed_call with NCCL's warning",
          "[failed_call][init]") {
  TemporaryDirectory dump_dir;
  const std::string warning = "NCCLEMU_FAULTS: unknown key 'sq' for hang in 'hang:rank=1,sq=3'";
  const Job job = RunTrainLoop(dump_dir, {"--ranks", "4", "--steps", "10", "--timeout", kHungJobSeconds},
                               {{"NCCLEMU_FAULTS", "hang:rank=1,sq=3"}});
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  REQUIRE(Contains(job.result.out, "ranks failed: 0,1,2,3"));
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 4);
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank);
    CHECK(
        LogLinesOf(job.result.err, pid, "ncclCommInitRank returned ncclInvalidArgument: " + warning).size() ==
        1);
  }

  const Analysis analysis = Analyze(job.job_dir);
  INFO(analysis.result.out);
  CHECK(analysis.result.exit_code == kAnalyzeUnhealthy);
  CHECK(FindVerdict(analysis.document, "unexplained").is_null());
  REQUIRE(analysis.document.at("verdicts").size() == 1);
  const Json& verdict = analysis.document.at("verdicts").at(0);
  REQUIRE(verdict.at("kind") == "failed_call");
  CHECK(Ranks(verdict) == std::vector<int>{0, 1, 2, 3});
  const std::string message = verdict.at("message");
  CHECK(message.starts_with("every rank's ncclCommInitRank for communicator " +
                            verdict.at("comm").get<std::string>() +
                            " (4 ranks) failed (ranks 0-3); NCCL's warning: \"" + warning + "\""));
  CHECK(verdict.at("evidence").at("api") == "ncclCommInitRank");
  CHECK(verdict.at("evidence").at("every_rank") == true);
  CHECK(verdict.at("evidence").at("inits").size() == 4);
  // The error each rank's call returned, from its dump.
  CHECK(Contains(message, "the application got ncclInvalidArgument"));
  CHECK(verdict.at("evidence").at("results") == Json::array({"ncclInvalidArgument"}));

  ProcessOptions options;
  options.timeout_seconds = 30;
  std::vector<std::string> argv = {NCCLGUARD_CLI, "analyze"};
  for (const std::string& argument : AnalyzeTarget(job.job_dir)) argv.push_back(argument);
  const ProcessResult text = RunProcess(argv, options);
  INFO(text.out);
  CHECK(text.exit_code == kAnalyzeUnhealthy);
  CHECK(Contains(text.out, "\nFAILED_CALL  comm "));
  CHECK(Contains(text.out, "every rank's ncclCommInitRank for communicator "));
  CHECK(Contains(text.out, warning));
  CHECK_FALSE(Contains(text.out, "UNEXPLAINED"));
}

TEST_CASE("a rank saving a checkpoint is waited for: warnings naming it, no abort, the job completes",
          "[rank_not_joined][action]") {
  const std::vector<std::string> arguments = {"--ranks", "4", "--steps", "40", "--timeout", "40"};
  TemporaryDirectory clean_dir;
  const Job clean = RunTrainLoop(clean_dir, arguments, {}, /*guarded=*/false);
  INFO(clean.transcript);
  REQUIRE(clean.result.exit_code == 0);
  const std::map<int, std::string> clean_checksums = Checksums(clean.result.out);
  REQUIRE(clean_checksums.size() == 4);

  TemporaryDirectory dump_dir;
  std::vector<std::string> saving = arguments;
  saving.insert(saving.end(), {"--sleep", "0:30:8"});
  const auto start = std::chrono::steady_clock::now();
  const Job job = RunTrainLoop(dump_dir, saving,
                               {{"NCCLGUARD_TIMEOUT", kStallTimeout},
                                {"NCCLGUARD_HARD_TIMEOUT", "60"},
                                {"NCCLGUARD_ACTION", "abort"}});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  CHECK(job.result.exit_code == 0);
  CHECK(seconds >= 8);  // the save really held the others up
  CHECK(Checksums(job.result.out) == clean_checksums);
  CHECK_FALSE(Contains(job.result.err, "aborting comm"));

  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 4);
  CHECK(LogLinesOf(job.result.err, pids.at(0), "verdict").empty());
  for (const int rank : {1, 2, 3}) {
    INFO("rank " << rank);
    // The first report and any periodic "still waiting" ones: every one names rank 0 as busy.
    const std::vector<std::string> lines = LogLinesOf(job.result.err, pids.at(rank), "verdict: ");
    REQUIRE_FALSE(lines.empty());
    for (const std::string& line : lines) {
      INFO(line);
      CHECK(Contains(line, "AllReduce #32 (float32 × 1024, sum)"));
      // The first report may know #31 by number only (see the test of the late rank's last operation).
      CHECK(Contains(line, "verdict: rank_not_joined: rank 0 completed "));
      CHECK(Contains(line, "#31 and issued nothing after; it is alive and busy outside NCCL"));
    }
    CHECK(LogLinesOf(job.result.err, pids.at(rank), "not acting yet (NCCLGUARD_ACTION=abort)").size() >= 1);
  }
}

namespace {

// On the emulator the ranks do not stop at the desynced #26: rank 2's larger AllReduce consumes
// the rounds of its peers' next ones, so ranks 0,1,3 finish their loops and exit while rank 2
// hangs in its last AllReduce. The mismatch is then only in the rings, hence the exit dumps.
Job RunDesync(const TemporaryDirectory& dump_dir) {
  return RunTrainLoop(dump_dir,
                      {"--ranks", "4", "--steps", "40", "--desync", "2:25", "--timeout", kHungJobSeconds},
                      {{"NCCLGUARD_TIMEOUT", kStallTimeout}, {"NCCLGUARD_DUMP_ON_EXIT", "1"}});
}

}  // namespace

TEST_CASE("a desync is a mismatch showing both counts", "[mismatch]") {
  TemporaryDirectory dump_dir;
  const Job job = RunDesync(dump_dir);
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  CHECK(job.result.exit_code != 0);

  const Analysis analysis = Analyze(job.job_dir);
  INFO(analysis.result.out);
  CHECK(analysis.result.exit_code == kAnalyzeUnhealthy);
  const Json& verdict = analysis.document.at("verdicts").at(0);
  REQUIRE(verdict.at("kind") == "mismatch");
  CHECK(verdict.at("seq") == 26);
  CHECK(Ranks(verdict) == std::vector<int>{2});
  CHECK(Contains(verdict.at("message"),
                 "rank 2 issued AllReduce #26 with 1049600 float32 elements while ranks 0,1,3 issued 1024"));
  const Json& sides = verdict.at("evidence").at("sides");
  REQUIRE(sides.size() == 2);
  CHECK(sides[0].at("ranks") == Json({0, 1, 3}));
  CHECK(sides[0].at("call").at("count") == 1024);
  CHECK(sides[1].at("ranks") == Json({2}));
  CHECK(sides[1].at("call").at("count") == 1024 + 1048576);
}

// The peers exit without dumping: only their last status files show what they issued, through the
// signatures of their latest 64 operations (#18..#81 here). Rank 2 stalls in its last AllReduce.
TEST_CASE("a desync is found from status files alone: the stalled rank is never healthy", "[mismatch]") {
  TemporaryDirectory dump_dir;
  const Job job = RunTrainLoop(
      dump_dir, {"--ranks", "4", "--steps", "80", "--desync", "2:25", "--timeout", kHungJobSeconds},
      {{"NCCLGUARD_TIMEOUT", kStallTimeout}});
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 4);

  // At the stall nothing but status files exists: which rank's signature of #26 differs.
  const std::string online = OnlineVerdict(job.result.err, pids.at(2));
  CHECK(online.starts_with("mismatch: rank 2 issued #26 with signature "));
  CHECK(Contains(online, " while ranks 0,1,3 issued #26 with signature "));
  // Where rank 2 is left waiting depends on how the transport splits its longer AllReduce: one of
  // the last operations, which the others completed before they exited.
  CHECK(
      std::regex_search(online, std::regex("since then rank 2 waits in AllReduce #(80|81) \\(float32 × 1024, "
                                           "sum\\): ranks 0,1,3 completed it and exited")));

  // Afterwards rank 2's stall dump describes its side.
  const Analysis analysis = Analyze(job.job_dir);
  INFO(analysis.result.out);
  CHECK(analysis.result.exit_code == kAnalyzeUnhealthy);
  CHECK(analysis.document.at("healthy") == false);
  const Json& verdict = analysis.document.at("verdicts").at(0);
  REQUIRE(verdict.at("kind") == "mismatch");
  CHECK(verdict.at("seq") == 26);
  CHECK(Ranks(verdict) == std::vector<int>{2});
  CHECK(Contains(
      verdict.at("message"),
      "rank 2 issued AllReduce #26 (float32 × 1049600, sum) while ranks 0,1,3 issued #26 with signature "));
  const Json& sides = verdict.at("evidence").at("sides");
  REQUIRE(sides.size() == 2);
  CHECK(sides[0].at("ranks") == Json({0, 1, 3}));
  CHECK(sides[0].at("call").is_null());
  CHECK(sides[1].at("call").at("count") == 1024 + 1048576);
  CHECK(sides[0].at("signature") != sides[1].at("signature"));
  CHECK(verdict.at("evidence").at("stalled_ranks") == Json({2}));
}

// Ranks 0,1,3 destroyed their communicator (which waits for all its work) and exited within
// milliseconds, before their watchdog had looked at a single operation's events.
TEST_CASE("operations of a communicator destroyed after its work completed are never stuck", "[mismatch]") {
  TemporaryDirectory dump_dir;
  const Job job = RunDesync(dump_dir);
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  REQUIRE(Checksums(job.result.out).size() == 3);  // the broadcast completed on every rank
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 4);

  const Analysis analysis = Analyze(job.job_dir);
  INFO(analysis.result.out);
  for (const Json& verdict : analysis.document.at("verdicts")) {
    INFO(verdict.dump());
    CHECK(verdict.at("seq") != 1);
  }
  for (const Json& process : analysis.document.at("processes")) {
    if (process.at("rank") == 2) continue;
    INFO(process.dump());
    CHECK(process.at("exited") == true);
  }
  CHECK_FALSE(Contains(OnlineVerdict(job.result.err, pids.at(2)), "Broadcast #1"));
}

// The emulator moves a broadcast in rounds with a barrier of all ranks each, so one rank hung in
// it holds every rank in the first round: no rank completes the broadcast, root 0 included. The
// rules then say stuck_inside_nccl (every rank entered #1, none completed it), and the message
// names the broadcast with its size and root.
TEST_CASE("a broadcast that never completes names Broadcast, its count, datatype and root",
          "[stuck_inside_nccl]") {
  TemporaryDirectory dump_dir;
  const Job job = RunTrainLoop(
      dump_dir, {"--ranks", "3", "--steps", "5", "--model-count", "4000000", "--timeout", kHungJobSeconds},
      {{"NCCLEMU_FAULTS", "hang:rank=2,seq=1"}, {"NCCLGUARD_TIMEOUT", kStallTimeout}});
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  REQUIRE(Contains(job.result.out, "ranks not finished: 0,1,2"));
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 3);

  const Analysis analysis = Analyze(job.job_dir);
  INFO(analysis.result.out);
  CHECK(analysis.result.exit_code == kAnalyzeUnhealthy);
  const Json& verdict = analysis.document.at("verdicts").at(0);
  REQUIRE(verdict.at("kind") == "stuck_inside_nccl");
  CHECK(verdict.at("seq") == 1);
  CHECK(Ranks(verdict) == std::vector<int>{0, 1, 2});
  CHECK(Contains(verdict.at("message"),
                 "all 3 ranks entered Broadcast #1 (float32 × 4000000, root 0) and none has completed it"));
  const Json& op = verdict.at("evidence").at("op");
  CHECK(op.at("op") == "Broadcast");
  CHECK(op.at("count") == 4000000);
  CHECK(op.at("dtype") == "float32");
  CHECK(op.at("root") == 0);
  CHECK(verdict.at("evidence").at("completed_ranks") == Json::array());

  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank);
    CHECK(OnlineVerdict(job.result.err, pid).starts_with("stuck_inside_nccl: "));
  }
}

namespace {

Job RunHangInsideNccl(const TemporaryDirectory& dump_dir) {
  return RunTrainLoop(dump_dir, {"--ranks", "4", "--steps", "20", "--timeout", kHungJobSeconds},
                      {{"NCCLEMU_FAULTS", "hang:rank=1,seq=10"}, {"NCCLGUARD_TIMEOUT", kStallTimeout}});
}

}  // namespace

TEST_CASE("a hang inside NCCL with every rank joined is stuck_inside_nccl", "[stuck_inside_nccl]") {
  TemporaryDirectory dump_dir;
  const Job job = RunHangInsideNccl(dump_dir);
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  REQUIRE(Contains(job.result.out, "ranks not finished: 0,1,2,3"));
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 4);

  const Analysis analysis = Analyze(job.job_dir);
  INFO(analysis.result.out);
  CHECK(analysis.result.exit_code == kAnalyzeUnhealthy);
  // An H100 with a sound driver: nothing points at P2P.
  REQUIRE(analysis.document.at("verdicts").size() == 1);
  const Json& verdict = analysis.document.at("verdicts")[0];
  REQUIRE(verdict.at("kind") == "stuck_inside_nccl");
  CHECK(verdict.at("seq") == 10);
  CHECK(Ranks(verdict) == std::vector<int>{0, 1, 2, 3});
  CHECK(Contains(verdict.at("message"),
                 "all 4 ranks entered AllReduce #10 (float32 × 1024, sum) and none has completed it"));
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank);
    CHECK(OnlineVerdict(job.result.err, pid).starts_with("stuck_inside_nccl: "));
  }
}

// The trace of a stopped link: every rank has a track for channel 0 of its communicator, where the
// stuck operation runs to the end; on the two ranks of the link it carries the verdict, and the
// sender's track shows its step waiting for the network, nested in it.
void CheckStoppedLinkTrace(const Json& trace, int ranks, int from, int to, std::uint64_t nccl_seq) {
  std::map<std::pair<int, int>, std::string> track_names;  // (trace pid, tid) -> name
  for (const Json& event : trace.at("traceEvents")) {
    if (event.at("ph") == "M" && event.at("name") == "thread_name")
      track_names[{event.at("pid").get<int>(), event.at("tid").get<int>()}] = event.at("args").at("name");
  }
  std::set<int> stuck_on_channel;  // ranks
  std::set<int> marked_with_link;
  bool sender_step_waits = false;
  for (const Json& event : trace.at("traceEvents")) {
    if (event.at("ph") != "X") continue;
    const auto track = track_names.find({event.at("pid").get<int>(), event.at("tid").get<int>()});
    if (track == track_names.end() || !track->second.ends_with(" channel 0")) continue;
    INFO(event.dump());
    const int rank = event.at("pid").get<int>() - 1;
    const std::string name = event.at("name");
    if (name == "AllReduce (NCCL's #" + std::to_string(nccl_seq) + ") (stuck)") {
      stuck_on_channel.insert(rank);
      CHECK(event.at("args").at("channel") == 0);
      if (event.at("args").contains("verdict")) {
        CHECK(event.at("args").at("verdict") ==
              "link_stalled: rank " + std::to_string(from) + " to rank " + std::to_string(to));
        marked_with_link.insert(rank);
      }
    }
    if (rank == from && name == "send to rank " + std::to_string(to) + ": step 0 send_net_wait") {
      sender_step_waits = true;
      CHECK(event.at("dur").get<double>() > 0);
    }
  }
  CHECK(stuck_on_channel.size() == static_cast<size_t>(ranks));
  CHECK(marked_with_link == std::set<int>{from, to});
  CHECK(sender_step_waits);
}

// One link of the ring stops (NCCLEMU_FAULTS hang with peer=) over the network (P2P and shared
// memory off): NCCL's profiler, which ncclguard serves, shows the sender's step posted and never
// received. Every rank's stall line names the two ranks and the channel, and so does analyze.
void CheckStoppedLink(int ranks, int from, int to, const Environment& extra = {}) {
  TemporaryDirectory dump_dir;
  const std::string fault = "hang:rank=" + std::to_string(from) + ",peer=" + std::to_string(to) + ",seq=10";
  Environment settings = {{"NCCLEMU_FAULTS", fault},
                          {"NCCL_P2P_DISABLE", "1"},
                          {"NCCL_SHM_DISABLE", "1"},
                          {"NCCLGUARD_TIMEOUT", kStallTimeout},
                          {"NCCLGUARD_STATUS_INTERVAL", kShortStatusInterval}};
  for (const auto& [name, value] : extra) settings[name] = value;
  const Job job = RunTrainLoop(
      dump_dir,
      {"--ranks", std::to_string(ranks), "--steps", "20", "--count", "262144", "--timeout", kHungJobSeconds},
      settings);
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == static_cast<size_t>(ranks));
  const std::string link = "stopped on the link from rank " + std::to_string(from) + " (host ";
  const std::string sent = "to rank " + std::to_string(to) + " (host ";
  const std::string step = "on channel 0: rank " + std::to_string(from) + " sent step 0 of ";
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank);
    const std::string online = OnlineVerdict(job.result.err, pid);
    CHECK(online.starts_with("link_stalled: AllReduce #10 (float32 × 262144, sum) " + link));
    CHECK(Contains(online, sent));
    CHECK(Contains(online, step));
  }
  TemporaryDirectory trace_dir;
  const std::string trace_path = trace_dir.path() + "/trace.json";
  const Analysis analysis = Analyze(job.job_dir, {"--trace", trace_path});
  INFO(analysis.result.out);
  CHECK(analysis.result.exit_code == kAnalyzeUnhealthy);
  const Json& verdict = analysis.document.at("verdicts").at(0);
  REQUIRE(verdict.at("kind") == "link_stalled");
  CHECK(verdict.at("seq") == 10);
  CHECK(Ranks(verdict) == std::vector<int>{from, to});
  const Json& links = verdict.at("evidence").at("links");
  REQUIRE(links.size() == 1);
  CHECK(links[0].at("from_rank") == from);
  CHECK(links[0].at("to_rank") == to);
  CHECK(links[0].at("channel") == 0);
  CHECK(links[0].at("sender_waits") == "send_net_wait");
  CHECK(links[0].at("receiver_waits") == "recv_net_wait");
  // The dump knows the GPUs at both ends.
  CHECK(Contains(links[0].at("from").get<std::string>(), ", GPU " + std::to_string(from) + " ("));
  CHECK(verdict.at("evidence").at("nccl_op").at("algo") == "RING");
  CheckStoppedLinkTrace(Json::parse(ReadFile(trace_path)), ranks, from, to,
                        verdict.at("evidence").at("nccl_op").at("nccl_seq").get<std::uint64_t>());
}

// Files the reader refuses are said at each stall, but a job directory full of junk must not flood
// every rank's log: five lines and a count.
// Status files planted in the job directory: on a Redis board they are no statuses at all.
TEST_CASE("files a verdict leaves out are logged, a few lines at most",
          "[stuck_inside_nccl][hostile][one-board]") {
  TemporaryDirectory dump_dir;
  const std::filesystem::path job_dir = std::filesystem::path(dump_dir.path()) / kJobId;
  std::filesystem::create_directory(job_dir);
  std::filesystem::permissions(job_dir, std::filesystem::perms::owner_all);
  constexpr int kJunkFiles = 8;
  for (int i = 0; i < kJunkFiles; ++i) {
    std::ofstream(job_dir / ("status-junk-" + std::to_string(i) + ".json")) << "not a status file";
  }
  const Job job = RunHangInsideNccl(dump_dir);
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 4);
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank);
    CHECK(OnlineVerdict(job.result.err, pid).starts_with("stuck_inside_nccl: "));
    // Five named and a count of the other three, at every verdict the rank worked out.
    const std::size_t verdicts =
        LogLinesOf(job.result.err, pid, "the verdict leaves out 3 more files of ").size();
    CHECK(verdicts >= 1);
    CHECK(LogLinesOf(job.result.err, pid, "the verdict leaves out status-junk-").size() == 5 * verdicts);
  }
}

TEST_CASE("an initialisation that never completes is stuck_in_init", "[stuck_in_init]") {
  TemporaryDirectory dump_dir;
  const Job job = RunTrainLoop(dump_dir, {"--ranks", "4", "--steps", "10", "--timeout", kHungJobSeconds},
                               {{"NCCLEMU_FAULTS", "init_hang:rank=1"}, {"NCCLGUARD_INIT_TIMEOUT", "2"}});
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  REQUIRE(Contains(job.result.out, "ranks not finished: 0,1,2,3"));
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 4);

  const Analysis analysis = Analyze(job.job_dir);
  INFO(analysis.result.out);
  CHECK(analysis.result.exit_code == kAnalyzeUnhealthy);
  const Json& verdict = analysis.document.at("verdicts").at(0);
  REQUIRE(verdict.at("kind") == "stuck_in_init");
  CHECK(verdict.at("seq") == 0);
  CHECK(Contains(verdict.at("message"), "ncclCommInitRank, 4 ranks"));
  const Json& evidence = verdict.at("evidence");
  CHECK(evidence.at("api") == "ncclCommInitRank");
  CHECK(evidence.at("nranks") == 4);
  CHECK(evidence.at("waited_seconds").get<double>() >= 2);
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank);
    CHECK(OnlineVerdict(job.result.err, pid).starts_with("stuck_in_init: "));
  }
}

TEST_CASE("a P2P stall on GeForce GPUs with driver 545.23.08 is p2p_suspect, and healthy with P2P disabled",
          "[p2p_suspect]") {
  const std::vector<std::string> arguments = {"--ranks", "4", "--steps", "20", "--timeout", kHungJobSeconds};
  const Environment faulty = {{"NCCLEMU_FAULTS", "p2p_stall:after=5"},
                              {"NCCLEMU_GPU_NAME", "NVIDIA GeForce RTX 4090"},
                              {"NCCLEMU_DRIVER_VERSION", "545.23.08"},
                              {"NCCLGUARD_TIMEOUT", kStallTimeout}};
  SECTION("P2P in use") {
    TemporaryDirectory dump_dir;
    const Job job = RunTrainLoop(dump_dir, arguments, faulty);
    INFO(job.transcript);
    REQUIRE_FALSE(job.result.timed_out);
    REQUIRE(Contains(job.result.out, "ranks not finished: 0,1,2,3"));

    const Analysis analysis = Analyze(job.job_dir);
    INFO(analysis.result.out);
    CHECK(analysis.result.exit_code == kAnalyzeUnhealthy);
    const Json& verdict = analysis.document.at("verdicts").at(0);
    REQUIRE(verdict.at("kind") == "p2p_suspect");
    CHECK(verdict.at("seq") == 6);
    const std::string message = verdict.at("message");
    CHECK(Contains(message, "NVIDIA GeForce RTX 4090"));
    CHECK(Contains(message, "545.23.08"));
    CHECK(Contains(message, "NCCL_P2P_DISABLE=1"));
    CHECK(verdict.at("evidence").at("consumer_gpus") == Json({"NVIDIA GeForce RTX 4090"}));
    CHECK(verdict.at("evidence").at("drivers") == Json({"545.23.08"}));
    // The stall itself is still there, below the cause.
    CHECK_FALSE(FindVerdict(analysis.document, "stuck_inside_nccl").is_null());
  }
  SECTION("P2P disabled") {
    TemporaryDirectory dump_dir;
    Environment settings = faulty;
    settings["NCCL_P2P_DISABLE"] = "1";
    settings["NCCLGUARD_DUMP_ON_EXIT"] = "1";
    const Job job = RunTrainLoop(dump_dir, arguments, settings);
    INFO(job.transcript);
    REQUIRE_FALSE(job.result.timed_out);
    REQUIRE(job.result.exit_code == 0);

    const Analysis analysis = Analyze(job.job_dir);
    INFO(analysis.result.out);
    CHECK(analysis.result.exit_code == 0);
    CHECK(analysis.document.at("healthy") == true);
    CHECK(analysis.document.at("verdicts").size() == 1);
  }
}

namespace {

Job RunAsyncError(const TemporaryDirectory& dump_dir) {
  return RunTrainLoop(dump_dir, {"--ranks", "4", "--steps", "20", "--timeout", "5"},
                      {{"NCCLEMU_FAULTS", "async_error:rank=1,seq=5,code=6"}});
}

}  // namespace

TEST_CASE("an asynchronous error is async_error with NCCL's warning text", "[async_error]") {
  TemporaryDirectory dump_dir;
  const Job job = RunAsyncError(dump_dir);
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);

  const Analysis analysis = Analyze(job.job_dir);
  INFO(analysis.result.out);
  CHECK(analysis.result.exit_code == kAnalyzeUnhealthy);
  const Json& verdict = analysis.document.at("verdicts").at(0);
  REQUIRE(verdict.at("kind") == "async_error");
  CHECK(Ranks(verdict) == std::vector<int>{1});
  const std::string message = verdict.at("message");
  CHECK(Contains(message, "rank 1 reported an asynchronous NCCL error"));
  // The emulator's WARN from its P2P transport (the device it names varies by rank).
  CHECK(Contains(message, "failed to peer with device"));
  CHECK(Contains(message, "217 peer access is not supported between these two devices"));
  const Json& reporting = verdict.at("evidence").at("ranks");
  REQUIRE(reporting.size() == 1);
  CHECK(reporting[0].at("rank") == 1);
}

TEST_CASE("the asynchronous error is named as NCCL names it", "[async_error]") {
  TemporaryDirectory dump_dir;
  const Job job = RunAsyncError(dump_dir);
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  const Analysis analysis = Analyze(job.job_dir);
  INFO(analysis.result.out);
  const Json& verdict = analysis.document.at("verdicts").at(0);
  REQUIRE(verdict.at("kind") == "async_error");
  CHECK(Contains(verdict.at("message"),
                 "error on communicator " + verdict.at("comm").get<std::string>() + ": ncclRemoteError"));
}

TEST_CASE("a rank that is slow before every collective is a straggler", "[straggler]") {
  TemporaryDirectory dump_dir;
  const Job job =
      RunTrainLoop(dump_dir, {"--ranks", "4", "--steps", "25", "--slow", "2:100", "--timeout", "40"},
                   {{"NCCLGUARD_DUMP_ON_EXIT", "1"}});
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  REQUIRE(job.result.exit_code == 0);

  const Analysis analysis = Analyze(job.job_dir);
  INFO(analysis.result.out);
  CHECK(analysis.result.exit_code == kAnalyzeUnhealthy);
  const Json& verdict = analysis.document.at("verdicts").at(0);
  REQUIRE(verdict.at("kind") == "straggler");
  CHECK(Ranks(verdict) == std::vector<int>{2});
  CHECK(Contains(verdict.at("message"), "rank 2 enters collectives a median "));
  const Json& evidence = verdict.at("evidence");
  // 100 ms late before each AllReduce; the others are not late at all.
  CHECK(evidence.at("median_lateness_ms").get<double>() >= 50);
  CHECK(evidence.at("common_ops").get<int>() >= 10);
  CHECK(evidence.at("latest_in").get<int>() >= evidence.at("common_ops").get<int>() * 8 / 10);
}

TEST_CASE("a clean run is healthy", "[healthy]") {
  TemporaryDirectory dump_dir;
  const Job job = RunTrainLoop(dump_dir, {"--ranks", "4", "--steps", "20", "--timeout", "40"},
                               {{"NCCLGUARD_DUMP_ON_EXIT", "1"}});
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  REQUIRE(job.result.exit_code == 0);

  const Analysis analysis = Analyze(job.job_dir);
  INFO(analysis.result.out);
  CHECK(analysis.result.exit_code == 0);
  CHECK(analysis.document.at("healthy") == true);
  REQUIRE(analysis.document.at("verdicts").size() == 1);
  CHECK(analysis.document.at("verdicts")[0].at("kind") == "healthy");
  CHECK(analysis.document.at("processes").size() == 4);
  CHECK(analysis.document.at("problems") == Json::array());
}

TEST_CASE("the trace of a hung job is Chrome trace JSON with a track per rank and the stuck operation",
          "[trace]") {
  TemporaryDirectory dump_dir;
  const Job job = RunHangInsideNccl(dump_dir);
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 4);

  TemporaryDirectory trace_dir;
  const std::string trace_path = trace_dir.path() + "/trace.json";
  const Analysis analysis = Analyze(job.job_dir, {"--trace", trace_path});
  CHECK(analysis.result.exit_code == kAnalyzeUnhealthy);
  REQUIRE(std::filesystem::exists(trace_path));
  const Json trace = Json::parse(ReadFile(trace_path));
  REQUIRE(trace.at("traceEvents").is_array());

  std::map<int, std::string> track_names;  // trace pid -> name
  std::set<int> tracks_with_stuck_op;
  for (const Json& event : trace.at("traceEvents")) {
    INFO(event.dump());
    REQUIRE(event.contains("ph"));
    REQUIRE(event.contains("pid"));
    if (event.at("ph") == "M" && event.at("name") == "process_name") {
      CHECK(track_names.emplace(event.at("pid").get<int>(), event.at("args").at("name").get<std::string>())
                .second);
    }
    if (event.at("ph") == "X") {
      CHECK(event.at("ts").is_number());
      CHECK(event.at("dur").get<double>() >= 0);
      if (event.at("name") == "AllReduce #10 (stuck)")
        tracks_with_stuck_op.insert(event.at("pid").get<int>());
    }
  }
  REQUIRE(track_names.size() == 4);
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank);
    REQUIRE(track_names.contains(rank + 1));
    CHECK(track_names.at(rank + 1).starts_with("rank " + std::to_string(rank) + " ("));
    CHECK(Contains(track_names.at(rank + 1), ":" + std::to_string(pid) + ")"));
    CHECK(tracks_with_stuck_op.contains(rank + 1));
  }
}

namespace {

// A job whose board fails early and comes back: train_loop steps every 50 ms and rank 1 hangs in
// AllReduce #60, about 3 s in. Once every rank has published a status, `interrupt` breaks the
// board; one second later `restore` mends it. Nothing may crash or hang, and the stall that comes
// after the board's return is reported with its verdict by every rank.
Job RunThroughBoardFailure(const TemporaryDirectory& dump_dir, const Environment& settings,
                           const std::function<bool()>& statuses_published,
                           const std::function<void()>& interrupt, const std::function<bool()>& restore) {
  Environment hang = settings;
  hang["NCCLEMU_FAULTS"] = "hang:rank=1,seq=60";
  hang["NCCLGUARD_TIMEOUT"] = kStallTimeout;
  hang["NCCLGUARD_STATUS_INTERVAL"] = kShortStatusInterval;
  Job job;
  std::thread running([&] {
    job =
        RunTrainLoop(dump_dir, {"--ranks", "4", "--steps", "100", "--slow", "0:50", "--timeout", "14"}, hang);
  });
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!statuses_published() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Nothing here may throw while the job's thread runs: the test checks after joining it.
  interrupt();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const bool restored = restore();
  running.join();
  REQUIRE(restored);
  return job;
}

void CheckStallReportedWithVerdict(const Job& job) {
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  REQUIRE(Contains(job.result.out, "ranks not finished: 0,1,2,3"));  // hung, ended by train_loop's --timeout
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 4);
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank);
    CHECK(OnlineVerdict(job.result.err, pid)
              .starts_with("stuck_inside_nccl: all 4 ranks entered AllReduce #60"));
    CHECK(LogLinesOf(job.result.err, pid, " ERROR ").empty());
  }
}

}  // namespace

TEST_CASE("Redis killed and restarted in the middle of a job: no crash, no hang, verdicts once it is back",
          "[board][one-board]") {
  TemporaryDirectory dump_dir;
  ncclguard::testing::RedisServer redis;
  REQUIRE(redis.started());
  const std::string status_key = "ncclguard:{" + std::to_string(getuid()) + ":" + kJobId + "}:status";
  const Job job = RunThroughBoardFailure(
      dump_dir, {{"NCCLGUARD_STORE", redis.Url()}}, [&] { return redis.HashLength(status_key) == 4; },
      [&] { redis.Kill(); }, [&] { return redis.Start(); });
  CheckStallReportedWithVerdict(job);
  // Each process said once that the board failed, and once that it answers again.
  for (const auto& [rank, pid] : RankPids(job.result.out)) {
    INFO("rank " << rank);
    CHECK(LogLinesOf(job.result.err, pid, "the Redis job board " + redis.Url() + " cannot be used").size() ==
          1);
  }
  CHECK(redis.HashLength(status_key) == 4);
}

TEST_CASE("the job directory removed in the middle of a job: no crash, no hang, verdicts once it is back",
          "[board][one-board]") {
  TemporaryDirectory dump_dir;
  const std::string job_dir = dump_dir.path() + "/" + kJobId;
  auto statuses = [&] {
    std::error_code error;
    int count = 0;
    for (const auto& entry : std::filesystem::directory_iterator(job_dir, error)) {
      count += entry.path().filename().string().starts_with("status-") ? 1 : 0;
    }
    return count == 4;
  };
  // Removed while the processes write into it: removed again until it is gone. They make it again
  // at their next status (the test makes nothing).
  auto remove = [&] {
    std::error_code error;
    for (int attempt = 0; attempt < 100 && std::filesystem::exists(job_dir, error); ++attempt) {
      std::filesystem::remove_all(job_dir, error);
    }
  };
  const Job job = RunThroughBoardFailure(dump_dir, {}, statuses, remove, [] { return true; });
  CheckStallReportedWithVerdict(job);
  CHECK(statuses());  // written again into the directory the processes made anew
}

TEST_CASE("a link that stops among 4 ranks is named, online and in analyze: link_stalled", "[link_stalled]") {
  CheckStoppedLink(4, 1, 2);
}

TEST_CASE("a link that stops among 8 ranks is named, online and in analyze: link_stalled", "[link_stalled]") {
  CheckStoppedLink(8, 5, 6);
}

// NCCL 2.26 and 2.27 speak the profiler's version 4 (the emulator looks the plugin up as they do):
// ncclguard serves that version too, and the verdict is the same.
TEST_CASE("a link that stops is named under NCCL's profiler version 4 too: link_stalled", "[link_stalled]") {
  CheckStoppedLink(4, 2, 3, {{"NCCLEMU_PROFILER_VERSION", "4"}});
}

// Forked ranks that end with _exit, as Python's multiprocessing workers do (os._exit), run no exit
// hook: what says they finished is the status each wrote when its application closed its last
// communicator. Before it was written, analyze took the job for one killed from outside.
TEST_CASE("ranks that close their communicators and end with _exit finished: the job is healthy",
          "[healthy][job_end]") {
  const bool nonblocking = GENERATE(false, true);
  INFO((nonblocking ? "non-blocking" : "blocking") << " communicators");
  TemporaryDirectory dump_dir;
  std::vector<std::string> command = {DDP_HABITS, "--ranks", "4", "--steps", "5"};
  if (nonblocking) command.emplace_back("--nonblocking");
  const Job job = RunProgram(dump_dir, command, {}, /*guarded=*/true, /*kill_after_seconds=*/50);
  INFO(job.transcript);
  REQUIRE(job.result.exit_code == 0);
  const Analysis analysis = Analyze(job.job_dir);
  CHECK(analysis.result.exit_code == 0);
  CHECK(analysis.document.at("healthy") == true);
  CHECK(analysis.document.at("job_end").is_null());
  const Json& processes = analysis.document.at("processes");
  REQUIRE(processes.size() == 4);
  for (const Json& process : processes) {
    INFO(process.dump());
    CHECK(process.at("exited") == false);  // no exit hook ran
    CHECK(process.at("closed_nccl") == true);
  }
}

// The same under PyTorch's habits (ddp_habits): the data-parallel communicator split from the
// default one, collectives on a dedicated NCCL stream, broadcasts and bucketed all-reduces queued
// back to back, the framework's own watchdog polling events and ncclCommGetAsyncError, which ends
// the job. The link stops in the 4th bucket's AllReduce of the first step (#10 of the split
// communicator); every rank names it online, and analyze does, blocking and non-blocking alike.
TEST_CASE("a link that stops under PyTorch's habits is named online and in analyze: link_stalled",
          "[link_stalled]") {
  const bool nonblocking = GENERATE(false, true);
  INFO((nonblocking ? "non-blocking" : "blocking") << " communicators");
  TemporaryDirectory dump_dir;
  std::vector<std::string> command = {DDP_HABITS, "--ranks", "4", "--framework-timeout", "6"};
  if (nonblocking) command.emplace_back("--nonblocking");
  const Job job = RunProgram(dump_dir, command,
                             {{"NCCLEMU_FAULTS", "hang:rank=1,peer=2,seq=10"},
                              {"NCCL_P2P_DISABLE", "1"},
                              {"NCCL_SHM_DISABLE", "1"},
                              {"NCCLGUARD_TIMEOUT", kStallTimeout},
                              {"NCCLGUARD_STATUS_INTERVAL", kShortStatusInterval}},
                             /*guarded=*/true, /*kill_after_seconds=*/50);
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  CHECK(Contains(job.result.out, "framework watchdog: "));  // the framework ended the hung job
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 4);
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank);
    const std::string online = OnlineVerdict(job.result.err, pid);
    CHECK(online.starts_with("link_stalled: AllReduce #10 "));
    CHECK(Contains(online, "stopped on the link from rank 1 (host "));
    CHECK(Contains(online, "to rank 2 (host "));
  }
  const Analysis analysis = Analyze(job.job_dir);
  const Json& verdict = analysis.document.at("verdicts").at(0);
  REQUIRE(verdict.at("kind") == "link_stalled");
  CHECK(verdict.at("seq") == 10);
  CHECK(Ranks(verdict) == std::vector<int>{1, 2});
  const Json& links = verdict.at("evidence").at("links");
  REQUIRE(links.size() == 1);
  CHECK(links[0].at("from_rank") == 1);
  CHECK(links[0].at("to_rank") == 2);
}

// Over P2P the transfers run inside the kernel: NCCL reports no proxy step, only the kernel
// channels, and the verdict says which never stopped and that the link cannot be known.
TEST_CASE("a link that stops over P2P is stuck_inside_nccl, with the channel that never stopped",
          "[stuck_inside_nccl][link_stalled]") {
  TemporaryDirectory dump_dir;
  const Job job = RunTrainLoop(dump_dir, {"--ranks", "4", "--steps", "20", "--timeout", kHungJobSeconds},
                               {{"NCCLEMU_FAULTS", "hang:rank=1,peer=2,seq=10"},
                                {"NCCLGUARD_TIMEOUT", kStallTimeout},
                                {"NCCLGUARD_STATUS_INTERVAL", kShortStatusInterval}});
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  const Analysis analysis = Analyze(job.job_dir);
  INFO(analysis.result.out);
  const Json& verdict = analysis.document.at("verdicts").at(0);
  REQUIRE(verdict.at("kind") == "stuck_inside_nccl");
  CHECK(Contains(verdict.at("message"), "NCCL's profiler: channel 0 never stopped on ranks 0-3"));
  CHECK(Contains(verdict.at("message"), "so which link is not known"));
}
