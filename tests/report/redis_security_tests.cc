// A Redis board that only its job can use: the address parsed (IPv6 literals; no credentials in the
// URL, and none echoed), the credentials read from NCCLGUARD_STORE_AUTH_FILE, and against a real
// redis-server with requirepass and with ACL users limited to one user's keys.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/support/process.h"
#include "tests/support/redis_server.h"
#include "watchdog/common/escape.h"
#include "watchdog/report/job_board.h"
#include "watchdog/report/redis_client.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {
namespace {

using testing::BoardAclUser;
using testing::RedisServer;
using testing::RedisServerOptions;
using testing::TemporaryDirectory;

constexpr char kPassword[] = "s3cret-Pa55word";

// A credentials file of `content` and `mode` in `directory`.
std::string CredentialsFile(const TemporaryDirectory& directory, const std::string& content,
                            mode_t mode = 0600, std::string name = "") {
  static int files = 0;
  if (name.empty()) name = "redis-auth-" + std::to_string(++files);  // a file of mode 0400 stays so
  const std::string path = directory.path() + "/" + name;
  std::ofstream(path, std::ios::trunc) << content;
  REQUIRE(chmod(path.c_str(), mode) == 0);
  return path;
}

std::shared_ptr<JobBoard> Open(const std::string& url, const TemporaryDirectory& directory,
                               const std::string& auth_file, const std::string& job = "job-7") {
  absl::StatusOr<std::shared_ptr<JobBoard>> board = OpenJobBoard(
      url, directory.path() + "/" + job, job, BoardIdentity{.host = "node-a", .pid = 100}, auth_file);
  REQUIRE(board.ok());
  return *board;
}

// One record written and read back: the board works.
absl::Status WriteAndRead(const std::shared_ptr<JobBoard>& board) {
  if (absl::Status put = board->Put("", "probe", "yes", false); !put.ok()) return put;
  absl::StatusOr<std::string> got = board->Get("", "probe", 100);
  if (!got.ok()) return got.status();
  return *got == "yes" ? absl::OkStatus() : absl::InternalError("read back " + *got);
}

std::string OwnKey(const std::string& job, const char* kind) {
  return "ncclguard:{" + std::to_string(getuid()) + ":" + job + "}:" + kind;
}

TEST_CASE("Redis addresses: IPv6 literals, and no credentials in the URL, echoed nowhere",
          "[redis_security]") {
  const absl::StatusOr<RedisAddress> literal = ParseRedisAddress("redis://[::1]:6390/2");
  REQUIRE(literal.ok());
  CHECK(literal->host == "::1");
  CHECK(literal->port == 6390);
  CHECK(literal->database == 2);
  CHECK(literal->ToString() == "redis://[::1]:6390/2");
  CHECK(ParseRedisAddress("redis://[fd00::17]")->port == 6379);
  CHECK(ParseRedisAddress("redis://[fd00::17]/3")->host == "fd00::17");
  const absl::StatusOr<RedisJob> job = ParseRedisJob("redis://[::1]:6390/0/slurm-12");
  REQUIRE(job.ok());
  CHECK(job->address.host == "::1");
  CHECK(job->job_id == "slurm-12");
  CHECK_FALSE(ParseRedisAddress("redis://[::1:6390/0").ok());
  CHECK_FALSE(ParseRedisAddress("redis://[::1]x/0").ok());
  // Unbracketed, an IPv6 address cannot be told from its port.
  CHECK_FALSE(ParseRedisAddress("redis://::1:6390/0").ok());

  for (const std::string url :
       {"redis://:s3cret-Pa55word@cache:6379/0", "redis://alice:s3cret-Pa55word@cache/0",
        "redis://alice:s3/cret-Pa55word@cache/0"}) {
    INFO(url);
    const absl::StatusOr<RedisAddress> refused = ParseRedisAddress(url);
    REQUIRE_FALSE(refused.ok());
    CHECK(absl::IsInvalidArgument(refused.status()));
    const std::string message(refused.status().message());
    CHECK(message.find("NCCLGUARD_STORE_AUTH_FILE") != std::string::npos);
    CHECK(message.find("Pa55word") == std::string::npos);
    const absl::StatusOr<std::shared_ptr<JobBoard>> board = OpenJobBoard(url, "/tmp/x/job", "job", {}, "");
    REQUIRE_FALSE(board.ok());
    CHECK(std::string(board.status().message()).find("Pa55word") == std::string::npos);
    CHECK_FALSE(ParseRedisJob(url + "/job").ok());
    CHECK(std::string(ParseRedisJob(url + "/job").status().message()).find("Pa55word") == std::string::npos);
  }
}

TEST_CASE("rediss:// is refused with a clear word where this build has no TLS", "[redis_security]") {
  const absl::StatusOr<RedisAddress> tls = ParseRedisAddress("rediss://cache:6380/0");
  if (RedisTlsAvailable()) {
    REQUIRE(tls.ok());
    CHECK(tls->tls);
    return;
  }
  REQUIRE_FALSE(tls.ok());
  CHECK(std::string(tls.status().message()).find("TLS (rediss://) is unavailable in this build") !=
        std::string::npos);
}

TEST_CASE("credentials are removed from every URL in a text", "[redis_security]") {
  CHECK(RemoveUrlCredentials("redis://:pw@host:6379/0") == "redis://<redacted>@host:6379/0");
  CHECK(RemoveUrlCredentials("redis://user:p@ss@host/0 and http://a:b@c/d") ==
        "redis://<redacted>@host/0 and http://<redacted>@c/d");
  CHECK(RemoveUrlCredentials("redis://host:6379/0/job@x") == "redis://host:6379/0/job@x");
  CHECK(RemoveUrlCredentials("/tmp/ncclguard-1000/job") == "/tmp/ncclguard-1000/job");
}

TEST_CASE("the credentials file: the password, or a user and a password; private to its user",
          "[redis_security]") {
  TemporaryDirectory directory;
  const absl::StatusOr<RedisCredentials> password =
      ReadRedisCredentials(CredentialsFile(directory, "pw one\n"));
  REQUIRE(password.ok());
  CHECK(password->user.empty());
  CHECK(password->password == "pw one");
  const absl::StatusOr<RedisCredentials> user =
      ReadRedisCredentials(CredentialsFile(directory, "alice\r\npw two\r\n\n", 0400));
  REQUIRE(user.ok());
  CHECK(user->user == "alice");
  CHECK(user->password == "pw two");
  for (const auto& [content, mode] : {std::pair<std::string, mode_t>{"Xy7Secret\n", 0644},
                                      {"Xy7Secret\n", 0660},
                                      {"", 0600},
                                      {"a\nb\nXy7Secret\n", 0600},
                                      {"\nXy7Secret\n", 0600}}) {
    INFO(content << " mode " << mode);
    const absl::StatusOr<RedisCredentials> refused =
        ReadRedisCredentials(CredentialsFile(directory, content, mode));
    REQUIRE_FALSE(refused.ok());
    CHECK(std::string(refused.status().message()).find("NCCLGUARD_STORE_AUTH_FILE") != std::string::npos);
    CHECK(std::string(refused.status().message()).find("Xy7Secret") == std::string::npos);
  }
  CHECK(std::string(ReadRedisCredentials(CredentialsFile(directory, "pw\n", 0644)).status().message())
            .find("chmod 600") != std::string::npos);
  CHECK_FALSE(ReadRedisCredentials(directory.path() + "/absent").ok());
  CHECK_FALSE(ReadRedisCredentials(directory.path()).ok());
}

TEST_CASE("with requirepass: the board works with the password file, and only with it", "[redis_security]") {
  RedisServer redis(RedisServerOptions{.requirepass = kPassword});
  REQUIRE(redis.started());
  TemporaryDirectory directory;
  const std::string good = CredentialsFile(directory, std::string(kPassword) + "\n", 0600, "good");
  CHECK(WriteAndRead(Open(redis.Url(), directory, good)).ok());
  CHECK(redis.HashLength(OwnKey("job-7", "records:")) == 1);
  // In a database other than 0 too (SELECT comes after AUTH).
  CHECK(WriteAndRead(Open(redis.Url(5), directory, good)).ok());

  const absl::Status without = WriteAndRead(Open(redis.Url(), directory, ""));
  CHECK(absl::IsUnavailable(without));
  CHECK(std::string(without.message()).find("NCCLGUARD_STORE_AUTH_FILE") != std::string::npos);
  const std::string wrong = CredentialsFile(directory, "not the password\n", 0600, "wrong");
  const absl::Status refused = WriteAndRead(Open(redis.Url(), directory, wrong));
  CHECK(absl::IsUnavailable(refused));
  CHECK(std::string(refused.message()).find("refuses the credentials") != std::string::npos);
  CHECK(std::string(refused.message()).find("not the password") == std::string::npos);

  // The file corrected while the board backs off: used at the next try, without a restart.
  const std::shared_ptr<JobBoard> board = Open(redis.Url(), directory, wrong, "job-8");
  CHECK_FALSE(WriteAndRead(board).ok());
  CredentialsFile(directory, std::string(kPassword) + "\n", 0600, "wrong");
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  absl::Status again = WriteAndRead(board);
  while (!again.ok() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    again = WriteAndRead(board);
  }
  CHECK(again.ok());
}

TEST_CASE("an ACL user limited to its own keys: its job works, other users' keys are refused",
          "[redis_security]") {
  RedisServer redis(RedisServerOptions{.requirepass = "admin-password"});
  REQUIRE(redis.started());
  const std::string uid = std::to_string(getuid());
  const std::string other_uid = std::to_string(getuid() + 1);
  // The pattern docs/deploying.md gives: the user's keys, the commands of the board, nothing else.
  auto add_user = [&](const std::string& name, const std::string& owner) {
    return redis.Run(BoardAclUser(name, name + "-password", owner));
  };
  REQUIRE(add_user("alice", uid) == "+OK");
  REQUIRE(add_user("mallory", other_uid) == "+OK");
  TemporaryDirectory directory;
  const std::string alice = CredentialsFile(directory, "alice\nalice-password\n", 0600, "alice");
  const std::string mallory = CredentialsFile(directory, "mallory\nmallory-password\n", 0600, "mallory");

  const std::shared_ptr<JobBoard> own = Open(redis.Url(), directory, alice);
  CHECK(WriteAndRead(own).ok());
  ProcessSnapshot snapshot;
  snapshot.time_ns = 1;
  ProcessFacts facts;
  facts.host = "node-a";
  facts.pid = 100;
  CHECK(own->PublishStatus(snapshot, facts).ok());
  CHECK(own->RequestDumps("test").ok());
  CHECK(own->PollDumpRequests().ok());
  CHECK(redis.HashLength(OwnKey("job-7", "status")) == 1);

  // A user whose keys are another uid's cannot touch this user's job.
  const absl::Status foreign = WriteAndRead(Open(redis.Url(), directory, mallory));
  REQUIRE_FALSE(foreign.ok());
  CHECK(std::string(foreign.message()).find("NOPERM") != std::string::npos);
  CHECK(redis.RunAs("mallory", "mallory-password", {"HSET", OwnKey("job-7", "records:"), "p2p", "x"})
            .starts_with("-NOPERM"));
  CHECK(redis.RunAs("mallory", "mallory-password", {"HGETALL", OwnKey("job-7", "facts")})
            .starts_with("-NOPERM"));
  CHECK(redis.RunAs("alice", "alice-password", {"KEYS", "*"}).starts_with("-NOPERM"));
  // Nor may this user's ACL name reach them under another uid.
  CHECK(
      redis.RunAs("alice", "alice-password", {"HSET", "ncclguard:{" + other_uid + ":job-7}:status", "a", "b"})
          .starts_with("-NOPERM"));
}

TEST_CASE("an IPv6 literal address connects where ::1 is available", "[redis_security]") {
  if (!RedisServer::HasIpv6Loopback()) {
    WARN("no IPv6 loopback on this machine: the connection is not tried");
    return;
  }
  RedisServer redis(RedisServerOptions{.requirepass = "", .ipv6 = true});
  REQUIRE(redis.started());
  TemporaryDirectory directory;
  CHECK(WriteAndRead(Open(redis.Ipv6Url(3), directory, "")).ok());
}

}  // namespace
}  // namespace ncclguard
