// cuGetProcAddress, and the older entry points that programs built against earlier cuda.h
// headers link to. CUDA's runtime fetches driver functions by base name and CUDA version; the
// version picks among an API's revisions (cuStreamGetCaptureInfo v1, v2 or v3).
#pragma GCC visibility push(default)
#include <cuda.h>
#pragma GCC visibility pop

#include <cstring>
#include <vector>

namespace {

struct ProcEntry {
  const char* name;
  int since_version;  // the first CUDA version whose cuda.h maps `name` to this function
  void* function;
};

// `name` is stringised before cuda.h's macro turns it into the current revision's symbol.
#define NCCLEMU_PROC(name, since_version) ProcEntry{#name, since_version, reinterpret_cast<void*>(&name)}

std::vector<ProcEntry> currentEntries() {
  return {
      NCCLEMU_PROC(cuInit, 0), NCCLEMU_PROC(cuDriverGetVersion, 0), NCCLEMU_PROC(cuGetErrorName, 0),
      NCCLEMU_PROC(cuGetErrorString, 0), NCCLEMU_PROC(cuGetProcAddress, 12000), NCCLEMU_PROC(cuDeviceGet, 0),
      NCCLEMU_PROC(cuDeviceGetCount, 0), NCCLEMU_PROC(cuDeviceGetName, 0), NCCLEMU_PROC(cuDeviceGetPCIBusId, 0),
      NCCLEMU_PROC(cuDeviceGetByPCIBusId, 0), NCCLEMU_PROC(cuDeviceTotalMem, 0), NCCLEMU_PROC(cuDeviceGetUuid, 11040),
      NCCLEMU_PROC(cuDeviceGetAttribute, 0), NCCLEMU_PROC(cuDeviceCanAccessPeer, 0),
      NCCLEMU_PROC(cuDevicePrimaryCtxRetain, 0), NCCLEMU_PROC(cuDevicePrimaryCtxRelease, 11000),
      NCCLEMU_PROC(cuDevicePrimaryCtxReset, 11000), NCCLEMU_PROC(cuDevicePrimaryCtxGetState, 0),
      NCCLEMU_PROC(cuDevicePrimaryCtxSetFlags, 11000), NCCLEMU_PROC(cuCtxCreate, 12050),
      NCCLEMU_PROC(cuCtxDestroy, 4000), NCCLEMU_PROC(cuCtxSetCurrent, 0), NCCLEMU_PROC(cuCtxGetCurrent, 0),
      NCCLEMU_PROC(cuCtxPushCurrent, 4000), NCCLEMU_PROC(cuCtxPopCurrent, 4000), NCCLEMU_PROC(cuCtxGetDevice, 0),
      NCCLEMU_PROC(cuCtxGetFlags, 0), NCCLEMU_PROC(cuCtxGetId, 0), NCCLEMU_PROC(cuCtxGetStreamPriorityRange, 0),
      NCCLEMU_PROC(cuCtxSynchronize, 0), NCCLEMU_PROC(cuMemAlloc, 0), NCCLEMU_PROC(cuMemAllocHost, 0),
      NCCLEMU_PROC(cuMemFree, 0), NCCLEMU_PROC(cuMemFreeHost, 0), NCCLEMU_PROC(cuMemGetInfo, 0),
      NCCLEMU_PROC(cuPointerGetAttribute, 0), NCCLEMU_PROC(cuMemcpy, 0), NCCLEMU_PROC(cuMemcpyHtoD, 0),
      NCCLEMU_PROC(cuMemcpyDtoH, 0), NCCLEMU_PROC(cuMemcpyDtoD, 0), NCCLEMU_PROC(cuMemcpyAsync, 0),
      NCCLEMU_PROC(cuMemcpyHtoDAsync, 0), NCCLEMU_PROC(cuMemcpyDtoHAsync, 0), NCCLEMU_PROC(cuMemcpyDtoDAsync, 0),
      NCCLEMU_PROC(cuMemsetD8, 0), NCCLEMU_PROC(cuMemsetD16, 0), NCCLEMU_PROC(cuMemsetD32, 0),
      NCCLEMU_PROC(cuMemsetD8Async, 0), NCCLEMU_PROC(cuMemsetD16Async, 0), NCCLEMU_PROC(cuMemsetD32Async, 0),
      NCCLEMU_PROC(cuStreamCreate, 0), NCCLEMU_PROC(cuStreamCreateWithPriority, 0), NCCLEMU_PROC(cuStreamDestroy, 4000),
      NCCLEMU_PROC(cuStreamQuery, 0), NCCLEMU_PROC(cuStreamSynchronize, 0), NCCLEMU_PROC(cuStreamWaitEvent, 0),
      NCCLEMU_PROC(cuStreamGetCtx, 0), NCCLEMU_PROC(cuStreamGetFlags, 0), NCCLEMU_PROC(cuStreamGetPriority, 0),
      NCCLEMU_PROC(cuStreamGetId, 0), NCCLEMU_PROC(cuLaunchHostFunc, 0), NCCLEMU_PROC(cuEventCreate, 0),
      NCCLEMU_PROC(cuEventDestroy, 4000), NCCLEMU_PROC(cuEventRecord, 0), NCCLEMU_PROC(cuEventRecordWithFlags, 0),
      NCCLEMU_PROC(cuEventQuery, 0), NCCLEMU_PROC(cuEventSynchronize, 0), NCCLEMU_PROC(cuEventElapsedTime, 12080),
      NCCLEMU_PROC(cuThreadExchangeStreamCaptureMode, 0), NCCLEMU_PROC(cuStreamBeginCapture, 10010),
      NCCLEMU_PROC(cuStreamEndCapture, 0), NCCLEMU_PROC(cuStreamIsCapturing, 0),
      NCCLEMU_PROC(cuStreamGetCaptureInfo, 12030), NCCLEMU_PROC(cuGraphCreate, 0), NCCLEMU_PROC(cuGraphDestroy, 0),
      NCCLEMU_PROC(cuGraphInstantiate, 11040), NCCLEMU_PROC(cuGraphInstantiateWithFlags, 0),
      NCCLEMU_PROC(cuGraphExecDestroy, 0), NCCLEMU_PROC(cuGraphLaunch, 0), NCCLEMU_PROC(cuUserObjectCreate, 0),
      NCCLEMU_PROC(cuUserObjectRetain, 0), NCCLEMU_PROC(cuUserObjectRelease, 0),
      NCCLEMU_PROC(cuGraphRetainUserObject, 0), NCCLEMU_PROC(cuGraphReleaseUserObject, 0),
      NCCLEMU_PROC(cuMemHostAlloc, 0), NCCLEMU_PROC(cuMemHostGetDevicePointer, 3020), NCCLEMU_PROC(cuMemHostGetFlags, 0),
      NCCLEMU_PROC(cuMemHostRegister, 6050), NCCLEMU_PROC(cuMemHostUnregister, 0),
      NCCLEMU_PROC(cuStreamWaitValue32, 11070), NCCLEMU_PROC(cuStreamWaitValue64, 11070),
      NCCLEMU_PROC(cuStreamWriteValue32, 11070), NCCLEMU_PROC(cuStreamWriteValue64, 11070),
  };
}
#undef NCCLEMU_PROC

}  // namespace

