// The rest of the shim's door (hooks.h): starting ncclguard at the first call (configuration,
// log, P2P policy) and again in a forked child, and logging calls. What calls mean is
// operations.cc's.
#include "watchdog/record/hooks.h"

#include <nccl.h>
#include <pthread.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "watchdog/common/config.h"
#include "watchdog/common/in_process_recovery.h"
#include "watchdog/common/launcher.h"
#include "watchdog/common/libraries.h"
#include "watchdog/common/log.h"
#include "watchdog/common/nccl_api.h"
#include "watchdog/common/version.h"
#include "watchdog/detect/runtime.h"
#include "watchdog/record/profiler_plugin.h"
#include "watchdog/recover/door.h"
#include "watchdog/recover/p2p_policy.h"
#include "watchdog/state/registry.h"

namespace ncclguard {

namespace hooks {
namespace {

enum class State { kNotStarted, kActive, kDisabled, kBroken };

std::atomic<State> g_state{State::kNotStarted};
std::mutex g_start_mutex;

std::string ProgramName() {
  char path[1024] = {};
  const ssize_t length = readlink("/proc/self/exe", path, sizeof(path) - 1);
  return length > 0 ? std::string(path, length) : "unknown program";
}

// A forked child starts over at its own first NCCL call, with its own log (DataLoader workers
// usually never make one). The configuration is kept: it is the parent's environment too.
void RegisterForkHandlersOnce() {
  static std::atomic<bool> registered{false};
  if (registered.exchange(true)) return;
  pthread_atfork([] { g_start_mutex.lock(); }, [] { g_start_mutex.unlock(); },
                 [] {
                   g_start_mutex.unlock();
                   log::ForgetAfterFork();
                   if (g_state.load() == State::kActive) g_state.store(State::kNotStarted);
                 });
}

bool Start(RealLibraries& libraries) noexcept {
  std::lock_guard<std::mutex> lock(g_start_mutex);
  InstallRealLibraries(&libraries);
  State state = g_state.load(std::memory_order_acquire);
  if (state != State::kNotStarted) return state == State::kActive;
  const Config& config = GetConfig();
  if (config.disable) {
    g_state.store(State::kDisabled, std::memory_order_release);
    return false;
  }
  try {
    log::Start(config);
    // The launcher's rank until a communicator says more.
    log::SetRank(LauncherRankFromEnvironment());
    RegisterForkHandlersOnce();
    log::Info("ncclguard {} watching {} (pid {})", kVersion, ProgramName(), getpid());
    for (const std::string& line : config.effective_values) log::Info("setting {}", line);
    for (const std::string& problem : config.problems) log::Warn("{}", problem);
    // Before the first communicator: the only moment NCCL still reads NCCL_P2P_DISABLE. Both read
    // what the user set in NCCL's config files, read here once.
    const std::vector<NcclConfigFile> nccl_config_files = ReadNcclConfigFiles(ReadProcessEnvironment);
    ApplyP2pPolicy(config, nccl_config_files);
    PointNcclAtOwnProfiler(config, nccl_config_files);
    // Before the first communicator: from now on calls that name one reach in-process recovery.
    if (config.recover == RecoverMode::kInProcess)
      g_in_process_recovery.store(&InProcessDoor(), std::memory_order_release);
    g_state.store(State::kActive, std::memory_order_release);
    return true;
  } catch (const std::exception& error) {
    // Fail open: say so once, on stderr since the log may be what failed, and forward every call.
    char line[512];
    const int length =
        std::snprintf(line, sizeof(line), "ncclguard: cannot start (%s); NCCL calls pass through unwatched\n",
                      error.what());
    if (length > 0) (void)!write(STDERR_FILENO, line, std::min<size_t>(length, sizeof(line) - 1));
  } catch (...) {
    static constexpr char kLine[] = "ncclguard: cannot start; NCCL calls pass through unwatched\n";
    (void)!write(STDERR_FILENO, kLine, sizeof(kLine) - 1);
  }
  g_state.store(State::kBroken, std::memory_order_release);
  return false;
}

}  // namespace

bool Disabled() noexcept { return GetConfig().disable; }

bool Active(RealLibraries& libraries) noexcept {
  const State state = g_state.load(std::memory_order_acquire);
  if (state == State::kActive) return true;
  if (state != State::kNotStarted) return false;
  return Start(libraries);
}

void NestedCall(Api api, Api outer) noexcept {
  log::Write(spdlog::level::trace, "{} nested in {}: passed through", Describe(api).name,
             Describe(outer).name);
}

void WaitIfExiting() noexcept { ::ncclguard::WaitIfExiting(); }

ncclComm_t ResolveCommunicator(ncclComm_t comm, int* library) noexcept {
  InProcessRecovery* recovery = InProcessRecoveryOn();
  return recovery != nullptr ? recovery->Resolve(comm, library) : comm;
}

bool ResolvesCommunicators() noexcept { return InProcessRecoveryOn() != nullptr; }

const char* NcclLibraryOfUser() noexcept {
  try {
    return GetConfig().nccl_library.c_str();  // parsed once, kept for the process
  } catch (...) {
    return "";
  }
}

void ReportNcclLibraryProblem(const std::string& configured, const std::string& problem) noexcept {
  // A dlsym() lookup may come before the first call, and the log.
  static std::atomic<bool> reported{false};
  if (log::Get() != nullptr && !reported.exchange(true)) {
    log::Error("NCCLGUARD_NCCL_LIBRARY='{}' {}; looking for the process's own NCCL", configured, problem);
  }
}

void EnterNccl(Api api) noexcept { ::ncclguard::EnterNccl(api); }
void LeaveNccl() noexcept { ::ncclguard::LeaveNccl(); }

CallDetail LoggedCallDetail() noexcept {
  // Debug first: off at the defaults, and trace is below it.
  if (!log::Enabled(spdlog::level::debug)) return CallDetail::kNone;
  return log::Enabled(spdlog::level::trace) ? CallDetail::kArguments : CallDetail::kName;
}

void LogCall(CallDetail detail, const std::string& call, const std::string& returned) noexcept {
  log::Write(detail == CallDetail::kArguments ? spdlog::level::trace : spdlog::level::debug, "{} -> {}", call,
             returned);
}

void ReportMissingFunction(Api api, int library) noexcept {
  static std::atomic<bool> reported[kApiCount];
  if (reported[static_cast<int>(api)].exchange(true)) return;
  const std::string path = Real().Path(library);
  if (path.empty()) {
    log::Error("{} called but no NCCL library was found in the process (set NCCLGUARD_NCCL_LIBRARY)",
               Describe(api).name);
  } else {
    log::Error("{} called but the NCCL library {} does not provide it", Describe(api).name, path);
  }
}

}  // namespace hooks
}  // namespace ncclguard
