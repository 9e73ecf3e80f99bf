// Dumps: the document (parsed back), and how it is written: atomically, privately, never through
// a symbolic link, never for longer than a deadline, failing quietly.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/support/process.h"
#include "watchdog/common/config.h"
#include "watchdog/common/log.h"
#include "watchdog/common/version.h"
#include "watchdog/report/dump.h"
#include "watchdog/report/dump_reader.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/report/snapshot_json.h"

namespace ncclguard {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using testing::TemporaryDirectory;

ProcessSnapshot StalledSnapshot() {
  ProcessSnapshot snapshot;
  snapshot.reason = "stall";
  snapshot.time_ns = 1'700'000'000'123'456'789;
  snapshot.rank = 2;
  snapshot.in_nccl_call = "ncclAllReduce";
  snapshot.last_nccl_warning = "NCCL WARN peer 3 closed the connection";
  CommSnapshot comm;
  comm.id = "9f3a000000000001";
  comm.handle = 0x55d0c0de;
  comm.rank = 2;
  comm.nranks = 4;
  comm.device = 1;
  comm.created_by = "ncclCommInitRank";
  comm.library_path = "/usr/lib/libnccl.so.2";
  comm.nccl_version = 22809;
  comm.state = "ready";
  comm.last_enqueued = 20;
  comm.last_started = 20;
  comm.last_completed = 19;
  for (std::uint64_t seq = 19; seq <= 20; ++seq) {
    OpSnapshot op;
    op.seq = seq;
    op.op = "AllReduce";
    op.dtype = "float32";
    op.count = 1048576;
    op.bytes = 4 * op.count;
    op.reduction = "sum";
    op.stream = 0x7f00aa;
    op.enqueue_ns = 1'700'000'000'000'000'000 + static_cast<std::int64_t>(seq);
    op.state = seq == 19 ? "completed" : "started";
    comm.ring.push_back(op);
  }
  snapshot.comms.push_back(comm);
  CommSnapshot child = comm;
  child.id = "77aa000000000002";
  child.parent_id = comm.id;
  child.created_by = "ncclCommSplit";
  child.ring.clear();
  child.last_enqueued = child.last_started = child.last_completed = 0;
  snapshot.comms.push_back(child);
  snapshot.stall = StallSnapshot{.kind = "not_completed",
                                 .comm_id = comm.id,
                                 .seq = 20,
                                 .seconds = 15.0,
                                 .message = "rank 2 comm 9f3a…: AllReduce #20 started 15.0 s ago",
                                 .verdict = "stuck_inside_nccl",
                                 .verdict_message = "every rank entered AllReduce #20"};
  return snapshot;
}

ProcessFacts SomeFacts() {
  ProcessFacts facts;
  facts.host = "node17";
  facts.pid = 4242;
  facts.ppid = 1;
  facts.program = "/usr/bin/python3";
  facts.command_line = {"python3", "train.py"};
  facts.launcher = {{"RANK", "2"}, {"WORLD_SIZE", "4"}};
  facts.environment = {{"NCCL_DEBUG", "WARN"}};
  facts.kernel_release = "6.1.0";
  facts.driver_version = "580.65.06";
  facts.cuda.driver_version = 13000;
  facts.cuda.gpus.push_back(GpuFacts{.device = 1,
                                     .name = "NVIDIA H100",
                                     .pci_bus_id = "0000:19:00.0",
                                     .memory_free_bytes = 10,
                                     .memory_total_bytes = 80});
  facts.host_memory_available_bytes = 123;
  facts.rss_bytes = 456;
  return facts;
}

mode_t Mode(const std::string& path) {
  struct stat status {};
  REQUIRE(lstat(path.c_str(), &status) == 0);
  return status.st_mode & 07777;
}

std::vector<std::string> Names(const std::string& directory) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(directory)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

// n of dump-node17-4242-2-<n>.json, the name SomeFacts() and StalledSnapshot() give; -1 otherwise.
int DumpNumber(const std::string& name) {
  const std::string prefix = "dump-node17-4242-2-";
  const std::string suffix = ".json";
  if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return -1;
  }
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoi(digits);
}

