// What the small NCCL programs of the end-to-end tests share: a context and stream on device 0,
// a one-rank communicator, and failing loudly (the tests read the programs' output).
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>

namespace e2e {

inline void CheckCuda(CUresult result, const char* call) {
  if (result == CUDA_SUCCESS) return;
  const char* name = nullptr;
  if (cuGetErrorName(result, &name) != CUDA_SUCCESS) name = "unnamed CUDA error";
  std::fprintf(stderr, "%s failed: %s\n", call, name);
  std::exit(EXIT_FAILURE);
}

inline void CheckNccl(ncclResult_t result, const char* call) {
  if (result == ncclSuccess) return;
  std::fprintf(stderr, "%s failed: %s\n", call, ncclGetErrorString(result));
  std::exit(EXIT_FAILURE);
}

struct Gpu {
  CUstream stream = nullptr;
  ncclComm_t comm = nullptr;
};

// cuInit, device 0's primary context, a non-blocking stream, and a communicator of one rank made
// from a unique id of this process's own.
inline Gpu StartOneRank() {
  Gpu gpu;
  CheckCuda(cuInit(0), "cuInit");
  CUdevice device = 0;
  CheckCuda(cuDeviceGet(&device, 0), "cuDeviceGet");
  CUcontext context = nullptr;
  CheckCuda(cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
  CheckCuda(cuCtxSetCurrent(context), "cuCtxSetCurrent");
  CheckCuda(cuStreamCreate(&gpu.stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  ncclUniqueId id;
  CheckNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  CheckNccl(ncclCommInitRank(&gpu.comm, 1, id, 0), "ncclCommInitRank");
  return gpu;
}

inline CUdeviceptr AllocateFloats(size_t count) {
  CUdeviceptr buffer = 0;
  CheckCuda(cuMemAlloc(&buffer, count * sizeof(float)), "cuMemAlloc");
  CheckCuda(cuMemsetD32(buffer, 0, count), "cuMemsetD32");
  return buffer;
}

}  // namespace e2e
