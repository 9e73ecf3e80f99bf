// Job directories and files that another local user planted or a crash cut off: FIFOs, devices,
// symbolic links, files of other users, huge files and huge claimed sizes. Reading them never
// blocks, never allocates by what they claim, and writing never goes through a planted link.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "tests/support/process.h"
#include "tests/report/honest_job.h"
#include "watchdog/common/config.h"
#include "watchdog/report/dump.h"
#include "watchdog/report/dump_reader.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/diagnose/known_bad.h"
#include "watchdog/common/log.h"
#include "watchdog/recover/p2p_policy.h"
#include "watchdog/diagnose/verdicts.h"

namespace ncclguard {
namespace {

namespace fs = std::filesystem;
using testing::HonestFacts;
using testing::HonestSnapshot;
using testing::kHonestNow;
using testing::TemporaryDirectory;
using testing::WithinSeconds;

constexpr uid_t kStranger = 12345;
// Far less than anything that would block: the reads under test return at once.
constexpr double kPromptSeconds = 30;

bool Contains(const std::vector<std::string>& problems, const std::string& text) {
  for (const std::string& problem : problems) {
    if (problem.find(text) != std::string::npos) return true;
  }
  return false;
}

std::optional<absl::StatusOr<JobView>> ReadPromptly(const std::string& directory,
                                                    JobDirectoryOrigin origin = JobDirectoryOrigin::kNamedByUser) {
  return WithinSeconds<absl::StatusOr<JobView>>(
      kPromptSeconds, [=] { return ReadJobDirectory(directory, kHonestNow, 2, origin); });
}

void WriteHonestProcess(const std::string& job_dir, int rank, int pid) {
  REQUIRE(WriteStatus(job_dir, HonestSnapshot(rank, 2, 1, 4), HonestFacts("node-a", pid)).ok());
}

void MakeFifo(const std::string& path) { REQUIRE(mkfifo(path.c_str(), 0666) == 0); }

mode_t Mode(const std::string& path) {
  struct stat status {};
  REQUIRE(lstat(path.c_str(), &status) == 0);
  return status.st_mode & 07777;
}

// ---------------------------------------------------------------------------------------------
// 1. Special files never block a reader

TEST_CASE("FIFOs named like dumps and status files are refused without blocking", "[hostile]") {
  TemporaryDirectory job;
  WriteHonestProcess(job.path(), 0, 100);
  MakeFifo(job.path() + "/dump-planted-1-0-1.json");
  MakeFifo(job.path() + "/status-planted-2.json");
  const auto read = ReadPromptly(job.path());
  REQUIRE(read.has_value());
  REQUIRE(read->ok());
  CHECK((*read)->processes.size() == 1);  // the honest one is still read
  CHECK(Contains((*read)->problems, "dump-planted-1-0-1.json: not a regular file"));
  CHECK(Contains((*read)->problems, "status-planted-2.json: not a regular file"));
}

TEST_CASE("FIFOs as status files leak no thread: ncclguard keeps writing", "[hostile]") {
  TemporaryDirectory job;
  for (int i = 0; i < 6; ++i) MakeFifo(absl::StrCat(job.path(), "/status-planted-", i, ".json"));
  for (int attempt = 0; attempt < 6; ++attempt) {
    const auto scan = WithinSeconds<absl::StatusOr<StatusScan>>(kPromptSeconds, [&] { return ReadStatuses(job.path()); });
    REQUIRE(scan.has_value());
    REQUIRE(scan->ok());
    CHECK((*scan)->problems.size() == 6);
  }
  // Every bounded thread of the reads above has finished: a write still gets one.
  CHECK(WriteStatus(job.path(), HonestSnapshot(0, 2, 1, 4), HonestFacts("node-a", 100)).ok());
}

TEST_CASE("a FIFO as the dump requests' generation file does not block the watcher", "[hostile]") {
  TemporaryDirectory job;
  REQUIRE(mkdir((job.path() + "/dump-requests").c_str(), 0700) == 0);
  MakeFifo(job.path() + "/dump-requests/generation");
  DumpRequestWatcher watcher(job.path(), "node-a", 100, 0);
  const auto polled = WithinSeconds<bool>(kPromptSeconds, [&] { return watcher.Poll().ok(); });
  REQUIRE(polled.has_value());
  CHECK_FALSE(*polled);
}

TEST_CASE("a device in the job directory is not opened", "[hostile]") {
  TemporaryDirectory job;
  if (mknod((job.path() + "/dump-zero-1-0-1.json").c_str(), S_IFCHR | 0666, makedev(1, 5)) != 0) {
    WARN("cannot make a device node here; test skipped");
    return;
  }
  const auto read = ReadPromptly(job.path());
  REQUIRE(read.has_value());
  REQUIRE(read->ok());
  CHECK(Contains((*read)->problems, "dump-zero-1-0-1.json: not a regular file"));
}

TEST_CASE("reading a job directory has a deadline as a whole", "[hostile]") {
  TemporaryDirectory job;
  for (int pid = 1; pid <= 40; ++pid) WriteHonestProcess(job.path(), 0, pid);
  // A deadline already passed: either the caller gives up at once, or the reading thread, quicker,
  // stops before the first file and says so.
  const absl::StatusOr<JobView> read =
      ReadJobDirectory(job.path(), kHonestNow, 2, JobDirectoryOrigin::kNamedByUser, std::chrono::milliseconds(0));
  if (read.ok()) {
    CHECK(read->processes.empty());
    CHECK(Contains(read->problems, "status files: not read, the deadline passed"));
  } else {
    CHECK(absl::IsDeadlineExceeded(read.status()));
  }
}

// ---------------------------------------------------------------------------------------------
// 2. Claimed sizes never size an allocation

TEST_CASE("a dump claiming 10^8 ranks is refused, not allocated for", "[hostile]") {
  TemporaryDirectory job;
  ProcessSnapshot snapshot = HonestSnapshot(0, 2, 1, 4);
  snapshot.comms[0].nranks = 100'000'000;
  REQUIRE(WriteDump(job.path(), snapshot, HonestFacts("node-a", 100)).ok());
  ProcessSnapshot initialising = HonestSnapshot(1, 2, 0, 0);
  initialising.pending_inits.push_back(PendingInitSnapshot{
      .comm_id = "00000000000000bb", .api = "ncclCommInitRank", .rank = 1, .nranks = 100'000'000, .start_ns = 1, .result = ""});
  REQUIRE(WriteStatus(job.path(), initialising, HonestFacts("node-a", 101)).ok());
  auto read = ReadPromptly(job.path());
  REQUIRE(read.has_value());
  REQUIRE(read->ok());
  CHECK((*read)->processes.empty());
  CHECK(Contains((*read)->problems, "nranks 100000000 is outside 0..131072"));
  CHECK((*read)->problems.size() == 2);
  CHECK_NOTHROW(Classify(**read, ProcessKnownBad().entries));
}

TEST_CASE("a rank beyond its communicator's size is refused", "[hostile]") {
  CHECK_NOTHROW(CheckRanks(-1, 0));
  CHECK_NOTHROW(CheckRanks(3, 4));
  CHECK_NOTHROW(CheckRanks(kMaxRanks - 1, kMaxRanks));
  CHECK_THROWS(CheckRanks(4, 4));
  CHECK_THROWS(CheckRanks(-2, 4));
  CHECK_THROWS(CheckRanks(0, -1));
  CHECK_THROWS(CheckRanks(0, kMaxRanks + 1));
}

TEST_CASE("the dump size cap follows the ring size and is checked before reading", "[hostile]") {
  const long default_ring = Config{}.ring_size.value;
  CHECK(MaxDumpBytes(default_ring) < (16u << 20));
  CHECK(MaxDumpBytes(4 * default_ring) > MaxDumpBytes(default_ring));
  // The largest honest dump at the default ring fits.
  const std::string largest = FormatDump(HonestSnapshot(0, 2, static_cast<int>(kMaxDumpedRings), default_ring),
                                         HonestFacts("node-a", 100));
  CHECK(largest.size() < MaxDumpBytes(default_ring));

  TemporaryDirectory job;
  // A sparse file: big as claimed by its size, nothing to read if the size is checked first.
  const std::string huge = job.path() + "/dump-huge-1-0-1.json";
  const int fd = open(huge.c_str(), O_WRONLY | O_CREAT, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 300 << 20) == 0);
  close(fd);
  const auto read = ReadPromptly(job.path());
  REQUIRE(read.has_value());
  REQUIRE(read->ok());
  CHECK(Contains((*read)->problems, absl::StrCat("dump-huge-1-0-1.json: larger than ", MaxDumpBytes(default_ring), " bytes")));
}

TEST_CASE("JSON nested too deep or too costly for its size is refused while parsing", "[hostile]") {
  const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
  CHECK_THROWS_WITH(ParseBoundedJson(deep), Catch::Contains("nested deeper than"));
  std::string objects = "[";
  for (int i = 0; i < 1'000'000; ++i) objects += "{},";
  objects += "{}]";
  CHECK_THROWS_WITH(ParseBoundedJson(objects), Catch::Contains("bytes of memory"));
  const std::string honest = FormatDump(HonestSnapshot(0, 2, 2, 2048), HonestFacts("node-a", 100));
  CHECK_NOTHROW(ParseBoundedJson(honest));
  CHECK(ParseDump(honest).ok());
  CHECK_FALSE(ParseDump(deep).ok());
}

// ---------------------------------------------------------------------------------------------
// 3. Reader rules: the directory as the user names it

TEST_CASE("analyze reads a job directory named by a relative path or a symbolic link", "[hostile]") {
  TemporaryDirectory temporary;
  const std::string job = temporary.path() + "/job";
  REQUIRE(mkdir(job.c_str(), 0700) == 0);
  WriteHonestProcess(job, 0, 100);
  REQUIRE(WriteDump(job, HonestSnapshot(1, 2, 1, 4), HonestFacts("node-a", 101)).ok());
  const std::string link = temporary.path() + "/link";
  fs::create_directory_symlink(job, link);
  const fs::path previous = fs::current_path();
  fs::current_path(temporary.path());
  const auto relative = ReadPromptly("job");
  const auto through_link = ReadPromptly("link/");
  fs::current_path(previous);
  for (const auto* read : {&relative, &through_link}) {
    REQUIRE(read->has_value());
    REQUIRE((*read)->ok());
    CHECK((**read)->problems.empty());
    CHECK((**read)->processes.size() == 2);
    CHECK_FALSE((**read)->processes[0].status_file.empty());
  }
  // The process's own job directory must be a real one.
  const auto own = ReadPromptly(link, JobDirectoryOrigin::kOwn);
  REQUIRE(own.has_value());
  CHECK_FALSE(own->ok());
}

TEST_CASE("root reads a user's job directory; files of a third user are refused", "[hostile]") {
  if (geteuid() != 0) {
    WARN("not root: cannot give files to other users; test skipped");
    return;
  }
  TemporaryDirectory temporary;
  const std::string job = temporary.path() + "/job";
  REQUIRE(mkdir(job.c_str(), 0777) == 0);
  WriteHonestProcess(job, 0, 100);
  WriteHonestProcess(job, 1, 101);
  REQUIRE(chown(job.c_str(), kStranger, kStranger) == 0);
  const std::string users_file = job + "/status-node-a-100.json";
  const std::string third_users_file = job + "/status-node-a-101.json";
  REQUIRE(chown(users_file.c_str(), kStranger, kStranger) == 0);
  REQUIRE(chown(third_users_file.c_str(), kStranger + 1, kStranger + 1) == 0);
  const auto read = ReadPromptly(job);
  REQUIRE(read.has_value());
  REQUIRE(read->ok());
  REQUIRE((*read)->processes.size() == 1);
  CHECK((*read)->processes[0].pid == 100);
  CHECK(Contains((*read)->problems, absl::StrCat("status-node-a-101.json: belongs to uid ", kStranger + 1)));
  // The watchdog reads only its own job directory.
  const auto own = ReadPromptly(job, JobDirectoryOrigin::kOwn);
  REQUIRE(own.has_value());
  CHECK_FALSE(own->ok());
}

TEST_CASE("a planted file of another user in our job directory is not read", "[hostile]") {
  if (geteuid() != 0) {
    WARN("not root: cannot give files to other users; test skipped");
    return;
  }
  TemporaryDirectory job;
  WriteHonestProcess(job.path(), 0, 100);
  REQUIRE(WriteDump(job.path(), HonestSnapshot(1, 2, 1, 4), HonestFacts("node-a", 101)).ok());
  for (const auto& entry : fs::directory_iterator(job.path())) {
    if (entry.path().filename().string().rfind("dump-", 0) == 0) {
      REQUIRE(chown(entry.path().c_str(), kStranger, kStranger) == 0);
    }
  }
  const auto read = ReadPromptly(job.path(), JobDirectoryOrigin::kOwn);
  REQUIRE(read.has_value());
  REQUIRE(read->ok());
  CHECK((*read)->processes.size() == 1);
  CHECK(Contains((*read)->problems, absl::StrCat("belongs to uid ", kStranger)));
}

// ---------------------------------------------------------------------------------------------
// 4. Writes refuse a symbolic link or another user's directory at every level of ncclguard's

TEST_CASE("dump requests are not written through a symbolic link to the job directory", "[hostile]") {
  TemporaryDirectory temporary;
  const std::string elsewhere = temporary.path() + "/elsewhere";
  REQUIRE(mkdir(elsewhere.c_str(), 0700) == 0);
  REQUIRE(mkdir((elsewhere + "/dump-requests").c_str(), 0700) == 0);
  const std::string job = temporary.path() + "/job";
  fs::create_directory_symlink(elsewhere, job);
  const absl::StatusOr<std::string> requested = RequestDumps(job, "test");
  REQUIRE_FALSE(requested.ok());
  CHECK(requested.status().message().find(job + " is a symbolic link") != std::string::npos);
  CHECK(fs::is_empty(elsewhere + "/dump-requests"));
}

TEST_CASE("the default dump directory ncclguard-<uid> may not be a symbolic link", "[hostile]") {
  TemporaryDirectory temporary;
  const std::string elsewhere = temporary.path() + "/elsewhere";
  REQUIRE(mkdir(elsewhere.c_str(), 0700) == 0);
  const std::string base = absl::StrCat(temporary.path(), "/ncclguard-", getuid());
  fs::create_directory_symlink(elsewhere, base);
  const auto written = WriteStatus(base + "/job", HonestSnapshot(0, 2, 1, 4), HonestFacts("node-a", 100));
  REQUIRE_FALSE(written.ok());
  CHECK(written.status().message().find(base + " is a symbolic link") != std::string::npos);
  CHECK(fs::is_empty(elsewhere));
  // Another name is the user's own choice of directory: followed.
  const std::string users = temporary.path() + "/users-dumps";
  fs::create_directory_symlink(elsewhere, users);
  CHECK(WriteStatus(users + "/job", HonestSnapshot(0, 2, 1, 4), HonestFacts("node-a", 100)).ok());
  CHECK(Mode(elsewhere + "/job") == 0700);
}

TEST_CASE("dump requests are not written into another user's job directory", "[hostile]") {
  if (geteuid() != 0) {
    WARN("not root: cannot give a directory to another user; test skipped");
    return;
  }
  TemporaryDirectory temporary;
  const std::string job = temporary.path() + "/job";
  REQUIRE(mkdir(job.c_str(), 0777) == 0);
  REQUIRE(mkdir((job + "/dump-requests").c_str(), 0700) == 0);  // ours, inside theirs
  REQUIRE(chown(job.c_str(), kStranger, kStranger) == 0);
  const absl::StatusOr<std::string> requested = RequestDumps(job, "test");
  REQUIRE_FALSE(requested.ok());
  CHECK(requested.status().message().find(absl::StrCat(job, " belongs to uid ", kStranger)) != std::string::npos);
  CHECK(fs::is_empty(job + "/dump-requests"));
}

// ---------------------------------------------------------------------------------------------
// 7. The known-bad file: regular, bounded, never blocking

TEST_CASE("a FIFO, a device or a huge file as the known-bad file is refused promptly", "[hostile]") {
  TemporaryDirectory temporary;
  const std::string fifo = temporary.path() + "/known-bad.json";
  MakeFifo(fifo);
  const std::string huge = temporary.path() + "/huge.json";
  const int fd = open(huge.c_str(), O_WRONLY | O_CREAT, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 1 << 30) == 0);
  close(fd);
  for (const std::string& path : {fifo, std::string("/dev/zero"), huge}) {
    const auto loaded = WithinSeconds<absl::Status>(kPromptSeconds, [&] { return LoadKnownBad(path).status(); });
    REQUIRE(loaded.has_value());
    CHECK_FALSE(loaded->ok());
    CHECK(loaded->message().find(path) != std::string::npos);
  }
}

