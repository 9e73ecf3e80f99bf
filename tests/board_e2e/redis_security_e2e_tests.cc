// A Redis board that only its job can use, end to end: train_loop jobs on the emulator under
// ncclguard against a real redis-server with a password (requirepass) or ACL users. A job whose
// board works gives every rank the cross-rank verdict of its stall (it needs every rank's status
// from the board); a board refused is said once at WARN and never stops the job; the password
// appears in no log line, status, facts record or dump.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/support/process.h"
#include "tests/support/redis_server.h"
#include "tests/support/train_loop_output.h"

using ncclguard::testing::BoardAclUser;
using ncclguard::testing::EmulatorJobEnvironment;
using ncclguard::testing::LogLinesOf;
using ncclguard::testing::ProcessOptions;
using ncclguard::testing::ProcessResult;
using ncclguard::testing::RankPids;
using ncclguard::testing::ReadFile;
using ncclguard::testing::RedisServer;
using ncclguard::testing::RedisServerOptions;
using ncclguard::testing::RunProcess;
using ncclguard::testing::TemporaryDirectory;
using Environment = std::map<std::string, std::optional<std::string>>;

namespace {

constexpr char kJobId[] = "secured";
constexpr char kPassword[] = "Tr0ub4dor-and-3";

struct Job {
  ProcessResult result;
  std::string job_dir;
  std::string transcript;
};

Job RunTrainLoop(const TemporaryDirectory& dump_dir, std::vector<std::string> arguments,
                 const Environment& settings) {
  arguments.insert(arguments.begin(), TRAIN_LOOP);
  ProcessOptions options;
  options.timeout_seconds = 60;
  options.environment = EmulatorJobEnvironment(EMULATOR_LIBRARY_DIR, dump_dir.path(), kJobId);
  options.environment["LD_PRELOAD"] = PRELOAD_LIBRARY;
  for (const auto& [name, value] : settings) options.environment[name] = value;
  Job job;
  job.result = RunProcess(arguments, options);
  job.job_dir = dump_dir.path() + "/" + kJobId;
  job.transcript = "exit code " + std::to_string(job.result.exit_code) +
                   (job.result.timed_out ? ", timed out" : "") + "\nstdout:\n" + job.result.out +
                   "\nstderr:\n" + job.result.err;
  return job;
}

// Rank 1 hangs in AllReduce #10; every rank reports the stall after 2 s, and train_loop's own
// --timeout ends the job after 7 s.
Job RunHungJob(const TemporaryDirectory& dump_dir, Environment settings) {
  settings["NCCLEMU_FAULTS"] = "hang:rank=1,seq=10";
  settings["NCCLGUARD_TIMEOUT"] = "2";
  settings["NCCLGUARD_STATUS_INTERVAL"] = "0.2";
  return RunTrainLoop(dump_dir, {"--ranks", "4", "--steps", "20", "--timeout", "7"}, settings);
}

std::string CredentialsFile(const TemporaryDirectory& directory, const std::string& content) {
  const std::string path = directory.path() + "/redis-auth";
  std::ofstream(path, std::ios::trunc) << content;
  REQUIRE(chmod(path.c_str(), 0600) == 0);
  return path;
}

bool Contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// Every rank logged the verdict of the stall, which needs every rank's status from the board.
void CheckVerdictOnEveryRank(const Job& job) {
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 4);
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank);
    CHECK_FALSE(
        LogLinesOf(job.result.err, pid, "verdict: stuck_inside_nccl: all 4 ranks entered AllReduce #10")
            .empty());
    CHECK(LogLinesOf(job.result.err, pid, "cannot be used").empty());
  }
}

// `secret` is in no output of the job and no file of its job directory.
void CheckSecretNowhere(const Job& job, const std::string& secret) {
  CHECK_FALSE(Contains(job.result.out, secret));
  CHECK_FALSE(Contains(job.result.err, secret));
  std::error_code error;
  int files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(job.job_dir, error)) {
    if (!entry.is_regular_file()) continue;
    ++files;
    INFO(entry.path());
    CHECK_FALSE(Contains(ReadFile(entry.path()), secret));
  }
  CHECK(files > 0);  // the dumps of the stall at least
}

}  // namespace

