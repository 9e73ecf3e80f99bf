// ncclguard doctor [--json]
//
// The facts of this machine that decide whether an NCCL job will hang on it: GPUs and their P2P
// matrix, driver, kernel, the NCCL library the dynamic loader would load, NCCL_* variables and
// config files, whether ncclguard is preloaded, every known-bad configuration that matches (with
// its remedy), and what NCCLGUARD_P2P would decide. Exit status: 0 nothing matched, 1 something
// matched, 2 usage error or an unreadable known-bad file.
#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <iostream>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/commands.h"
#include "shim/libraries.h"
#include "watchdog/common/config.h"
#include "watchdog/common/escape.h"
#include "watchdog/diagnose/known_bad.h"
#include "watchdog/recover/p2p_policy.h"
#include "watchdog/report/facts.h"

namespace ncclguard {
namespace {

using Json = nlohmann::json;

struct DoctorOptions {
  bool json = false;
};

struct NcclLibrary {
  std::string path;     // "" when none can be loaded
  int version = 0;      // ncclGetVersion's code, 0 when unknown
  std::string problem;  // why nothing is known
};

// The libnccl that a program linked with -lnccl, or one that dlopen()s "libnccl.so.2", would get.
// Loaded locally and never closed: NCCL's libraries do not like to be unloaded.
NcclLibrary FindNcclLibrary() {
  NcclLibrary library;
  void* handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    library.problem = error != nullptr ? error : "libnccl.so.2 cannot be loaded";
    return library;
  }
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, static_cast<void*>(&map)) == 0 && map != nullptr &&
      map->l_name != nullptr)
    library.path = map->l_name;
  // glibc's dlsym, not ncclguard's, should this command run with ncclguard preloaded.
  using GetVersion = int (*)(int*);
  const auto get_version = reinterpret_cast<GetVersion>(shim::RealDlsym()(handle, "ncclGetVersion"));
  if (get_version == nullptr || get_version(&library.version) != 0) library.problem = "ncclGetVersion failed";
  return library;
}

// Every GPU the CUDA driver shows this process, not only those with an active context.
FactSources AllGpuSources() {
  FactSources sources = RealFactSources();
  sources.cuda = [real = sources.cuda](const std::vector<int>&) {
    const CudaFacts visible = real({});
    std::vector<int> all(static_cast<size_t>(std::max(visible.device_count, 0)));
    std::iota(all.begin(), all.end(), 0);
    return real(all);
  };
  return sources;
}

struct PreloadEntry {
  std::string path;
  bool exists = false;
};

// The LD_PRELOAD entries that name libncclguard (separated by colons or spaces, as ld.so reads it).
std::vector<PreloadEntry> NcclguardPreloads(const std::string& preload) {
  std::vector<PreloadEntry> entries;
  for (const std::string& entry :
       std::vector<std::string>(absl::StrSplit(preload, absl::ByAnyChar(": \t"), absl::SkipEmpty()))) {
    if (!absl::StrContains(entry, "libncclguard")) continue;
    entries.push_back({entry, access(entry.c_str(), R_OK) == 0});
  }
  return entries;
}

std::string CudaVersionText(int code) {
  return code > 0 ? fmt::format("{}.{}", code / 1000, code % 1000 / 10) : "unknown";
}

