// A program as a latency-bound job issues its collectives: N small AllReduces back to back on one
// stream of a one-rank communicator, then one wait. NCCL is reached the way Paddle and JAX reach
// it (dlopen + dlsym), so under LD_PRELOAD=libncclguard.so every call goes through ncclguard.
// bench/call_cost.sh runs it under valgrind's callgrind for two values of N, with and without
// ncclguard, and prints what ncclguard adds per collective on the calling thread.
//
//   collective_loop <collectives>
#include <cuda.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>

namespace {

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "collective_loop: %s\n", what);
  std::exit(1);
}

template <typename Function>
Function Resolve(void* library, const char* name) {
  void* found = dlsym(library, name);
  if (found == nullptr) Fail(name);
  return reinterpret_cast<Function>(found);
}

// cuda.h maps some names to versioned symbols (cuMemAlloc is cuMemAlloc_v2).
#define LOOP_NAME(name) LOOP_TEXT(name)
#define LOOP_TEXT(name) #name

}  // namespace

int main(int argc, char** argv) {
  const long collectives = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 1000;
  void* libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  void* libnccl = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (libcuda == nullptr || libnccl == nullptr) Fail(dlerror());
  auto init = Resolve<decltype(&::cuInit)>(libcuda, LOOP_NAME(cuInit));
  auto device_get = Resolve<decltype(&::cuDeviceGet)>(libcuda, LOOP_NAME(cuDeviceGet));
  auto retain = Resolve<decltype(&::cuDevicePrimaryCtxRetain)>(libcuda, LOOP_NAME(cuDevicePrimaryCtxRetain));
  auto set_current = Resolve<decltype(&::cuCtxSetCurrent)>(libcuda, LOOP_NAME(cuCtxSetCurrent));
  auto stream_create = Resolve<decltype(&::cuStreamCreate)>(libcuda, LOOP_NAME(cuStreamCreate));
  auto synchronize = Resolve<decltype(&::cuStreamSynchronize)>(libcuda, LOOP_NAME(cuStreamSynchronize));
  auto mem_alloc = Resolve<decltype(&::cuMemAlloc)>(libcuda, LOOP_NAME(cuMemAlloc));
  auto get_unique_id = Resolve<decltype(&::ncclGetUniqueId)>(libnccl, "ncclGetUniqueId");
  auto comm_init_rank = Resolve<decltype(&::ncclCommInitRank)>(libnccl, "ncclCommInitRank");
  auto all_reduce = Resolve<decltype(&::ncclAllReduce)>(libnccl, "ncclAllReduce");
  auto comm_destroy = Resolve<decltype(&::ncclCommDestroy)>(libnccl, "ncclCommDestroy");

  CUdevice device = 0;
  CUcontext context = nullptr;
  CUstream stream = nullptr;
  CUdeviceptr send = 0;
  CUdeviceptr receive = 0;
  if (init(0) != CUDA_SUCCESS || device_get(&device, 0) != CUDA_SUCCESS ||
      retain(&context, device) != CUDA_SUCCESS || set_current(context) != CUDA_SUCCESS ||
      stream_create(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS || mem_alloc(&send, 64) != CUDA_SUCCESS ||
      mem_alloc(&receive, 64) != CUDA_SUCCESS) {
    Fail("the CUDA driver could not give a device, a stream and memory");
  }
  ncclUniqueId id;
  ncclComm_t comm = nullptr;
  if (get_unique_id(&id) != ncclSuccess || comm_init_rank(&comm, 1, id, 0) != ncclSuccess) {
    Fail("ncclCommInitRank failed");
  }
  for (long i = 0; i < collectives; ++i) {
    if (all_reduce(reinterpret_cast<const void*>(send), reinterpret_cast<void*>(receive), 4, ncclFloat32, ncclSum,
                   comm, stream) != ncclSuccess) {
      Fail("ncclAllReduce failed");
    }
  }
  if (synchronize(stream) != CUDA_SUCCESS) Fail("cuStreamSynchronize failed");
  if (comm_destroy(comm) != ncclSuccess) Fail("ncclCommDestroy failed");
  return 0;
}