// --- Earlier revisions, under the names real libcuda keeps exporting for older programs --------

#define NCCLEMU_EXPORT extern "C" __attribute__((visibility("default")))

#undef cuEventElapsedTime
NCCLEMU_EXPORT CUresult cuEventElapsedTime(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  return cuEventElapsedTime_v2(pMilliseconds, hStart, hEnd);
}

#undef cuStreamDestroy
NCCLEMU_EXPORT CUresult cuStreamDestroy(CUstream hStream) { return cuStreamDestroy_v2(hStream); }

#undef cuEventDestroy
NCCLEMU_EXPORT CUresult cuEventDestroy(CUevent hEvent) { return cuEventDestroy_v2(hEvent); }

#undef cuCtxDestroy
NCCLEMU_EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

#undef cuCtxPushCurrent
NCCLEMU_EXPORT CUresult cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }

#undef cuCtxPopCurrent
NCCLEMU_EXPORT CUresult cuCtxPopCurrent(CUcontext* pctx) { return cuCtxPopCurrent_v2(pctx); }

#undef cuDevicePrimaryCtxRelease
NCCLEMU_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

#undef cuDevicePrimaryCtxReset
NCCLEMU_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

#undef cuDevicePrimaryCtxSetFlags
NCCLEMU_EXPORT CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
  return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}

#undef cuDeviceGetUuid
NCCLEMU_EXPORT CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }

#undef cuCtxCreate
NCCLEMU_EXPORT CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return cuCtxCreate_v4(pctx, nullptr, flags, dev);
}

#undef cuStreamBeginCapture
// The first revision had no mode argument; it behaved as the global mode does.
NCCLEMU_EXPORT CUresult cuStreamBeginCapture(CUstream hStream) {
  return cuStreamBeginCapture_v2(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

#undef cuStreamGetCaptureInfo
NCCLEMU_EXPORT CUresult cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus* captureStatus_out, cuuint64_t* id_out) {
  return cuStreamGetCaptureInfo_v3(hStream, captureStatus_out, id_out, nullptr, nullptr, nullptr, nullptr);
}

NCCLEMU_EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus* captureStatus_out, cuuint64_t* id_out,
                                                  CUgraph* graph_out, const CUgraphNode** dependencies_out, size_t* numDependencies_out) {
  return cuStreamGetCaptureInfo_v3(hStream, captureStatus_out, id_out, graph_out, dependencies_out, nullptr, numDependencies_out);
}