Json Report() {
  const bool cuda_initialised = InitialiseCudaDriver();
  const ProcessFacts facts = CollectMatchingFacts(AllGpuSources());
  const NcclLibrary nccl = FindNcclLibrary();
  const Config& config = GetConfig();

  Json report;
  Json gpus = Json::array();
  for (const GpuFacts& gpu : facts.cuda.gpus) {
    gpus.push_back(Json{{"device", gpu.device}, {"name", gpu.name}, {"pci_bus_id", gpu.pci_bus_id}});
  }
  report["cuda_initialised"] = cuda_initialised;
  report["gpu_count"] = facts.cuda.device_count;
  report["gpus"] = gpus;
  report["peer_access"] = facts.cuda.peer_access;
  report["driver_version"] = facts.driver_version;
  report["cuda_driver_version"] = facts.cuda.driver_version;
  report["kernel_release"] = facts.kernel_release;
  report["nccl"] = Json{{"library", nccl.path},
                        {"version", nccl.version > 0 ? NcclVersionText(nccl.version) : ""},
                        {"problem", nccl.problem}};

  Json variables = Json::object();
  for (const auto& [name, value] : facts.environment) {
    if (name.starts_with("NCCL_")) variables[name] = value;
  }
  report["nccl_variables"] = variables;
  P2pPolicyInputs inputs;
  inputs.config_files = ReadNcclConfigFiles(ReadProcessEnvironment);
  Json config_files = Json::array();
  for (const NcclConfigFile& file : inputs.config_files) {
    Json set = Json::object();
    for (const auto& [name, value] : ParseNcclConfigFile(file.content)) {
      if (name.starts_with("NCCL_")) set[name] = value;
    }
    if (!set.empty()) config_files.push_back(Json{{"path", file.path}, {"variables", set}});
  }
  report["nccl_config_files"] = config_files;

  std::string preload;
  ReadProcessEnvironment("LD_PRELOAD", &preload);
  Json preloads = Json::array();
  for (const PreloadEntry& entry : NcclguardPreloads(preload)) {
    preloads.push_back(Json{{"path", entry.path}, {"exists", entry.exists}});
  }
  report["ncclguard_preloaded"] = preloads;

  const KnownBadList& known_bad = ProcessKnownBad();
  report["known_bad_file"] = known_bad.path;
  report["known_bad_problem"] = std::string(known_bad.status.message());
  Json matches = Json::array();
  for (const KnownBadMatch& match : MatchKnownBad(known_bad.entries, facts)) {
    Json matched = KnownBadEntryJson(*match.entry);
    matched["facts"] = Json::array();
    for (const MatchedFact& fact : match.facts) matched["facts"].push_back(fact.description);
    matches.push_back(std::move(matched));
  }
  inputs.known_bad = known_bad.entries;
  report["known_bad"] = matches;

  inputs.mode = config.p2p;
  inputs.read_environment = ReadProcessEnvironment;
  inputs.facts = facts;
  ReadEarlierVerdict(config, inputs);
  const P2pDecision decision = DecideP2p(inputs);
  Json set = Json::object();
  for (const auto& [name, value] : decision.set_environment) set[name] = value;
  report["p2p_decision"] = Json{{"mode", P2pModeName(config.p2p)},
                                {"set", set},
                                {"warnings", decision.warnings},
                                {"infos", decision.infos}};
  return report;
}

// A text field of the report, as a terminal may show it (names and values come from outside).
std::string Text(const Json& field) { return EscapeControlCharacters(field.get<std::string>()); }

