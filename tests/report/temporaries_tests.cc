// A rank's files are found by name, never by listing the job directory; the temporaries of killed
// writers are named after their writer and removed by the tools that read the whole job.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <catch2/catch.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "tests/support/process.h"
#include "watchdog/common/clock.h"
#include "watchdog/common/files.h"
#include "watchdog/common/temporaries.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {
namespace {

namespace fs = std::filesystem;
using testing::TemporaryDirectory;

std::string OwnHost() {
  char host[256] = {};
  REQUIRE(gethostname(host, sizeof(host) - 1) == 0);
  return host;
}

ProcessFacts Identity(const std::string& host, int pid) {
  ProcessFacts identity;
  identity.host = host;
  identity.pid = pid;
  return identity;
}

// Run by the next case under strace, in a process of its own: a rank's first two intervals.
TEST_CASE("one status write, traced by the next case", "[.status-write-probe]") {
  const char* job_dir = std::getenv("JOB_DIR_PROBE_DIRECTORY");
  REQUIRE(job_dir != nullptr);
  DumpRequestWatcher watcher(job_dir, OwnHost(), 424242, WallNowNs());
  REQUIRE(WriteStatus(job_dir, ProcessSnapshot{}, Identity(OwnHost(), 424242)).ok());
  REQUIRE(watcher.Poll().ok());
  REQUIRE(WriteStatus(job_dir, ProcessSnapshot{}, Identity(OwnHost(), 424242)).ok());
  REQUIRE(watcher.Poll().ok());
}

// Every rank of a job writes its status: one that listed the job directory would make a job of N
// ranks read N² directory entries from a shared file system as it starts.
TEST_CASE("a rank's status writes and looks for dump requests list no directory", "[temporaries]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  fs::create_directories(job_dir);
  fs::permissions(job_dir, fs::perms::owner_all);
  // Another rank's status and a killed writer's temporary: something to list.
  REQUIRE(WriteStatus(job_dir, ProcessSnapshot{}, Identity("node-b", 8)).ok());
  std::ofstream(job_dir + "/" + TemporaryName("status-node-b-9.json", "node-b", 9, 0));
  // An earlier launch's requests, made before the traced process starts.
  REQUIRE(RequestDumps(job_dir, "an earlier launch").ok());
  REQUIRE(RequestDumps(job_dir, "an earlier launch").ok());
  if (testing::RunProcess({"strace", "-f", "-qq", "-o", "/dev/null", "true"}).exit_code != 0) {
    WARN("strace cannot trace here (not installed, or ptrace not allowed): not checked");
    return;
  }
  const std::string self = fs::read_symlink("/proc/self/exe");
  const std::string trace = temporary.path() + "/trace";
  // -y names each call's directory: only listings of the job directory count (a sanitizer's
  // runtime lists /proc/self/task). LeakSanitizer cannot run under ptrace: off in the traced probe.
  const testing::ProcessResult traced = testing::RunProcess(
      {"strace", "-f", "-qq", "-y", "-e", "trace=getdents,getdents64", "-o", trace, self,
       "[.status-write-probe]"},
      {.environment = {{"JOB_DIR_PROBE_DIRECTORY", job_dir}, {"ASAN_OPTIONS", "detect_leaks=0"}}});
  INFO(traced.out << traced.err);
  REQUIRE(traced.exit_code == 0);
  const std::string calls = testing::ReadFile(trace);
  INFO(calls);
  CHECK(testing::CountOccurrences(calls, "<" + job_dir) == 0);
  CHECK(fs::exists(job_dir + "/status-" + SafeFileName(OwnHost()) + "-424242.json"));
}

TEST_CASE("a temporary's name says which writer of which host is writing it", "[temporaries]") {
  const std::string name = TemporaryName("status-node~a-7.json", "node-a.example", 7, 12);
  CHECK(absl::StartsWith(name, ".tmp-status-node~a-7.json"));
  const std::optional<TemporaryWriter> writer = ParseTemporaryName(name);
  REQUIRE(writer.has_value());
  CHECK(writer->host == "node-a.example");
  CHECK(writer->pid == 7);
  // An earlier build's name gives no host; not a temporary at all, nothing.
  CHECK_FALSE(ParseTemporaryName(".tmp-status-node-a-7.json.7.3").has_value());
  CHECK_FALSE(ParseTemporaryName("status-node-a-7.json").has_value());
  CHECK_FALSE(ParseTemporaryName(".tmp-x~host~0~1").has_value());
  // A long host name is cut: the name stays within NAME_MAX.
  CHECK(TemporaryName(std::string(120, 's'), std::string(100, 'h'), 4194304, 99).size() < 255);
}

void Backdate(const std::string& path, std::chrono::seconds age) {
  const std::time_t then = std::time(nullptr) - age.count();
  const timespec times[2] = {{then, 0}, {then, 0}};
  REQUIRE(utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW) == 0);
}