// Threads left over from earlier tests finish on their own; waited for, bounded.
void WaitForBoundedThreadsToFinish() {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (detail::UnfinishedThreads() != 0 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::yield();
  }
  REQUIRE(detail::UnfinishedThreads() == 0);
}

TEST_CASE("the dump parses back, format and version first", "[dump]") {
  const std::string text = FormatDump(StalledSnapshot(), SomeFacts());
  REQUIRE(text.back() == '\n');
  const Json document = Json::parse(text);
  std::vector<std::string> keys;
  for (const auto& item : document.items()) keys.push_back(item.key());
  const std::vector<std::string> first_keys{
      "format", "format_version", "ncclguard_version", "nccl_version", "host", "pid", "rank", "reason",
      "time",   "time_ns"};
  REQUIRE(keys.size() > first_keys.size());
  CHECK(std::vector<std::string>(keys.begin(), keys.begin() + first_keys.size()) == first_keys);
  CHECK(document["format"] == "ncclguard-dump");
  CHECK(document["format_version"] == 2);
  CHECK(document["ncclguard_version"] == kVersion);
  CHECK(document["nccl_version"] == "2.28.9");
  CHECK(document["host"] == "node17");
  CHECK(document["pid"] == 4242);
  CHECK(document["rank"] == 2);
  CHECK(document["reason"] == "stall");
  CHECK(document["time"] == "2023-11-14T22:13:20.123Z");
  CHECK(document["time_ns"] == 1'700'000'000'123'456'789);

  CHECK(document["process"]["launcher"]["WORLD_SIZE"] == "4");
  CHECK(document["process"]["environment"]["NCCL_DEBUG"] == "WARN");
  CHECK(document["process"]["command_line"][1] == "train.py");
  CHECK(document["process"]["rss_bytes"] == 456);
  CHECK(document["system"]["driver_version"] == "580.65.06");
  CHECK(document["system"]["cuda_driver_version"] == 13000);
  CHECK(document["system"]["gpus"][0]["pci_bus_id"] == "0000:19:00.0");
  CHECK(document["system"]["gpus"][0]["memory_free_bytes"] == 10);
  CHECK(document["system"]["host_memory_total_bytes"] == -1);

  const Json& comms = document["communicators"];
  REQUIRE(comms.size() == 2);
  CHECK(comms[0]["id"] == "9f3a000000000001");
  CHECK(comms[0]["handle"] == "0x55d0c0de");
  CHECK(comms[0]["nranks"] == 4);
  CHECK(comms[1]["parent_id"] == "9f3a000000000001");
  CHECK(comms[1]["created_by"] == "ncclCommSplit");
  CHECK(comms[1]["ops"].empty());
  const Json& stuck = comms[0]["ops"][1];
  CHECK(stuck["seq"] == 20);
  CHECK(stuck["op"] == "AllReduce");
  CHECK(stuck["dtype"] == "float32");
  CHECK(stuck["count"] == 1048576);
  CHECK(stuck["bytes"] == 4194304);
  CHECK(stuck["reduction"] == "sum");
  CHECK(stuck["stream"] == "0x7f00aa");
  CHECK(stuck["root"] == -1);
  CHECK(stuck["state"] == "started");
  CHECK(stuck["enqueue_ns"] == 1'700'000'000'000'000'020);

  CHECK(document["stall"]["kind"] == "not_completed");
  CHECK(document["stall"]["seq"] == 20);
  CHECK(document["stall"]["seconds"] == 15.0);
  CHECK(document["watchdog"]["in_nccl_call"] == "ncclAllReduce");
  CHECK(document["watchdog"]["progress"][0]["last_completed"] == 19);
  CHECK(document["watchdog"]["progress"][0]["last_started"] == 20);
  CHECK(document["last_nccl_warning"] == "NCCL WARN peer 3 closed the connection");
}

