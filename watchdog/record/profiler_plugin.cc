// Which profiler plugin NCCL loads: ncclguard's own (shim/profiler.cc), with the user's behind it.
#include "watchdog/record/profiler_plugin.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "watchdog/common/config.h"
#include "watchdog/common/libraries.h"
#include "watchdog/common/log.h"
#include "watchdog/common/profile_events.h"
#include "watchdog/record/hooks.h"
#include "watchdog/recover/p2p_policy.h"
#include "watchdog/state/profiles.h"
#include "watchdog/state/records.h"
#include "watchdog/state/registry.h"

namespace ncclguard {
namespace {

constexpr char kPluginVariable[] = "NCCL_PROFILER_PLUGIN";
// NCCL's name for "look in the process itself", where a preloaded library is.
constexpr char kStaticPlugin[] = "STATIC_PLUGIN";

std::mutex g_mutex;
std::string g_user_plugin;  // what NCCL_PROFILER_PLUGIN named before we pointed it at ourselves
std::string g_own_plugin;   // what we pointed it at

// The shared object that serves NCCL's profiler (shim/profiler.cc), as NCCL can dlopen() it:
// libncclguard.so's path, or STATIC_PLUGIN where the shim is linked into a program. Found from the
// libraries the shim handed the core (an object of the shim's), not from this code, which is in
// libncclguard-core.so when the shim is libncclguard.so's front end.
std::string OwnPlugin() {
  Dl_info info{};
  if (dladdr(static_cast<const void*>(&Real()), &info) != 0 && info.dli_fname != nullptr &&
      absl::EndsWith(info.dli_fname, ".so")) {
    // As loaded, which may be relative to a directory the application leaves before NCCL's first
    // communicator (LD_PRELOAD=./libncclguard.so).
    const std::unique_ptr<char, decltype(&free)> absolute(realpath(info.dli_fname, nullptr), &free);
    return absolute != nullptr ? absolute.get() : info.dli_fname;
  }
  return kStaticPlugin;
}

// The plugin the user named, and where: the environment, else the first NCCL config file that
// names one (NCCL loads them into the environment without overriding it, at its first call; once
// ncclguard has set the variable, theirs would be lost).
struct UserPlugin {
  std::string name;
  std::string where = "the environment";
};
UserPlugin UserPluginSetting(const std::vector<NcclConfigFile>& nccl_config_files) {
  if (const char* set = getenv(kPluginVariable); set != nullptr) return {set};
  for (const NcclConfigFile& file : nccl_config_files) {
    for (const auto& [name, value] : ParseNcclConfigFile(file.content)) {
      if (name == kPluginVariable) return {value, file.path};
    }
  }
  return {};
}

}  // namespace

void PointNcclAtOwnProfiler(const Config& config, const std::vector<NcclConfigFile>& nccl_config_files) {
  const UserPlugin setting = UserPluginSetting(nccl_config_files);
  const std::string& user = setting.name;
  if (!config.profiler) {
    log::Info("NCCLGUARD_PROFILER=0: NCCL's profiler plugin left as it is ({}={})", kPluginVariable,
              user.empty() ? "unset" : user);
    return;
  }
  if (strcasecmp(user.c_str(), "none") == 0) {
    log::Info("{}=none in {}: NCCL's profiler stays off, and ncclguard goes without it", kPluginVariable,
              setting.where);
    return;
  }
  const std::string own = OwnPlugin();
  std::lock_guard<std::mutex> lock(g_mutex);
  // A process started by one of ours inherits our setting: the user's plugin is not ours.
  g_user_plugin = user == own ? "" : user;
  g_own_plugin = own;
  // Before the first communicator: NCCL reads the variable when it loads its plugin, at the first
  // init. Set while this process makes its first NCCL call, before any of NCCL's own threads run.
  if (setenv(kPluginVariable, own.c_str(), 1) != 0) {
    log::Warn("cannot set {}: NCCL's profiler plugin left as it is", kPluginVariable);
    return;
  }
  log::Info("NCCL's profiler plugin is ncclguard's ({}={}){}", kPluginVariable, own,
            g_user_plugin.empty() ? ""
                                  : absl::StrCat(", which forwards every event to the user's ", g_user_plugin,
                                                 " (named in ", setting.where, ")"));
}

namespace hooks {

const char* ProfilerPluginOfUser() noexcept {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_user_plugin.c_str();
}

void ReportProfilerPluginOfUser(const std::string& name, const char* plugin_name, bool opened,
                                const char* wanted, const char* error) noexcept {
  if (plugin_name != nullptr) {
    log::Info("NCCL's profiler events go to the user's plugin {} ({}={}) too", plugin_name, kPluginVariable,
              name);
  } else if (opened) {
    log::Warn("the user's profiler plugin {}={} has no {}, which this NCCL calls: it gets no events",
              kPluginVariable, name, wanted);
  } else {
    log::Warn("the user's profiler plugin {}={} cannot be loaded ({}): it gets no events", kPluginVariable,
              name, error != nullptr ? error : "unknown error");
  }
}

namespace profiler {

CommProfile* Open(int rank, int nranks, bool api_events) noexcept {
  try {
    // The communicator being created, best first: one of that rank and size on this thread (a
    // blocking init); a split or shrink on this thread (its rank and size are NCCL's to choose, so
    // unknown until it returns); the newest of that rank and size, then the newest split or shrink,
    // whose call may also have returned already (ncclInProgress: NCCL's own thread initialises a
    // non-blocking one).
    std::string comm_id;
    int best = 0;
    auto consider = [&](const std::string& id, int its_rank, int its_nranks, bool this_thread) {
      const bool same_size = its_rank == rank && its_nranks == nranks;
      if (!same_size && its_rank >= 0) return;
      const int score = (this_thread ? 2 : 0) + (same_size ? 2 : 1);
      if (score >= best) {
        best = score;
        comm_id = id;
      }
    };
    for (const CommState* comm : GetRegistry().All()) {
      if (comm->init_end_ns.load(std::memory_order_acquire) == 0) {
        consider(comm->id, comm->rank.load(std::memory_order_relaxed),
                 comm->nranks.load(std::memory_order_relaxed), false);
      }
    }
    const std::int64_t thread = syscall(SYS_gettid);
    for (const PendingInit& init : GetRegistry().PendingInits()) {
      consider(init.comm_id, init.rank, init.nranks, init.thread == thread);
    }
    return GetProfileTable().Open(comm_id, rank, api_events);
  } catch (...) {
    return nullptr;
  }
}

void Close(CommProfile* profile) noexcept {
  if (profile != nullptr) GetProfileTable().Close(profile);
}

ProfileRef StartApi(CommProfile* profile, bool graph_captured) noexcept {
  return CommProfile::StartApi(profile, graph_captured);
}
ProfileRef StartOp(CommProfile* profile, const ProfiledOpStart& start, const ProfileRef& api) noexcept {
  return profile != nullptr ? profile->StartOp(start, api) : ProfileRef{};
}
ProfileRef StartChannel(const ProfileRef& op, int channel, std::int64_t gpu_ns) noexcept {
  return CommProfile::StartChannel(op, channel, gpu_ns);
}
void StopChannel(const ProfileRef& channel, std::int64_t gpu_ns) noexcept {
  CommProfile::StopChannel(channel, gpu_ns);
}
ProfileRef StartProxyOp(const ProfileRef& op, int channel, int peer, bool send, int steps) noexcept {
  return CommProfile::StartProxyOp(op, channel, peer, send, steps);
}
void StopProxyOp(const ProfileRef& proxy) noexcept { CommProfile::StopProxyOp(proxy); }
ProfileRef StartStep(const ProfileRef& proxy, int step) noexcept {
  return CommProfile::StartStep(proxy, step);
}
void SetStepWait(const ProfileRef& step, StepWait wait, std::size_t bytes) noexcept {
  CommProfile::SetStepWait(step, wait, bytes);
}
void StopStep(const ProfileRef& step) noexcept { CommProfile::StopStep(step); }

}  // namespace profiler
}  // namespace hooks
}  // namespace ncclguard
