// What a dump says about the process, its host, its GPUs and its NCCL environment. Gathered when a
// dump or status file is written, never on a hot path. Every fact that cannot be read is
// "unknown" or -1: collecting facts never fails and never throws.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ncclguard {

struct GpuFacts {
  int device = -1;  // CUDA device ordinal
  std::string name = "unknown";
  std::string pci_bus_id = "unknown";
  // Read in the device's primary context, and only when the process already has it active.
  std::int64_t memory_free_bytes = -1;
  std::int64_t memory_total_bytes = -1;
};

struct CudaFacts {
  int driver_version = -1;  // cuDriverGetVersion: 1000 × major + 10 × minor, e.g. 13000
  int device_count = -1;    // cuDeviceGetCount: the GPUs visible to the process; -1: unknown
  std::vector<GpuFacts> gpus;
  // cuDeviceCanAccessPeer between the visible GPUs: peer_access[i][j] is 1 when device i can
  // access device j's memory (the diagonal is 0); empty when unknown.
  std::vector<std::vector<int>> peer_access;
};

using EnvironmentVariables = std::vector<std::pair<std::string, std::string>>;

struct ProcessFacts {
  std::string host = "unknown";
  int pid = -1;
  int ppid = -1;
  std::string program = "unknown";        // the executable's path
  std::vector<std::string> command_line;  // argv, from /proc/self/cmdline
  EnvironmentVariables launcher;          // the launcher's rank variables that are set
  EnvironmentVariables environment;       // the allowlisted variables that are set, sorted
  std::string kernel_release = "unknown";
  std::string driver_version = "unknown";  // the kernel driver's, from NVML, e.g. "580.65.06"
  // Every GPU of the host, from NVML, whatever CUDA_VISIBLE_DEVICES says: known before the process
  // initialises CUDA (when `cuda` knows nothing yet). Empty when unknown.
  std::vector<std::string> host_gpu_names;
  int nccl_version = 0;  // ncclGetVersion's code of the default libnccl, 0: unknown
  CudaFacts cuda;
  std::int64_t host_memory_total_bytes = -1;
  std::int64_t host_memory_available_bytes = -1;
  std::int64_t rss_bytes = -1;
  std::int64_t peak_rss_bytes = -1;
};

// Where facts come from. The defaults (RealFactSources) read the running system; tests replace
// any of them. A source that cannot answer returns an empty string, std::nullopt or -1.
struct FactSources {
  std::function<std::string()> host_name;
  std::function<int()> pid;
  std::function<int()> parent_pid;
  std::function<std::optional<std::string>(const std::string& path)> read_file;
  std::function<std::optional<std::string>(const std::string& path)> read_link;
  std::function<EnvironmentVariables()> environment;  // the whole environment, unfiltered
  std::function<std::string()> kernel_release;
  std::function<std::string()> nvml_driver_version;
  std::function<std::vector<std::string>()> nvml_gpu_names;
  std::function<int()> nccl_version;
  // GPU facts of the devices with an active primary context plus `devices`, the number of
  // visible GPUs and their peer access. Never initialises CUDA: before the process's cuInit only
  // the driver version is known.
  std::function<CudaFacts(const std::vector<int>& devices)> cuda;
};

FactSources RealFactSources();

// The whole content of a file; std::nullopt when it cannot be read (errno says why).
std::optional<std::string> ReadWholeFile(const std::string& path);

// Every fact. `devices` are the ordinals the process's communicators use; devices whose primary
// context is active are reported whether listed or not.
ProcessFacts CollectProcessFacts(const FactSources& sources, const std::vector<int>& devices = {});

// What matching known-bad configurations needs (known_bad.h): host, pid, the allowlisted
// environment, kernel release, NVML driver version and GPU names, and the CUDA facts. No /proc
// reads.
ProcessFacts CollectMatchingFacts(const FactSources& sources);

// Only what a status file needs: host, pid, ppid and the launcher's variables. No /proc reads,
// no driver calls.
ProcessFacts CollectIdentityFacts(const FactSources& sources);

// An ncclGetVersion code as text: 22809 → "2.28.9" (and 2708 → "2.7.8", before NCCL 2.9 changed
// the encoding); "unknown" for 0.
std::string NcclVersionText(int code);
// And back: "2.28.9" → 22809, "2.7.8" → 2708; 0 for "unknown" or anything else.
int NcclVersionCode(const std::string& text);

// True for the variables a dump may show: NCCL_*, CUDA_*, NCCLGUARD_*, LD_PRELOAD and
// LD_LIBRARY_PATH. Nothing else: secrets live in the environment. (The values of those whose name
// contains PASSWORD, TOKEN, SECRET or KEY are shown as "<redacted>".)
bool IsAllowlistedVariable(const std::string& name);

// argv with the values of --*key*, --*token* and --*password* options (as `--opt=VALUE` or
// `--opt VALUE`, any case) replaced by "<redacted>".
std::vector<std::string> RedactCommandLine(std::vector<std::string> arguments);

// Whether these variables turn NCCL's P2P transport off, as NCCL reads them:
// NCCL_P2P_DISABLE=1, or NCCL_P2P_LEVEL=LOC (or its legacy number 0).
bool P2pDisabledBy(const EnvironmentVariables& variables);

// The variables by which a user decides NCCL's P2P transport: set, they always win over ncclguard.
inline constexpr const char* kNcclP2pVariables[] = {"NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL"};

// Initialises the CUDA driver (cuInit) in this process, for a program of ncclguard's own that
// reports on the machine; false when there is no driver or it fails. The library never calls it:
// it must not initialise CUDA on an application's behalf.
bool InitialiseCudaDriver();

// The launcher's rank among the launcher variables kept in the facts, read as the log prefix reads
// it from the environment (common/launcher.h); -1 when none is set.
int LauncherRank(const ProcessFacts& facts);

}  // namespace ncclguard