std::vector<std::string> Keys(const Json& object) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : object.items()) keys.push_back(key);
  return keys;
}

TEST_CASE("each snapshot type has one JSON form; a status file carries a part of it", "[dump]") {
  OpSnapshot completed;
  completed.seq = 6;
  completed.op = "AllReduce";
  completed.dtype = "float32";
  completed.count = 1024;
  completed.bytes = 4096;
  completed.reduction = "sum";
  completed.stream = 0xffff'ffff'ffff'fff0;
  completed.state = "completed";
  OpSnapshot outstanding = completed;
  outstanding.seq = 7;
  outstanding.state = "started";
  outstanding.enqueue_ns = 11;
  outstanding.start_ns = 12;
  CommSnapshot comm;
  comm.id = "9f3a000000000001";
  comm.rank = 1;
  comm.nranks = 4;
  comm.state = "ready";
  comm.timing = "profiler";
  comm.last_enqueued = 7;
  comm.last_started = 7;
  comm.last_completed = 6;
  comm.ring = {completed, outstanding};

  // Every field of an operation, and back.
  const Json op_json = outstanding;
  const OpSnapshot op_back = ReadOp(nlohmann::json::parse(op_json.dump()), OpFields::kAll);
  CHECK(op_back.stream == outstanding.stream);
  CHECK(op_back.start_ns == 12);
  CHECK(Json(op_back) == op_json);

  const Json status = CommJson(comm, SnapshotDocument::kStatus);
  CHECK(Keys(status) == std::vector<std::string>{"id", "rank", "nranks", "device", "state", "timing",
                                                 "last_enqueued", "collectives", "last_started",
                                                 "last_completed", "async_error", "last_completed_op",
                                                 "oldest_outstanding", "signatures"});
  CHECK(Keys(status["last_completed_op"]) == std::vector<std::string>{"seq", "op", "coll_seq", "dtype",
                                                                      "count", "bytes", "root", "peer",
                                                                      "reduction"});
  CHECK(Keys(status["oldest_outstanding"]) == std::vector<std::string>{"seq", "op", "state", "bytes", "dtype",
                                                                       "count", "root", "peer", "reduction",
                                                                       "enqueue_ns", "start_ns", "coll_seq"});
  ProcessSnapshot process;
  process.comms = {comm};
  const absl::StatusOr<std::string> status_text = FormatStatus(process, ProcessFacts{});
  REQUIRE(status_text.ok());
  const absl::StatusOr<PeerStatus> read_back = ParseStatusRecord("status-x.json", *status_text);
  REQUIRE(read_back.ok());
  REQUIRE(read_back->snapshot.comms.size() == 1);
  const CommSnapshot& status_back = read_back->snapshot.comms[0];
  REQUIRE(status_back.ring.size() == 2);
  CHECK(status_back.ring[0].seq == 6);
  CHECK(status_back.ring[0].state == "completed");
  CHECK(status_back.ring[1].seq == 7);
  CHECK(status_back.ring[1].start_ns == 12);
  CHECK(status_back.last_completed == 6);

  // What a file gets wrong is an exception for the reader to report, never a crash.
  nlohmann::json wrong = nlohmann::json::parse(CommJson(comm, SnapshotDocument::kDump).dump());
  wrong["ops"] = nlohmann::json::object();
  CHECK_THROWS(ReadComm(wrong));
  wrong["ops"] = nlohmann::json::array({{{"seq", "seven"}}});
  CHECK_THROWS(ReadComm(wrong));
  wrong["ops"] = nlohmann::json::array();
  wrong["nranks"] = 100'000'000;
  CHECK_THROWS(ReadComm(wrong));
  CHECK_THROWS(ReadStall(nlohmann::json::array()));
}

