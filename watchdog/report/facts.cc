#include "watchdog/report/facts.h"

#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/types.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "watchdog/common/escape.h"
#include "watchdog/common/launcher.h"
#include "watchdog/common/libraries.h"
#include "watchdog/common/log.h"

extern char** environ;

namespace ncclguard {
namespace {

// cuda.h maps many driver functions to versioned symbols with #defines (cuMemGetInfo is
// cuMemGetInfo_v2): the name looked up must be the expanded one, or dlsym finds the old ABI.
#define NCCLGUARD_SYMBOL_NAME(function) NCCLGUARD_SYMBOL_NAME_TEXT(function)
#define NCCLGUARD_SYMBOL_NAME_TEXT(function) #function

constexpr std::array kLauncherVariables = {"RANK",
                                           "LOCAL_RANK",
                                           "WORLD_SIZE",
                                           "LOCAL_WORLD_SIZE",
                                           "GROUP_RANK",
                                           "ROLE_RANK",
                                           "MASTER_ADDR",
                                           "MASTER_PORT",
                                           "TORCHELASTIC_RUN_ID",
                                           "TORCHELASTIC_RESTART_COUNT",
                                           "SLURM_JOB_ID",
                                           "SLURM_STEP_ID",
                                           "SLURM_PROCID",
                                           "SLURM_LOCALID",
                                           "SLURM_NTASKS",
                                           "SLURM_NODEID",
                                           "SLURM_NODELIST",
                                           "OMPI_COMM_WORLD_RANK",
                                           "OMPI_COMM_WORLD_SIZE",
                                           "OMPI_COMM_WORLD_LOCAL_RANK",
                                           "OMPI_COMM_WORLD_LOCAL_SIZE",
                                           "PMI_RANK",
                                           "PMI_SIZE",
                                           "PMIX_RANK",
                                           "PMIX_NAMESPACE",
                                           "PADDLE_TRAINER_ID",
                                           "PADDLE_TRAINERS_NUM",
                                           "PADDLE_JOB_ID",
                                           "LSB_JOBID",
                                           "PBS_JOBID",
                                           "FLUX_JOB_ID"};

template <typename T, typename Source, typename... Args>
T Ask(const Source& source, T fallback, const Args&... args) noexcept {
  if (!source) return fallback;
  try {
    return source(args...);
  } catch (...) {
    return fallback;
  }
}

std::optional<std::string> ReadLink(const std::string& path) {
  char target[4096];
  const ssize_t n = readlink(path.c_str(), target, sizeof(target));
  if (n <= 0 || static_cast<size_t>(n) >= sizeof(target)) return std::nullopt;
  return std::string(target, static_cast<size_t>(n));
}

EnvironmentVariables ProcessEnvironment() {
  EnvironmentVariables variables;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const absl::string_view text(*entry);
    if (!absl::StrContains(text, '=')) continue;
    std::pair<std::string, std::string> variable = absl::StrSplit(text, absl::MaxSplits('=', 1));
    variables.push_back(std::move(variable));
  }
  return variables;
}

// A library the process may already have loaded. It is opened ourselves only when it is not,
// and never closed: unloading a GPU driver library under a running process is asking for trouble.
void* OpenDriverLibrary(const char* soname) {
  void* handle = dlopen(soname, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
  if (handle == nullptr) handle = dlopen(soname, RTLD_LAZY | RTLD_LOCAL);
  return handle;
}

template <typename Function>
Function Resolve(void* handle, const char* name) {
  if (handle == nullptr) return nullptr;
  return reinterpret_cast<Function>(Real().Symbol(handle, name));
}

std::string NvmlDriverVersion() {
  // No nvml.h at build time: these match NVML's documented C signatures (nvmlReturn_t is an
  // enum, 0 meaning success).
  using Init = int (*)();
  using GetDriverVersion = int (*)(char* version, unsigned int length);
  using Shutdown = int (*)();
  static void* const handle = OpenDriverLibrary("libnvidia-ml.so.1");
  const auto init = Resolve<Init>(handle, "nvmlInit_v2");
  const auto get_driver_version = Resolve<GetDriverVersion>(handle, "nvmlSystemGetDriverVersion");
  const auto shutdown = Resolve<Shutdown>(handle, "nvmlShutdown");
  if (init == nullptr || get_driver_version == nullptr || shutdown == nullptr) return "";
  if (init() != 0) return "";
  char version[96] = {};
  const bool ok = get_driver_version(version, sizeof(version)) == 0;
  shutdown();  // NVML counts its initialisations: this one is ours to undo
  return ok ? std::string(version) : "";
}

// NVML needs no cuInit and creates no CUDA context: the GPUs' names are known before the
// application initialises CUDA, which is when its first NCCL call may come.
std::vector<std::string> NvmlGpuNames() {
  using Device = void*;  // nvmlDevice_t
  using Init = int (*)();
  using GetCount = int (*)(unsigned int* count);
  using GetHandle = int (*)(unsigned int index, Device* device);
  using GetName = int (*)(Device device, char* name, unsigned int length);
  using Shutdown = int (*)();
  static void* const handle = OpenDriverLibrary("libnvidia-ml.so.1");
  const auto init = Resolve<Init>(handle, "nvmlInit_v2");
  const auto get_count = Resolve<GetCount>(handle, "nvmlDeviceGetCount_v2");
  const auto get_handle = Resolve<GetHandle>(handle, "nvmlDeviceGetHandleByIndex_v2");
  const auto get_name = Resolve<GetName>(handle, "nvmlDeviceGetName");
  const auto shutdown = Resolve<Shutdown>(handle, "nvmlShutdown");
  if (!init || !get_count || !get_handle || !get_name || !shutdown || init() != 0) return {};
  std::vector<std::string> names;
  unsigned int count = 0;
  if (get_count(&count) == 0) {
    for (unsigned int index = 0; index < count; ++index) {
      Device device = nullptr;
      char name[96] = {};
      if (get_handle(index, &device) != 0 || get_name(device, name, sizeof(name)) != 0) {
        names.clear();  // a partial list would miscount the host's GPUs
        break;
      }
      names.emplace_back(name);
    }
  }
  shutdown();
  return names;
}

struct CudaDriver {
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDriverGetVersion) driver_get_version = nullptr;
  decltype(&::cuDeviceGetCount) device_get_count = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetName) device_get_name = nullptr;
  decltype(&::cuDeviceGetPCIBusId) device_get_pci_bus_id = nullptr;
  decltype(&::cuDevicePrimaryCtxGetState) primary_context_get_state = nullptr;
  decltype(&::cuDeviceCanAccessPeer) device_can_access_peer = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primary_context_retain = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease) primary_context_release = nullptr;
  decltype(&::cuCtxPushCurrent) context_push = nullptr;
  decltype(&::cuCtxPopCurrent) context_pop = nullptr;
  decltype(&::cuMemGetInfo) memory_get_info = nullptr;

  bool CanQueryDevices() const {
    return device_get_count && device_get && device_get_name && device_get_pci_bus_id &&
           primary_context_get_state;
  }
  bool CanQueryMemory() const {
    return primary_context_retain && primary_context_release && context_push && context_pop &&
           memory_get_info;
  }
};

