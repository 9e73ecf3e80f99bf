// NCCL's profiler plugin interface, versions 5 (NCCL 2.28) and 6 (2.29), and 4 (2.26 and 2.27)
// below them, as a plugin sees it: the structure NCCL looks up by name (ncclProfiler_v5, ...) in the
// library that NCCL_PROFILER_PLUGIN names, the events it starts, stops and updates, and their
// states. NCCL installs no header for it; this one is written from its documented layout (member
// order and types, constant values), which is all the ABI is. Version 6 only adds copy-engine
// events at the end of the descriptor's union, whose size does not change: one descriptor serves
// both.
#pragma once

#include <nccl.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

// NCCL's names, kept so that the structures read as NCCL's documentation does.
// NOLINTBEGIN(readability-identifier-naming)
extern "C" {

// The logger NCCL passes to init: ncclDebugLogger_t of nccl_net.h, repeated so that this header
// needs nccl.h only.
typedef void (*ncclProfilerLogger_t)(int level, unsigned long flags, const char* file, int line,
                                     const char* fmt, ...);

// Event types: the bits of the activation mask, and a descriptor's `type`.
enum {
  ncclProfileGroup = 1 << 0,
  ncclProfileColl = 1 << 1,
  ncclProfileP2p = 1 << 2,
  ncclProfileProxyOp = 1 << 3,
  ncclProfileProxyStep = 1 << 4,
  ncclProfileProxyCtrl = 1 << 5,
  ncclProfileKernelCh = 1 << 6,
  ncclProfileNetPlugin = 1 << 7,
  ncclProfileGroupApi = 1 << 8,
  ncclProfileCollApi = 1 << 9,
  ncclProfileP2pApi = 1 << 10,
  ncclProfileKernelLaunch = 1 << 11,
  ncclProfileCeColl = 1 << 12,  // version 6
  ncclProfileCeSync = 1 << 13,
  ncclProfileCeBatch = 1 << 14,
};

typedef enum {
  ncclProfilerProxyStepSendGPUWait = 8,  // the buffer is the GPU's to fill
  ncclProfilerProxyStepSendWait = 9,     // sent on the network, not yet acknowledged
  ncclProfilerProxyStepRecvWait = 10,    // posted, nothing received yet
  ncclProfilerProxyStepRecvFlushWait = 11,
  ncclProfilerProxyStepRecvGPUWait = 12,  // received, the GPU has not consumed it
  ncclProfilerProxyCtrlIdle = 13,
  ncclProfilerProxyCtrlActive = 14,
  ncclProfilerProxyCtrlSleep = 15,
  ncclProfilerProxyCtrlWakeup = 16,
  ncclProfilerProxyCtrlAppend = 17,
  ncclProfilerProxyCtrlAppendEnd = 18,
  ncclProfilerProxyOpInProgress = 19,
  ncclProfilerProxyStepSendPeerWait = 20,  // the GPU filled it; waiting for the peer's credit
  ncclProfilerNetPluginUpdate = 21,
  ncclProfilerKernelChStop = 22,
  ncclProfilerGroupStartApiStop = 23,
  ncclProfilerGroupEndApiStart = 24,
} ncclProfilerEventState_t;

// Descriptor of an event at its start. Strings are NCCL's own literals, valid for the process's
// life. `rank` is set for Coll, P2p, ProxyOp, ProxyStep and NetPlugin events only.
typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      bool graphCaptured;
      int groupDepth;
    } groupApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
    } collApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
    } p2pApi;
    struct {
      void* stream;
    } kernelLaunch;
    struct {
      uint64_t seqNumber;  // per communicator and collective function
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
      void* parentGroup;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void* parentGroup;
    } p2p;
    struct {
      pid_t pid;  // the process that posted it: another one's under PXN
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
      uint64_t pTimer;  // the GPU's global timer at the channel's start, ns
    } kernelCh;
    struct {
      int64_t id;
      void* data;
    } netPlugin;
    // Version 6: copy-engine collectives (never read here; they keep the union's size honest).
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      const char* syncStrategy;
      bool intraBatchSync;
      uint32_t batchSize;
      uint32_t numBatches;
      uint32_t ceSeqNum;
      void* stream;
    } ceColl;
  };
} ncclProfilerEventDescr_t;

typedef union {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    uint64_t pTimer;  // the GPU's global timer at the channel's stop, ns
  } kernelCh;
} ncclProfilerEventStateArgs_t;

// ncclProfiler_v5 and ncclProfiler_v6 have this type; only the descriptor's name differs in NCCL.
typedef struct {
  const char* name;
  // Once per communicator, before its proxy thread starts; `eActivationMask` is one int for the
  // whole process, which the last init wrote.
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName,
                       int nNodes, int nranks, int rank, ncclProfilerLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_t eState,
                                   ncclProfilerEventStateArgs_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_t;

// Version 4 (NCCL 2.26 and 2.27): the same event types but the API and launch events, the same
// states and state arguments, and a descriptor of its own: a byte for the type, no parentGroup (a
// collective's or point-to-point's parent is its Group event), and init with the communicator's
// hash after its name.
typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
    } p2p;
    struct {
      pid_t pid;
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
      uint64_t pTimer;
    } kernelCh;
    struct {
      int64_t id;
      void* data;
    } netPlugin;
  };
} ncclProfilerEventDescr_v4_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, int* eActivationMask, const char* commName, uint64_t commHash,
                       int nNodes, int nranks, int rank, ncclProfilerLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v4_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_t eState,
                                   ncclProfilerEventStateArgs_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v4_t;

// The event types version 4 has.
enum {
  ncclProfileTypesV4 = ncclProfileGroup | ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp |
                       ncclProfileProxyStep | ncclProfileProxyCtrl | ncclProfileKernelCh |
                       ncclProfileNetPlugin,
};

}  // extern "C"
// NOLINTEND(readability-identifier-naming)

static_assert(sizeof(ncclProfilerEventDescr_t) == 112, "NCCL's profiler event descriptor is 112 bytes");
static_assert(offsetof(ncclProfilerEventDescr_t, coll.nChannels) == 80, "coll.nChannels at 80");
static_assert(offsetof(ncclProfilerEventDescr_t, proxyOp.peer) == 32, "proxyOp.peer at 32");
static_assert(offsetof(ncclProfilerEventDescr_t, kernelCh.pTimer) == 32, "kernelCh.pTimer at 32");
static_assert(sizeof(ncclProfilerEventStateArgs_t) == 8, "NCCL's state arguments are 8 bytes");
static_assert(sizeof(ncclProfiler_t) == 48, "NCCL's profiler structure is six pointers");
static_assert(sizeof(ncclProfilerEventDescr_v4_t) == 104, "version 4's descriptor is 104 bytes");
static_assert(offsetof(ncclProfilerEventDescr_v4_t, coll.nChannels) == 80, "v4 coll.nChannels at 80");
static_assert(offsetof(ncclProfilerEventDescr_v4_t, proxyOp.peer) == 32, "v4 proxyOp.peer at 32");
static_assert(sizeof(ncclProfiler_v4_t) == 48, "version 4's structure is six pointers");
