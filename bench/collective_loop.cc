// A program as a latency-bound job issues its collectives: N small AllReduces back to back, then
// one wait. With one rank, on one stream of a one-rank communicator; with R ranks, the way one
// process drives R GPUs (JAX, NCCL's benchmarks with -g): ncclCommInitAll, then per step one group
// of R AllReduces, one per communicator on its device's stream. NCCL is reached the way Paddle and
// JAX reach it (dlopen + dlsym), so under LD_PRELOAD=libncclguard.so every call goes through
// ncclguard. bench/call_cost.sh runs it under valgrind's callgrind for two values of N, with and
// without ncclguard, and prints what ncclguard adds per collective on the calling thread.
//
//   collective_loop <collectives per rank> [<ranks>]
#include <cuda.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

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
  const int ranks = argc > 2 ? static_cast<int>(std::strtol(argv[2], nullptr, 10)) : 1;
  if (collectives < 0 || ranks < 1 || ranks > 8) Fail("usage: collective_loop <collectives per rank> [<ranks, 1 to 8>]");
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
  auto comm_init_all = Resolve<decltype(&::ncclCommInitAll)>(libnccl, "ncclCommInitAll");
  auto group_start = Resolve<decltype(&::ncclGroupStart)>(libnccl, "ncclGroupStart");
  auto group_end = Resolve<decltype(&::ncclGroupEnd)>(libnccl, "ncclGroupEnd");
  auto all_reduce = Resolve<decltype(&::ncclAllReduce)>(libnccl, "ncclAllReduce");
  auto comm_destroy = Resolve<decltype(&::ncclCommDestroy)>(libnccl, "ncclCommDestroy");

  if (init(0) != CUDA_SUCCESS) Fail("cuInit failed");
  struct Rank {
    CUstream stream = nullptr;
    CUdeviceptr send = 0;
    CUdeviceptr receive = 0;
    ncclComm_t comm = nullptr;
  };
  std::vector<Rank> rank(static_cast<std::size_t>(ranks));
  std::vector<int> devices;
  for (int r = 0; r < ranks; ++r) {
    CUdevice device = 0;
    CUcontext context = nullptr;
    Rank& mine = rank[static_cast<std::size_t>(r)];
    if (device_get(&device, r) != CUDA_SUCCESS || retain(&context, device) != CUDA_SUCCESS ||
        set_current(context) != CUDA_SUCCESS || stream_create(&mine.stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
        mem_alloc(&mine.send, 64) != CUDA_SUCCESS || mem_alloc(&mine.receive, 64) != CUDA_SUCCESS) {
      Fail("the CUDA driver could not give a device, a stream and memory");
    }
    devices.push_back(r);
  }
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(ranks));
  if (ranks == 1) {
    ncclUniqueId id;
    if (get_unique_id(&id) != ncclSuccess || comm_init_rank(&comms[0], 1, id, 0) != ncclSuccess) {
      Fail("ncclCommInitRank failed");
    }
  } else if (comm_init_all(comms.data(), ranks, devices.data()) != ncclSuccess) {
    Fail("ncclCommInitAll failed");
  }
  for (long i = 0; i < collectives; ++i) {
    if (ranks > 1 && group_start() != ncclSuccess) Fail("ncclGroupStart failed");
    for (int r = 0; r < ranks; ++r) {
      const Rank& mine = rank[static_cast<std::size_t>(r)];
      if (all_reduce(reinterpret_cast<const void*>(mine.send), reinterpret_cast<void*>(mine.receive), 4,
                     ncclFloat32, ncclSum, comms[static_cast<std::size_t>(r)], mine.stream) != ncclSuccess) {
        Fail("ncclAllReduce failed");
      }
    }
    if (ranks > 1 && group_end() != ncclSuccess) Fail("ncclGroupEnd failed");
  }
  for (int r = 0; r < ranks; ++r) {
    if (synchronize(rank[static_cast<std::size_t>(r)].stream) != CUDA_SUCCESS) Fail("cuStreamSynchronize failed");
    if (comm_destroy(comms[static_cast<std::size_t>(r)]) != ncclSuccess) Fail("ncclCommDestroy failed");
  }
  return 0;
}