TEST_CASE("a dump carries the pace blocks and reads them back", "[dump]") {
  ProcessSnapshot snapshot = StalledSnapshot();
  CommSnapshot& comm = snapshot.comms.at(0);
  PaceBlockSnapshot& block = comm.pace.emplace_back();
  block.first_seq = 1025;
  block.collectives = 7;
  block.wait_ms = 812.5;
  block.span_ms = 2000.25;
  block.links.push_back(
      PaceLinkSnapshot{.peer = 3, .channel = 1, .bytes = 1 << 20, .steps = 8, .network_ms = 3.5});
  const absl::StatusOr<ParsedDump> parsed = ParseDump(FormatDump(snapshot, SomeFacts()));
  REQUIRE(parsed.ok());
  const CommSnapshot& read_comm = parsed->snapshot.comms.at(0);
  REQUIRE(read_comm.pace.size() == 1);
  CHECK(read_comm.pace[0].first_seq == 1025);
  CHECK(read_comm.pace[0].wait_ms == 812.5);
  CHECK(read_comm.pace[0].span_ms == 2000.25);
  REQUIRE(read_comm.pace[0].links.size() == 1);
  CHECK(read_comm.pace[0].links[0].channel == 1);
  CHECK(read_comm.pace[0].links[0].network_ms == 3.5);
}

TEST_CASE("a dump without communicators, stall or rank is still complete", "[dump]") {
  ProcessSnapshot snapshot;
  snapshot.reason = "signal";
  ProcessFacts facts;
  facts.launcher = {{"SLURM_PROCID", "7"}};
  const Json document = Json::parse(FormatDump(snapshot, facts));
  CHECK(document["rank"] == 7);  // the launcher's, when no communicator gave one
  CHECK(document["nccl_version"] == "unknown");
  CHECK(document["stall"].is_null());
  CHECK(document["communicators"].empty());
  CHECK(document["time"] == "1970-01-01T00:00:00.000Z");
}

TEST_CASE("invalid UTF-8 from NCCL does not break the dump", "[dump]") {
  ProcessSnapshot snapshot = StalledSnapshot();
  snapshot.last_nccl_warning = "bad \xff\xfe bytes";
  std::string text;
  REQUIRE_NOTHROW(text = FormatDump(snapshot, SomeFacts()));
  CHECK(Json::parse(text)["last_nccl_warning"].get<std::string>().find("bad") == 0);
}

TEST_CASE("a dump is written atomically, 0600, in 0700 directories created as needed", "[dump]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/dumps/job-1";
  const DumpResult first = WriteDump(job_dir, StalledSnapshot(), SomeFacts());
  REQUIRE(first.ok());
  const DumpResult second = WriteDump(job_dir, StalledSnapshot(), SomeFacts());
  REQUIRE(second.ok());
  CHECK(*first != *second);
  const std::string first_name = fs::path(*first).filename();
  const std::string second_name = fs::path(*second).filename();
  CHECK(DumpNumber(first_name) > 0);
  CHECK(DumpNumber(second_name) == DumpNumber(first_name) + 1);
  CHECK(fs::path(*first).parent_path() == job_dir);

  CHECK(Names(job_dir) ==
        std::vector<std::string>{std::min(first_name, second_name), std::max(first_name, second_name)});
  CHECK(Mode(*first) == 0600);
  CHECK(Mode(job_dir) == 0700);
  CHECK(Mode(temporary.path() + "/dumps") == 0700);
  CHECK(Json::parse(testing::ReadFile(*first)) == Json::parse(FormatDump(StalledSnapshot(), SomeFacts())));
}

