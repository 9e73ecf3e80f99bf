// NCCL's profiler plugin API, served by libncclguard.so (shim/nccl_profiler.h). The core points
// NCCL at this library before the first communicator (record/profiler_plugin.cc) and records what
// the events say (hooks::profiler). A plugin the user named in NCCL_PROFILER_PLUGIN is loaded here
// the way NCCL would load it, and gets the events NCCL would have given it under its own mask, with
// its own contexts and handles, so that both work. NCCL 2.26 and 2.27 speak version 4: ncclguard
// records what it says the same way, and forwards it to the user's plugin in version 4.
#include <dlfcn.h>
#include <nccl.h>
#include <strings.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <new>
#include <string>

#include "shim/libraries.h"
#include "shim/nccl_profiler.h"
#include "watchdog/common/profile_events.h"
#include "watchdog/record/hooks.h"

// What NCCL looks up by name (defined below): version 6 (2.29) and 5 (2.28), one set of functions,
// and version 4 (2.26, 2.27), whose init and descriptor are its own.
// NOLINTBEGIN(readability-identifier-naming): the names NCCL looks up.
extern "C" {
__attribute__((visibility("default"))) extern const ncclProfiler_t ncclProfiler_v6;
__attribute__((visibility("default"))) extern const ncclProfiler_t ncclProfiler_v5;
__attribute__((visibility("default"))) extern const ncclProfiler_v4_t ncclProfiler_v4;
}
// NOLINTEND(readability-identifier-naming)

