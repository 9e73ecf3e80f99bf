// The profiler plugin: finding and loading it (NCCL's plugin_open.cc and profiler.cc), its
// lifetime per communicator, and the events of the API call, the launch and the hand-over.
// The kernel's and the proxy's events are in profiler_trace.cc.
#include "profiler.h"

#include <dlfcn.h>
#include <link.h>
#include <strings.h>

#include <cerrno>
#include <cstdlib>
#include <cstdarg>
#include <cstring>
#include <string>

#include "comm.h"
#include "debug.h"

namespace ncclemu {
namespace {

enum class LoadStatus { Ready, Loaded, Failed };

// The plugin library, shared by this library's communicators: loaded at the first init, closed
// when the last communicator holding it is freed (then loaded afresh by the next init), never
// tried again after a failure.
struct PluginLibrary {
  std::mutex mutex;
  LoadStatus status = LoadStatus::Ready;
  int references = 0;
  void* handle = nullptr;
  const ncclProfiler_t* plugin = nullptr;
};

PluginLibrary& library() {
  static auto* plugin_library = new PluginLibrary;  // leaked: stream workers may still report at exit
  return *plugin_library;
}

// NCCL's ncclProfilerEventMask: one int for the whole process, which every init may write.
int g_event_mask = 0;

int currentMask() { return __atomic_load_n(&g_event_mask, __ATOMIC_RELAXED); }

bool namesStaticPlugin(const std::string& name) {
  return strncasecmp(name.c_str(), "STATIC_PLUGIN", name.size()) == 0;
}

// NCCL's tryOpenLib: a prefix of "STATIC_PLUGIN" means the program's own global scope. A missing
// file is only collected for one summary line; any other failure is logged at once.
void* tryOpen(const std::string& name, std::string* missing) {
  void* handle = dlopen(namesStaticPlugin(name) ? nullptr : name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle != nullptr) return handle;
  const char* error = dlerror();
  const std::string text = error ? error : "";
  if (text.find(name) != std::string::npos && text.find("No such file or directory") != std::string::npos) {
    *missing += " " + name;
  } else {
    EMU_INFO("PROFILER/Plugin: %s: %s", name.c_str(), text.c_str());
  }
  return nullptr;
}

bool isLibraryFileName(const std::string& name) {
  return name.size() >= 6 && name.compare(0, 3, "lib") == 0 && name.compare(name.size() - 3, 3, ".so") == 0;
}

// NCCL's openPluginLib: the name as given (or libnccl-profiler.so when unset), then, for a bare
// name that is neither a path nor lib*.so, libnccl-profiler-<name>.so.
void* openPluginLibrary(const char* value, std::string* opened_name) {
  const std::string given = value ? value : "";
  std::string missing;
  *opened_name = given.empty() ? "libnccl-profiler.so" : given;
  if (void* handle = tryOpen(*opened_name, &missing)) return handle;
  if (!given.empty() && given.find('/') == std::string::npos && !isLibraryFileName(given)) {
    *opened_name = "libnccl-profiler-" + given + ".so";
    if (void* handle = tryOpen(*opened_name, &missing)) return handle;
  }
  if (!missing.empty()) EMU_INFO("PROFILER/Plugin: Could not find:%s", missing.c_str());
  return nullptr;
}

// The file the loader found (the program's own name, often empty, for STATIC_PLUGIN).
std::string loadedPath(void* handle, const std::string& fallback) {
  struct link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || map == nullptr || map->l_name == nullptr) return fallback;
  return map->l_name;
}

// ---- A version 4 plugin, behind the v5 calls (NCCL's own adapter) ------------------------------
// One plugin per process: the adapter's functions reach it through this.
const ncclProfiler_v4_t* g_v4 = nullptr;

ncclResult_t v4Init(void** context, uint64_t comm_id, int* mask, const char* comm_name, int nodes, int nranks,
                    int rank, ncclProfilerLogger_t log) {
  return g_v4->init(context, mask, comm_name, comm_id, nodes, nranks, rank, log);
}

// Version 4 knows no API or launch events: they start nothing. A task's parent is its Group event.
ncclResult_t v4StartEvent(void* context, void** handle, ncclProfilerEventDescr_t* descr) {
  *handle = nullptr;
  if ((descr->type & ncclProfileTypesV4) == 0) return ncclSuccess;
  ncclProfilerEventDescr_v4_t old{};
  old.type = static_cast<uint8_t>(descr->type);
  old.parentObj = descr->parentObj;
  old.rank = descr->rank;
  switch (descr->type) {
    case ncclProfileColl: {
      const auto& c = descr->coll;
      old.parentObj = c.parentGroup;
      old.coll = {c.seqNumber, c.func,     c.sendBuff,  c.recvBuff, c.count, c.root,
                  c.datatype,  c.nChannels, c.nWarps, c.algo,     c.proto};
      break;
    }
    case ncclProfileP2p: {
      const auto& p = descr->p2p;
      old.parentObj = p.parentGroup;
      old.p2p = {p.func, p.buff, p.datatype, p.count, p.peer, p.nChannels};
      break;
    }
    case ncclProfileProxyOp: {
      const auto& o = descr->proxyOp;
      old.proxyOp = {o.pid, o.channelId, o.peer, o.nSteps, o.chunkSize, o.isSend};
      break;
    }
    case ncclProfileProxyStep:
      old.proxyStep.step = descr->proxyStep.step;
      break;
    case ncclProfileKernelCh:
      old.kernelCh = {descr->kernelCh.channelId, descr->kernelCh.pTimer};
      break;
    case ncclProfileNetPlugin:
      old.netPlugin = {descr->netPlugin.id, descr->netPlugin.data};
      break;
    default:
      break;
  }
  return g_v4->startEvent(context, handle, &old);
}

ncclResult_t v4StopEvent(void* handle) { return g_v4->stopEvent(handle); }
ncclResult_t v4RecordEventState(void* handle, ncclProfilerEventState_t state, ncclProfilerEventStateArgs_t* args) {
  return g_v4->recordEventState(handle, state, args);
}
ncclResult_t v4Finalize(void* context) { return g_v4->finalize(context); }

ncclProfiler_t g_v4_adapter = {nullptr, v4Init, v4StartEvent, v4StopEvent, v4RecordEventState, v4Finalize};

// Which NCCL's lookup to follow (NCCLEMU_PROFILER_VERSION): 5, NCCL 2.28.9's, ncclProfiler_v5 and
// then ncclProfiler_v4 behind an adapter; 4, that of NCCL 2.26 and 2.27, ncclProfiler_v4 first.
int emulatedVersion() {
  const char* value = getenv("NCCLEMU_PROFILER_VERSION");
  return value != nullptr && strcmp(value, "4") == 0 ? 4 : 5;
}

const ncclProfiler_t* findInterface(void* handle, const std::string& name) {
  if (emulatedVersion() >= 5) {
    if (auto* v5 = static_cast<const ncclProfiler_t*>(dlsym(handle, "ncclProfiler_v5"))) {
      EMU_INFO("PROFILER/Plugin: Loaded %s (v5)", v5->name ? v5->name : "(unnamed)");
      return v5;
    }
  }
  if (auto* v4 = static_cast<const ncclProfiler_v4_t*>(dlsym(handle, "ncclProfiler_v4"))) {
    EMU_INFO("PROFILER/Plugin: Loaded %s (v4)", v4->name ? v4->name : "(unnamed)");
    g_v4 = v4;
    g_v4_adapter.name = v4->name;
    return &g_v4_adapter;
  }
  for (const char* older : {"ncclProfiler_v3", "ncclProfiler_v2", "ncclProfiler_v1"}) {
    if (dlsym(handle, older) != nullptr) {
      EMU_INFO("PROFILER/Plugin: %s exports %s only; the emulator does not model versions below 4. Continue "
               "without profiler.",
               name.c_str(), older);
      return nullptr;
    }
  }
  EMU_INFO("External profiler plugin %s is unsupported", name.c_str());
  return nullptr;
}

// NCCL's ncclProfilerPluginLoad: the plugin with one more reference, or null.
const ncclProfiler_t* acquirePlugin() {
  PluginLibrary& lib = library();
  std::lock_guard<std::mutex> lock(lib.mutex);
  if (lib.status == LoadStatus::Failed) return nullptr;
  if (lib.status == LoadStatus::Loaded) {
    ++lib.references;
    return lib.plugin;
  }
  const char* value = getNcclEnv("NCCL_PROFILER_PLUGIN");
  if (value != nullptr) EMU_INFO("NCCL_PROFILER_PLUGIN set by environment to %s", value);
  std::string name;
  // NCCL would next look in an external network plugin's library; the emulator loads none.
  void* handle = value && strcasecmp(value, "none") == 0 ? nullptr : openPluginLibrary(value, &name);
  const ncclProfiler_t* plugin = handle ? findInterface(handle, name) : nullptr;
  if (plugin == nullptr) {
    if (handle != nullptr) dlclose(handle);
    lib.status = LoadStatus::Failed;
    return nullptr;
  }
  EMU_INFO("Successfully loaded external profiler plugin %s", loadedPath(handle, name).c_str());
  lib.status = LoadStatus::Loaded;
  lib.handle = handle;
  lib.plugin = plugin;
  lib.references = 1;
  return plugin;
}

void releasePlugin() {
  PluginLibrary& lib = library();
  std::lock_guard<std::mutex> lock(lib.mutex);
  if (--lib.references > 0) return;
  EMU_INFO("PROFILER/Plugin: Closing profiler plugin %s", lib.plugin->name ? lib.plugin->name : "(unnamed)");
  dlclose(lib.handle);
  lib.handle = nullptr;
  lib.plugin = nullptr;
  lib.status = LoadStatus::Ready;
}

// What NCCL passes as the logger (ncclDebugLog): the plugin's lines join the library's log.
void pluginLogger(int level, unsigned long /*flags*/, const char* file, int line, const char* format, ...) {
  va_list args;
  va_start(args, format);
  logAtLevel(level, file, line, format, args);
  va_end(args);
}

bool hasPlugin(CommCore& core) {
  std::lock_guard<std::mutex> lock(core.profiler.mutex);
  return core.profiler.plugin != nullptr;
}

}  // namespace