TEST_CASE("abandoned temporaries are removed: a gone writer's of this host, and old ones", "[temporaries]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  REQUIRE(WriteStatus(job_dir, ProcessSnapshot{}, Identity("node-b", 8)).ok());
  const std::string requests = job_dir + "/dump-requests";
  fs::create_directories(requests);
  const pid_t ended = fork();
  if (ended == 0) _exit(0);
  REQUIRE(ended > 0);
  REQUIRE(waitpid(ended, nullptr, 0) == ended);
  const std::string host = SafeFileName(OwnHost());
  const std::string dead = job_dir + "/" + TemporaryName("status-x.json", host, ended, 3);
  const std::string dead_below = requests + "/" + TemporaryName("dump-request-x", host, ended, 4);
  const std::string alive = job_dir + "/" + TemporaryName("status-y.json", host, getpid(), 9);
  const std::string elsewhere = job_dir + "/" + TemporaryName("status-z.json", "another-host", ended, 1);
  const std::string old_elsewhere = job_dir + "/" + TemporaryName("status-w.json", "another-host", 5, 1);
  const std::string old_format = job_dir + "/.tmp-status-v.json." + std::to_string(ended) + ".2";
  const std::string old_format_aged = job_dir + "/.tmp-status-u.json.5.2";
  for (const std::string& path :
       {dead, dead_below, alive, elsewhere, old_elsewhere, old_format, old_format_aged})
    std::ofstream(path) << "{";
  Backdate(old_elsewhere, std::chrono::minutes(20));
  Backdate(old_format_aged, std::chrono::minutes(20));
  // Neither followed nor removed: a link, and a directory, with a gone writer's name.
  const std::string link = job_dir + "/" + TemporaryName("status-l.json", host, ended, 1);
  fs::create_symlink(alive, link);
  const std::string directory = job_dir + "/" + TemporaryName("status-d.json", host, ended, 1);
  fs::create_directory(directory);

  const absl::StatusOr<TemporaryCleanup> cleanup = RemoveAbandonedTemporaries(job_dir, kReadDeadline);
  REQUIRE(cleanup.ok());
  CHECK(cleanup->removed == 4);
  CHECK(cleanup->kept == 3);
  CHECK_FALSE(fs::exists(dead));
  CHECK_FALSE(fs::exists(dead_below));
  CHECK_FALSE(fs::exists(old_elsewhere));
  CHECK_FALSE(fs::exists(old_format_aged));
  CHECK(fs::exists(alive));
  CHECK(fs::exists(elsewhere));
  CHECK(fs::exists(old_format));
  CHECK(fs::is_symlink(link));
  CHECK(fs::is_directory(directory));
  // Readers never took any of them for a status.
  const absl::StatusOr<StatusScan> scan = ReadStatuses(job_dir);
  REQUIRE(scan.ok());
  CHECK(scan->statuses.size() == 1);
  CHECK(scan->problems.empty());
}

}  // namespace
}  // namespace ncclguard