TEST_CASE("the umask does not change a dump's mode", "[dump]") {
  TemporaryDirectory temporary;
  const mode_t previous = umask(0);
  const DumpResult written = WriteDump(temporary.path() + "/job", StalledSnapshot(), SomeFacts());
  umask(previous);
  REQUIRE(written.ok());
  CHECK(Mode(*written) == 0600);
  CHECK(Mode(temporary.path() + "/job") == 0700);
}

TEST_CASE("a job directory that is a symbolic link is refused", "[dump]") {
  TemporaryDirectory temporary;
  const std::string elsewhere = temporary.path() + "/elsewhere";
  fs::create_directory(elsewhere);
  const std::string job_dir = temporary.path() + "/job";
  fs::create_directory_symlink(elsewhere, job_dir);
  for (const std::string& path : {job_dir, job_dir + "/"}) {
    const DumpResult written = WriteDump(path, StalledSnapshot(), SomeFacts());
    REQUIRE_FALSE(written.ok());
    CHECK(written.status().message().find("symbolic link") != std::string::npos);
  }
  CHECK(fs::is_empty(elsewhere));
}

TEST_CASE("a job directory that belongs to another user is refused", "[dump]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  REQUIRE(mkdir(job_dir.c_str(), 0700) == 0);
  if (geteuid() != 0) {
    WARN("not root: cannot give a directory to another user; part of this test skipped");
    return;
  }
  REQUIRE(chown(job_dir.c_str(), 12345, 12345) == 0);
  const DumpResult written = WriteDump(job_dir, StalledSnapshot(), SomeFacts());
  REQUIRE_FALSE(written.ok());
  CHECK(written.status().message().find("belongs to uid 12345") != std::string::npos);
  CHECK(fs::is_empty(job_dir));
}

TEST_CASE("an unwritable job directory is an error, not an exception", "[dump]") {
  TemporaryDirectory temporary;
  const std::string file = temporary.path() + "/a-file";
  std::ofstream(file) << "x";
  DumpResult written = absl::UnknownError("not run");
  REQUIRE_NOTHROW(written = WriteDump(file + "/job", StalledSnapshot(), SomeFacts()));
  REQUIRE_FALSE(written.ok());
  CHECK(written.status().message().find(file) != std::string::npos);
  REQUIRE_NOTHROW(written = WriteDump("relative/job", StalledSnapshot(), SomeFacts()));
  CHECK_FALSE(written.ok());
}

TEST_CASE("a full disk fails the write and leaves no temporary file", "[dump]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  REQUIRE(mkdir(job_dir.c_str(), 0700) == 0);
  // The file size limit makes write() fail with EFBIG part way, as ENOSPC would.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  struct sigaction previous_action {};
  REQUIRE(sigaction(SIGXFSZ, &ignore, &previous_action) == 0);
  rlimit previous_limit{};
  REQUIRE(getrlimit(RLIMIT_FSIZE, &previous_limit) == 0);
  rlimit small = previous_limit;
  small.rlim_cur = 100;
  REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
  const DumpResult written = WriteDump(job_dir, StalledSnapshot(), SomeFacts());
  setrlimit(RLIMIT_FSIZE, &previous_limit);
  sigaction(SIGXFSZ, &previous_action, nullptr);
  REQUIRE_FALSE(written.ok());
  CHECK(written.status().message().find("write") != std::string::npos);
  CHECK(fs::is_empty(job_dir));
}

TEST_CASE("an existing file of the same name is replaced, a symbolic link is not followed", "[dump]") {
  TemporaryDirectory temporary;
  const std::string job_dir = temporary.path() + "/job";
  const std::string target = temporary.path() + "/precious";
  std::ofstream(target) << "keep me";
  REQUIRE(mkdir(job_dir.c_str(), 0700) == 0);
  fs::create_symlink(target, job_dir + "/status.json");
  const absl::StatusOr<std::string> written = WriteFileAtomically(job_dir, "status.json", "{}\n", false);
  REQUIRE(written.ok());
  CHECK(testing::ReadFile(target) == "keep me");
  CHECK_FALSE(fs::is_symlink(job_dir + "/status.json"));
  CHECK(testing::ReadFile(job_dir + "/status.json") == "{}\n");
  REQUIRE(WriteFileAtomically(job_dir, "status.json", "[]\n", false).ok());
  CHECK(testing::ReadFile(job_dir + "/status.json") == "[]\n");
  CHECK(Names(job_dir) == std::vector<std::string>{"status.json"});
}