// ---- Calls into a communicator's plugin ----------------------------------------------------------
// NCCL ignores what startEvent, stopEvent and recordEventState return, and so do these. Nothing
// reaches a plugin for a communicator once it is finalized.

void* profilerStartEvent(CommCore& core, ncclProfilerEventDescr_t& descr) {
  std::lock_guard<std::mutex> lock(core.profiler.mutex);
  if (core.profiler.plugin == nullptr) return nullptr;
  void* handle = nullptr;  // a plugin that does not write it starts nothing
  core.profiler.plugin->startEvent(core.profiler.context, &handle, &descr);
  return handle;
}

void profilerStopEvent(CommCore& core, void* handle) {
  if (handle == nullptr) return;
  std::lock_guard<std::mutex> lock(core.profiler.mutex);
  if (core.profiler.plugin != nullptr) core.profiler.plugin->stopEvent(handle);
}

void profilerRecordState(CommCore& core, void* handle, ncclProfilerEventState_t state,
                         ncclProfilerEventStateArgs_t* args) {
  if (handle == nullptr) return;
  std::lock_guard<std::mutex> lock(core.profiler.mutex);
  if (core.profiler.plugin != nullptr) core.profiler.plugin->recordEventState(handle, state, args);
}

// ---- Lifetime ------------------------------------------------------------------------------------