CudaDriver ResolveCudaDriver() {
  CudaDriver driver;
  void* handle = OpenDriverLibrary("libcuda.so.1");
#define NCCLGUARD_RESOLVE(field, function) \
  driver.field = Resolve<decltype(driver.field)>(handle, NCCLGUARD_SYMBOL_NAME(function))
  NCCLGUARD_RESOLVE(init, cuInit);
  NCCLGUARD_RESOLVE(driver_get_version, cuDriverGetVersion);
  NCCLGUARD_RESOLVE(device_get_count, cuDeviceGetCount);
  NCCLGUARD_RESOLVE(device_get, cuDeviceGet);
  NCCLGUARD_RESOLVE(device_get_name, cuDeviceGetName);
  NCCLGUARD_RESOLVE(device_get_pci_bus_id, cuDeviceGetPCIBusId);
  NCCLGUARD_RESOLVE(primary_context_get_state, cuDevicePrimaryCtxGetState);
  NCCLGUARD_RESOLVE(device_can_access_peer, cuDeviceCanAccessPeer);
  NCCLGUARD_RESOLVE(primary_context_retain, cuDevicePrimaryCtxRetain);
  NCCLGUARD_RESOLVE(primary_context_release, cuDevicePrimaryCtxRelease);
  NCCLGUARD_RESOLVE(context_push, cuCtxPushCurrent);
  NCCLGUARD_RESOLVE(context_pop, cuCtxPopCurrent);
  NCCLGUARD_RESOLVE(memory_get_info, cuMemGetInfo);
#undef NCCLGUARD_RESOLVE
  return driver;
}

