// NCCL's profiler plugin, as NCCL 2.28.9 drives it: found through NCCL_PROFILER_PLUGIN, loaded
// once per process (per loaded copy of this library) and reference-counted per communicator,
// initialised once per communicator, and told about every operation from the API call down to
// the kernel's channels and the network proxy's steps. Only the plugin interface v5 exists here.
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "shim/nccl_profiler.h"

namespace ncclemu {

struct CommCore;
struct Operation;

// Which mask bits make NCCL start each kind of event: its own bit or a descendant's, so a
// plugin asking for KernelCh alone still gets the GroupApi, CollApi, Group and Coll parents.
constexpr int kProxyStepEvents = ncclProfileProxyStep | ncclProfileNetPlugin;
constexpr int kProxyOpEvents = ncclProfileProxyOp | kProxyStepEvents;
constexpr int kCollEvents = ncclProfileColl | kProxyOpEvents | ncclProfileKernelCh;
constexpr int kP2pEvents = ncclProfileP2p | kProxyOpEvents | ncclProfileKernelCh;
constexpr int kGroupEvents = ncclProfileGroup | kCollEvents | kP2pEvents;
constexpr int kCollApiEvents = ncclProfileCollApi | kCollEvents;
constexpr int kP2pApiEvents = ncclProfileP2pApi | kP2pEvents;
constexpr int kGroupApiEvents =
    ncclProfileGroupApi | kCollApiEvents | kP2pApiEvents | ncclProfileKernelLaunch | ncclProfileGroup;
// What the Coll event reports of the emulated kernel (NCCL's SIMPLE ring kernel on Hopper).
constexpr uint8_t kWarps = 16;

// What one communicator holds of the plugin: NCCL's comm->profilerContext, the plugin it came
// from (kept loaded by this communicator's reference), and NCCL's per-function sequence numbers.
struct CommProfiler {
  std::mutex mutex;  // orders every call into the plugin for this communicator against finalize
  const ncclProfiler_t* plugin = nullptr;  // null: no plugin, or finalized
  void* context = nullptr;
  bool holds_reference = false;    // counted in the plugin's reference count
  uint64_t coll_sequence[5] = {};  // AllReduce, Broadcast, Reduce, AllGather, ReduceScatter
};

// One task as NCCL's planner holds it, i.e. what the Coll or P2p event describes. A collective is
// one task; Send and Recv are one each; AlltoAll, Gather and Scatter are several Send/Recv tasks,
// as NCCL 2.28 splits them.
struct ProfiledTask {
  bool p2p = false;
  const char* func = "";
  const void* send_buff = nullptr;  // a P2p task's buffer is `recv_buff`, for Send too (NCCL's p2p.buff)
  void* recv_buff = nullptr;
  size_t count = 0;  // AllGather and Broadcast: bytes, as NCCL rewrites the task
  const char* datatype = "";
  int root_or_peer = 0;
  int sequence_slot = 0;  // a collective's index in CommProfiler::coll_sequence
  size_t bytes = 0;
  int channels = 1;
  int mask = 0;               // the activation mask when the API call ran
  void* group_api = nullptr;  // parent handles, from the API call
  void* api = nullptr;
  void* event = nullptr;  // the Coll or P2p event, at hand-over
};

// NCCL's names of datatypes ("ncclFloat32"); "Unknown" for ncclUint8, as NCCL's table lacks it.
const char* datatypeName(ncclDataType_t datatype);

// Calls into a communicator's plugin (none without one, or once it is finalized). A handle that
// is null is neither stopped nor updated, as in NCCL.
void* profilerStartEvent(CommCore& core, ncclProfilerEventDescr_t& descr);
void profilerStopEvent(CommCore& core, void* handle);
void profilerRecordState(CommCore& core, void* handle, ncclProfilerEventState_t state,
                         ncclProfilerEventStateArgs_t* args);

// Loading and lifetime (init.cc: after the communicator is set up; releaseHandle: at destroy/abort).
void profilerInitComm(CommCore& core);
void profilerFinalizeComm(CommCore& core);

// The API call (enqueue.cc), in NCCL's order: enter, append (GroupApi, CollApi/P2pApi events),
// leave the group (GroupEndApiStart at the outermost end), launch, stop the GroupApi event.
void profilerEnterApiCall();
void profilerAppendTasks(const std::shared_ptr<CommCore>& core, Operation& op, int group_depth,
                         bool graph_captured);
void profilerLeaveGroup();
void profilerStopGroupApi();

// The launch: KernelLaunch around the launch on `stream`, then the hand-over to the "GPU":
// Group start, Coll/P2p starts, Coll/P2p stops, Group stop.
void* profilerStartKernelLaunch(CommCore& core, std::vector<Operation>& operations, CUstream stream);
void profilerStopKernelLaunch(CommCore& core, void* handle);
void profilerHandOver(CommCore& core, std::vector<Operation>& operations, bool graph_captured);
// NCCL hands a captured plan over at every replay when the plan has proxy operations.
bool profilerHasProxyWork(const CommCore& core, const std::vector<Operation>& operations);

// The part of `bytes` that channel `channel` of `channels` carries (or step `channel` of a
// connection's steps); the data path splits elements alike.
size_t channelShare(size_t bytes, int channel, int channels);
// How many proxy steps carry `bytes` over one network connection (NCCL_STEPS at most).
int proxyStepCount(size_t bytes);

// The kernel and proxy side of one operation on one rank, on the stream's worker: KernelCh per
// task and channel, and, over NET connections, ProxyOp per channel and peer with its ProxySteps.
class KernelTrace {
 public:
  KernelTrace(CommCore& core, const Operation& op);
  KernelTrace(KernelTrace&&) = default;
  // Channels start executing; the proxy posts every step (at most NCCL_STEPS, all at once).
  void start();
  // Every step of the channel's connections completes, then the channel's kernel block.
  void completeChannel(int channel);
  void completeAll();
  // A Send/Recv task has moved `done` of `total` bytes: the steps covered complete.
  void progress(size_t done, size_t total);
  // The GPU filled the next step for `peer` on `channel` and the proxy posted it to the network,
  // which never completes it: the step stays in SendWait.
  void sendPosted(int channel, int peer);
  // The proxy posts the next send step on `channel` to the network (SendPeerWait, SendWait),
  // unless one is still there.
  void postNextSend(int channel);
  // The network completed the sends (or receives) of `channel` up to step `upto`, exclusive.
  void completeNetSteps(int channel, bool send, int upto);

 private:
  struct ProxySub {
    int channel = 0;
    int peer = 0;
    bool send = false;
    size_t bytes = 0;
    int chunk = 0;
    int steps = 0;
    int completed = 0;      // steps stopped
    int posted = 0;         // send steps the proxy handed to the network (SendWait)
    size_t trans_size = 0;  // NCCL's sub->transSize: the size of the last step sent or received
    void* event = nullptr;
    std::vector<void*> step_events;
  };
  struct Traced {
    const ProfiledTask* task;
    std::vector<void*> channel_events;
    std::vector<bool> channel_done;
    std::vector<ProxySub> subs;
  };
  void addRingConnections(Traced& traced, const Operation& op);
  void startSub(const Traced& traced, ProxySub& sub);
  void recordStep(ProxySub& sub, int step, ncclProfilerEventState_t state);
  void completeSteps(ProxySub& sub, int upto);

  CommCore* core_;
  std::vector<Traced> traced_;
};

}  // namespace ncclemu
