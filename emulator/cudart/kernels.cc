// Device code cannot run on the CPU. A program built with nvcc registers its kernels at start
// (the hooks below accept that, so the program starts), and every launch fails with
// cudaErrorNotSupported and one line on stderr saying why, once per process.
#pragma GCC visibility push(default)
#include <cuda_runtime_api.h>
#pragma GCC visibility pop

#include <cstdio>
#include <mutex>

#include "runtime_state.h"

namespace {

cudaError_t refuseDeviceCode(const char* function) {
  static std::once_flag said;
  std::call_once(said, [function] {
    std::fprintf(stderr,
                 "libcudart (CPU emulator): %s: device code cannot run on the CPU emulator; the launch fails with "
                 "cudaErrorNotSupported\n",
                 function);
  });
  return cudartemu::remember(cudaErrorNotSupported);
}

struct LaunchConfiguration {
  dim3 grid;
  dim3 block;
  size_t shared_memory = 0;
  cudaStream_t stream = nullptr;
};

thread_local LaunchConfiguration t_configuration;

// What __cudaRegisterFatBinary hands out: the program only passes it back.
void* g_module_handle = nullptr;

}  // namespace

cudaError_t cudaLaunchKernel(const void* /*func*/, dim3 /*gridDim*/, dim3 /*blockDim*/, void** /*args*/,
                             size_t /*sharedMem*/, cudaStream_t /*stream*/) {
  return refuseDeviceCode("cudaLaunchKernel");
}

// The hooks nvcc's generated host code calls (crt/host_runtime.h, crt/device_functions.h); they
// have no prototypes in the public headers.
extern "C" {

__attribute__((visibility("default"))) void** __cudaRegisterFatBinary(void* /*fatCubin*/) { return &g_module_handle; }

__attribute__((visibility("default"))) void __cudaRegisterFatBinaryEnd(void** /*fatCubinHandle*/) {}

__attribute__((visibility("default"))) void __cudaUnregisterFatBinary(void** /*fatCubinHandle*/) {}

__attribute__((visibility("default"))) char __cudaInitModule(void** /*fatCubinHandle*/) { return 1; }

__attribute__((visibility("default"))) void __cudaRegisterFunction(void** /*fatCubinHandle*/, const char* /*hostFun*/,
                                                                   char* /*deviceFun*/, const char* /*deviceName*/,
                                                                   int /*thread_limit*/, uint3* /*tid*/, uint3* /*bid*/,
                                                                   dim3* /*bDim*/, dim3* /*gDim*/, int* /*wSize*/) {}

__attribute__((visibility("default"))) void __cudaRegisterVar(void** /*fatCubinHandle*/, char* /*hostVar*/,
                                                              char* /*deviceAddress*/, const char* /*deviceName*/,
                                                              int /*ext*/, size_t /*size*/, int /*constant*/,
                                                              int /*global*/) {}

__attribute__((visibility("default"))) unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim,
                                                                            size_t sharedMem, CUstream_st* stream) {
  t_configuration = LaunchConfiguration{gridDim, blockDim, sharedMem, stream};
  return 0;
}

__attribute__((visibility("default"))) cudaError_t __cudaPopCallConfiguration(dim3* gridDim, dim3* blockDim,
                                                                              size_t* sharedMem, void* stream) {
  *gridDim = t_configuration.grid;
  *blockDim = t_configuration.block;
  *sharedMem = t_configuration.shared_memory;
  *static_cast<cudaStream_t*>(stream) = t_configuration.stream;
  return cudaSuccess;
}

__attribute__((visibility("default"))) cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* function) {
  *kernel = reinterpret_cast<cudaKernel_t>(const_cast<void*>(function));
  return cudaSuccess;
}

__attribute__((visibility("default"))) cudaError_t __cudaLaunchKernel(cudaKernel_t /*kernel*/, dim3 /*gridDim*/,
                                                                      dim3 /*blockDim*/, void** /*args*/,
                                                                      size_t /*sharedMem*/, cudaStream_t /*stream*/) {
  return refuseDeviceCode("cudaLaunchKernel");
}

}  // extern "C"
