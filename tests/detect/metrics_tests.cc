// NCCLGUARD_METRICS_DIR: what the watchdog counts and publishes, the text format, and the file.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

#include "tests/detect/fakes.h"
#include "watchdog/detect/metrics.h"
#include "watchdog/detect/watchdog.h"
#include "watchdog/state/registry.h"

using namespace ncclguard;
using ncclguard::testing::EnqueueAllReduce;
using ncclguard::testing::ExitCalled;
using ncclguard::testing::FakeGpuEvents;
using ncclguard::testing::RecordingEffects;

namespace {

constexpr std::int64_t kSecond = 1'000'000'000;

// A watchdog over one ready communicator, acting as `action` says.
struct Watched : ncclguard::testing::WatchdogFixture {
  explicit Watched(Action action) : WatchdogFixture(Configured(action), 1) {}
  static Config Configured(Action action) {
    Config config;
    config.timeout = Seconds{10};
    config.status_interval = Seconds{2};
    config.action = action;
    return config;
  }
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE("the metrics count the stall, its verdict, the dump and the action, and say when the process exits",
          "[metrics]") {
  Watched w(Action::kExit);
  w.effects.verdicts = {Verdict{.kind = VerdictKind::kStuckInsideNccl, .comm = "", .seq = 1, .ranks = {2}}};
  for (int i = 0; i < 3; ++i) EnqueueAllReduce(*w.comm, w.events, 0);
  w.watchdog.PollOnce(1 * kSecond);
  REQUIRE_FALSE(w.effects.metrics.empty());  // the first status brings the first publication
  CHECK(w.effects.metrics.back().operations == 3);
  CHECK(w.effects.metrics.back().counts.operation_stalls == 0);
  CHECK(w.effects.metrics.back().running);
  CHECK_THROWS_AS(w.watchdog.PollOnce(12 * kSecond), ExitCalled);
  const MetricsSample& last = w.effects.metrics.back();
  CHECK(last.counts.operation_stalls == 1);
  CHECK(last.counts.init_stalls == 0);
  CHECK(last.counts.stall_verdicts ==
        std::map<std::string, std::uint64_t, std::less<>>{{"stuck_inside_nccl", 1}});
  CHECK(last.counts.dumps_written == 1);
  CHECK(last.counts.exits == 1);
  CHECK(last.stalled);
  CHECK_FALSE(last.running);  // published just before the exit
  CHECK(last.rounds == 2);
}

TEST_CASE("the operations counted never go down when a communicator is freed", "[metrics]") {
  Registry registry;
  FakeGpuEvents events;
  WatchdogMetrics metrics;
  CommState* first = registry.Add(reinterpret_cast<ncclComm_t>(0x10), 0, 16);
  CommState* second = registry.Add(reinterpret_cast<ncclComm_t>(0x20), 0, 16);
  for (int i = 0; i < 5; ++i) EnqueueAllReduce(*first, events, 0);
  for (int i = 0; i < 2; ++i) EnqueueAllReduce(*second, events, 0);
  CHECK(metrics.Sample(registry, 0, false, true, 0).operations == 7);
  registry.Remove(first);
  CHECK(metrics.Sample(registry, 0, false, true, 0).operations == 7);
  EnqueueAllReduce(*second, events, 0);
  const MetricsSample sample = metrics.Sample(registry, 0, false, true, 0);
  CHECK(sample.operations == 8);
  CHECK(sample.communicators == 1);
}

TEST_CASE("the text is Prometheus's exposition format, with every label value quoted safely", "[metrics]") {
  MetricsSample sample;
  sample.counts.operation_stalls = 2;
  sample.counts.stall_verdicts["link_stalled"] = 2;
  sample.counts.recoveries_recovered = 1;
  sample.operations = 12345;
  sample.wall_ns = 1'700'000'000'250'000'000;
  const MetricsLabels labels{.job = "train \"big\"\\run\n2\xff", .host = "node7", .pid = 42, .rank = 3};
  const std::string text = PrometheusText(sample, labels);
  const std::string series = R"(job="train \"big\"\\run_2_",host="node7",pid="42",rank="3")";
  CHECK(text.find("ncclguard_stalls_total{" + series + R"(,kind="operation"} 2)" + "\n") !=
        std::string::npos);
  CHECK(text.find("ncclguard_stall_verdicts_total{" + series + R"(,verdict="link_stalled"} 2)") !=
        std::string::npos);
  // The kinds that have not happened are there at 0, so that increase() sees their first.
  CHECK(text.find("ncclguard_stall_verdicts_total{" + series + R"(,verdict="p2p_suspect"} 0)") !=
        std::string::npos);
  CHECK(text.find("ncclguard_recoveries_total{" + series + R"(,outcome="recovered"} 1)") !=
        std::string::npos);
  CHECK(text.find("ncclguard_operations_total{" + series + "} 12345\n") != std::string::npos);
  CHECK(text.find("ncclguard_up{" + series + "} 1\n") != std::string::npos);
  CHECK(text.find("ncclguard_last_update_timestamp_seconds{" + series + "} 1700000000.250\n") !=
        std::string::npos);
  // Every line is a comment or `name{labels} value`; every family is typed before its samples.
  std::istringstream lines(text);
  std::string line;
  std::string typed;
  while (std::getline(lines, line)) {
    INFO(line);
    if (line.rfind("# TYPE ", 0) == 0) {
      typed = line.substr(7, line.find(' ', 7) - 7);
      continue;
    }
    if (line.rfind("# HELP ", 0) == 0) continue;
    CHECK(line.rfind(typed + "{", 0) == 0);
    CHECK(line.find("} ") != std::string::npos);
  }
  CHECK(MetricsFileName(labels) == "ncclguard_train__big__run_2__node7_42.prom");
}

TEST_CASE("the metrics file is replaced whole, readable by others, and never written through a link",
          "[metrics]") {
  const std::string directory =
      std::filesystem::temp_directory_path() / ("metrics-" + std::to_string(getpid()));
  std::filesystem::remove_all(directory);
  std::filesystem::create_directories(directory);
  const std::string target = directory + "/victim";
  std::ofstream(target) << "keep";
  std::filesystem::create_symlink(target, directory + "/ncclguard_j_h_1.prom");
  const mode_t previous = umask(077);
  REQUIRE(WriteMetricsFile(directory, "ncclguard_j_h_1.prom", "first\n", std::chrono::seconds(5)).ok());
  REQUIRE(WriteMetricsFile(directory, "ncclguard_j_h_1.prom", "second\n", std::chrono::seconds(5)).ok());
  umask(previous);
  const std::string path = directory + "/ncclguard_j_h_1.prom";
  CHECK_FALSE(std::filesystem::is_symlink(path));
  CHECK(ReadAll(path) == "second\n");
  CHECK(ReadAll(target) == "keep");
  struct stat status {};
  REQUIRE(stat(path.c_str(), &status) == 0);
  CHECK((status.st_mode & 0777) == 0644);
  int entries = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(directory)) ++entries;
  CHECK(entries == 2);  // the file and the link's old target: no temporary left
  CHECK_FALSE(WriteMetricsFile(directory + "/missing", "x.prom", "x\n", std::chrono::seconds(5)).ok());
  std::filesystem::remove_all(directory);
}