TEST_CASE(
    "a job on a Redis board with requirepass and NCCLGUARD_STORE_AUTH_FILE: verdicts, and the password "
    "nowhere",
    "[redis_security]") {
  RedisServer redis(RedisServerOptions{.requirepass = kPassword});
  REQUIRE(redis.started());
  TemporaryDirectory dump_dir;
  TemporaryDirectory secrets;
  const std::string auth_file = CredentialsFile(secrets, std::string(kPassword) + "\n");
  const Job job =
      RunHungJob(dump_dir, {{"NCCLGUARD_STORE", redis.Url()}, {"NCCLGUARD_STORE_AUTH_FILE", auth_file}});
  CheckVerdictOnEveryRank(job);
  CheckSecretNowhere(job, kPassword);
  // Nor on the board: statuses and facts records hold no password.
  const std::string prefix = "ncclguard:{" + std::to_string(getuid()) + ":" + kJobId + "}:";
  CHECK(redis.HashLength(prefix + "facts") >= 1);
  CHECK(redis.Run({"HGETALL", prefix + "facts"}).starts_with("*"));

  // `ncclguard analyze` reads the job on Redis with the same file.
  ProcessOptions options;
  options.timeout_seconds = 30;
  options.environment["NCCLGUARD_STORE_AUTH_FILE"] = auth_file;
  const ProcessResult analysis =
      RunProcess({NCCLGUARD_CLI, "analyze", redis.Url() + "/" + kJobId, "--dump-dir", job.job_dir}, options);
  INFO(analysis.out << analysis.err);
  CHECK(analysis.exit_code == 1);  // unhealthy
  CHECK(Contains(analysis.out, "STUCK_INSIDE_NCCL"));
  CHECK_FALSE(Contains(analysis.out + analysis.err, kPassword));
}

TEST_CASE("a job whose ACL user may only touch its own keys works, and another user's may not touch them",
          "[redis_security]") {
  RedisServer redis(RedisServerOptions{.requirepass = "admin-only"});
  REQUIRE(redis.started());
  const std::string uid = std::to_string(getuid());
  // docs/deploying.md's pattern: one ACL user per cluster user, its keys only, the board's commands.
  auto add_user = [&](const std::string& name, const std::string& owner) {
    return redis.Run(BoardAclUser(name, name + "-Pw", owner));
  };
  REQUIRE(add_user("trainer", uid) == "+OK");
  REQUIRE(add_user("neighbour", std::to_string(getuid() + 1)) == "+OK");
  TemporaryDirectory dump_dir;
  TemporaryDirectory secrets;
  const std::string auth_file = CredentialsFile(secrets, "trainer\ntrainer-Pw\n");
  const Job job =
      RunHungJob(dump_dir, {{"NCCLGUARD_STORE", redis.Url()}, {"NCCLGUARD_STORE_AUTH_FILE", auth_file}});
  CheckVerdictOnEveryRank(job);
  CheckSecretNowhere(job, "trainer-Pw");

  // Another user's ACL user can neither read this job's records nor write a verdict into them.
  const std::string prefix = "ncclguard:{" + uid + ":" + kJobId + "}:";
  CHECK(redis.RunAs("trainer", "trainer-Pw", {"HLEN", prefix + "facts"}).starts_with(":"));
  CHECK(redis.RunAs("neighbour", "neighbour-Pw", {"HGETALL", prefix + "facts"}).starts_with("-NOPERM"));
  CHECK(redis.RunAs("neighbour", "neighbour-Pw", {"HSET", prefix + "records:", "p2p-verdict.json", "{}"})
            .starts_with("-NOPERM"));
  CHECK(redis.RunAs("neighbour", "neighbour-Pw", {"RPUSH", prefix + "dump-requests", "x"})
            .starts_with("-NOPERM"));
}

TEST_CASE(
    "a Redis board that asks for a password the job lacks: said once per process, the job runs to its end",
    "[redis_security]") {
  RedisServer redis(RedisServerOptions{.requirepass = kPassword});
  REQUIRE(redis.started());
  TemporaryDirectory dump_dir;
  const Job job = RunTrainLoop(dump_dir, {"--ranks", "2", "--steps", "60", "--slow", "0:30"},
                               {{"NCCLGUARD_STORE", redis.Url()}, {"NCCLGUARD_STATUS_INTERVAL", "0.2"}});
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  CHECK(job.result.exit_code == 0);
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 2);
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank);
    // Whichever of its connections met the server first (the P2P policy's, the watchdog's).
    const std::vector<std::string> said = LogLinesOf(job.result.err, pid, "cannot be used");
    REQUIRE(said.size() == 1);
    CHECK(Contains(said[0], "NCCLGUARD_STORE_AUTH_FILE"));
    CHECK(Contains(said[0], " WARN "));
    CHECK(Contains(said[0], "NOAUTH"));
  }
}

