// `ncclguard doctor` end to end: the built command on the emulator's driver, NVML and NCCL (their
// GPU name, driver version and P2P matrix set through the emulator's variables), and with the
// toolkit's real libnccl on a machine that may have no GPU at all.
#include <catch2/catch.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/process.h"

using ncclguard::testing::ProcessOptions;
using ncclguard::testing::ProcessResult;
using ncclguard::testing::RunProcess;
using ncclguard::testing::TemporaryDirectory;
using Json = nlohmann::json;
using Environment = std::map<std::string, std::optional<std::string>>;

namespace {

constexpr int kNothingMatched = 0;
constexpr int kMatched = 1;
constexpr int kUsageError = 2;

struct Doctor {
  ProcessResult result;
  std::string transcript;
};

Doctor RunDoctor(const std::vector<std::string>& arguments, const Environment& settings) {
  std::vector<std::string> argv{NCCLGUARD_COMMAND, "doctor"};
  argv.insert(argv.end(), arguments.begin(), arguments.end());
  ProcessOptions options;
  options.timeout_seconds = 30;
  options.environment = {{"LD_LIBRARY_PATH", std::nullopt},     {"NCCLEMU_GPU_NAME", std::nullopt},
                         {"NCCLEMU_DRIVER_VERSION", std::nullopt}, {"NCCLEMU_P2P_ACCESS", std::nullopt},
                         {"NCCLEMU_DEVICES", std::nullopt},     {"NCCL_P2P_DISABLE", std::nullopt},
                         {"NCCL_P2P_LEVEL", std::nullopt},      {"NCCL_CONF_FILE", std::nullopt}};
  for (const auto& [name, value] : settings) options.environment[name] = value;
  Doctor doctor;
  doctor.result = RunProcess(argv, options);
  doctor.transcript = "exit " + std::to_string(doctor.result.exit_code) + "\n--- stdout\n" + doctor.result.out +
                      "--- stderr\n" + doctor.result.err;
  return doctor;
}

// On the emulator: two GPUs of the given name, a driver of the given version.
Environment Emulated(const std::string& gpu_name, const std::string& driver) {
  return {{"LD_LIBRARY_PATH", EMULATOR_LIBRARY_DIR},
          {"NCCLEMU_DEVICES", "2"},
          {"NCCLEMU_GPU_NAME", gpu_name},
          {"NCCLEMU_DRIVER_VERSION", driver}};
}

Json RunJson(const Environment& settings, int expected_exit) {
  const Doctor doctor = RunDoctor({"--json"}, settings);
  INFO(doctor.transcript);
  REQUIRE_FALSE(doctor.result.timed_out);
  REQUIRE(doctor.result.exit_code == expected_exit);
  return Json::parse(doctor.result.out);
}

std::vector<std::string> MatchedIds(const Json& report) {
  std::vector<std::string> ids;
  for (const Json& match : report.at("known_bad")) ids.push_back(match.at("id"));
  return ids;
}

}  // namespace

TEST_CASE("GeForce GPUs with P2P on the emulator: a match, exit 1", "[doctor]") {
  const Json report = RunJson(Emulated("NVIDIA GeForce RTX 4090", "550.54.15"), kMatched);
  CHECK(report.at("cuda_initialised") == true);
  CHECK(report.at("gpu_count") == 2);
  REQUIRE(report.at("gpus").size() == 2);
  CHECK(report.at("gpus")[1].at("name") == "NVIDIA GeForce RTX 4090");
  CHECK(report.at("peer_access") == Json::parse("[[0, 1], [1, 0]]"));
  CHECK(report.at("driver_version") == "550.54.15");
  CHECK(report.at("cuda_driver_version") == 13000);
  CHECK(report.at("nccl").at("library") == std::string(EMULATOR_LIBRARY_DIR) + "/libnccl.so.2");
  CHECK(report.at("nccl").at("version") == "2.28.9");
  CHECK(report.at("known_bad_file").get<std::string>().ends_with("/share/ncclguard/known-bad.json"));
  REQUIRE(MatchedIds(report) == std::vector<std::string>{"geforce-p2p"});
  const Json& match = report.at("known_bad")[0];
  CHECK(match.at("facts") == Json({"GPU NVIDIA GeForce RTX 4090", "P2P not disabled"}));
  CHECK(match.at("remedy").get<std::string>().starts_with("set NCCL_P2P_DISABLE=1"));
  CHECK(match.at("source").get<std::string>().starts_with("https://"));
  // A warn entry: NCCLGUARD_P2P=auto reports it and leaves P2P on.
  CHECK(report.at("p2p_decision").at("mode") == "auto");
  CHECK(report.at("p2p_decision").at("set").empty());

  SECTION("the same for people") {
    const Doctor doctor = RunDoctor({}, Emulated("NVIDIA GeForce RTX 4090", "550.54.15"));
    INFO(doctor.transcript);
    CHECK(doctor.result.exit_code == kMatched);
    for (const char* line : {"GPUs: 2 visible\n", "  1  NVIDIA GeForce RTX 4090  0000:2A:00.0\n",
                             "P2P access (cuDeviceCanAccessPeer, row to column):\n", "    1  1  X\n",
                             "Driver: 550.54.15 (NVML), CUDA 13.0 (cuDriverGetVersion)\n",
                             "  [geforce-p2p] (warn) GPU NVIDIA GeForce RTX 4090, P2P not disabled\n",
                             "    remedy: set NCCL_P2P_DISABLE=1", "NCCLGUARD_P2P=auto: P2P left as it is\n"}) {
      INFO(line);
      CHECK(doctor.result.out.find(line) != std::string::npos);
    }
  }
  SECTION("with P2P disabled by the user, nothing matches") {
    Environment settings = Emulated("NVIDIA GeForce RTX 4090", "550.54.15");
    settings["NCCL_P2P_DISABLE"] = "1";
    const Json disabled = RunJson(settings, kNothingMatched);
    CHECK(disabled.at("nccl_variables").at("NCCL_P2P_DISABLE") == "1");
    CHECK(disabled.at("p2p_decision").at("infos").back() ==
          "P2P left as the user set it: NCCL_P2P_DISABLE=1 in the environment");
  }
}