TEST_CASE("a FIFO or a device as NCCL_CONF_FILE is skipped, not waited for", "[hostile]") {
  TemporaryDirectory temporary;
  const std::string fifo = temporary.path() + "/nccl.conf";
  MakeFifo(fifo);
  const std::string readable = temporary.path() + "/readable.conf";
  std::ofstream(readable) << "NCCL_P2P_DISABLE=1\n";
  for (const std::string& path : {fifo, std::string("/dev/zero"), readable}) {
    const auto files = WithinSeconds<std::vector<NcclConfigFile>>(kPromptSeconds, [&] {
      return ReadNcclConfigFiles([&](const char* name, std::string* value) {
        if (std::string(name) != "NCCL_CONF_FILE") return false;
        *value = path;
        return true;
      });
    });
    REQUIRE(files.has_value());
    const bool read = std::any_of(files->begin(), files->end(), [&](const NcclConfigFile& file) { return file.path == path; });
    CHECK(read == (path == readable));
  }
}

// ---------------------------------------------------------------------------------------------
// 8. The log file is written like every other file of ncclguard

TEST_CASE("the log file is created 0600 in 0700 directories and never through a link", "[hostile]") {
  TemporaryDirectory temporary;
  const std::string log_path = temporary.path() + "/logs/nested/ncclguard.log";
  const absl::StatusOr<int> opened = OpenFileForAppending(log_path);
  REQUIRE(opened.ok());
  close(*opened);
  CHECK(Mode(log_path) == 0600);
  CHECK(Mode(temporary.path() + "/logs") == 0700);
  CHECK(Mode(temporary.path() + "/logs/nested") == 0700);

  const std::string target = temporary.path() + "/target";
  std::ofstream(target) << "kept\n";
  const std::string link = temporary.path() + "/planted.log";
  fs::create_symlink(target, link);
  CHECK_FALSE(OpenFileForAppending(link).ok());
  CHECK(testing::ReadFile(target) == "kept\n");

  const std::string fifo = temporary.path() + "/fifo.log";
  MakeFifo(fifo);
  const auto fifo_opened = WithinSeconds<bool>(kPromptSeconds, [&] {
    const absl::StatusOr<int> fd = OpenFileForAppending(fifo);
    if (fd.ok()) close(*fd);
    return fd.ok();
  });
  REQUIRE(fifo_opened.has_value());
  CHECK_FALSE(*fifo_opened);
}

TEST_CASE("NCCLGUARD_LOG_FILE goes through the same checks", "[hostile]") {
  TemporaryDirectory temporary;
  Config config;
  config.log_file = temporary.path() + "/sub/ncclguard-%p.log";
  log::Start(config);
  log::Warn("a line for the file");
  const std::string path = absl::StrCat(temporary.path(), "/sub/ncclguard-", getpid(), ".log");
  CHECK(Mode(path) == 0600);
  CHECK(Mode(temporary.path() + "/sub") == 0700);
  CHECK(testing::ReadFile(path).find("a line for the file") != std::string::npos);
  // Started once only: a second logger would leave the first unreachable (a leak to the sanitizers).
}

}  // namespace
}  // namespace ncclguard