void profilerInitComm(CommCore& core) {
  const ncclProfiler_t* plugin = acquirePlugin();
  if (plugin == nullptr) return;
  // Not under a lock, as in NCCL: communicators initialise concurrently (groups, non-blocking).
  void* context = nullptr;
  const ncclResult_t result =
      plugin->init(&context, core.magic, &g_event_mask, core.named ? core.comm_name.c_str() : nullptr,
                   /*nNodes=*/1, core.nranks, core.rank, pluginLogger);
  if (result != ncclSuccess) {
    // NCCL 2.28 only logs this and keeps the plugin: events go on with whatever context it left.
    EMU_INFO("Profiler init failed with error '%d': %s. Continue without profiler.", static_cast<int>(result),
             strerror(errno));
  }
  std::lock_guard<std::mutex> lock(core.profiler.mutex);
  core.profiler.plugin = plugin;
  core.profiler.context = context;
  core.profiler.holds_reference = true;
}

void profilerFinalizeComm(CommCore& core) {
  {
    std::lock_guard<std::mutex> lock(core.profiler.mutex);
    if (!core.profiler.holds_reference) return;
    // Under the lock: an event a stream worker is about to report is either done or never made.
    if (core.profiler.context != nullptr) core.profiler.plugin->finalize(core.profiler.context);
    core.profiler.plugin = nullptr;
    core.profiler.context = nullptr;
    core.profiler.holds_reference = false;
  }
  releasePlugin();
}

