// Which source times a communicator's operations (docs/architecture.md, "Timing"), end to end on
// the emulator: with NCCL's profiler the application's thread makes no driver call per operation,
// and the log and the dump name the source (ctest names watchdog_e2e.*, too).
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/support/process.h"
#include "tests/support/train_loop_output.h"

using ncclguard::testing::EmulatorJobEnvironment;
using ncclguard::testing::ProcessOptions;
using ncclguard::testing::ProcessResult;
using ncclguard::testing::ReadFile;
using ncclguard::testing::RunProcess;
using ncclguard::testing::TemporaryDirectory;
using Json = nlohmann::json;

namespace {

constexpr char kJobId[] = "timing";

struct Run {
  ProcessResult result;
  double driver_calls = -1;  // per group of two AllReduces, on the application's thread
  std::string job_dir;
  std::string transcript;
};

Run DriverCalls(const TemporaryDirectory& dump_dir,
                std::map<std::string, std::optional<std::string>> settings, bool guarded,
                const std::vector<std::string>& arguments = {"600"}) {
  ProcessOptions options;
  options.environment = EmulatorJobEnvironment(EMULATOR_LIBRARY_DIR, dump_dir.path(), kJobId);
  if (guarded) options.environment["LD_PRELOAD"] = PRELOAD_LIBRARY;
  for (auto& [name, value] : settings) options.environment[name] = value;
  Run run;
  // More groups than the ring has slots: the application's thread reclaims slots as it goes.
  std::vector<std::string> command = {DRIVER_CALLS_PROGRAM};
  command.insert(command.end(), arguments.begin(), arguments.end());
  run.result = RunProcess(command, options);
  run.job_dir = dump_dir.path() + "/" + kJobId;
  run.transcript = "stdout:\n" + run.result.out + "\nstderr:\n" + run.result.err;
  static const std::regex calls(R"(driver calls per group: ([0-9.]+))");
  std::smatch match;
  if (std::regex_search(run.result.out, match, calls)) run.driver_calls = std::stod(match[1]);
  return run;
}

// The job directory's documents of one format: "ncclguard-dump" or "ncclguard-status".
std::vector<Json> Documents(const std::string& job_dir, const std::string& format = "ncclguard-dump") {
  std::vector<Json> dumps;
  if (!std::filesystem::exists(job_dir)) return dumps;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(job_dir)) {
    if (!entry.is_regular_file() || entry.path().filename() == "generation") continue;
    Json document = Json::parse(ReadFile(entry.path().string()), nullptr, false);
    if (!document.is_discarded() && document.value("format", "") == format)
      dumps.push_back(std::move(document));
  }
  return dumps;
}

}  // namespace