TEST_CASE("work that hangs is abandoned at the deadline", "[dump]") {
  WaitForBoundedThreadsToFinish();
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> finished{0};
  auto hanging = [released, &finished]() -> absl::StatusOr<int> {
    released.wait();
    finished.fetch_add(1);
    return 1;
  };
  const auto start = std::chrono::steady_clock::now();
  const absl::StatusOr<int> result = RunWithDeadline<int>(hanging, std::chrono::milliseconds(50));
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(absl::IsDeadlineExceeded(result.status()));
  CHECK(waited >= std::chrono::milliseconds(50));
  CHECK(waited < std::chrono::seconds(5));

  // Abandoned work still occupies its thread: past a few, nothing more is started.
  int refused_after = 0;
  for (int attempt = 1; attempt <= 10 && refused_after == 0; ++attempt) {
    const absl::StatusOr<int> more = RunWithDeadline<int>(hanging, std::chrono::milliseconds(1));
    if (absl::IsUnavailable(more.status())) refused_after = attempt;
  }
  CHECK(refused_after == 4);  // the first hung one plus three more fill the four threads

  release.set_value();
  WaitForBoundedThreadsToFinish();
  CHECK(finished.load() == 4);
  const absl::StatusOr<int> quick =
      RunWithDeadline<int>([]() -> absl::StatusOr<int> { return 7; }, std::chrono::seconds(5));
  REQUIRE(quick.ok());
  CHECK(*quick == 7);
}

TEST_CASE("the bounded thread runs with every signal blocked", "[dump]") {
  const absl::StatusOr<bool> blocked = RunWithDeadline<bool>(
      []() -> absl::StatusOr<bool> {
        sigset_t mask;
        pthread_sigmask(SIG_SETMASK, nullptr, &mask);
        return sigismember(&mask, SIGUSR2) == 1 && sigismember(&mask, SIGTERM) == 1;
      },
      std::chrono::seconds(5));
  REQUIRE(blocked.ok());
  CHECK(*blocked);
  sigset_t mine;
  pthread_sigmask(SIG_SETMASK, nullptr, &mine);
  CHECK(sigismember(&mine, SIGUSR2) == 0);  // the caller's mask is restored
}

// Run as a test program of its own (ctest watchdog.dump.log_once): "once per process" needs a
// process in which nothing failed before.
TEST_CASE("failures are logged once per process", "[own-process]") {
  TemporaryDirectory temporary;
  Config config;
  config.log_file = temporary.path() + "/log";
  log::Start(config);
  const std::string file = temporary.path() + "/a-file";
  std::ofstream(file) << "x";
  const DumpResult first = WriteDump(file + "/job-one", StalledSnapshot(), SomeFacts());
  const DumpResult second = WriteDump(file + "/job-two", StalledSnapshot(), SomeFacts());
  CHECK_FALSE(first.ok());
  CHECK_FALSE(second.ok());
  const std::string logged = testing::ReadFile(config.log_file);
  CHECK(testing::CountOccurrences(logged, " WARN ") == 1);
  CHECK(testing::CountOccurrences(logged, "job-one") == 1);
  CHECK(testing::CountOccurrences(logged, "job-two") == 0);
  CHECK(testing::CountOccurrences(logged, "NCCLGUARD_DUMP_DIR") == 1);
}