#undef cuGraphInstantiate
NCCLEMU_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec* phGraphExec, CUgraph hGraph, CUgraphNode* phErrorNode, char* logBuffer,
                                              size_t bufferSize) {
  if (phErrorNode != nullptr) *phErrorNode = nullptr;
  if (logBuffer != nullptr && bufferSize > 0) logBuffer[0] = '\0';
  return cuGraphInstantiateWithFlags(phGraphExec, hGraph, 0);
}

NCCLEMU_EXPORT CUresult cuGraphInstantiate(CUgraphExec* phGraphExec, CUgraph hGraph, CUgraphNode* phErrorNode, char* logBuffer,
                                           size_t bufferSize) {
  return cuGraphInstantiate_v2(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

// Defined with the stream memory operations.
#undef cuStreamWaitValue32
#undef cuStreamWaitValue64
#undef cuStreamWriteValue32
#undef cuStreamWriteValue64
#undef cuMemHostRegister
extern "C" {
CUresult cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags);
CUresult cuStreamWaitValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags);
CUresult cuStreamWriteValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags);
CUresult cuStreamWriteValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags);
CUresult cuMemHostRegister(void* p, size_t bytesize, unsigned int Flags);
}

namespace {

std::vector<ProcEntry> earlierEntries() {
  return {
      {"cuEventElapsedTime", 0, reinterpret_cast<void*>(&cuEventElapsedTime)},
      {"cuStreamDestroy", 0, reinterpret_cast<void*>(&cuStreamDestroy)},
      {"cuEventDestroy", 0, reinterpret_cast<void*>(&cuEventDestroy)},
      {"cuCtxDestroy", 0, reinterpret_cast<void*>(&cuCtxDestroy)},
      {"cuCtxPushCurrent", 0, reinterpret_cast<void*>(&cuCtxPushCurrent)},
      {"cuCtxPopCurrent", 0, reinterpret_cast<void*>(&cuCtxPopCurrent)},
      {"cuDevicePrimaryCtxRelease", 0, reinterpret_cast<void*>(&cuDevicePrimaryCtxRelease)},
      {"cuDevicePrimaryCtxReset", 0, reinterpret_cast<void*>(&cuDevicePrimaryCtxReset)},
      {"cuDevicePrimaryCtxSetFlags", 0, reinterpret_cast<void*>(&cuDevicePrimaryCtxSetFlags)},
      {"cuDeviceGetUuid", 0, reinterpret_cast<void*>(&cuDeviceGetUuid)},
      {"cuCtxCreate", 0, reinterpret_cast<void*>(&cuCtxCreate_v2)},
      {"cuStreamBeginCapture", 0, reinterpret_cast<void*>(&cuStreamBeginCapture)},
      {"cuStreamGetCaptureInfo", 10010, reinterpret_cast<void*>(&cuStreamGetCaptureInfo)},
      {"cuStreamGetCaptureInfo", 11030, reinterpret_cast<void*>(&cuStreamGetCaptureInfo_v2)},
      {"cuGraphInstantiate", 0, reinterpret_cast<void*>(&cuGraphInstantiate_v2)},
      {"cuStreamWaitValue32", 8000, reinterpret_cast<void*>(&cuStreamWaitValue32)},
      {"cuStreamWaitValue64", 9000, reinterpret_cast<void*>(&cuStreamWaitValue64)},
      {"cuStreamWriteValue32", 8000, reinterpret_cast<void*>(&cuStreamWriteValue32)},
      {"cuStreamWriteValue64", 9000, reinterpret_cast<void*>(&cuStreamWriteValue64)},
      {"cuMemHostRegister", 4000, reinterpret_cast<void*>(&cuMemHostRegister)},
  };
}

CUresult lookUp(const char* symbol, void** pfn, int cudaVersion, CUdriverProcAddressQueryResult* symbolStatus) {
  static const std::vector<ProcEntry> entries = [] {
    std::vector<ProcEntry> all = currentEntries();
    for (const ProcEntry& entry : earlierEntries()) all.push_back(entry);
    return all;
  }();
  const ProcEntry* best = nullptr;
  bool name_known = false;
  for (const ProcEntry& entry : entries) {
    if (std::strcmp(entry.name, symbol) != 0) continue;
    name_known = true;
    if (entry.since_version <= cudaVersion && (best == nullptr || entry.since_version > best->since_version)) best = &entry;
  }
  *pfn = best != nullptr ? best->function : nullptr;
  if (symbolStatus != nullptr) {
    *symbolStatus = best != nullptr ? CU_GET_PROC_ADDRESS_SUCCESS
                    : name_known    ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                                    : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  }
  return best != nullptr ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

}  // namespace

// Works before cuInit, as CUDA's runtime fetches cuInit itself this way. The per-thread-stream
// flag is accepted but changes nothing: the emulator has no _ptds/_ptsz variants.
CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t /*flags*/,
                          CUdriverProcAddressQueryResult* symbolStatus) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return lookUp(symbol, pfn, cudaVersion, symbolStatus);
}

#undef cuGetProcAddress
NCCLEMU_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, nullptr);
}
