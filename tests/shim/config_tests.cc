#include <map>

#include <catch2/catch.hpp>

#include "tests/support/process.h"
#include "watchdog/common/config.h"

using ncclguard::Config;
using ncclguard::LogLevel;
using ncclguard::ParseConfig;

namespace {

Config Parse(const std::map<std::string, std::string>& environment) {
  return ParseConfig([&](const char* name, std::string* value) {
    const auto found = environment.find(name);
    if (found == environment.end()) return false;
    *value = found->second;
    return true;
  });
}

}  // namespace

TEST_CASE("defaults when nothing is set", "[config]") {
  const Config config = Parse({});
  CHECK_FALSE(config.disable);
  CHECK(config.log_level == LogLevel::kWarn);
  CHECK(config.log_file.empty());
  CHECK(config.nccl_library.empty());
  CHECK(config.problems.empty());
  CHECK(config.effective_values.empty());
}

TEST_CASE("valid values are used and listed", "[config]") {
  const Config config = Parse({{"NCCLGUARD_DISABLE", "yes"},
                               {"NCCLGUARD_LOG_LEVEL", "DEBUG"},
                               {"NCCLGUARD_LOG_FILE", "/tmp/g-%p.log"},
                               {"NCCLGUARD_NCCL_LIBRARY", "/opt/nccl/libnccl.so.2"}});
  CHECK(config.disable);
  CHECK(config.log_level == LogLevel::kDebug);
  CHECK(config.log_file == "/tmp/g-%p.log");
  CHECK(config.nccl_library == "/opt/nccl/libnccl.so.2");
  CHECK(config.problems.empty());
  CHECK(config.effective_values == std::vector<std::string>{"NCCLGUARD_DISABLE=1",
                                                            "NCCLGUARD_LOG_LEVEL=debug",
                                                            "NCCLGUARD_LOG_FILE=/tmp/g-%p.log",
                                                            "NCCLGUARD_NCCL_LIBRARY=/opt/nccl/libnccl.so.2"});
}

TEST_CASE("every accepted spelling of a boolean", "[config]") {
  for (const char* yes : {"1", "true", "TRUE", "yes", "on"}) {
    CHECK(Parse({{"NCCLGUARD_DISABLE", yes}}).disable);
  }
  for (const char* no : {"0", "false", "no", "off", ""}) {
    CHECK_FALSE(Parse({{"NCCLGUARD_DISABLE", no}}).disable);
  }
}

TEST_CASE("a bad value names the variable, the value and the default used", "[config]") {
  const Config config = Parse({{"NCCLGUARD_DISABLE", "2"}, {"NCCLGUARD_LOG_LEVEL", "loud"}});
  CHECK_FALSE(config.disable);
  CHECK(config.log_level == LogLevel::kWarn);
  REQUIRE(config.problems.size() == 2);
  CHECK(config.problems[0] ==
        "NCCLGUARD_DISABLE='2' is not a boolean (1/0, true/false, yes/no, on/off); using the "
        "default '0'");
  CHECK(config.problems[1] ==
        "NCCLGUARD_LOG_LEVEL='loud' is not one of trace|debug|info|warn|error|off; using the "
        "default 'warn'");
}

TEST_CASE("the table of variables in docs/settings.md is the configuration table", "[config]") {
  const std::string doc = ncclguard::testing::ReadFile(SETTINGS_DOC_PATH);
  const std::string begin = "<!-- settings-table-begin -->\n";
  const std::string end = "<!-- settings-table-end -->";
  const size_t from = doc.find(begin);
  const size_t to = doc.find(end);
  REQUIRE(from != std::string::npos);
  REQUIRE(to != std::string::npos);
  CHECK(doc.substr(from + begin.size(), to - from - begin.size()) == ncclguard::OptionsMarkdownTable());
}

TEST_CASE("a dump signal must leave the signal's default action alone", "[config]") {
  for (const char* fatal : {"SIGTERM", "SEGV", "11", "SIGINT", "SIGABRT", "SIGHUP", "SIGKILL", "SIGALRM"}) {
    const Config config = Parse({{"NCCLGUARD_DUMP_SIGNAL", fatal}});
    INFO(fatal);
    CHECK(config.dump_signal.number == SIGUSR2);
    REQUIRE(config.problems.size() == 1);
    CHECK(config.problems[0].find("NCCLGUARD_DUMP_SIGNAL='" + std::string(fatal) + "' is not SIGUSR1") == 0);
  }
  CHECK(Parse({{"NCCLGUARD_DUMP_SIGNAL", "usr1"}}).dump_signal.number == SIGUSR1);
  CHECK(Parse({{"NCCLGUARD_DUMP_SIGNAL", "SIGWINCH"}}).dump_signal.number == SIGWINCH);
  CHECK(Parse({{"NCCLGUARD_DUMP_SIGNAL", "SIGRTMIN+2"}}).dump_signal.number == SIGRTMIN + 2);
  CHECK(Parse({{"NCCLGUARD_DUMP_SIGNAL", "rtmax-1"}}).dump_signal.number == SIGRTMAX - 1);
  CHECK(Parse({{"NCCLGUARD_DUMP_SIGNAL", std::to_string(SIGRTMAX)}}).dump_signal.number == SIGRTMAX);
  CHECK(Parse({{"NCCLGUARD_DUMP_SIGNAL", "0"}}).dump_signal.number == 0);
  CHECK(Parse({{"NCCLGUARD_DUMP_SIGNAL", "SIGRTMIN+999"}}).problems.size() == 1);
}

TEST_CASE("a numeric setting outside its range is reported and the default used", "[config]") {
  const Config config = Parse({{"NCCLGUARD_POLL_INTERVAL", "1e-9"},
                               {"NCCLGUARD_RING_SIZE", "16777216"},
                               {"NCCLGUARD_STATUS_INTERVAL", "nan"},
                               {"NCCLGUARD_TIMEOUT", "inf"}});
  CHECK(config.poll_interval.value == 0.1);
  CHECK(config.ring_size.value == 2048);
  CHECK(config.status_interval.value == 2);
  CHECK(config.timeout.value == 120);
  REQUIRE(config.problems.size() == 4);
  CHECK(config.problems[0] == "NCCLGUARD_TIMEOUT='inf' is not a number of seconds; using the default '120'");
  CHECK(config.problems[1] ==
        "NCCLGUARD_RING_SIZE='16777216' is not between 16 and 65536; using the default '2048'");
  CHECK(config.problems[2] ==
        "NCCLGUARD_POLL_INTERVAL='1e-9' is not between 0.01 and 10; using the default '0.1'");
  CHECK(config.problems[3] ==
        "NCCLGUARD_STATUS_INTERVAL='nan' is not a number of seconds; using the default '2'");

  const Config edges = Parse({{"NCCLGUARD_POLL_INTERVAL", "0.01"}, {"NCCLGUARD_RING_SIZE", "65536"}});
  CHECK(edges.problems.empty());
  // 0 s is a value where the range allows it (the fail-slow judge off), and out of range elsewhere.
  const Config zero = Parse({{"NCCLGUARD_SLOW_INTERVAL", "0"}, {"NCCLGUARD_TIMEOUT", "0"}});
  CHECK(zero.slow_interval.value == 0);
  CHECK(zero.timeout.value == 120);
  REQUIRE(zero.problems.size() == 1);
  CHECK(zero.problems[0] == "NCCLGUARD_TIMEOUT='0' is not between 1 and 604800; using the default '120'");
  CHECK(edges.poll_interval.value == 0.01);
  CHECK(edges.ring_size.value == 65536);
}
