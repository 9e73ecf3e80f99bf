// The exported driver API. Each function is defined under its cuda.h name, so cuda.h's macros
// give it the versioned symbol a program compiled against cuda.h links to (cuMemAlloc_v2, ...).
#pragma GCC visibility push(default)
#include <cuda.h>
#pragma GCC visibility pop

#include <strings.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "device_config.h"
#include "runtime.h"

using ncclemu::CapturePtr;
using ncclemu::Marker;
using ncclemu::State;
using ncclemu::currentContext;
using ncclemu::resolveStream;

namespace {

using EventPtr = std::shared_ptr<CUevent_st>;

// Driver calls the calling thread has made: what a test counts of the calls a library adds on an
// application's thread (cuEmuThreadDriverCalls, below).
thread_local unsigned long long t_driver_calls = 0;

// Takes the driver lock for the length of one API call; most calls must come after cuInit.
// User objects released during the call are destroyed after it, without the lock.
struct Driver {
  Driver() : s(ncclemu::state()), lock(s.mutex) { ++t_driver_calls; }
  ~Driver() {
    if (!lock.owns_lock()) lock.lock();
    std::vector<std::pair<CUhostFn, void*>> destructors;
    destructors.swap(s.pending_destructors);
    lock.unlock();
    for (const auto& [destroy, pointer] : destructors) destroy(pointer);
  }
  bool initialized() const { return s.initialized; }
  State& s;
  std::unique_lock<std::mutex> lock;
};

bool isValidDevice(const State& s, CUdevice device) { return device >= 0 && device < s.device_count; }

CUresult findEvent(State& s, CUevent handle, EventPtr& out) {
  auto found = s.events.find(handle);
  if (found == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  out = found->second;
  return CUDA_SUCCESS;
}

// CUDA refuses "potentially unsafe" calls (synchronisation, queries, allocation) while a capture
// that the calling thread's capture mode does not tolerate is under way, and that capture becomes
// invalid: its cuStreamEndCapture then fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.
CUresult refuseIfCaptureForbids(State& s) {
  const std::thread::id self = std::this_thread::get_id();
  const CUstreamCaptureMode own_mode = ncclemu::threadState().capture_mode;
  bool refused = false;
  for (const CapturePtr& capture : s.active_captures) {
    bool own = capture->thread == self && capture->mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    bool foreign = capture->thread != self && own_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && capture->mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (own || foreign) {
      capture->invalidated = true;
      refused = true;
    }
  }
  return refused ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

// A blocking stream that captures cannot take part in the legacy stream's implicit ordering.
CapturePtr captureBlockingLegacy(const StreamPtr& stream) {
  if (stream->kind != CUstream_st::Kind::kLegacy) return nullptr;
  for (const StreamPtr& other : stream->context->streams) {
    if (other->synchronizesWithLegacy() && other->capture) return other->capture;
  }
  return nullptr;
}

struct Enqueued {
  CapturePtr capture;  // set when the operation went into a capture instead of the stream
  std::uint64_t position = 0;
};

// Queues work on a stream with the legacy stream's implicit ordering, or, while the stream
// captures, appends the operation to the capture's graph.
CUresult enqueue(const StreamPtr& stream, Work work, Replay replay, Enqueued* where = nullptr) {
  if (const CapturePtr& capture = stream->capture) {
    if (capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    capture->graph->nodes.push_back(std::move(replay));
    if (where != nullptr) where->capture = capture;
    return CUDA_SUCCESS;
  }
  if (CapturePtr blocking = captureBlockingLegacy(stream)) {
    blocking->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  }
  std::vector<Work> earlier_work;
  auto waitForEarlierWork = [&earlier_work](const StreamPtr& other) {
    if (std::uint64_t until = other->pendingUntil()) earlier_work.push_back([other, until] { other->waitUntilDone(until); });
  };
  CUctx_st* context = stream->context;
  if (stream->kind == CUstream_st::Kind::kLegacy) {
    for (const StreamPtr& other : context->streams) {
      if (other->synchronizesWithLegacy()) waitForEarlierWork(other);
    }
  } else if (stream->synchronizesWithLegacy()) {
    waitForEarlierWork(context->legacy_stream);
  }
  if (!earlier_work.empty()) {
    work = [earlier_work = std::move(earlier_work), work = std::move(work)] {
      for (const Work& wait : earlier_work) wait();
      work();
    };
  }
  std::uint64_t position = stream->push(std::move(work));
  if (where != nullptr) where->position = position;
  return CUDA_SUCCESS;
}

CUresult enqueueHostFunc(const StreamPtr& stream, CUhostFn fn, void* user_data) {
  return enqueue(stream, [fn, user_data] { fn(user_data); },
                 [fn, user_data](const StreamPtr& target) { return enqueueHostFunc(target, fn, user_data); });
}

CUresult enqueueCopy(const StreamPtr& stream, void* dst, const void* src, std::size_t bytes, Enqueued* where = nullptr) {
  return enqueue(
      stream, [dst, src, bytes] { std::memmove(dst, src, bytes); },
      [dst, src, bytes](const StreamPtr& target) { return enqueueCopy(target, dst, src, bytes); }, where);
}

template <typename Element>
CUresult enqueueFill(const StreamPtr& stream, CUdeviceptr dst, Element value, std::size_t count, Enqueued* where = nullptr) {
  auto* begin = reinterpret_cast<Element*>(dst);
  return enqueue(
      stream, [begin, value, count] { std::fill(begin, begin + count, value); },
      [dst, value, count](const StreamPtr& target) { return enqueueFill(target, dst, value, count); }, where);
}

CUresult enqueueEventRecord(const EventPtr& event, const StreamPtr& stream) {
  auto marker = std::make_shared<Marker>();
  Enqueued where;
  CUresult result = enqueue(
      stream, [marker] { marker->complete(); },
      [event](const StreamPtr& target) { return enqueueEventRecord(event, target); }, &where);
  if (result != CUDA_SUCCESS) return result;
  event->recorded_in_capture = where.capture;
  if (!where.capture) event->last_record = marker;
  return CUDA_SUCCESS;
}

// Synchronous copies and fills go through the legacy stream, as on CUDA, and return once done.
template <typename Enqueue>
CUresult runOnLegacyStream(Enqueue&& enqueue_operation) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  CUctx_st* context = currentContext(d.s);
  if (context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  StreamPtr legacy = context->legacy_stream;
  Enqueued where;
  CUresult result = enqueue_operation(legacy, &where);
  if (result != CUDA_SUCCESS) return result;
  d.lock.unlock();
  legacy->waitUntilDone(where.position);
  return CUDA_SUCCESS;
}

template <typename Enqueue>
CUresult runOnStream(CUstream handle, Enqueue&& enqueue_operation) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  StreamPtr stream;
  if (CUresult result = resolveStream(d.s, handle, stream); result != CUDA_SUCCESS) return result;
  return enqueue_operation(stream);
}

// The positions a synchronisation of `stream` waits for. The legacy stream also waits for the
// blocking streams' earlier work, as any work queued on it would.
std::vector<std::pair<StreamPtr, std::uint64_t>> workToWaitFor(const StreamPtr& stream) {
  std::vector<std::pair<StreamPtr, std::uint64_t>> pending;
  auto add = [&pending](const StreamPtr& candidate) {
    if (std::uint64_t until = candidate->pendingUntil()) pending.emplace_back(candidate, until);
  };
  add(stream);
  if (stream->kind == CUstream_st::Kind::kLegacy) {
    for (const StreamPtr& other : stream->context->streams) {
      if (other->synchronizesWithLegacy()) add(other);
    }
  }
  return pending;
}

// Everything queued so far on every stream of the context: what cuCtxSynchronize waits for.
std::vector<std::pair<StreamPtr, std::uint64_t>> contextWorkToWaitFor(CUctx_st* context) {
  std::vector<std::pair<StreamPtr, std::uint64_t>> pending = workToWaitFor(context->legacy_stream);
  for (const StreamPtr& stream : context->streams) {
    if (!stream->synchronizesWithLegacy()) {
      if (std::uint64_t until = stream->pendingUntil()) pending.emplace_back(stream, until);
    }
  }
  return pending;
}

void activateContext(State& s, CUctx_st* context) {
  context->active = true;
  context->id = s.next_id++;
  context->legacy_stream = ncclemu::createStream(s, context, CUstream_st::Kind::kLegacy, CU_STREAM_DEFAULT, 0);
}

void popIfCurrent(CUctx_st* context) {
  auto& stack = ncclemu::threadState().context_stack;
  if (!stack.empty() && stack.back() == context) stack.pop_back();
}

CUresult eventCompletion(State& s, CUevent handle, std::shared_ptr<Marker>& marker) {
  EventPtr event;
  if (CUresult result = findEvent(s, handle, event); result != CUDA_SUCCESS) return result;
  if (event->recorded_in_capture) return CUDA_ERROR_CAPTURED_EVENT;
  marker = event->last_record;
  return CUDA_SUCCESS;
}

std::size_t copyName(char* out, int length, const std::string& text) {
  std::size_t copied = std::min<std::size_t>(text.size(), static_cast<std::size_t>(length) - 1);
  std::memcpy(out, text.data(), copied);
  out[copied] = '\0';
  return copied;
}

}  // namespace

CUresult ncclemu::enqueueWork(const StreamPtr& stream, Work work, Replay replay) {
  return enqueue(stream, std::move(work), std::move(replay));
}

const ncclemu::Allocation* ncclemu::findAllocation(State& s, std::uintptr_t address, std::size_t bytes) {
  auto found = s.allocations.upper_bound(address);
  if (found == s.allocations.begin()) return nullptr;
  --found;
  const auto& [base, allocation] = *found;
  if (address + bytes > base + allocation.size) return nullptr;
  return &allocation;
}

// --- Initialisation and devices ----------------------------------------------------------------

CUresult cuInit(unsigned int Flags) {
  Driver d;
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (d.s.device_count == 0) return CUDA_ERROR_NO_DEVICE;
  d.s.initialized = true;
  return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* driverVersion) {
  if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver d;
  *driverVersion = d.s.driver_version;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!isValidDevice(d.s, ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* count) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = d.s.device_count;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!isValidDevice(d.s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  copyName(name, len, d.s.gpu_name);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (pciBusId == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!isValidDevice(d.s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  copyName(pciBusId, len, ncclemu::pciBusId(dev));
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetByPCIBusId(CUdevice* dev, const char* pciBusId) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (dev == nullptr || pciBusId == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (int index = 0; index < d.s.device_count; ++index) {
    if (strcasecmp(ncclemu::pciBusId(index).c_str(), pciBusId) == 0) {
      *dev = index;
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_DEVICE;
}

CUresult cuDeviceTotalMem(size_t* bytes, CUdevice dev) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!isValidDevice(d.s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = d.s.gpu_memory_bytes;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!isValidDevice(d.s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  ncclemu::deviceUuid(dev, reinterpret_cast<unsigned char*>(uuid->bytes));
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (pi == nullptr || attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  if (!isValidDevice(d.s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  const ncclemu::GpuModel model = ncclemu::gpuModelForName(d.s.gpu_name);
  const ncclemu::PciLocation pci = ncclemu::pciLocation(dev);
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = model.compute_major; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = model.compute_minor; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = model.multiprocessors; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = static_cast<int>(pci.bus); break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *pi = static_cast<int>(pci.device); break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *pi = static_cast<int>(pci.domain); break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *pi = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *pi = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *pi = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *pi = 65535; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *pi = 49152; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *pi = 65536; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *pi = 2048; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *pi = 50 << 20; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *pi = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *pi = 2619000; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *pi = 5120; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: *pi = 2; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM:
    // The v2 stream memory operations (cuStreamWaitValue32_v2, ...), 64-bit ones and the NOR
    // condition included; the v1 API (the *_V1 attributes) needs a driver option and reads 0.
    case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS:
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: *pi = CU_COMPUTEMODE_DEFAULT; break;
    // Everything else (integrated, TCC, ECC, GPUDirect RDMA, ...) reads as absent.
    default: *pi = 0; break;
  }
  return CUDA_SUCCESS;
}

CUresult cuDeviceCanAccessPeer(int* canAccessPeer, CUdevice dev, CUdevice peerDev) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (canAccessPeer == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!isValidDevice(d.s, dev) || !isValidDevice(d.s, peerDev)) return CUDA_ERROR_INVALID_DEVICE;
  *canAccessPeer = d.s.p2p_access[dev][peerDev] ? 1 : 0;
  return CUDA_SUCCESS;
}

// --- Contexts ----------------------------------------------------------------------------------

CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!isValidDevice(d.s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  ncclemu::Device& device = d.s.devices[dev];
  if (!device.primary_context) {
    device.primary_context = std::make_unique<CUctx_st>();
    device.primary_context->device = dev;
    device.primary_context->primary = true;
  }
  // The handle stays the same across release and retain, as CUDA's does.
  CUctx_st* context = device.primary_context.get();
  if (!context->active) {
    context->flags = device.primary_flags;
    activateContext(d.s, context);
  }
  ++device.primary_retains;
  *pctx = context;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!isValidDevice(d.s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  ncclemu::Device& device = d.s.devices[dev];
  if (device.primary_retains == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--device.primary_retains == 0) {
    ncclemu::releaseContextResources(d.s, device.primary_context.get());
    device.primary_context->active = false;
  }
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!isValidDevice(d.s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  ncclemu::Device& device = d.s.devices[dev];
  if (device.primary_context && device.primary_context->active) {
    ncclemu::releaseContextResources(d.s, device.primary_context.get());
    activateContext(d.s, device.primary_context.get());
  }
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!isValidDevice(d.s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  *flags = d.s.devices[dev].primary_flags;
  *active = d.s.devices[dev].primary_retains > 0 ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!isValidDevice(d.s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  d.s.devices[dev].primary_flags = flags;
  return CUDA_SUCCESS;
}

CUresult cuCtxCreate(CUcontext* pctx, CUctxCreateParams* /*ctxCreateParams*/, unsigned int flags, CUdevice dev) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!isValidDevice(d.s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  auto context = std::make_unique<CUctx_st>();
  context->device = dev;
  context->flags = flags;
  activateContext(d.s, context.get());
  CUctx_st* handle = context.get();
  d.s.created_contexts.emplace(handle, std::move(context));
  ncclemu::threadState().context_stack.push_back(handle);
  *pctx = handle;
  return CUDA_SUCCESS;
}

CUresult cuCtxDestroy(CUcontext ctx) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  auto found = d.s.created_contexts.find(ctx);
  if (found == d.s.created_contexts.end()) return CUDA_ERROR_INVALID_CONTEXT;
  ncclemu::releaseContextResources(d.s, ctx);
  popIfCurrent(ctx);
  d.s.created_contexts.erase(found);
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  auto& stack = ncclemu::threadState().context_stack;
  if (ctx == nullptr) {
    if (!stack.empty()) stack.pop_back();
    return CUDA_SUCCESS;
  }
  if (!ncclemu::isLiveContext(d.s, ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (stack.empty()) {
    stack.push_back(ctx);
  } else {
    stack.back() = ctx;
  }
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext* pctx) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto& stack = ncclemu::threadState().context_stack;
  *pctx = stack.empty() ? nullptr : stack.back();
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent(CUcontext ctx) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!ncclemu::isLiveContext(d.s, ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  ncclemu::threadState().context_stack.push_back(ctx);
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext* pctx) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  auto& stack = ncclemu::threadState().context_stack;
  if (stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx != nullptr) *pctx = stack.back();
  stack.pop_back();
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice* device) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* context = currentContext(d.s);
  if (context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *device = context->device;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetFlags(unsigned int* flags) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* context = currentContext(d.s);
  if (context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *flags = context->flags;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetId(CUcontext ctx, unsigned long long* ctxId) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (ctxId == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (ctx == nullptr) ctx = currentContext(d.s);
  if (!ncclemu::isLiveContext(d.s, ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  *ctxId = ctx->id;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (currentContext(d.s) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (leastPriority != nullptr) *leastPriority = 0;
  if (greatestPriority != nullptr) *greatestPriority = -5;
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize() {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  CUctx_st* context = currentContext(d.s);
  if (context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult result = refuseIfCaptureForbids(d.s); result != CUDA_SUCCESS) return result;
  auto pending = contextWorkToWaitFor(context);
  d.lock.unlock();
  for (const auto& [stream, until] : pending) stream->waitUntilDone(until);
  return CUDA_SUCCESS;
}

// --- Memory ------------------------------------------------------------------------------------

CUresult cuMemAlloc(CUdeviceptr* dptr, size_t bytesize) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* context = currentContext(d.s);
  if (context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult result = refuseIfCaptureForbids(d.s); result != CUDA_SUCCESS) return result;
  const std::size_t rounded = (bytesize + 255) & ~static_cast<std::size_t>(255);
  ncclemu::Device& device = d.s.devices[context->device];
  if (rounded > d.s.gpu_memory_bytes - device.allocated_bytes) return CUDA_ERROR_OUT_OF_MEMORY;
  void* memory = std::aligned_alloc(256, rounded);
  if (memory == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  device.allocated_bytes += rounded;
  d.s.allocations.emplace(reinterpret_cast<std::uintptr_t>(memory), ncclemu::Allocation{rounded, context, false});
  *dptr = reinterpret_cast<CUdeviceptr>(memory);
  return CUDA_SUCCESS;
}

// Page-locked host memory is always mapped (unified addressing): its device pointer is its address.
CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  constexpr unsigned kKnownFlags = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if (pp == nullptr || bytesize == 0 || (Flags & ~kKnownFlags) != 0) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* context = currentContext(d.s);
  if (context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult result = refuseIfCaptureForbids(d.s); result != CUDA_SUCCESS) return result;
  const std::size_t rounded = (bytesize + 255) & ~static_cast<std::size_t>(255);
  void* memory = std::aligned_alloc(256, rounded);
  if (memory == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  d.s.allocations.emplace(reinterpret_cast<std::uintptr_t>(memory), ncclemu::Allocation{rounded, context, true, false, Flags});
  *pp = memory;
  return CUDA_SUCCESS;
}

CUresult cuMemAllocHost(void** pp, size_t bytesize) { return cuMemHostAlloc(pp, bytesize, 0); }

namespace {

CUresult freeAllocation(std::uintptr_t address, bool host) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (CUresult result = refuseIfCaptureForbids(d.s); result != CUDA_SUCCESS) return result;
  auto found = d.s.allocations.find(address);
  if (found == d.s.allocations.end() || found->second.host != host || found->second.registered || found->second.freeing) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (d.s.frees_wait) {
    // As on a driver whose free synchronises the device: the work queued on the owning context's
    // streams before this call finishes first, however long a stream stays parked. The entry
    // stays, marked, while the lock is released, so that nobody frees it (or is handed the
    // address again) meanwhile.
    found->second.freeing = true;
    auto pending = contextWorkToWaitFor(found->second.context);
    d.lock.unlock();
    for (const auto& [stream, until] : pending) stream->waitUntilDone(until);
    d.lock.lock();
    found = d.s.allocations.find(address);
    // Destroying the context meanwhile took the allocation with it.
    if (found == d.s.allocations.end() || !found->second.freeing) return CUDA_SUCCESS;
  }
  if (!host) d.s.devices[found->second.context->device].allocated_bytes -= found->second.size;
  d.s.allocations.erase(found);
  std::free(reinterpret_cast<void*>(address));
  return CUDA_SUCCESS;
}

}  // namespace

CUresult cuMemFree(CUdeviceptr dptr) { return freeAllocation(static_cast<std::uintptr_t>(dptr), false); }

CUresult cuMemFreeHost(void* p) { return freeAllocation(reinterpret_cast<std::uintptr_t>(p), true); }

CUresult cuMemGetInfo(size_t* free, size_t* total) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* context = currentContext(d.s);
  if (context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *total = d.s.gpu_memory_bytes;
  *free = d.s.gpu_memory_bytes - d.s.devices[context->device].allocated_bytes;
  return CUDA_SUCCESS;
}

CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto found = d.s.allocations.upper_bound(static_cast<std::uintptr_t>(ptr));
  if (found == d.s.allocations.begin()) return CUDA_ERROR_INVALID_VALUE;
  --found;
  const auto& [base, allocation] = *found;
  if (ptr >= base + allocation.size) return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *static_cast<CUcontext*>(data) = allocation.context; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) = allocation.host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *static_cast<CUdeviceptr*>(data) = ptr; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER: *static_cast<void**>(data) = reinterpret_cast<void*>(ptr); break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data) = allocation.context->device; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *static_cast<CUdeviceptr*>(data) = base; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<size_t*>(data) = allocation.size; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *static_cast<unsigned*>(data) = 0; break;
    default: return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  return runOnLegacyStream([&](const StreamPtr& legacy, Enqueued* where) {
    return enqueueCopy(legacy, reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), ByteCount, where);
  });
}

CUresult cuMemcpyHtoD(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount) {
  return cuMemcpy(dstDevice, reinterpret_cast<CUdeviceptr>(srcHost), ByteCount);
}

CUresult cuMemcpyDtoH(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  return cuMemcpy(reinterpret_cast<CUdeviceptr>(dstHost), srcDevice, ByteCount);
}

CUresult cuMemcpyDtoD(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  return cuMemcpy(dstDevice, srcDevice, ByteCount);
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
  return runOnStream(hStream, [&](const StreamPtr& stream) {
    return enqueueCopy(stream, reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), ByteCount);
  });
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount, CUstream hStream) {
  return cuMemcpyAsync(dstDevice, reinterpret_cast<CUdeviceptr>(srcHost), ByteCount, hStream);
}

CUresult cuMemcpyDtoHAsync(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  return cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dstHost), srcDevice, ByteCount, hStream);
}

CUresult cuMemcpyDtoDAsync(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  return cuMemcpyAsync(dstDevice, srcDevice, ByteCount, hStream);
}

CUresult cuMemsetD8(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  return runOnLegacyStream([&](const StreamPtr& legacy, Enqueued* where) { return enqueueFill(legacy, dstDevice, uc, N, where); });
}

CUresult cuMemsetD16(CUdeviceptr dstDevice, unsigned short us, size_t N) {
  return runOnLegacyStream([&](const StreamPtr& legacy, Enqueued* where) { return enqueueFill(legacy, dstDevice, us, N, where); });
}

CUresult cuMemsetD32(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  return runOnLegacyStream([&](const StreamPtr& legacy, Enqueued* where) { return enqueueFill(legacy, dstDevice, ui, N, where); });
}

CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
  return runOnStream(hStream, [&](const StreamPtr& stream) { return enqueueFill(stream, dstDevice, uc, N); });
}

CUresult cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream) {
  return runOnStream(hStream, [&](const StreamPtr& stream) { return enqueueFill(stream, dstDevice, us, N); });
}

CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
  return runOnStream(hStream, [&](const StreamPtr& stream) { return enqueueFill(stream, dstDevice, ui, N); });
}

// --- Streams -----------------------------------------------------------------------------------

CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (phStream == nullptr || (flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* context = currentContext(d.s);
  if (context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  // Out-of-range priorities are clamped, as CUDA does.
  priority = std::clamp(priority, -5, 0);
  *phStream = ncclemu::createStream(d.s, context, CUstream_st::Kind::kCreated, flags, priority).get();
  return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) { return cuStreamCreateWithPriority(phStream, Flags, 0); }

CUresult cuStreamDestroy(CUstream hStream) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  auto found = d.s.streams.find(hStream);
  if (found == d.s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  // Returns at once; queued work still runs, as on CUDA.
  ncclemu::destroyStream(d.s, StreamPtr(found->second));
  return CUDA_SUCCESS;
}

CUresult cuStreamQuery(CUstream hStream) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  StreamPtr stream;
  if (CUresult result = resolveStream(d.s, hStream, stream); result != CUDA_SUCCESS) return result;
  if (stream->capture) {
    stream->capture->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (CUresult result = refuseIfCaptureForbids(d.s); result != CUDA_SUCCESS) return result;
  return workToWaitFor(stream).empty() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuStreamSynchronize(CUstream hStream) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  StreamPtr stream;
  if (CUresult result = resolveStream(d.s, hStream, stream); result != CUDA_SUCCESS) return result;
  if (stream->capture) {
    stream->capture->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (CUresult result = refuseIfCaptureForbids(d.s); result != CUDA_SUCCESS) return result;
  auto pending = workToWaitFor(stream);
  d.lock.unlock();
  for (const auto& [other, until] : pending) other->waitUntilDone(until);
  return CUDA_SUCCESS;
}

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if ((Flags & ~static_cast<unsigned>(CU_EVENT_WAIT_EXTERNAL)) != 0) return CUDA_ERROR_INVALID_VALUE;
  StreamPtr stream;
  if (CUresult result = resolveStream(d.s, hStream, stream); result != CUDA_SUCCESS) return result;
  EventPtr event;
  if (CUresult result = findEvent(d.s, hEvent, event); result != CUDA_SUCCESS) return result;
  if (const CapturePtr& captured = event->recorded_in_capture) {
    if (captured->ended) return CUDA_ERROR_CAPTURED_EVENT;
    if (stream->capture == captured) return CUDA_SUCCESS;
    if (stream->capture) return CUDA_ERROR_STREAM_CAPTURE_MERGE;
    // Waiting on a capturing stream's event makes this stream join the capture (fork/join). The
    // emulator records all joined streams' work in one sequence, in call order.
    if (stream->kind == CUstream_st::Kind::kLegacy) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    stream->capture = captured;
    captured->members.push_back(stream);
    return CUDA_SUCCESS;
  }
  if (stream->capture) {
    stream->capture->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
  }
  std::shared_ptr<Marker> marker = event->last_record;
  if (!marker || marker->isComplete()) return CUDA_SUCCESS;
  return enqueue(stream, [marker] { marker->waitComplete(); }, Replay());
}

CUresult cuStreamGetCtx(CUstream hStream, CUcontext* pctx) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  StreamPtr stream;
  if (CUresult result = resolveStream(d.s, hStream, stream); result != CUDA_SUCCESS) return result;
  *pctx = stream->context;
  return CUDA_SUCCESS;
}

CUresult cuStreamGetFlags(CUstream hStream, unsigned int* flags) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  StreamPtr stream;
  if (CUresult result = resolveStream(d.s, hStream, stream); result != CUDA_SUCCESS) return result;
  *flags = stream->flags;
  return CUDA_SUCCESS;
}

CUresult cuStreamGetPriority(CUstream hStream, int* priority) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (priority == nullptr) return CUDA_ERROR_INVALID_VALUE;
  StreamPtr stream;
  if (CUresult result = resolveStream(d.s, hStream, stream); result != CUDA_SUCCESS) return result;
  *priority = stream->priority;
  return CUDA_SUCCESS;
}

CUresult cuStreamGetId(CUstream hStream, unsigned long long* streamId) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (streamId == nullptr) return CUDA_ERROR_INVALID_VALUE;
  StreamPtr stream;
  if (CUresult result = resolveStream(d.s, hStream, stream); result != CUDA_SUCCESS) return result;
  *streamId = stream->id;
  return CUDA_SUCCESS;
}

CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData) {
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return runOnStream(hStream, [&](const StreamPtr& stream) { return enqueueHostFunc(stream, fn, userData); });
}

// --- Events ------------------------------------------------------------------------------------

CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  constexpr unsigned kKnownFlags = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (phEvent == nullptr || (Flags & ~kKnownFlags) != 0) return CUDA_ERROR_INVALID_VALUE;
  if ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* context = currentContext(d.s);
  if (context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  auto event = std::make_shared<CUevent_st>();
  event->context = context;
  event->flags = Flags;
  *phEvent = event.get();
  d.s.events.emplace(event.get(), std::move(event));
  return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent hEvent) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  // A pending record still completes: the stream holds its own reference to the position.
  return d.s.events.erase(hEvent) != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if ((flags & ~static_cast<unsigned>(CU_EVENT_RECORD_EXTERNAL)) != 0) return CUDA_ERROR_INVALID_VALUE;
  EventPtr event;
  if (CUresult result = findEvent(d.s, hEvent, event); result != CUDA_SUCCESS) return result;
  StreamPtr stream;
  if (CUresult result = resolveStream(d.s, hStream, stream); result != CUDA_SUCCESS) return result;
  return enqueueEventRecord(event, stream);
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream) { return cuEventRecordWithFlags(hEvent, hStream, CU_EVENT_RECORD_DEFAULT); }

CUresult cuEventQuery(CUevent hEvent) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  std::shared_ptr<Marker> marker;
  if (CUresult result = eventCompletion(d.s, hEvent, marker); result != CUDA_SUCCESS) return result;
  if (CUresult result = refuseIfCaptureForbids(d.s); result != CUDA_SUCCESS) return result;
  // An event never recorded counts as complete, as on CUDA.
  return (!marker || marker->isComplete()) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent hEvent) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  std::shared_ptr<Marker> marker;
  if (CUresult result = eventCompletion(d.s, hEvent, marker); result != CUDA_SUCCESS) return result;
  if (CUresult result = refuseIfCaptureForbids(d.s); result != CUDA_SUCCESS) return result;
  d.lock.unlock();
  if (marker) marker->waitComplete();
  return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (pMilliseconds == nullptr) return CUDA_ERROR_INVALID_VALUE;
  EventPtr start;
  EventPtr end;
  if (CUresult result = findEvent(d.s, hStart, start); result != CUDA_SUCCESS) return result;
  if (CUresult result = findEvent(d.s, hEnd, end); result != CUDA_SUCCESS) return result;
  if ((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
  if (start->recorded_in_capture || end->recorded_in_capture) return CUDA_ERROR_CAPTURED_EVENT;
  if (!start->last_record || !end->last_record) return CUDA_ERROR_INVALID_HANDLE;
  if (!start->last_record->isComplete() || !end->last_record->isComplete()) return CUDA_ERROR_NOT_READY;
  std::chrono::duration<float, std::milli> elapsed = end->last_record->completionTime() - start->last_record->completionTime();
  *pMilliseconds = elapsed.count();
  return CUDA_SUCCESS;
}

// --- Graph capture -----------------------------------------------------------------------------

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (mode == nullptr || *mode < CU_STREAM_CAPTURE_MODE_GLOBAL || *mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
  std::swap(*mode, ncclemu::threadState().capture_mode);
  return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture(CUstream hStream, CUstreamCaptureMode mode) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
  StreamPtr stream;
  if (CUresult result = resolveStream(d.s, hStream, stream); result != CUDA_SUCCESS) return result;
  if (stream->kind == CUstream_st::Kind::kLegacy) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (stream->capture) return CUDA_ERROR_ILLEGAL_STATE;
  auto capture = std::make_shared<ncclemu::Capture>();
  capture->id = d.s.next_id++;
  capture->mode = mode;
  capture->thread = std::this_thread::get_id();
  capture->origin = stream.get();
  capture->graph = std::make_unique<CUgraph_st>();
  capture->members.push_back(stream);
  stream->capture = capture;
  d.s.active_captures.push_back(std::move(capture));
  return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (phGraph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  StreamPtr stream;
  if (CUresult result = resolveStream(d.s, hStream, stream); result != CUDA_SUCCESS) return result;
  CapturePtr capture = stream->capture;
  if (!capture) return CUDA_ERROR_ILLEGAL_STATE;
  if (capture->origin != stream.get()) {
    capture->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
  }
  if (capture->mode != CU_STREAM_CAPTURE_MODE_RELAXED && capture->thread != std::this_thread::get_id()) {
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  }
  capture->ended = true;
  for (const StreamPtr& member : capture->members) member->capture.reset();
  std::erase(d.s.active_captures, capture);
  if (capture->invalidated) {
    ncclemu::releaseUserObjects(d.s, capture->graph->user_objects);
    *phGraph = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  CUgraph_st* graph = capture->graph.get();
  d.s.graphs.emplace(graph, std::move(capture->graph));
  *phGraph = graph;
  return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (captureStatus == nullptr) return CUDA_ERROR_INVALID_VALUE;
  StreamPtr stream;
  if (CUresult result = resolveStream(d.s, hStream, stream); result != CUDA_SUCCESS) return result;
  if (captureBlockingLegacy(stream)) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  const CapturePtr& capture = stream->capture;
  *captureStatus = !capture ? CU_STREAM_CAPTURE_STATUS_NONE
                   : capture->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                          : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return CUDA_SUCCESS;
}

// The dependency outputs are always empty: the emulator captures a sequence, not a DAG.
CUresult cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus* captureStatus_out, cuuint64_t* id_out, CUgraph* graph_out,
                                const CUgraphNode** dependencies_out, const CUgraphEdgeData** edgeData_out, size_t* numDependencies_out) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (captureStatus_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  StreamPtr stream;
  if (CUresult result = resolveStream(d.s, hStream, stream); result != CUDA_SUCCESS) return result;
  if (captureBlockingLegacy(stream)) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  const CapturePtr& capture = stream->capture;
  *captureStatus_out = !capture ? CU_STREAM_CAPTURE_STATUS_NONE
                       : capture->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                              : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  if (id_out != nullptr && capture) *id_out = capture->id;
  if (graph_out != nullptr && capture) *graph_out = capture->graph.get();
  if (dependencies_out != nullptr) *dependencies_out = nullptr;
  if (edgeData_out != nullptr) *edgeData_out = nullptr;
  if (numDependencies_out != nullptr) *numDependencies_out = 0;
  return CUDA_SUCCESS;
}

CUresult cuGraphCreate(CUgraph* phGraph, unsigned int flags) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (phGraph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  auto graph = std::make_unique<CUgraph_st>();
  *phGraph = graph.get();
  d.s.graphs.emplace(graph.get(), std::move(graph));
  return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph hGraph) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  auto found = d.s.graphs.find(hGraph);
  if (found == d.s.graphs.end()) return CUDA_ERROR_INVALID_VALUE;
  ncclemu::releaseUserObjects(d.s, found->second->user_objects);
  d.s.graphs.erase(found);
  return CUDA_SUCCESS;
}

CUresult cuGraphInstantiate(CUgraphExec* phGraphExec, CUgraph hGraph, unsigned long long /*flags*/) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (phGraphExec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto found = d.s.graphs.find(hGraph);
  if (found == d.s.graphs.end()) return CUDA_ERROR_INVALID_VALUE;
  auto exec = std::make_unique<CUgraphExec_st>();
  exec->nodes = found->second->nodes;
  exec->user_objects = found->second->user_objects;
  ncclemu::retainUserObjects(exec->user_objects);
  *phGraphExec = exec.get();
  d.s.graph_execs.emplace(exec.get(), std::move(exec));
  return CUDA_SUCCESS;
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  auto found = d.s.graph_execs.find(hGraphExec);
  if (found == d.s.graph_execs.end()) return CUDA_ERROR_INVALID_VALUE;
  ncclemu::releaseUserObjects(d.s, found->second->user_objects);
  d.s.graph_execs.erase(found);
  return CUDA_SUCCESS;
}

namespace {

// A launch keeps the graph's user objects alive until its work has run, as CUDA does, even if
// the executable graph is destroyed meanwhile; launched into a capture, the outer graph keeps them.
CUresult holdUserObjectsForLaunch(const StreamPtr& stream, const UserObjectReferences& references) {
  if (references.empty()) return CUDA_SUCCESS;
  ncclemu::retainUserObjects(references);
  if (const CapturePtr& capture = stream->capture) {
    for (const auto& [object, count] : references) capture->graph->user_objects[object] += count;
    return CUDA_SUCCESS;
  }
  auto release = [held = references]() mutable {
    Driver d;
    ncclemu::releaseUserObjects(d.s, held);
  };
  return enqueue(stream, std::move(release), Replay());
}

CUgraph_st* findGraph(State& s, CUgraph handle) {
  if (s.graphs.count(handle) != 0) return handle;
  for (const CapturePtr& capture : s.active_captures) {
    if (capture->graph.get() == handle) return handle;
  }
  return nullptr;
}

CUuserObject_st* findUserObject(State& s, CUuserObject handle) {
  return s.user_objects.count(handle) != 0 ? handle : nullptr;
}

}  // namespace

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  auto found = d.s.graph_execs.find(hGraphExec);
  if (found == d.s.graph_execs.end()) return CUDA_ERROR_INVALID_VALUE;
  StreamPtr stream;
  if (CUresult result = resolveStream(d.s, hStream, stream); result != CUDA_SUCCESS) return result;
  for (const Replay& node : found->second->nodes) {
    if (CUresult result = node(stream); result != CUDA_SUCCESS) return result;
  }
  return holdUserObjectsForLaunch(stream, found->second->user_objects);
}

// --- User objects ------------------------------------------------------------------------------

CUresult cuUserObjectCreate(CUuserObject* object_out, void* ptr, CUhostFn destroy, unsigned int initialRefcount,
                            unsigned int flags) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (object_out == nullptr || destroy == nullptr || initialRefcount == 0 || flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto object = std::make_unique<CUuserObject_st>();
  object->pointer = ptr;
  object->destroy = destroy;
  object->references = initialRefcount;
  *object_out = object.get();
  d.s.user_objects.emplace(object.get(), std::move(object));
  return CUDA_SUCCESS;
}

CUresult cuUserObjectRetain(CUuserObject object, unsigned int count) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (findUserObject(d.s, object) == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  object->references += count;
  return CUDA_SUCCESS;
}

CUresult cuUserObjectRelease(CUuserObject object, unsigned int count) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (findUserObject(d.s, object) == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  ncclemu::releaseUserObject(d.s, object, count);
  return CUDA_SUCCESS;
}

CUresult cuGraphRetainUserObject(CUgraph graph, CUuserObject object, unsigned int count, unsigned int flags) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (findGraph(d.s, graph) == nullptr || findUserObject(d.s, object) == nullptr || count == 0 ||
      (flags & ~CU_GRAPH_USER_OBJECT_MOVE) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // With MOVE the caller hands over references it holds; otherwise the graph takes new ones.
  if (!(flags & CU_GRAPH_USER_OBJECT_MOVE)) object->references += count;
  graph->user_objects[object] += count;
  return CUDA_SUCCESS;
}

CUresult cuGraphReleaseUserObject(CUgraph graph, CUuserObject object, unsigned int count) {
  Driver d;
  if (!d.initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (findGraph(d.s, graph) == nullptr || findUserObject(d.s, object) == nullptr || count == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto held = graph->user_objects.find(object);
  if (held == graph->user_objects.end() || held->second < count) return CUDA_ERROR_INVALID_VALUE;
  held->second -= count;
  if (held->second == 0) graph->user_objects.erase(held);
  ncclemu::releaseUserObject(d.s, object, count);
  return CUDA_SUCCESS;
}

// Not CUDA's: the emulator's count of the driver calls made on the calling thread so far.
extern "C" __attribute__((visibility("default"))) unsigned long long cuEmuThreadDriverCalls() {
  return t_driver_calls;
}