// ---- The API call ------------------------------------------------------------------------------

namespace {

enum class GroupApiPhase { Reset, Started, Stopped };

// NCCL's thread-local ncclProfilerApiState.
struct ApiState {
  int mask = 0;                           // snapshot of the global mask at the latest API call
  std::shared_ptr<CommCore> group_owner;  // the communicator whose plugin started group_api
  void* group_api = nullptr;
  int group_depth = 0;  // the group depth the GroupApi event started at, counted down as groups end
  GroupApiPhase phase = GroupApiPhase::Reset;
  // Never cleared after its stop, as in NCCL 2.28.9: if the mask later drops every CollApi bit,
  // the next collective gets this stale handle as its Coll parent, and a second stopEvent on it.
  void* coll_api = nullptr;
  void* p2p_api = nullptr;
};

thread_local ApiState t_api;

void recordGroupApiState(ncclProfilerEventState_t state) {
  bool record = false;
  if (state == ncclProfilerGroupStartApiStop && t_api.phase == GroupApiPhase::Started) {
    t_api.phase = GroupApiPhase::Stopped;
    record = true;
  } else if (state == ncclProfilerGroupEndApiStart && t_api.phase == GroupApiPhase::Stopped) {
    t_api.phase = GroupApiPhase::Reset;
    record = true;
  }
  if (record && t_api.group_owner) profilerRecordState(*t_api.group_owner, t_api.group_api, state, nullptr);
}

// Only the outermost group of API calls gets a GroupApi event.
void startGroupApi(const std::shared_ptr<CommCore>& core, int group_depth, bool graph_captured) {
  t_api.mask = currentMask();
  if (!(t_api.mask & kGroupApiEvents) || t_api.group_depth != 0) return;
  ncclProfilerEventDescr_t descr{};
  descr.type = ncclProfileGroupApi;
  descr.groupApi.graphCaptured = graph_captured;
  descr.groupApi.groupDepth = group_depth;
  t_api.group_api = profilerStartEvent(*core, descr);
  t_api.group_owner = core;
  t_api.group_depth = group_depth;
  t_api.phase = GroupApiPhase::Started;
}

void startApiEvent(CommCore& core, const Operation& op, const ProfiledTask& task, bool graph_captured) {
  ncclProfilerEventDescr_t descr{};
  descr.parentObj = t_api.group_api;
  if (task.p2p) {
    descr.type = ncclProfileP2pApi;
    descr.p2pApi = {task.func, op.count, datatypeName(op.datatype), op.stream, graph_captured};
    if (t_api.mask & kP2pApiEvents) t_api.p2p_api = profilerStartEvent(core, descr);
    return;
  }
  // The user's call as made: AllGather and Broadcast keep their count and datatype here.
  descr.type = ncclProfileCollApi;
  descr.collApi = {task.func,       op.count,  datatypeName(op.datatype),
                   op.root_or_peer, op.stream, graph_captured};
  if (t_api.mask & kCollApiEvents) t_api.coll_api = profilerStartEvent(core, descr);
}

void stopApiEvent(CommCore& core, bool p2p) {
  if (!p2p) {
    profilerStopEvent(core, t_api.coll_api);
    return;
  }
  profilerStopEvent(core, t_api.p2p_api);
  t_api.p2p_api = nullptr;
}

ProfiledTask pointToPointTask(const Operation& op, const char* func, const void* buff, int peer) {
  ProfiledTask task;
  task.p2p = true;
  task.func = func;
  task.recv_buff = const_cast<void*>(buff);
  task.count = op.count;
  task.datatype = datatypeName(op.datatype);
  task.root_or_peer = peer;
  task.bytes = op.count * datatypeSize(op.datatype);
  task.channels = 1;
  return task;
}

// The tasks NCCL 2.28's taskAppend makes of one call.
std::vector<ProfiledTask> tasksOf(const CommCore& core, const Operation& op) {
  if (op.kind == OpKind::Send) return {pointToPointTask(op, "Send", op.send, op.root_or_peer)};
  if (op.kind == OpKind::Recv) return {pointToPointTask(op, "Recv", op.recv, op.root_or_peer)};
  // An empty collective is dropped; on one rank NCCL copies without a task.
  if (op.count == 0 || core.nranks == 1) return {};
  const size_t block = op.count * datatypeSize(op.datatype);
  const auto* send = static_cast<const char*>(op.send);
  auto* recv = static_cast<char*>(op.recv);
  const int root = op.root_or_peer;
  std::vector<ProfiledTask> tasks;
  if (op.kind == OpKind::AlltoAll) {
    for (int r = 0; r < core.nranks; ++r) {
      tasks.push_back(pointToPointTask(op, "Send", send + r * block, r));
      tasks.push_back(pointToPointTask(op, "Recv", recv + r * block, r));
    }
    return tasks;
  }
  if (op.kind == OpKind::Gather) {
    tasks.push_back(pointToPointTask(op, "Send", send, root));
    for (int r = 0; core.rank == root && r < core.nranks; ++r)
      tasks.push_back(pointToPointTask(op, "Recv", recv + r * block, r));
    return tasks;
  }
  if (op.kind == OpKind::Scatter) {
    for (int r = 0; core.rank == root && r < core.nranks; ++r)
      tasks.push_back(pointToPointTask(op, "Send", send + r * block, r));
    tasks.push_back(pointToPointTask(op, "Recv", recv, root));
    return tasks;
  }
  ProfiledTask task;
  task.func = opName(op.kind);
  task.sequence_slot = static_cast<int>(op.kind);
  task.send_buff = op.send;
  task.recv_buff = op.recv;
  task.count = op.count;
  task.datatype = datatypeName(op.datatype);
  task.root_or_peer = root;
  task.bytes = block;
  task.channels = kCollectiveChannels;
  if (op.kind == OpKind::AllGather || op.kind == OpKind::Broadcast) {
    task.count = block;  // NCCL moves these as bytes
    task.datatype = "ncclInt8";
  }
  return {task};
}

}  // namespace

