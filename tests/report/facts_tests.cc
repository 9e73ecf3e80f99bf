// Process facts: every source injected, failing sources, the environment allowlist, and one run
// against the real system.
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <stdexcept>

#include <catch2/catch.hpp>

#include "watchdog/common/launcher.h"
#include "watchdog/report/facts.h"

namespace ncclguard {
namespace {

std::string Lookup(const EnvironmentVariables& variables, const std::string& name) {
  for (const auto& [key, value] : variables) {
    if (key == name) return value;
  }
  return "<absent>";
}

bool Contains(const EnvironmentVariables& variables, const std::string& name) {
  return Lookup(variables, name) != "<absent>";
}

FactSources FakeSources(std::vector<int>* devices_asked) {
  FactSources sources;
  sources.host_name = [] { return std::string("node17"); };
  sources.pid = [] { return 4242; };
  sources.parent_pid = [] { return 4200; };
  sources.read_link = [](const std::string& path) -> std::optional<std::string> {
    if (path == "/proc/self/exe") return "/opt/train/python3";
    return std::nullopt;
  };
  sources.read_file = [](const std::string& path) -> std::optional<std::string> {
    if (path == "/proc/self/cmdline") return std::string("python3\0train.py\0--epochs\0\0", 27);
    if (path == "/proc/meminfo") {
      return "MemTotal:       16000000 kB\nMemFree:          100 kB\nMemAvailable:    8000000 kB\n";
    }
    if (path == "/proc/self/status") return "Name:\tpython3\nVmHWM:\t    2048 kB\nVmRSS:\t    1024 kB\n";
    return std::nullopt;
  };
  sources.environment = [] {
    return EnvironmentVariables{{"HOME", "/home/alice"},
                                {"AWS_SECRET_ACCESS_KEY", "hunter2"},
                                {"WANDB_API_KEY", "abc"},
                                {"NCCL_DEBUG", "INFO"},
                                {"CUDA_VISIBLE_DEVICES", "0,1"},
                                {"NCCLGUARD_TIMEOUT", "3"},
                                {"NCCL", "not a prefix match"},
                                {"MY_NCCL_SETTING", "x"},
                                {"LD_PRELOAD", "libncclguard.so"},
                                {"LD_LIBRARY_PATH", "/usr/local/cuda/lib64"},
                                {"LD_AUDIT", "x"},
                                {"SLURM_PROCID", "5"},
                                {"RANK", "3"},
                                {"MASTER_ADDR", "10.0.0.1"},
                                {"SLURM_JOB_ID", "991"},
                                {"OMPI_COMM_WORLD_SIZE", "8"}};
  };
  sources.kernel_release = [] { return std::string("6.1.0-test"); };
  sources.nvml_driver_version = [] { return std::string("580.65.06"); };
  sources.nccl_version = [] { return 22809; };
  sources.cuda = [devices_asked](const std::vector<int>& devices) {
    *devices_asked = devices;
    CudaFacts facts;
    facts.driver_version = 13000;
    facts.gpus.push_back(GpuFacts{.device = 1,
                                  .name = "NVIDIA H100",
                                  .pci_bus_id = "0000:19:00.0",
                                  .memory_free_bytes = 1000,
                                  .memory_total_bytes = 2000});
    return facts;
  };
  return sources;
}

TEST_CASE("every fact comes from its source", "[facts]") {
  std::vector<int> devices_asked;
  const ProcessFacts facts = CollectProcessFacts(FakeSources(&devices_asked), {1, 3});
  CHECK(facts.host == "node17");
  CHECK(facts.pid == 4242);
  CHECK(facts.ppid == 4200);
  CHECK(facts.program == "/opt/train/python3");
  CHECK(facts.command_line == std::vector<std::string>{"python3", "train.py", "--epochs", ""});
  CHECK(facts.kernel_release == "6.1.0-test");
  CHECK(facts.driver_version == "580.65.06");
  CHECK(facts.nccl_version == 22809);
  CHECK(devices_asked == std::vector<int>{1, 3});
  CHECK(facts.cuda.driver_version == 13000);
  REQUIRE(facts.cuda.gpus.size() == 1);
  CHECK(facts.cuda.gpus[0].pci_bus_id == "0000:19:00.0");
  CHECK(facts.host_memory_total_bytes == 16000000LL * 1024);
  CHECK(facts.host_memory_available_bytes == 8000000LL * 1024);
  CHECK(facts.rss_bytes == 1024 * 1024);
  CHECK(facts.peak_rss_bytes == 2048 * 1024);
}

TEST_CASE("launcher variables are kept in a fixed order and give the rank", "[facts]") {
  std::vector<int> unused;
  const ProcessFacts facts = CollectProcessFacts(FakeSources(&unused));
  const EnvironmentVariables expected{{"RANK", "3"},
                                      {"MASTER_ADDR", "10.0.0.1"},
                                      {"SLURM_JOB_ID", "991"},
                                      {"SLURM_PROCID", "5"},
                                      {"OMPI_COMM_WORLD_SIZE", "8"}};
  CHECK(facts.launcher == expected);
  CHECK(LauncherRank(facts) == 3);  // RANK is preferred to SLURM_PROCID

  ProcessFacts slurm_only;
  slurm_only.launcher = {{"SLURM_PROCID", "5"}, {"PMI_RANK", "9"}};
  CHECK(LauncherRank(slurm_only) == 5);
  ProcessFacts garbage;
  garbage.launcher = {{"RANK", "three"}};
  CHECK(LauncherRank(garbage) == -1);
}

TEST_CASE("the log prefix and the dump name the same launcher rank", "[facts]") {
  // Slurm's rank and Open MPI's disagree (mpirun inside an allocation): both readers pick the
  // same one, and LOCAL_RANK is never a job-wide rank.
  std::map<std::string, std::optional<std::string>> saved;
  for (const std::string_view name : kLauncherRankVariables) {
    const std::string variable(name);
    const char* value = std::getenv(variable.c_str());
    saved[variable] = value != nullptr ? std::optional<std::string>(value) : std::nullopt;
    unsetenv(variable.c_str());
  }
  const char* local_rank = std::getenv("LOCAL_RANK");
  saved["LOCAL_RANK"] = local_rank != nullptr ? std::optional<std::string>(local_rank) : std::nullopt;
  setenv("LOCAL_RANK", "1", 1);
  setenv("SLURM_PROCID", "4", 1);
  setenv("OMPI_COMM_WORLD_RANK", "6", 1);

  const int for_log_prefix = LauncherRankFromEnvironment();
  const int for_dump = LauncherRank(CollectIdentityFacts(RealFactSources()));

  for (const auto& [name, value] : saved) {
    if (value) {
      setenv(name.c_str(), value->c_str(), 1);
    } else {
      unsetenv(name.c_str());
    }
  }
  CHECK(for_log_prefix == 4);
  CHECK(for_dump == 4);
}

TEST_CASE("only allowlisted variables reach the facts: secrets never do", "[facts]") {
  std::vector<int> unused;
  const ProcessFacts facts = CollectProcessFacts(FakeSources(&unused));
  CHECK(Lookup(facts.environment, "NCCL_DEBUG") == "INFO");
  CHECK(Lookup(facts.environment, "CUDA_VISIBLE_DEVICES") == "0,1");
  CHECK(Lookup(facts.environment, "NCCLGUARD_TIMEOUT") == "3");
  CHECK(Lookup(facts.environment, "LD_PRELOAD") == "libncclguard.so");
  CHECK(Lookup(facts.environment, "LD_LIBRARY_PATH") == "/usr/local/cuda/lib64");
  CHECK(facts.environment.size() == 5);
  for (const char* secret : {"HOME", "AWS_SECRET_ACCESS_KEY", "WANDB_API_KEY", "NCCL",
                             "MY_NCCL_SETTING", "LD_AUDIT"}) {
    INFO(secret);
    CHECK_FALSE(Contains(facts.environment, secret));
    CHECK_FALSE(Contains(facts.launcher, secret));
  }
  CHECK(std::is_sorted(facts.environment.begin(), facts.environment.end()));
}

TEST_CASE("a source that fails or throws leaves its fact unknown", "[facts]") {
  FactSources failing;
  failing.host_name = [] { return std::string(); };
  failing.pid = []() -> int { throw std::runtime_error("no pid"); };
  failing.read_file = [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
  failing.read_link = [](const std::string&) -> std::optional<std::string> {
    throw std::runtime_error("no /proc");
  };
  failing.environment = []() -> EnvironmentVariables { throw std::bad_alloc(); };
  failing.cuda = [](const std::vector<int>&) -> CudaFacts { throw std::runtime_error("driver gone"); };
  // parent_pid, kernel_release, nvml_driver_version and nccl_version are left empty.
  ProcessFacts facts;
  REQUIRE_NOTHROW(facts = CollectProcessFacts(failing));
  CHECK(facts.host == "unknown");
  CHECK(facts.pid == -1);
  CHECK(facts.ppid == -1);
  CHECK(facts.program == "unknown");
  CHECK(facts.command_line.empty());
  CHECK(facts.launcher.empty());
  CHECK(facts.environment.empty());
  CHECK(facts.kernel_release == "unknown");
  CHECK(facts.driver_version == "unknown");
  CHECK(facts.nccl_version == 0);
  CHECK(facts.cuda.driver_version == -1);
  CHECK(facts.cuda.gpus.empty());
  CHECK(facts.host_memory_available_bytes == -1);
  CHECK(facts.rss_bytes == -1);
}

TEST_CASE("a malformed /proc file leaves the memory facts unknown", "[facts]") {
  FactSources sources;
  sources.read_file = [](const std::string& path) -> std::optional<std::string> {
    if (path == "/proc/meminfo") return "MemTotal: lots kB\nMemAvailableX: 5 kB\n";
    return std::string("VmRSS:\n");
  };
  const ProcessFacts facts = CollectProcessFacts(sources);
  CHECK(facts.host_memory_total_bytes == -1);
  CHECK(facts.host_memory_available_bytes == -1);
  CHECK(facts.rss_bytes == -1);
}

TEST_CASE("identity facts read nothing but the identity", "[facts]") {
  std::vector<int> devices_asked{-7};
  FactSources sources = FakeSources(&devices_asked);
  bool read_a_file = false;
  sources.read_file = [&](const std::string&) -> std::optional<std::string> {
    read_a_file = true;
    return std::nullopt;
  };
  const ProcessFacts facts = CollectIdentityFacts(sources);
  CHECK(facts.host == "node17");
  CHECK(facts.pid == 4242);
  CHECK(LauncherRank(facts) == 3);
  CHECK(facts.environment.empty());
  CHECK_FALSE(read_a_file);
  CHECK(devices_asked == std::vector<int>{-7});  // the driver was not asked
}

TEST_CASE("the real system's facts", "[facts][real]") {
  REQUIRE(setenv("NCCL_FACTS_TEST_MARKER", "present", 1) == 0);
  REQUIRE(setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak", 1) == 0);
  REQUIRE(setenv("HOME", "/home/do-not-leak", 1) == 0);
  const ProcessFacts facts = CollectProcessFacts(RealFactSources());
  char host[256] = {};
  REQUIRE(gethostname(host, sizeof(host) - 1) == 0);
  utsname names{};
  REQUIRE(uname(&names) == 0);
  CHECK(facts.host == host);
  CHECK(facts.pid == getpid());
  CHECK(facts.ppid == getppid());
  CHECK(facts.program.find("facts_tests") != std::string::npos);
  REQUIRE_FALSE(facts.command_line.empty());
  CHECK(facts.command_line[0].find("facts_tests") != std::string::npos);
  CHECK(facts.kernel_release == names.release);
  CHECK(facts.host_memory_total_bytes > 0);
  CHECK(facts.host_memory_available_bytes > 0);
  CHECK(facts.host_memory_available_bytes <= facts.host_memory_total_bytes);
  CHECK(facts.rss_bytes > 0);
  CHECK(facts.peak_rss_bytes >= facts.rss_bytes);
  CHECK_FALSE(facts.driver_version.empty());
  CHECK(Lookup(facts.environment, "NCCL_FACTS_TEST_MARKER") == "present");
  for (const auto& [name, value] : facts.environment) {
    INFO(name);
    CHECK(IsAllowlistedVariable(name));
    CHECK(value.find("do-not-leak") == std::string::npos);
  }
  // This test program never initialises CUDA, so no device is in use, whatever the machine has.
  CHECK(facts.cuda.gpus.empty());
}

TEST_CASE("secrets in allowlisted variables and in the command line are redacted", "[facts]") {
  std::vector<int> unused;
  FactSources sources = FakeSources(&unused);
  sources.environment = [] {
    return EnvironmentVariables{{"NCCL_IB_TOKEN", "t0k"},        {"CUDA_API_KEY", "k3y"},
                                {"NCCLGUARD_DB_PASSWORD", "pw"}, {"NCCL_SOCKET_secret", "s"},
                                {"NCCL_DEBUG", "INFO"}};
  };
  sources.read_file = [](const std::string& path) -> std::optional<std::string> {
    if (path != "/proc/self/cmdline") return std::nullopt;
    const std::vector<std::string> argv{"python3", "train.py",  "--api-key=abc", "--hf-token",    "xyz",
                                        "--Password", "--epochs", "3",             "--keyfile", "/k",
                                        "--lr=0.1", "-k", "plain"};
    std::string text;
    for (const std::string& argument : argv) text += argument + '\0';
    return text;
  };
  const ProcessFacts facts = CollectProcessFacts(sources);
  CHECK(Lookup(facts.environment, "NCCL_IB_TOKEN") == "<redacted>");
  CHECK(Lookup(facts.environment, "CUDA_API_KEY") == "<redacted>");
  CHECK(Lookup(facts.environment, "NCCLGUARD_DB_PASSWORD") == "<redacted>");
  CHECK(Lookup(facts.environment, "NCCL_SOCKET_secret") == "<redacted>");
  CHECK(Lookup(facts.environment, "NCCL_DEBUG") == "INFO");
  CHECK(facts.command_line == std::vector<std::string>{"python3", "train.py", "--api-key=<redacted>", "--hf-token",
                                                       "<redacted>", "--Password", "--epochs", "3", "--keyfile",
                                                       "<redacted>", "--lr=0.1", "-k", "plain"});
}

}  // namespace
}  // namespace ncclguard