// Memory of a device whose primary context is active. Retaining an active primary context only
// counts a reference; it never creates one (the caller checked it is active).
void ReadDeviceMemory(const CudaDriver& driver, CUdevice device, GpuFacts* gpu) {
  if (!driver.CanQueryMemory()) return;
  CUcontext context = nullptr;
  if (driver.primary_context_retain(&context, device) != CUDA_SUCCESS) return;
  if (driver.context_push(context) == CUDA_SUCCESS) {
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    if (driver.memory_get_info(&free_bytes, &total_bytes) == CUDA_SUCCESS) {
      gpu->memory_free_bytes = static_cast<std::int64_t>(free_bytes);
      gpu->memory_total_bytes = static_cast<std::int64_t>(total_bytes);
    }
    CUcontext popped = nullptr;
    driver.context_pop(&popped);
  }
  driver.primary_context_release(device);
}

const CudaDriver& Driver() {
  static const CudaDriver driver = ResolveCudaDriver();
  return driver;
}

// cuDeviceCanAccessPeer between every pair of visible devices; empty when any answer is missing
// (a partial matrix would read as "no access").
std::vector<std::vector<int>> ReadPeerAccess(const CudaDriver& driver, int count) {
  if (driver.device_can_access_peer == nullptr || driver.device_get == nullptr) return {};
  std::vector<CUdevice> devices(static_cast<size_t>(count));
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    if (driver.device_get(&devices[ordinal], ordinal) != CUDA_SUCCESS) return {};
  }
  std::vector<std::vector<int>> access(devices.size(), std::vector<int>(devices.size(), 0));
  for (size_t from = 0; from < devices.size(); ++from) {
    for (size_t to = 0; to < devices.size(); ++to) {
      if (from == to) continue;
      int can_access = 0;
      if (driver.device_can_access_peer(&can_access, devices[from], devices[to]) != CUDA_SUCCESS) return {};
      access[from][to] = can_access != 0 ? 1 : 0;
    }
  }
  return access;
}

CudaFacts ReadCudaFacts(const std::vector<int>& devices) {
  const CudaDriver& driver = Driver();
  CudaFacts facts;
  int version = 0;
  if (driver.driver_get_version != nullptr && driver.driver_get_version(&version) == CUDA_SUCCESS) {
    facts.driver_version = version;
  }
  int count = 0;
  // cuDeviceGetCount fails before cuInit: a process that never initialised CUDA uses no GPU,
  // and ncclguard does not initialise it on its behalf.
  if (!driver.CanQueryDevices() || driver.device_get_count(&count) != CUDA_SUCCESS) return facts;
  facts.device_count = count;
  facts.peer_access = ReadPeerAccess(driver, count);
  const std::set<int> wanted(devices.begin(), devices.end());
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    CUdevice device = 0;
    if (driver.device_get(&device, ordinal) != CUDA_SUCCESS) continue;
    unsigned int flags = 0;
    int active = 0;
    if (driver.primary_context_get_state(device, &flags, &active) != CUDA_SUCCESS) active = 0;
    if (!active && !wanted.contains(ordinal)) continue;
    GpuFacts gpu;
    gpu.device = ordinal;
    char text[256] = {};
    if (driver.device_get_name(text, sizeof(text) - 1, device) == CUDA_SUCCESS) gpu.name = text;
    char bus_id[64] = {};
    if (driver.device_get_pci_bus_id(bus_id, sizeof(bus_id) - 1, device) == CUDA_SUCCESS) {
      gpu.pci_bus_id = bus_id;
    }
    if (active) ReadDeviceMemory(driver, device, &gpu);
    facts.gpus.push_back(std::move(gpu));
  }
  return facts;
}

