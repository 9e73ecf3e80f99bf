// Time the application did not run, and time it spent waiting on a slow rank, end to end:
// train_loop on the emulator with libncclguard.so preloaded. A rank stopped with SIGSTOP while the
// machine is loaded, then continued, reports no stall of its own and aborts nothing, and its
// peers say that it is stopped; a persistent straggler does not make its peers dump at every step.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/process.h"
#include "tests/support/train_loop_output.h"

using ncclguard::testing::Checksums;
using ncclguard::testing::CountOccurrences;
using ncclguard::testing::EmulatorJobEnvironment;
using ncclguard::testing::LogLinesOf;
using ncclguard::testing::ProcessOptions;
using ncclguard::testing::ProcessResult;
using ncclguard::testing::RankPids;
using ncclguard::testing::ReadFile;
using ncclguard::testing::RunProcess;
using ncclguard::testing::TemporaryDirectory;
using Json = nlohmann::json;
using Environment = std::map<std::string, std::optional<std::string>>;

namespace {

constexpr char kJobId[] = "e2e";

struct Run {
  ProcessResult result;
  std::string job_dir;
  std::string transcript;  // for the test's messages
};

Run RunTrainLoop(const TemporaryDirectory& dump_dir, std::vector<std::string> arguments,
                 const Environment& settings, double timeout_seconds) {
  ProcessOptions options;
  options.timeout_seconds = timeout_seconds;
  options.environment = EmulatorJobEnvironment(EMULATOR_LIBRARY_DIR, dump_dir.path(), kJobId);
  options.environment["LD_PRELOAD"] = PRELOAD_LIBRARY;
  for (const auto& [name, value] : settings) options.environment[name] = value;
  arguments.insert(arguments.begin(), TRAIN_LOOP);
  Run run;
  run.result = RunProcess(arguments, options);
  run.job_dir = dump_dir.path() + "/" + kJobId;
  run.transcript = "exit code " + std::to_string(run.result.exit_code) + ", signal " +
                   std::to_string(run.result.signal) + (run.result.timed_out ? ", timed out" : "") +
                   "\nstdout:\n" + run.result.out + "\nstderr:\n" + run.result.err;
  return run;
}

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

// Keeps every core of the machine busy while it lives: the rank's threads then resume in no
// particular order after a stop, as on a node busy with data loading.
class CpuBurners {
 public:
  CpuBurners() {
    const unsigned cores = std::max(2u, std::thread::hardware_concurrency());
    for (unsigned index = 0; index < cores; ++index) {
      threads_.emplace_back([this] {
        volatile std::uint64_t spin = 0;
        while (!stop_.load(std::memory_order_relaxed)) spin = spin + 1;
      });
    }
  }
  ~CpuBurners() {
    stop_.store(true);
    for (std::thread& thread : threads_) thread.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

struct Dump {
  int pid = 0;
  Json document;
};

std::vector<Dump> Dumps(const std::string& job_dir) {
  std::vector<Dump> dumps;
  if (!std::filesystem::exists(job_dir)) return dumps;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(job_dir)) {
    if (!entry.is_regular_file() || !entry.path().filename().string().starts_with("dump-")) continue;
    Json document = Json::parse(ReadFile(entry.path().string()));
    if (document.value("format", "") != "ncclguard-dump") continue;
    dumps.push_back({document.at("pid").get<int>(), std::move(document)});
  }
  return dumps;
}

bool ReportsAnyStall(const std::vector<std::string>& lines) {
  return std::ranges::any_of(lines, [](const std::string& line) {
    return line.find("has not completed") != std::string::npos || line.find("has not started") != std::string::npos;
  });
}

}  // namespace

// A job frozen and thawed (a cgroup freezer, a paused VM) resumes its processes one after the
// other: here rank 0 stops first, rank 2 a moment later while it waits for rank 0 inside an
// AllReduce, and rank 2 is continued 0.5 s before rank 0. Rank 2's first look after the stop finds
// its AllReduce started 6 s before and not completed (rank 0 does not run yet): none of that time
// was a stall.
TEST_CASE("ranks stopped and continued on a loaded machine report no stall, abort nothing and are said to be "
          "stopped by their peers",
          "[pause]") {
  TemporaryDirectory dump_dir;
  const std::string job_dir = dump_dir.path() + "/" + kJobId;
  std::optional<Run> run;
  std::optional<int> first;   // rank 0
  std::optional<int> second;  // rank 2
  {
    CpuBurners burners;
    std::thread job([&] {
      // Rank 1 takes 20 ms longer per step: the job lasts 10 s and more, well past the stops.
      run = RunTrainLoop(dump_dir, {"--ranks", "4", "--steps", "500", "--slow", "1:20", "--timeout", "90"},
                         {{"NCCLGUARD_TIMEOUT", "3"},
                          {"NCCLGUARD_ACTION", "abort"},
                          {"NCCLGUARD_STATUS_INTERVAL", "0.5"}},
                         120);
    });
    first = WaitForStatusOfRank(job_dir, 0, 60);
    second = WaitForStatusOfRank(job_dir, 2, 60);
    if (first && second) {
      std::this_thread::sleep_for(std::chrono::seconds(1));  // in the middle of their steps
      kill(*first, SIGSTOP);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // rank 2 waits for rank 0
      kill(*second, SIGSTOP);
      std::this_thread::sleep_for(std::chrono::seconds(6));  // two timeouts
      kill(*second, SIGCONT);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      kill(*first, SIGCONT);
    }
    job.join();
  }
  REQUIRE(run);
  INFO(run->transcript);
  REQUIRE(first);
  REQUIRE(second);
  REQUIRE_FALSE(run->result.timed_out);
  // The job completes: nobody aborted a communicator of this healthy job.
  CHECK(run->result.exit_code == 0);
  CHECK(Checksums(run->result.out).size() == 4);
  CHECK(CountOccurrences(run->result.err, "aborting comm") == 0);
  // The stopped ranks found no stall in the time they did not run.
  CHECK_FALSE(ReportsAnyStall(LogLinesOf(run->result.err, *second, "")));
  CHECK_FALSE(ReportsAnyStall(LogLinesOf(run->result.err, *first, "")));
  // Their peers waited on them (two timeouts) and said they were stopped, not busy.
  int peers_saying_stopped = 0;
  for (const int peer : {RankPids(run->result.out)[1], RankPids(run->result.out)[3]}) {
    const std::vector<std::string> lines =
        LogLinesOf(run->result.err, peer, "rank 0 (pid " + std::to_string(*first) + ") is stopped");
    if (!lines.empty()) ++peers_saying_stopped;
    for (const std::string& line : lines) CHECK(line.find("busy outside NCCL (e.g.") == std::string::npos);
  }
  CHECK(peers_saying_stopped >= 1);
}

TEST_CASE("a persistent straggler slower than the timeout does not make its peers dump at every step",
          "[dumps]") {
  TemporaryDirectory dump_dir;
  // 14 steps of 1.5 s, each a stall of 0.5 s past the timeout on ranks 0, 1 and 2.
  const Run run = RunTrainLoop(dump_dir, {"--ranks", "4", "--steps", "14", "--slow", "3:1500", "--timeout", "90"},
                               {{"NCCLGUARD_TIMEOUT", "1"}, {"NCCLGUARD_STATUS_INTERVAL", "0.5"}}, 120);
  INFO(run.transcript);
  REQUIRE_FALSE(run.result.timed_out);
  CHECK(run.result.exit_code == 0);
  const std::map<int, int> pids = RankPids(run.result.out);
  REQUIRE(pids.size() == 4);
  const std::vector<Dump> dumps = Dumps(run.job_dir);
  INFO(dumps.size() << " dumps");
  std::map<int, int> stall_dumps;  // pid -> how many
  int skipped_in_dumps = 0;
  for (const Dump& dump : dumps) {
    if (dump.document.at("stall").is_null()) continue;
    ++stall_dumps[dump.pid];
    skipped_in_dumps += dump.document.at("stall").value("skipped_dumps", 0);
  }
  for (int rank = 0; rank < 3; ++rank) {
    const int pid = pids.at(rank);
    const std::vector<std::string> stalls = LogLinesOf(run.result.err, pid, "has not completed");
    INFO("rank " << rank << ": " << stalls.size() << " stalls, " << stall_dumps[pid] << " dumped");
    // The straggler makes it stall at most steps...
    CHECK(stalls.size() >= 8);
    // ... but dumps come at most once per timeout, the spacing doubling: 1, 2, 4, 8, 16 s (the
    // sixth needs a job of over 31 s).
    CHECK(stall_dumps[pid] >= 1);
    CHECK(stall_dumps[pid] <= 6);
    // The stalls not dumped are said, with their count.
    CHECK(LogLinesOf(run.result.err, pid, "not dumped: the same operation stalled before (").size() ==
          stalls.size() - static_cast<std::size_t>(stall_dumps[pid]));
  }
  CHECK(skipped_in_dumps >= 1);
  // Where the straggler is comes from its last dump, taken as it began a step: said as of then.
  CHECK(run.result.err.find("sleeping for 0.0 s") == std::string::npos);
  // Nor does the straggler dump at every step at their request: only when they dump.
  const int straggler = pids.at(3);
  CHECK(std::ranges::count_if(dumps, [straggler](const Dump& dump) { return dump.pid == straggler; }) <= 7);
}