TEST_CASE("a password file corrected while the job runs: the board comes back, said once each way",
          "[redis_security]") {
  RedisServer redis(RedisServerOptions{.requirepass = kPassword});
  REQUIRE(redis.started());
  TemporaryDirectory dump_dir;
  TemporaryDirectory secrets;
  const std::string auth_file = CredentialsFile(secrets, "a mistyped password\n");
  const std::string status_key = "ncclguard:{" + std::to_string(getuid()) + ":" + kJobId + "}:status";
  Job job;
  std::thread running([&] {
    job = RunTrainLoop(dump_dir, {"--ranks", "2", "--steps", "400", "--slow", "0:40"},
                       {{"NCCLGUARD_STORE", redis.Url()},
                        {"NCCLGUARD_STORE_AUTH_FILE", auth_file},
                        {"NCCLGUARD_STATUS_INTERVAL", "0.2"}});
  });
  std::this_thread::sleep_for(std::chrono::seconds(3));
  CredentialsFile(secrets, std::string(kPassword) + "\n");
  // Back within the longest backoff of its first failures (0.5, 1, 2, 4 s ...).
  long long published = -1;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(12);
  while ((published = redis.HashLength(status_key)) != 2 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  running.join();
  INFO(job.transcript);
  CHECK(published == 2);
  CHECK(job.result.exit_code == 0);
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 2);
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank);
    // Whichever of its connections met the refusal first (the P2P policy's, the watchdog's).
    const std::vector<std::string> said = LogLinesOf(job.result.err, pid, "cannot be used");
    REQUIRE(said.size() == 1);
    CHECK(Contains(said[0], "refuses the credentials of NCCLGUARD_STORE_AUTH_FILE"));
    CHECK(LogLinesOf(job.result.err, pid, "answers again").size() == 1);
    CHECK_FALSE(Contains(job.result.err, "a mistyped password"));
  }
}

TEST_CASE(
    "a URL that carries a password is refused, naming the setting to use: the password is in no log or dump",
    "[redis_security]") {
  RedisServer redis(RedisServerOptions{.requirepass = kPassword});
  REQUIRE(redis.started());
  TemporaryDirectory dump_dir;
  const std::string url =
      "redis://:" + std::string(kPassword) + "@127.0.0.1:" + std::to_string(redis.port()) + "/0";
  const Job job = RunHungJob(dump_dir, {{"NCCLGUARD_STORE", url}, {"NCCLGUARD_LOG_LEVEL", "info"}});
  INFO(job.transcript);
  REQUIRE_FALSE(job.result.timed_out);
  const std::map<int, int> pids = RankPids(job.result.out);
  REQUIRE(pids.size() == 4);
  for (const auto& [rank, pid] : pids) {
    INFO("rank " << rank);
    const std::vector<std::string> refused = LogLinesOf(job.result.err, pid, "NCCLGUARD_STORE_AUTH_FILE");
    CHECK_FALSE(refused.empty());
    for (const std::string& line : refused) CHECK(Contains(line, " WARN "));
    // The job directory was its board instead: the verdict still came.
    CHECK_FALSE(LogLinesOf(job.result.err, pid, "verdict: stuck_inside_nccl").empty());
  }
  CheckSecretNowhere(job, kPassword);
}

TEST_CASE("a Redis board named by an IPv6 literal is used", "[redis_security]") {
  if (!RedisServer::HasIpv6Loopback()) {
    WARN("no IPv6 loopback on this machine: not tried");
    return;
  }
  RedisServer redis(RedisServerOptions{.requirepass = "", .ipv6 = true});
  REQUIRE(redis.started());
  TemporaryDirectory dump_dir;
  const Job job = RunHungJob(dump_dir, {{"NCCLGUARD_STORE", redis.Ipv6Url(4)}});
  CheckVerdictOnEveryRank(job);
}