TEST_CASE("every thread's stack goes into the dump and reads back; version 1 dumps are still read",
          "[dump]") {
  ProcessSnapshot snapshot = StalledSnapshot();
  ThreadsSnapshot threads;
  threads.time_ns = 1'700'000'000'000'000'000;
  threads.total = 2;
  threads.python_version = "3.11.7";
  ThreadSnapshot& main_thread = threads.threads.emplace_back();
  main_thread.tid = 4242;
  main_thread.name = "python3";
  main_thread.state = "sleeping";
  main_thread.syscall = "read";
  main_thread.fd = 5;
  main_thread.fd_target = "pipe:[42]";
  main_thread.blocked_seconds = 12.5;
  FrameSnapshot& python = main_thread.python.emplace_back();
  python.function = "save_checkpoint";
  python.file = "train.py";
  python.line = 88;
  FrameSnapshot& native = main_thread.native.emplace_back();
  native.function = "read";
  native.module = "/lib/x86_64-linux-gnu/libc.so.6";
  native.offset = 0xf82ea;
  ThreadSnapshot& blocking = threads.threads.emplace_back();
  blocking.tid = 4243;
  blocking.native_missing = "it blocks the stack signal";
  snapshot.threads = threads;

  const std::string text = FormatDump(snapshot, SomeFacts());
  const absl::StatusOr<ParsedDump> parsed = ParseDump(text);
  REQUIRE(parsed.ok());
  REQUIRE(parsed->snapshot.threads.has_value());
  const ThreadsSnapshot& read = *parsed->snapshot.threads;
  CHECK(read.time_ns == threads.time_ns);
  CHECK(read.python_version == "3.11.7");
  REQUIRE(read.threads.size() == 2);
  CHECK(read.threads[0].fd_target == "pipe:[42]");
  CHECK(read.threads[0].blocked_seconds == 12.5);
  REQUIRE(read.threads[0].python.size() == 1);
  CHECK(read.threads[0].python[0].function == "save_checkpoint");
  CHECK(read.threads[0].python[0].line == 88);
  REQUIRE(read.threads[0].native.size() == 1);
  CHECK(read.threads[0].native[0].offset == 0xf82ea);
  CHECK(read.threads[0].native[0].module == "/lib/x86_64-linux-gnu/libc.so.6");
  CHECK(read.threads[1].native_missing == "it blocks the stack signal");

  // A version 1 dump (no threads) is read; a version from the future is refused, with why.
  Json old = Json::parse(text);
  old["format_version"] = 1;
  old.erase("threads");
  const absl::StatusOr<ParsedDump> version_1 = ParseDump(old.dump());
  REQUIRE(version_1.ok());
  CHECK_FALSE(version_1->snapshot.threads.has_value());
  old["format_version"] = 3;
  const absl::StatusOr<ParsedDump> version_3 = ParseDump(old.dump());
  REQUIRE_FALSE(version_3.ok());
  CHECK(std::string(version_3.status().message()).find("a newer ncclguard wrote it") != std::string::npos);
}

TEST_CASE("a dump's frames stop at their budget: later threads are listed without them", "[dump]") {
  ThreadsSnapshot threads;
  for (int i = 0; i < 1000; ++i) {
    ThreadSnapshot& thread = threads.threads.emplace_back();
    thread.tid = 1000 + i;
    for (int f = 0; f < 64; ++f) {
      FrameSnapshot& frame = thread.native.emplace_back();
      frame.function = std::string(100, 'f');
      frame.module = std::string(100, 'm');
    }
  }
  const auto json = ThreadsJson(threads, kThreadFramesBudget);
  const std::string text = json.dump();
  CHECK(json["threads"].size() == 1000);  // every thread listed
  CHECK(json["threads"][0]["frames_omitted"] == false);
  CHECK(json["threads"][999]["frames_omitted"] == true);
  CHECK(json["threads"][999]["native"].empty());
  CHECK(text.size() < kThreadFramesBudget + 1000 * 512);
}

}  // namespace
}  // namespace ncclguard
