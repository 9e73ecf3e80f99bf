// A plugin with only the v4 interface (NCCL 2.26's and 2.27's), counting what it is given: NCCL
// 2.28.9 loads it behind its adapter, and NCCLEMU_PROFILER_VERSION=4 makes the emulator look it up
// as 2.26 and 2.27 do. The test reads the counts through emuV4Count().
#include <atomic>
#include <cstring>

#include "shim/nccl_profiler.h"

namespace {

struct Event {
  uint8_t type;
};

std::atomic<long> g_inits{0};
std::atomic<long> g_finalizes{0};
std::atomic<long> g_starts[8] = {};  // by the type's bit
std::atomic<long> g_stops{0};
std::atomic<long> g_tasks_under_groups{0};  // Coll and P2p events whose parent is a Group event
std::atomic<long> g_kernel_channel_stops{0};

int bitOf(uint8_t type) {
  for (int bit = 0; bit < 8; ++bit) {
    if (type == (1u << bit)) return bit;
  }
  return -1;
}

ncclResult_t init(void** context, int* mask, const char*, uint64_t, int, int, int, ncclProfilerLogger_t) {
  ++g_inits;
  *context = &g_inits;
  *mask = ncclProfileTypesV4;
  return ncclSuccess;
}

ncclResult_t startEvent(void*, void** handle, ncclProfilerEventDescr_v4_t* descr) {
  const int bit = bitOf(descr->type);
  if (bit >= 0) ++g_starts[bit];
  if ((descr->type == ncclProfileColl || descr->type == ncclProfileP2p) && descr->parentObj != nullptr &&
      static_cast<Event*>(descr->parentObj)->type == ncclProfileGroup) {
    ++g_tasks_under_groups;
  }
  *handle = new Event{descr->type};  // leaked: a test's few thousand events
  return ncclSuccess;
}

ncclResult_t stopEvent(void* handle) {
  if (handle != nullptr) ++g_stops;
  return ncclSuccess;
}

ncclResult_t recordEventState(void* handle, ncclProfilerEventState_t state, ncclProfilerEventStateArgs_t*) {
  if (handle != nullptr && static_cast<Event*>(handle)->type == ncclProfileKernelCh &&
      state == ncclProfilerKernelChStop) {
    ++g_kernel_channel_stops;
  }
  return ncclSuccess;
}

ncclResult_t finalize(void*) {
  ++g_finalizes;
  return ncclSuccess;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) ncclProfiler_v4_t ncclProfiler_v4 = {
    "emu-v4-only", init, startEvent, stopEvent, recordEventState, finalize};

// "init", "finalize", "stop", "tasks_under_groups", "kernel_channel_stops", or an event type's
// name ("Group", "Coll", "P2p", "ProxyOp", "ProxyStep", "ProxyCtrl", "KernelCh", "NetPlugin").
__attribute__((visibility("default"))) long emuV4Count(const char* what) {
  static const char* const kTypes[8] = {"Group",     "Coll",      "P2p",      "ProxyOp",
                                        "ProxyStep", "ProxyCtrl", "KernelCh", "NetPlugin"};
  for (int bit = 0; bit < 8; ++bit) {
    if (std::strcmp(what, kTypes[bit]) == 0) return g_starts[bit];
  }
  if (std::strcmp(what, "init") == 0) return g_inits;
  if (std::strcmp(what, "finalize") == 0) return g_finalizes;
  if (std::strcmp(what, "stop") == 0) return g_stops;
  if (std::strcmp(what, "tasks_under_groups") == 0) return g_tasks_under_groups;
  if (std::strcmp(what, "kernel_channel_stops") == 0) return g_kernel_channel_stops;
  return -1;
}

}  // extern "C"