TEST_CASE("data-centre GPUs with a sound driver on the emulator: exit 0", "[doctor]") {
  const Json report = RunJson(Emulated("NVIDIA H100 80GB HBM3", "580.65.06"), kNothingMatched);
  CHECK(MatchedIds(report).empty());
  CHECK(report.at("gpus")[0].at("name") == "NVIDIA H100 80GB HBM3");

  SECTION("without peer access") {
    Environment settings = Emulated("NVIDIA H100 80GB HBM3", "580.65.06");
    settings["NCCLEMU_P2P_ACCESS"] = "0";
    CHECK(RunJson(settings, kNothingMatched).at("peer_access") == Json::parse("[[0, 0], [0, 0]]"));
  }
}

TEST_CASE("the known-bad driver, and what NCCLGUARD_P2P=off would do", "[doctor]") {
  Environment settings = Emulated("NVIDIA H100 80GB HBM3", "545.23.08");
  settings["NCCLGUARD_P2P"] = "off";
  const Json report = RunJson(settings, kMatched);
  CHECK(MatchedIds(report) == std::vector<std::string>{"driver-545.23.08-p2p"});
  CHECK(report.at("p2p_decision").at("set") == Json({{"NCCL_P2P_DISABLE", "1"}}));
  CHECK(report.at("p2p_decision").at("warnings") ==
        Json({"NCCL_P2P_DISABLE=1 set before the first communicator: NCCLGUARD_P2P=off"}));
}

TEST_CASE("NCCL config files and a preloaded ncclguard are shown", "[doctor]") {
  TemporaryDirectory home;
  const std::string conf = home.path() + "/nccl.conf";
  {
    std::FILE* file = std::fopen(conf.c_str(), "w");
    REQUIRE(file != nullptr);
    std::fputs("# site settings\nNCCL_P2P_LEVEL=NVL\n", file);
    std::fclose(file);
  }
  Environment settings = Emulated("NVIDIA H100 80GB HBM3", "580.65.06");
  settings["NCCL_CONF_FILE"] = conf;
  settings["LD_PRELOAD"] = std::string(PRELOAD_LIBRARY) + " /nonexistent/libncclguard.so";
  const Json report = RunJson(settings, kNothingMatched);
  REQUIRE(report.at("nccl_config_files").size() >= 1);
  CHECK(report.at("nccl_config_files")[0] == Json({{"path", conf}, {"variables", {{"NCCL_P2P_LEVEL", "NVL"}}}}));
  CHECK(report.at("ncclguard_preloaded") ==
        Json::parse(R"([{"path": ")" + std::string(PRELOAD_LIBRARY) +
                    R"(", "exists": true}, {"path": "/nonexistent/libncclguard.so", "exists": false}])"));
}

TEST_CASE("the real libnccl, on a machine that may have no GPU", "[doctor]") {
  const Doctor doctor = RunDoctor({"--json"}, {{"LD_LIBRARY_PATH", REAL_NCCL_DIR}});
  INFO(doctor.transcript);
  REQUIRE_FALSE(doctor.result.timed_out);
  const Json report = Json::parse(doctor.result.out);
  CHECK(report.at("nccl").at("library").get<std::string>().starts_with(REAL_NCCL_DIR));
  CHECK(report.at("nccl").at("version") == REAL_NCCL_VERSION);
  CHECK(doctor.result.exit_code == (report.at("known_bad").empty() ? kNothingMatched : kMatched));
  if (!report.at("cuda_initialised").get<bool>()) {
    const Doctor human = RunDoctor({}, {{"LD_LIBRARY_PATH", REAL_NCCL_DIR}});
    CHECK(human.result.out.find("GPUs: none (no CUDA driver, or it found no GPU)\n") != std::string::npos);
  }
}

TEST_CASE("usage errors and an unreadable known-bad file: exit 2", "[doctor]") {
  CHECK(RunDoctor({"--bogus"}, {}).result.exit_code == kUsageError);
  const Doctor doctor = RunDoctor({}, {{"NCCLGUARD_KNOWN_BAD_FILE", "/nonexistent/known-bad.json"}});
  INFO(doctor.transcript);
  CHECK(doctor.result.exit_code == kUsageError);
  CHECK(doctor.result.out.find("Known-bad configurations: not checked: cannot read /nonexistent/known-bad.json: No "
                               "such file or directory\n") != std::string::npos);
}