void PrintHuman(const Json& report) {
  std::cout << "GPUs: ";
  if (!report["cuda_initialised"].get<bool>()) {
    std::cout << "none (no CUDA driver, or it found no GPU)\n";
  } else {
    std::cout << report["gpu_count"].get<int>() << " visible\n";
    for (const Json& gpu : report["gpus"]) {
      std::cout << fmt::format("  {}  {}  {}\n", gpu["device"].get<int>(), Text(gpu["name"]),
                               Text(gpu["pci_bus_id"]));
    }
    const auto& access = report["peer_access"];
    if (access.size() >= 2) {
      std::cout << "P2P access (cuDeviceCanAccessPeer, row to column):\n     ";
      for (size_t to = 0; to < access.size(); ++to) std::cout << fmt::format("{:>3}", to);
      std::cout << '\n';
      for (size_t from = 0; from < access.size(); ++from) {
        std::cout << fmt::format("  {:>3}", from);
        for (size_t to = 0; to < access.size(); ++to) {
          std::cout << fmt::format("{:>3}", from == to ? "X" : access[from][to].get<int>() != 0 ? "1" : "0");
        }
        std::cout << '\n';
      }
    }
  }
  std::cout << fmt::format("Driver: {} (NVML), CUDA {} (cuDriverGetVersion)\n",
                           Text(report["driver_version"]),
                           CudaVersionText(report["cuda_driver_version"].get<int>()));
  std::cout << fmt::format("Kernel: {}\n", Text(report["kernel_release"]));
  const Json& nccl = report["nccl"];
  if (Text(nccl["library"]).empty()) {
    std::cout << fmt::format("NCCL: none loadable ({})\n", Text(nccl["problem"]));
  } else {
    std::cout << fmt::format(
        "NCCL: {} {}\n", Text(nccl["library"]),
        Text(nccl["version"]).empty() ? "(" + Text(nccl["problem"]) + ")" : Text(nccl["version"]));
  }
  std::cout << "NCCL variables:" << (report["nccl_variables"].empty() ? " none" : "") << '\n';
  for (const auto& [name, value] : report["nccl_variables"].items()) {
    std::cout << fmt::format("  {}={}\n", EscapeControlCharacters(name), Text(value));
  }
  for (const Json& file : report["nccl_config_files"]) {
    std::cout << fmt::format("NCCL config file {}:\n", Text(file["path"]));
    for (const auto& [name, value] : file["variables"].items()) {
      std::cout << fmt::format("  {}={}\n", EscapeControlCharacters(name), Text(value));
    }
  }
  if (report["ncclguard_preloaded"].empty()) {
    std::cout << "ncclguard: not preloaded (LD_PRELOAD does not name libncclguard)\n";
  }
  for (const Json& entry : report["ncclguard_preloaded"]) {
    std::cout << fmt::format("ncclguard: preloaded as {}{}\n", Text(entry["path"]),
                             entry["exists"].get<bool>() ? "" : " (no such file here)");
  }
  if (!Text(report["known_bad_problem"]).empty()) {
    std::cout << fmt::format("Known-bad configurations: not checked: {}\n",
                             Text(report["known_bad_problem"]));
  } else if (report["known_bad"].empty()) {
    std::cout << fmt::format("Known-bad configurations ({}): none matches\n", Text(report["known_bad_file"]));
  } else {
    std::cout << fmt::format("Known-bad configurations ({}):\n", Text(report["known_bad_file"]));
    for (const Json& match : report["known_bad"]) {
      std::cout << fmt::format(
          "  [{}] ({}) {}\n    {}\n    remedy: {}\n    source: {}\n", Text(match["id"]),
          Text(match["action"]),
          EscapeControlCharacters(absl::StrJoin(match["facts"].get<std::vector<std::string>>(), ", ")),
          Text(match["summary"]), Text(match["remedy"]), Text(match["source"]));
    }
  }
  const Json& decision = report["p2p_decision"];
  std::cout << fmt::format("NCCLGUARD_P2P={}: {}\n", Text(decision["mode"]),
                           decision["set"].empty() ? "P2P left as it is" : "would set NCCL_P2P_DISABLE=1");
  for (const Json& line : decision["warnings"]) std::cout << "  " << Text(line) << '\n';
  for (const Json& line : decision["infos"]) std::cout << "  " << Text(line) << '\n';
}

int Doctor(const DoctorOptions& options) {
  const Json report = Report();
  if (options.json) {
    std::cout << report.dump(2, ' ', false, Json::error_handler_t::replace) << '\n';
  } else {
    PrintHuman(report);
  }
  if (!report["known_bad_problem"].get<std::string>().empty()) return kExitUsage;
  return report["known_bad"].empty() ? kExitHealthy : kExitProblemFound;
}

}  // namespace

void AddDoctorCommand(CLI::App& app, std::function<int()>& run) {
  auto options = std::make_shared<DoctorOptions>();
  CLI::App* doctor = app.add_subcommand(
      "doctor",
      "Check this machine for configurations known to break NCCL's P2P transport. Exit status: 0 "
      "nothing matched, 1 a known-bad configuration matched, 2 usage error or unreadable known-bad file.");
  doctor->add_flag("--json", options->json, "Print the report as JSON");
  doctor->callback([options, &run] { run = [options] { return Doctor(*options); }; });
}

}  // namespace ncclguard
