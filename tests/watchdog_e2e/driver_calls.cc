// Counts the CUDA driver calls this thread makes while it issues small AllReduces back to back on a
// two-rank communicator that one process drives (ncclCommInitAll, both ranks in each group), as a
// tensor-parallel decoder does: the emulator counts them per thread (cuEmuThreadDriverCalls).
//
// Prints "driver calls per group: N" for the groups after a warm-up, then checks the results. It
// waits for its streams every kBurst groups (those waits are the same with and without ncclguard),
// and exits with its communicators open, so that a dump at exit shows their rings.
//
// With "held", the groups are one burst instead: queued back to back behind a host function that
// holds both streams until the last one is queued, so that none of them has run when the next is
// issued, as behind a slow GPU.
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/watchdog_e2e/program_support.h"

namespace {

constexpr int kRanks = 2;
constexpr size_t kCount = 256;
constexpr int kWarmUp = 16;
constexpr int kBurst = 16;

using ThreadDriverCalls = unsigned long long (*)();

void Wait(const CUcontext* contexts, const CUstream* streams) {
  for (int rank = 0; rank < kRanks; ++rank) {
    e2e::CheckCuda(cuCtxSetCurrent(contexts[rank]), "cuCtxSetCurrent");
    e2e::CheckCuda(cuStreamSynchronize(streams[rank]), "cuStreamSynchronize");
  }
}

void Group(const ncclComm_t* comms, const CUstream* streams, const CUdeviceptr* buffers) {
  e2e::CheckNccl(ncclGroupStart(), "ncclGroupStart");
  for (int rank = 0; rank < kRanks; ++rank) {
    auto* buffer = reinterpret_cast<void*>(buffers[rank]);
    e2e::CheckNccl(ncclAllReduce(buffer, buffer, kCount, ncclFloat, ncclMax, comms[rank], streams[rank]),
                   "ncclAllReduce");
  }
  e2e::CheckNccl(ncclGroupEnd(), "ncclGroupEnd");
}

std::atomic<bool> g_released{false};

void HoldStream(void*) {
  while (!g_released.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

}  // namespace

int main(int argc, char** argv) {
  const bool held = argc == 3 && std::strcmp(argv[2], "held") == 0;
  if (argc != 2 && !held) {
    std::fprintf(stderr, "usage: %s GROUPS [held]\n", argv[0]);
    return 2;
  }
  const int groups = std::atoi(argv[1]);
  auto thread_driver_calls =
      reinterpret_cast<ThreadDriverCalls>(dlsym(RTLD_DEFAULT, "cuEmuThreadDriverCalls"));
  if (thread_driver_calls == nullptr) {
    std::fprintf(stderr, "the CUDA driver is not the emulator's: no cuEmuThreadDriverCalls\n");
    return 2;
  }
  e2e::CheckCuda(cuInit(0), "cuInit");
  ncclComm_t comms[kRanks] = {};
  const int devices[kRanks] = {0, 1};
  e2e::CheckNccl(ncclCommInitAll(comms, kRanks, devices), "ncclCommInitAll");
  CUcontext contexts[kRanks] = {};
  CUstream streams[kRanks] = {};
  CUdeviceptr buffers[kRanks] = {};
  for (int rank = 0; rank < kRanks; ++rank) {
    e2e::CheckCuda(cuDevicePrimaryCtxRetain(&contexts[rank], devices[rank]), "cuDevicePrimaryCtxRetain");
    e2e::CheckCuda(cuCtxSetCurrent(contexts[rank]), "cuCtxSetCurrent");
    e2e::CheckCuda(cuStreamCreate(&streams[rank], CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    buffers[rank] = e2e::AllocateFloats(kCount);
    std::vector<float> ones(kCount, 1.0F);
    e2e::CheckCuda(cuMemcpyHtoD(buffers[rank], ones.data(), kCount * sizeof(float)), "cuMemcpyHtoD");
  }
  for (int i = 0; i < kWarmUp; ++i) Group(comms, streams, buffers);
  if (held) {
    Wait(contexts, streams);
    for (int rank = 0; rank < kRanks; ++rank) {
      e2e::CheckCuda(cuCtxSetCurrent(contexts[rank]), "cuCtxSetCurrent");
      e2e::CheckCuda(cuLaunchHostFunc(streams[rank], HoldStream, nullptr), "cuLaunchHostFunc");
    }
  }
  const unsigned long long before = thread_driver_calls();
  for (int i = 0; i < groups; ++i) {
    Group(comms, streams, buffers);
    if (!held && i % kBurst == kBurst - 1) Wait(contexts, streams);
  }
  const unsigned long long after = thread_driver_calls();
  std::printf("driver calls per group: %.2f\n", static_cast<double>(after - before) / groups);
  g_released.store(true);
  Wait(contexts, streams);
  for (int rank = 0; rank < kRanks; ++rank) {
    e2e::CheckCuda(cuCtxSetCurrent(contexts[rank]), "cuCtxSetCurrent");
    std::vector<float> output(kCount);
    e2e::CheckCuda(cuMemcpyDtoH(output.data(), buffers[rank], kCount * sizeof(float)), "cuMemcpyDtoH");
    if (output != std::vector<float>(kCount, 1.0F)) {
      std::fprintf(stderr, "rank %d: wrong result\n", rank);
      return 1;
    }
  }
  std::printf("driver calls ok\n");
  return 0;
}