// "MemAvailable:   123456 kB" → bytes; -1 when the key is absent or unreadable.
std::int64_t KilobyteField(const std::optional<std::string>& text, absl::string_view key) {
  if (!text) return -1;
  const std::string prefix = absl::StrCat(key, ":");
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (!absl::ConsumePrefix(&line, prefix)) continue;
    if (const size_t unit = line.find("kB"); unit != absl::string_view::npos) line = line.substr(0, unit);
    std::int64_t kilobytes = 0;
    return absl::SimpleAtoi(line, &kilobytes) && kilobytes >= 0 ? kilobytes * 1024 : -1;
  }
  return -1;
}

// /proc/self/cmdline: each argument ends with a NUL, so the last one's separates nothing.
std::vector<std::string> SplitNulSeparated(absl::string_view text) {
  if (text.empty()) return {};
  absl::ConsumeSuffix(&text, absl::string_view("\0", 1));
  return absl::StrSplit(text, '\0');
}

std::string KnownOr(const std::string& value) { return value.empty() ? "unknown" : value; }

}  // namespace

std::optional<std::string> ReadWholeFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string content;
  char buffer[4096];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int read_error = errno;
      close(fd);
      if (n < 0) {
        errno = read_error;
        return std::nullopt;
      }
      return content;
    }
    content.append(buffer, static_cast<size_t>(n));
  }
}

std::string NcclVersionText(int code) {
  if (code <= 0) return "unknown";
  // NCCL 2.9 changed the code from major*1000+minor*100+patch to major*10000+minor*100+patch.
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? code % 10000 / 100 : code % 1000 / 100;
  return absl::StrCat(major, ".", minor, ".", code % 100);
}

int NcclVersionCode(const std::string& text) {
  const std::vector<std::string> parts = absl::StrSplit(text, '.');
  int major = 0;
  int minor = 0;
  int patch = 0;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &major) || !absl::SimpleAtoi(parts[1], &minor) ||
      !absl::SimpleAtoi(parts[2], &patch)) {
    return 0;
  }
  return major > 2 || (major == 2 && minor >= 9) ? major * 10000 + minor * 100 + patch
                                                 : major * 1000 + minor * 100 + patch;
}

bool IsAllowlistedVariable(const std::string& name) {
  // TORCH_NCCL_* and TORCH_FR_*: where PyTorch writes its Flight Recorder dumps, for analyze.
  for (const absl::string_view prefix : {"NCCL_", "CUDA_", "NCCLGUARD_", "TORCH_NCCL_", "TORCH_FR_"}) {
    if (name.size() > prefix.size() && absl::StartsWith(name, prefix)) return true;
  }
  return name == "LD_PRELOAD" || name == "LD_LIBRARY_PATH";
}

namespace {

constexpr char kRedacted[] = "<redacted>";

bool ContainsAnyWord(absl::string_view text, std::initializer_list<absl::string_view> words) {
  const std::string upper = absl::AsciiStrToUpper(text);
  for (const absl::string_view word : words) {
    if (absl::StrContains(upper, word)) return true;
  }
  return false;
}

bool NamesSecretVariable(absl::string_view name) {
  return ContainsAnyWord(name, {"PASSWORD", "TOKEN", "SECRET", "KEY"});
}

}  // namespace

std::vector<std::string> RedactCommandLine(std::vector<std::string> arguments) {
  bool value_follows = false;
  for (std::string& argument : arguments) {
    if (std::exchange(value_follows, false) && !absl::StartsWith(argument, "--")) {
      argument = kRedacted;
      continue;
    }
    if (!absl::StartsWith(argument, "--")) continue;
    const size_t equals = argument.find('=');
    if (!ContainsAnyWord(absl::string_view(argument).substr(0, equals), {"KEY", "TOKEN", "PASSWORD"}))
      continue;
    if (equals != std::string::npos) {
      argument = absl::StrCat(argument.substr(0, equals + 1), kRedacted);
    } else {
      value_follows = true;  // --api-key VALUE
    }
  }
  return arguments;
}

bool P2pDisabledBy(const EnvironmentVariables& variables) {
  for (const auto& [name, value] : variables) {
    int number = -1;
    if (name == "NCCL_P2P_DISABLE" && absl::SimpleAtoi(value, &number) && number == 1) return true;
    if (name == "NCCL_P2P_LEVEL" && (value == "LOC" || (absl::SimpleAtoi(value, &number) && number == 0))) {
      return true;
    }
  }
  return false;
}