const char* datatypeName(ncclDataType_t datatype) {
  switch (datatype) {
    case ncclInt8:
      return "ncclInt8";
    case ncclInt32:
      return "ncclInt32";
    case ncclUint32:
      return "ncclUint32";
    case ncclInt64:
      return "ncclInt64";
    case ncclUint64:
      return "ncclUint64";
    case ncclFloat16:
      return "ncclFloat16";
    case ncclFloat32:
      return "ncclFloat32";
    case ncclFloat64:
      return "ncclFloat64";
    case ncclBfloat16:
      return "ncclBfloat16";
    case ncclFloat8e4m3:
      return "ncclFloat8e4m3";
    case ncclFloat8e5m2:
      return "ncclFloat8e5m2";
    default:
      return "Unknown";  // ncclUint8 too: NCCL's table lacks it
  }
}

void profilerEnterApiCall() {
  // NCCL's ncclEnqueueCheck: the call's implicit group nests in an open GroupApi event's group.
  if (t_api.group_depth > 0) ++t_api.group_depth;
}

void profilerAppendTasks(const std::shared_ptr<CommCore>& core, Operation& op, int group_depth,
                         bool graph_captured) {
  if (!hasPlugin(*core)) return;
  op.profiled = tasksOf(*core, op);
  for (ProfiledTask& task : op.profiled) {
    startGroupApi(core, group_depth, graph_captured);
    recordGroupApiState(ncclProfilerGroupStartApiStop);
    startApiEvent(*core, op, task, graph_captured);
    task.mask = t_api.mask;
    task.group_api = t_api.group_api;
    task.api = task.p2p ? t_api.p2p_api : t_api.coll_api;
    stopApiEvent(*core, task.p2p);
  }
}

void profilerLeaveGroup() {
  if (t_api.group_depth > 0) --t_api.group_depth;
  if (t_api.group_depth == 0) recordGroupApiState(ncclProfilerGroupEndApiStart);
}

void profilerStopGroupApi() {
  if (t_api.group_api == nullptr || t_api.group_depth != 0) return;
  profilerStopEvent(*t_api.group_owner, t_api.group_api);
  t_api.group_api = nullptr;
  t_api.group_owner.reset();
}