namespace ncclguard::shim {
namespace {

// The user's plugin, loaded at the first communicator's init and kept for the process: NCCL
// unloads a plugin when its last communicator goes, but a later communicator would only load it
// again. It is looked up in the version NCCL speaks to ncclguard: at most one of the two is set.
struct UserPlugin {
  std::once_flag loaded;
  const ncclProfiler_t* plugin = nullptr;        // version 6 or 5
  const ncclProfiler_v4_t* plugin_v4 = nullptr;  // version 4
  // The calls both versions have alike, of whichever is loaded.
  ncclResult_t (*stop_event)(void* handle) = nullptr;
  ncclResult_t (*record_event_state)(void* handle, ncclProfilerEventState_t state,
                                     ncclProfilerEventStateArgs_t* arguments) = nullptr;
  ncclResult_t (*finalize)(void* context) = nullptr;
};
UserPlugin g_user;

// NCCL's rules (2.28): STATIC_PLUGIN (or a prefix of it, in any case) is the process's own symbols;
// a name is opened as given, then as libnccl-profiler-<name>.so unless it is a path or a lib*.so.
void* OpenLikeNccl(const std::string& name) {
  if (strncasecmp(name.c_str(), "STATIC_PLUGIN", name.size()) == 0) return dlopen(nullptr, RTLD_NOW);
  if (void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
  const bool path = name.find('/') != std::string::npos;
  const bool library =
      name.rfind("lib", 0) == 0 && name.size() > 3 && name.compare(name.size() - 3, 3, ".so") == 0;
  if (path || library) return nullptr;
  return dlopen(("libnccl-profiler-" + name + ".so").c_str(), RTLD_NOW | RTLD_LOCAL);
}

// The first of `symbols` in `handle` that is not one of ours: STATIC_PLUGIN searches the whole
// process, this library included.
template <typename Plugin>
const Plugin* FindPlugin(void* handle, std::initializer_list<const char*> symbols) {
  for (const char* symbol : symbols) {
    if (handle == nullptr) break;
    const void* found = RealDlsym()(handle, symbol);
    if (found != nullptr && found != &ncclProfiler_v6 && found != &ncclProfiler_v5 &&
        found != &ncclProfiler_v4)
      return static_cast<const Plugin*>(found);
  }
  return nullptr;
}

// Loads the user's plugin in the version NCCL speaks (`version`, that of the first init): 6 or 5,
// version 6 first as NCCL prefers it (it has version 5's layout); or 4.
void LoadUserPlugin(int version) {
  std::call_once(g_user.loaded, [version] {
    const std::string name = hooks::ProfilerPluginOfUser();
    if (name.empty()) return;
    void* handle = OpenLikeNccl(name);
    const char* plugin_name = nullptr;
    auto keep_shared_calls = [&](const auto* plugin) {
      if (plugin == nullptr) return;
      plugin_name = plugin->name;
      g_user.stop_event = plugin->stopEvent;
      g_user.record_event_state = plugin->recordEventState;
      g_user.finalize = plugin->finalize;
    };
    if (version >= 5) {
      g_user.plugin = FindPlugin<ncclProfiler_t>(handle, {"ncclProfiler_v6", "ncclProfiler_v5"});
      keep_shared_calls(g_user.plugin);
    } else {
      g_user.plugin_v4 = FindPlugin<ncclProfiler_v4_t>(handle, {"ncclProfiler_v4"});
      keep_shared_calls(g_user.plugin_v4);
    }
    hooks::ReportProfilerPluginOfUser(name, plugin_name, handle != nullptr,
                                      version >= 5 ? "ncclProfiler_v6 or ncclProfiler_v5" : "ncclProfiler_v4",
                                      handle == nullptr ? dlerror() : nullptr);
  });
}

// What ncclguard records (hooks::profiler): the operations, their kernel channels and, over the
// network, their proxy operations and steps. NCCL starts the parents of these (Group, API events)
// too; the activation mask is one int for the process, which ncclguard ORs these into.
// NCCL starts the Coll and P2p API events of a call whenever the mask has one of these; version 4
// (NCCL 2.26, 2.27) has none.
constexpr int kRecorded =
    ncclProfileColl | ncclProfileP2p | ncclProfileKernelCh | ncclProfileProxyOp | ncclProfileProxyStep;

// The types whose events NCCL starts when the mask has one of them: an event and its descendants.
int StartedFor(std::uint64_t type) {
  constexpr int kBelowProxyOp = ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileNetPlugin;
  constexpr int kBelowTask = kBelowProxyOp | ncclProfileKernelCh;
  switch (type) {
    case ncclProfileGroupApi:
      return ncclProfileGroupApi | ncclProfileCollApi | ncclProfileP2pApi | ncclProfileKernelLaunch |
             ncclProfileGroup | ncclProfileColl | ncclProfileP2p | kBelowTask;
    case ncclProfileCollApi:
      return ncclProfileCollApi | ncclProfileColl | kBelowTask;
    case ncclProfileP2pApi:
      return ncclProfileP2pApi | ncclProfileP2p | kBelowTask;
    case ncclProfileGroup:
      return ncclProfileGroup | ncclProfileColl | ncclProfileP2p | kBelowTask;
    case ncclProfileColl:
      return ncclProfileColl | kBelowTask;
    case ncclProfileP2p:
      return ncclProfileP2p | kBelowTask;
    case ncclProfileProxyOp:
      return kBelowProxyOp;
    case ncclProfileProxyStep:
      return ncclProfileProxyStep | ncclProfileNetPlugin;
    default:
      return static_cast<int>(type);
  }
}

// The mask as the user's plugin last set it: its events are those NCCL would start for it.
std::atomic<int> g_user_mask{0};

struct Context {
  CommProfile* profile = nullptr;
  void* user = nullptr;
  // This process, as NCCL initialised the communicator in it: getpid() is a system call, which a
  // proxy thread's callback must not make.
  pid_t pid = 0;
};

// An event as NCCL knows it. NCCL names an event as the parent of others after its stop, and may
// stop one twice: handles are never freed, but taken in turn from a ring of 65,536 (2.5 MiB), so
// that one comes back only after as many newer events. A stop or state NCCL sends for an event
// older than that lands on a newer event's handle: its record is then off by one state, never
// outside ncclguard's own memory.
struct Handle {
  std::uint64_t type = 0;
  ProfileRef recorded;
  void* user = nullptr;
};
constexpr std::size_t kHandles = std::size_t{1} << 16;
std::atomic<std::size_t> g_next_handle{0};
Handle* g_handles = nullptr;  // allocated at the first init

// The events ncclguard records something of (Record); the others (groups, kernel launches) get
// this one shared handle, never written, unless the user's plugin has a handle of its own to keep.
constexpr std::uint64_t kRecordedTypes = ncclProfileCollApi | ncclProfileP2pApi | ncclProfileColl |
                                         ncclProfileP2p | ncclProfileKernelCh | ncclProfileProxyOp |
                                         ncclProfileProxyStep;
Handle g_unrecorded;

// Its record is the caller's to write.
Handle* NewHandle(std::uint64_t type) {
  Handle& handle = g_handles[g_next_handle.fetch_add(1, std::memory_order_relaxed) % kHandles];
  handle.type = type;
  handle.user = nullptr;
  return &handle;
}

// A communicator's context, whichever version NCCL speaks; `init_user` initialises the user's
// plugin, when there is one, into the slot it is given.
template <typename InitUser>
ncclResult_t InitContext(void** context, int* mask, int ranks, int rank, bool api_events, bool user,
                         InitUser init_user) {
  static std::once_flag handles;
  std::call_once(handles, [] { g_handles = new (std::nothrow) Handle[kHandles]; });
  *context = nullptr;
  if (g_handles == nullptr) return ncclSuccess;
  auto* ours =
      new (std::nothrow) Context{.profile = hooks::profiler::Open(rank, ranks, api_events), .pid = getpid()};
  if (ours == nullptr) return ncclSuccess;
  // A failed init of theirs leaves them no context: nothing of theirs is called for it.
  if (user && init_user(&ours->user) != ncclSuccess) ours->user = nullptr;
  if (user) g_user_mask.store(*mask, std::memory_order_relaxed);
  if (ours->profile != nullptr) __atomic_fetch_or(mask, kRecorded, __ATOMIC_RELAXED);
  *context = ours;
  return ncclSuccess;
}

ncclResult_t Init(void** context, uint64_t comm_id, int* mask, const char* comm_name, int nodes, int ranks,
                  int rank, ncclProfilerLogger_t log) {
  LoadUserPlugin(5);
  const ncclProfiler_t* user = g_user.plugin;
  return InitContext(context, mask, ranks, rank, true, user != nullptr, [&](void** theirs) {
    return user->init(theirs, comm_id, mask, comm_name, nodes, ranks, rank, log);
  });
}

ncclResult_t InitV4(void** context, int* mask, const char* comm_name, uint64_t comm_hash, int nodes,
                    int ranks, int rank, ncclProfilerLogger_t log) {
  LoadUserPlugin(4);
  const ncclProfiler_v4_t* user = g_user.plugin_v4;
  return InitContext(context, mask, ranks, rank, false, user != nullptr, [&](void** theirs) {
    return user->init(theirs, mask, comm_name, comm_hash, nodes, ranks, rank, log);
  });
}

ProfileRef Record(const Context& context, const Handle* parent, const ncclProfilerEventDescr_t& event) {
  static constexpr ProfileRef kNoParent;
  const ProfileRef& parent_ref = parent != nullptr ? parent->recorded : kNoParent;
  // A task's parent is its API event (version 5; version 4's is the Group, which ties nothing).
  const ProfileRef& api =
      parent != nullptr && (parent->type == ncclProfileCollApi || parent->type == ncclProfileP2pApi)
          ? parent_ref
          : kNoParent;
  switch (event.type) {
    case ncclProfileCollApi:
      return hooks::profiler::StartApi(context.profile, event.collApi.graphCaptured != 0);
    case ncclProfileP2pApi:
      return hooks::profiler::StartApi(context.profile, event.p2pApi.graphCaptured != 0);
    case ncclProfileColl:
      return hooks::profiler::StartOp(context.profile,
                                      {.func = event.coll.func,
                                       .nccl_seq = event.coll.seqNumber,
                                       .algo = event.coll.algo,
                                       .proto = event.coll.proto,
                                       .channels = event.coll.nChannels},
                                      api);
    case ncclProfileP2p:
      return hooks::profiler::StartOp(
          context.profile, {.func = event.p2p.func, .channels = event.p2p.nChannels, .peer = event.p2p.peer},
          api);
    case ncclProfileKernelCh:
      return hooks::profiler::StartChannel(parent_ref, event.kernelCh.channelId,
                                           static_cast<std::int64_t>(event.kernelCh.pTimer));
    case ncclProfileProxyOp:
      // Another process's operation (PXN): its parent is that process's, not ours to look at.
      if (event.proxyOp.pid != context.pid) return {};
      return hooks::profiler::StartProxyOp(parent_ref, event.proxyOp.channelId, event.proxyOp.peer,
                                           event.proxyOp.isSend != 0, event.proxyOp.nSteps);
    case ncclProfileProxyStep:
      return hooks::profiler::StartStep(parent_ref, event.proxyStep.step);
    default:
      return {};
  }
}

// The user's handle of an event of ours, or null.
void* Theirs(void* ours) { return ours != nullptr ? static_cast<Handle*>(ours)->user : nullptr; }

// Starts the event in the user's plugin too, when its mask asks for it. Out of line: its copy of
// the descriptor would otherwise weigh on every event's frame.
template <typename Descriptor, typename Start>
[[gnu::noinline]] void StartInUserPlugin(const Context& ours, const Descriptor& descriptor, Handle& started,
                                         Start start) {
  if ((StartedFor(descriptor.type) & g_user_mask.load(std::memory_order_relaxed)) == 0) return;
  Descriptor theirs = descriptor;
  theirs.parentObj = Theirs(descriptor.parentObj);
  start(ours.user, theirs, &started.user);
}

// Records an event NCCL starts in `context` (not null), `descriptor` as NCCL gave it and `event`
// the same in version 5's terms, and gives out its handle. `start_theirs(their context, a copy of
// descriptor, the slot for their handle)` starts it in the user's plugin, when one is loaded
// (`user_loaded`) and its mask asks for the event.
template <typename Descriptor, typename StartTheirs>
[[gnu::noinline]] ncclResult_t StartRecorded(void* context, void** handle, const Descriptor& descriptor,
                                             const ncclProfilerEventDescr_t& event, bool user_loaded,
                                             StartTheirs start_theirs) {
  const auto* ours = static_cast<const Context*>(context);
  const bool theirs_too = user_loaded && ours->user != nullptr;
  Handle* started = NewHandle(descriptor.type);
  started->recorded = Record(*ours, static_cast<Handle*>(descriptor.parentObj), event);
  if (theirs_too) StartInUserPlugin(*ours, descriptor, *started, start_theirs);
  *handle = started;
  return ncclSuccess;
}

// Whether an event needs no handle of its own: ncclguard records nothing of it (groups, kernel
// launches) and no user plugin shares ncclguard's handles. Such events, most of those on the
// application's thread, get the shared handle without a frame of StartRecorded's size.
bool Unrecorded(const void* context, std::uint64_t type, bool user_loaded) {
  return (type & kRecordedTypes) == 0 &&
         (!user_loaded || context == nullptr || static_cast<const Context*>(context)->user == nullptr);
}

ncclResult_t StartEvent(void* context, void** handle, ncclProfilerEventDescr_t* descriptor) {
  if (descriptor == nullptr || context == nullptr) [[unlikely]] {
    *handle = nullptr;
    return ncclSuccess;
  }
  if (Unrecorded(context, descriptor->type, g_user.plugin != nullptr)) {
    *handle = &g_unrecorded;
    return ncclSuccess;
  }
  return StartRecorded(context, handle, *descriptor, *descriptor, g_user.plugin != nullptr,
                       [](void* user_context, ncclProfilerEventDescr_t& theirs, void** their_handle) {
                         if (theirs.type == ncclProfileColl)
                           theirs.coll.parentGroup = Theirs(theirs.coll.parentGroup);
                         if (theirs.type == ncclProfileP2p)
                           theirs.p2p.parentGroup = Theirs(theirs.p2p.parentGroup);
                         g_user.plugin->startEvent(user_context, their_handle, &theirs);
                       });
}

// What ncclguard records of a version 4 event, in version 5's terms.
ncclProfilerEventDescr_t AsVersion5(const ncclProfilerEventDescr_v4_t& event) {
  ncclProfilerEventDescr_t recorded{};
  recorded.type = event.type;
  recorded.parentObj = event.parentObj;
  recorded.rank = event.rank;
  switch (event.type) {
    case ncclProfileColl:
      recorded.coll.seqNumber = event.coll.seqNumber;
      recorded.coll.func = event.coll.func;
      recorded.coll.nChannels = event.coll.nChannels;
      recorded.coll.algo = event.coll.algo;
      recorded.coll.proto = event.coll.proto;
      break;
    case ncclProfileP2p:
      recorded.p2p.func = event.p2p.func;
      recorded.p2p.peer = event.p2p.peer;
      recorded.p2p.nChannels = event.p2p.nChannels;
      break;
    case ncclProfileKernelCh:
      recorded.kernelCh.channelId = event.kernelCh.channelId;
      recorded.kernelCh.pTimer = event.kernelCh.pTimer;
      break;
    case ncclProfileProxyOp:
      recorded.proxyOp.pid = event.proxyOp.pid;
      recorded.proxyOp.channelId = event.proxyOp.channelId;
      recorded.proxyOp.peer = event.proxyOp.peer;
      recorded.proxyOp.nSteps = event.proxyOp.nSteps;
      recorded.proxyOp.isSend = event.proxyOp.isSend;
      break;
    case ncclProfileProxyStep:
      recorded.proxyStep.step = event.proxyStep.step;
      break;
    default:
      break;
  }
  return recorded;
}

ncclResult_t StartEventV4(void* context, void** handle, ncclProfilerEventDescr_v4_t* descriptor) {
  if (descriptor == nullptr || context == nullptr) [[unlikely]] {
    *handle = nullptr;
    return ncclSuccess;
  }
  if (Unrecorded(context, descriptor->type, g_user.plugin_v4 != nullptr)) {
    *handle = &g_unrecorded;
    return ncclSuccess;
  }
  return StartRecorded(context, handle, *descriptor, AsVersion5(*descriptor), g_user.plugin_v4 != nullptr,
                       [](void* user_context, ncclProfilerEventDescr_v4_t& theirs, void** their_handle) {
                         g_user.plugin_v4->startEvent(user_context, their_handle, &theirs);
                       });
}

StepWait WaitOf(ncclProfilerEventState_t state) {
  switch (state) {
    case ncclProfilerProxyStepSendGPUWait:
      return StepWait::kSendGpu;
    case ncclProfilerProxyStepSendPeerWait:
      return StepWait::kSendPeer;
    case ncclProfilerProxyStepSendWait:
      return StepWait::kSendNet;
    case ncclProfilerProxyStepRecvWait:
      return StepWait::kRecvNet;
    case ncclProfilerProxyStepRecvFlushWait:
      return StepWait::kRecvFlush;
    case ncclProfilerProxyStepRecvGPUWait:
      return StepWait::kRecvGpu;
    default:
      return StepWait::kNone;
  }
}

ncclResult_t RecordEventState(void* handle, ncclProfilerEventState_t state,
                              ncclProfilerEventStateArgs_t* arguments) {
  auto* event = static_cast<Handle*>(handle);
  if (event == nullptr || event == &g_unrecorded) return ncclSuccess;
  if (event->type == ncclProfileProxyStep) {
    const std::size_t bytes = arguments != nullptr ? arguments->proxyStep.transSize : 0;
    hooks::profiler::SetStepWait(event->recorded, WaitOf(state), bytes);
  } else if (event->type == ncclProfileKernelCh && state == ncclProfilerKernelChStop &&
             arguments != nullptr) {
    hooks::profiler::StopChannel(event->recorded, static_cast<std::int64_t>(arguments->kernelCh.pTimer));
  }
  return event->user != nullptr && g_user.record_event_state != nullptr
             ? g_user.record_event_state(event->user, state, arguments)
             : ncclSuccess;
}

ncclResult_t StopEvent(void* handle) {
  auto* event = static_cast<Handle*>(handle);
  if (event == nullptr || event == &g_unrecorded) return ncclSuccess;
  if ((event->type & (ncclProfileProxyStep | ncclProfileProxyOp)) != 0) {
    if (event->type == ncclProfileProxyStep) hooks::profiler::StopStep(event->recorded);
    if (event->type == ncclProfileProxyOp) hooks::profiler::StopProxyOp(event->recorded);
  }
  return event->user != nullptr && g_user.stop_event != nullptr ? g_user.stop_event(event->user)
                                                                : ncclSuccess;
}

ncclResult_t Finalize(void* context) {
  auto* ours = static_cast<Context*>(context);
  if (ours == nullptr) return ncclSuccess;
  if (ours->user != nullptr && g_user.finalize != nullptr) g_user.finalize(ours->user);
  hooks::profiler::Close(ours->profile);
  delete ours;
  return ncclSuccess;
}

constexpr ncclProfiler_t kProfiler = {"ncclguard", Init, StartEvent, StopEvent, RecordEventState, Finalize};
constexpr ncclProfiler_v4_t kProfilerV4 = {"ncclguard", InitV4,           StartEventV4,
                                           StopEvent,   RecordEventState, Finalize};

}  // namespace
}  // namespace ncclguard::shim

const ncclProfiler_t ncclProfiler_v6 = ncclguard::shim::kProfiler;  // NOLINT(readability-identifier-naming)
const ncclProfiler_t ncclProfiler_v5 = ncclguard::shim::kProfiler;  // NOLINT(readability-identifier-naming)
const ncclProfiler_v4_t ncclProfiler_v4 =
    ncclguard::shim::kProfilerV4;  // NOLINT(readability-identifier-naming)