bool InitialiseCudaDriver() {
  const CudaDriver& driver = Driver();
  return driver.init != nullptr && driver.init(0) == CUDA_SUCCESS;
}

int LauncherRank(const ProcessFacts& facts) {
  return LauncherRankFrom([&](std::string_view variable) -> std::optional<std::string> {
    for (const auto& [name, value] : facts.launcher) {
      if (name == variable) return value;
    }
    return std::nullopt;
  });
}

FactSources RealFactSources() {
  FactSources sources;
  sources.host_name = log::HostName;
  sources.pid = [] { return static_cast<int>(getpid()); };
  sources.parent_pid = [] { return static_cast<int>(getppid()); };
  sources.read_file = ReadWholeFile;
  sources.read_link = ReadLink;
  sources.environment = ProcessEnvironment;
  sources.kernel_release = [] {
    utsname names{};
    return uname(&names) == 0 ? std::string(names.release) : std::string();
  };
  sources.nvml_driver_version = NvmlDriverVersion;
  sources.nvml_gpu_names = NvmlGpuNames;
  sources.nccl_version = [] { return Real().Version(0); };
  sources.cuda = ReadCudaFacts;
  return sources;
}

ProcessFacts CollectIdentityFacts(const FactSources& sources) {
  ProcessFacts facts;
  facts.host = KnownOr(Ask(sources.host_name, std::string()));
  facts.pid = Ask(sources.pid, -1);
  facts.ppid = Ask(sources.parent_pid, -1);
  EnvironmentVariables environment = Ask(sources.environment, EnvironmentVariables());
  for (const std::string_view wanted : kLauncherVariables) {
    for (const auto& [name, value] : environment) {
      if (name == wanted) {
        facts.launcher.emplace_back(name, value);
        break;
      }
    }
  }
  return facts;
}

namespace {

void AddMatchingFacts(const FactSources& sources, const std::vector<int>& devices, ProcessFacts& facts) {
  for (auto& [name, value] : Ask(sources.environment, EnvironmentVariables())) {
    if (!IsAllowlistedVariable(name)) continue;
    facts.environment.emplace_back(
        name, NamesSecretVariable(name) ? std::string(kRedacted) : RemoveUrlCredentials(value));
  }
  std::sort(facts.environment.begin(), facts.environment.end());
  facts.kernel_release = KnownOr(Ask(sources.kernel_release, std::string()));
  facts.driver_version = KnownOr(Ask(sources.nvml_driver_version, std::string()));
  facts.host_gpu_names = Ask(sources.nvml_gpu_names, std::vector<std::string>());
  facts.cuda = Ask(sources.cuda, CudaFacts(), devices);
}

}  // namespace

ProcessFacts CollectMatchingFacts(const FactSources& sources) {
  ProcessFacts facts = CollectIdentityFacts(sources);
  AddMatchingFacts(sources, {}, facts);
  return facts;
}

ProcessFacts CollectProcessFacts(const FactSources& sources, const std::vector<int>& devices) {
  ProcessFacts facts = CollectIdentityFacts(sources);
  AddMatchingFacts(sources, devices, facts);
  using OptionalText = std::optional<std::string>;
  facts.program = KnownOr(Ask(sources.read_link, OptionalText(), std::string("/proc/self/exe")).value_or(""));
  if (const OptionalText command_line =
          Ask(sources.read_file, OptionalText(), std::string("/proc/self/cmdline"))) {
    facts.command_line = RedactCommandLine(SplitNulSeparated(*command_line));
  }
  facts.nccl_version = Ask(sources.nccl_version, 0);
  const OptionalText meminfo = Ask(sources.read_file, OptionalText(), std::string("/proc/meminfo"));
  facts.host_memory_total_bytes = KilobyteField(meminfo, "MemTotal");
  facts.host_memory_available_bytes = KilobyteField(meminfo, "MemAvailable");
  const OptionalText status = Ask(sources.read_file, OptionalText(), std::string("/proc/self/status"));
  facts.rss_bytes = KilobyteField(status, "VmRSS");
  facts.peak_rss_bytes = KilobyteField(status, "VmHWM");
  return facts;
}

}  // namespace ncclguard