// ---- The launch and the hand-over --------------------------------------------------------------

namespace {

// Collectives first, then Send/Recv: the order of NCCL's plan (and of the emulator's task).
std::vector<ProfiledTask*> planOrder(std::vector<Operation>& operations) {
  std::vector<ProfiledTask*> tasks;
  for (bool p2p : {false, true}) {
    for (Operation& op : operations) {
      for (ProfiledTask& task : op.profiled) {
        if (task.p2p == p2p) tasks.push_back(&task);
      }
    }
  }
  return tasks;
}

// KernelLaunch and Group take their mask (and KernelLaunch its parent) from the plan's first
// task with a non-zero one.
const ProfiledTask* firstMasked(const std::vector<ProfiledTask*>& tasks) {
  for (const ProfiledTask* task : tasks) {
    if (task->mask != 0) return task;
  }
  return nullptr;
}

uint64_t takeSequenceNumber(CommCore& core, int slot, bool advance) {
  std::lock_guard<std::mutex> lock(core.profiler.mutex);
  return advance ? core.profiler.coll_sequence[slot]++ : core.profiler.coll_sequence[slot];
}

void startTaskEvent(CommCore& core, ProfiledTask& task, void* group, bool graph_captured) {
  ncclProfilerEventDescr_t descr{};
  descr.parentObj = task.api;
  descr.rank = core.rank;
  if (task.p2p) {
    descr.type = ncclProfileP2p;
    descr.p2p = {task.func,  task.recv_buff,    task.datatype,
                 task.count, task.root_or_peer, static_cast<uint8_t>(task.channels),
                 group};
    if (task.mask & kP2pEvents) task.event = profilerStartEvent(core, descr);
    return;
  }
  // Captured plans count only when KernelCh makes NCCL hand them over at every replay.
  const bool counted = !graph_captured || ((group || task.api) && (task.mask & ncclProfileKernelCh));
  descr.type = ncclProfileColl;
  descr.coll = {takeSequenceNumber(core, task.sequence_slot, counted),
                task.func,
                task.send_buff,
                task.recv_buff,
                task.count,
                task.root_or_peer,
                task.datatype,
                static_cast<uint8_t>(task.channels),
                kWarps,
                "RING",
                "SIMPLE",
                group};
  if (task.mask & kCollEvents) task.event = profilerStartEvent(core, descr);
}

}  // namespace

void* profilerStartKernelLaunch(CommCore& core, std::vector<Operation>& operations, CUstream stream) {
  const std::vector<ProfiledTask*> tasks = planOrder(operations);
  const ProfiledTask* first = firstMasked(tasks);
  if (first == nullptr || !(first->mask & ncclProfileKernelLaunch)) return nullptr;
  ncclProfilerEventDescr_t descr{};
  descr.type = ncclProfileKernelLaunch;
  descr.parentObj = first->group_api;
  descr.kernelLaunch.stream = stream;
  return profilerStartEvent(core, descr);
}

void profilerStopKernelLaunch(CommCore& core, void* handle) { profilerStopEvent(core, handle); }

// NCCL's hostStreamPlanTask: Coll stop means "handed over", not "done"; completion is only seen
// through KernelCh and the proxy's events.
void profilerHandOver(CommCore& core, std::vector<Operation>& operations, bool graph_captured) {
  const std::vector<ProfiledTask*> tasks = planOrder(operations);
  if (tasks.empty()) return;
  const ProfiledTask* first = firstMasked(tasks);
  void* group = nullptr;
  if (first != nullptr && (first->mask & kGroupEvents)) {
    ncclProfilerEventDescr_t descr{};
    descr.type = ncclProfileGroup;
    group = profilerStartEvent(core, descr);
  }
  for (ProfiledTask* task : tasks) startTaskEvent(core, *task, group, graph_captured);
  for (ProfiledTask* task : tasks) profilerStopEvent(core, task->event);
  profilerStopEvent(core, group);
}

bool profilerHasProxyWork(const CommCore& core, const std::vector<Operation>& operations) {
  if (core.transport == Transport::NET) return true;
  for (const Operation& op : operations) {
    for (const ProfiledTask& task : op.profiled) {
      if (task.mask & ncclProfileKernelCh) return true;
    }
  }
  return false;
}

}  // namespace ncclemu