TEST_CASE("with NCCL's profiler the application's thread makes no driver call per collective", "[timing]") {
  TemporaryDirectory dump_dir;
  const Run unguarded = DriverCalls(dump_dir, {}, false);
  INFO(unguarded.transcript);
  REQUIRE(unguarded.result.exit_code == 0);
  REQUIRE(unguarded.driver_calls >= 0);

  const std::map<std::string, std::optional<std::string>> common = {
      {"NCCLGUARD_RING_SIZE", "64"}, {"NCCLGUARD_LOG_LEVEL", "info"}, {"NCCLGUARD_DUMP_ON_EXIT", "1"}};
  auto with = [&](const char* profiler) {
    auto settings = common;
    settings["NCCLGUARD_PROFILER"] = profiler;
    return settings;
  };
  const Run profiled = DriverCalls(dump_dir, with("1"), true);
  INFO(profiled.transcript);
  REQUIRE(profiled.result.exit_code == 0);
  CHECK(profiled.driver_calls == unguarded.driver_calls);
  CHECK(std::regex_search(profiled.result.err,
                          std::regex("comm [0-9a-f]{16}: operations timed by NCCL's profiler")));
  const std::vector<Json> dumps = Documents(profiled.job_dir);
  REQUIRE(dumps.size() == 1);
  REQUIRE(dumps[0].at("communicators").size() == 2);
  for (const Json& comm : dumps[0].at("communicators")) {
    CHECK(comm.at("timing") == "profiler");
    CHECK(comm.at("dropped") == 0);
    // Every operation the ring still holds completed on the GPU, timed by its kernel channels.
    REQUIRE_FALSE(comm.at("ops").empty());
    for (const Json& op : comm.at("ops")) {
      CHECK(op.at("state") == "completed");
      CHECK(op.at("gpu_ms").get<double>() >= 0);
    }
  }

  TemporaryDirectory events_dir;
  const Run events = DriverCalls(events_dir, with("0"), true);
  INFO(events.transcript);
  REQUIRE(events.result.exit_code == 0);
  // A capture query and two event records per AllReduce, at least.
  CHECK(events.driver_calls >= unguarded.driver_calls + 6);
  CHECK(events.result.err.find("operations timed by CUDA events (NCCLGUARD_PROFILER=0)") !=
        std::string::npos);
  const std::vector<Json> event_dumps = Documents(events.job_dir);
  REQUIRE(event_dumps.size() == 1);
  for (const Json& comm : event_dumps[0].at("communicators")) CHECK(comm.at("timing") == "cuda_events");
}

TEST_CASE(
    "10,000 collectives queued back to back on one communicator are all numbered, the ring says how many "
    "it could not keep, and no reclaim lands on the application's thread",
    "[timing]") {
  // Behind a held stream none of them runs while the application queues them: a ring of 64 keeps
  // the first 64 and counts every later one as dropped, on either source.
  constexpr int kGroups = 10000;
  constexpr int kWarmUp = 16;  // driver_calls.cc's, completed before the burst
  constexpr int kRing = 64;
  const std::vector<std::string> burst = {std::to_string(kGroups), "held"};
  TemporaryDirectory unguarded_dir;
  const Run unguarded = DriverCalls(unguarded_dir, {}, false, burst);
  INFO(unguarded.transcript);
  REQUIRE(unguarded.result.exit_code == 0);
  REQUIRE(unguarded.driver_calls >= 0);

  for (const char* profiler : {"1", "0"}) {
    CAPTURE(profiler);
    TemporaryDirectory dump_dir;
    const Run run = DriverCalls(dump_dir,
                                {{"NCCLGUARD_RING_SIZE", std::to_string(kRing)},
                                 {"NCCLGUARD_DUMP_ON_EXIT", "1"},
                                 {"NCCLGUARD_PROFILER", profiler}},
                                true, burst);
    INFO(run.transcript);
    REQUIRE(run.result.exit_code == 0);
    const std::vector<Json> dumps = Documents(run.job_dir);
    REQUIRE(dumps.size() == 1);
    REQUIRE(dumps[0].at("communicators").size() == 2);
    for (const Json& comm : dumps[0].at("communicators")) CHECK(comm.at("dropped") == kGroups - kRing);
    // Every one of them was numbered (the status file written at exit says the last number).
    const std::vector<Json> statuses = Documents(run.job_dir, "ncclguard-status");
    REQUIRE(statuses.size() == 1);
    REQUIRE(statuses[0].at("communicators").size() == 2);
    for (const Json& comm : statuses[0].at("communicators"))
      CHECK(comm.at("last_enqueued") == kWarmUp + kGroups);
    if (std::string(profiler) == "1") {
      // Not one driver call more than NCCL's own, the burst's reclaims included.
      CHECK(run.driver_calls == unguarded.driver_calls);
    } else {
      // The 64 kept collectives' capture query and two event records, each on both ranks; a
      // reclaim that asked the GPU for every later one would add three calls per collective.
      CHECK(run.driver_calls <= unguarded.driver_calls + 0.2);
    }
  }
}
