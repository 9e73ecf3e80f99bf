// A benchmark written the way NCCL's own performance tests are: one process drives four GPUs
// (ncclCommInitAll, or `--group`: every ncclCommInitRank inside one group), each iteration is one
// AllReduce per GPU inside a group, and the streams are synchronised by polling cuStreamQuery and
// ncclCommGetAsyncError. Every NCCL call is checked at once: a failed call, or an asynchronous
// error, aborts every communicator and calls exit(3) right away; a synchronisation that takes
// longer than `--timeout` seconds aborts them and calls exit(4). Any other status is not its own.
//
// Prints "iteration N ok" per iteration and "Test NCCL failure ..." or "Test timeout ..." when it
// stops.
#include <sched.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/watchdog_e2e/program_support.h"

namespace {

constexpr int kGpus = 4;
constexpr size_t kCount = 4096;
constexpr int kIterations = 200;
constexpr int kNcclFailureExitCode = 3;
constexpr int kTimeoutExitCode = 4;

struct Gpu {
  CUcontext context = nullptr;
  CUstream stream = nullptr;
  CUdeviceptr buffer = 0;
  ncclComm_t comm = nullptr;
};

std::vector<Gpu> g_gpus(kGpus);

void AbortAll() {
  for (Gpu& gpu : g_gpus) {
    if (gpu.comm != nullptr) ncclCommAbort(gpu.comm);
  }
}

// The error check of the performance tests: report, abort every communicator, leave with the
// test's own code.
void NcclCheck(ncclResult_t result, const char* call, int line) {
  if (result == ncclSuccess) return;
  std::printf("Test NCCL failure perf_exit.cc:%d '%s': %s\n", line, call, ncclGetErrorString(result));
  std::fflush(stdout);
  AbortAll();
  std::exit(kNcclFailureExitCode);
}
#define NCCLCHECK(call) NcclCheck((call), #call, __LINE__)

void Prepare(int index) {
  Gpu& gpu = g_gpus[index];
  CUdevice device = 0;
  e2e::CheckCuda(cuDeviceGet(&device, index), "cuDeviceGet");
  e2e::CheckCuda(cuDevicePrimaryCtxRetain(&gpu.context, device), "cuDevicePrimaryCtxRetain");
  e2e::CheckCuda(cuCtxSetCurrent(gpu.context), "cuCtxSetCurrent");
  e2e::CheckCuda(cuStreamCreate(&gpu.stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  gpu.buffer = e2e::AllocateFloats(kCount);
}

void InitCommunicators(bool group) {
  if (!group) {
    ncclComm_t comms[kGpus];
    NCCLCHECK(ncclCommInitAll(comms, kGpus, nullptr));
    for (int i = 0; i < kGpus; ++i) g_gpus[i].comm = comms[i];
    return;
  }
  ncclUniqueId id;
  NCCLCHECK(ncclGetUniqueId(&id));
  NCCLCHECK(ncclGroupStart());
  for (int i = 0; i < kGpus; ++i) {
    e2e::CheckCuda(cuCtxSetCurrent(g_gpus[i].context), "cuCtxSetCurrent");
    NCCLCHECK(ncclCommInitRank(&g_gpus[i].comm, kGpus, id, i));
  }
  NCCLCHECK(ncclGroupEnd());
}

// Polls every stream until each is done, as the performance tests' testStreamSynchronize does.
void Synchronize(double timeout_seconds) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<bool> done(kGpus, false);
  int remaining = kGpus;
  while (remaining > 0) {
    for (int i = 0; i < kGpus; ++i) {
      if (done[i]) continue;
      const CUresult query = cuStreamQuery(g_gpus[i].stream);
      if (query == CUDA_SUCCESS) {
        done[i] = true;
        --remaining;
        continue;
      }
      if (query != CUDA_ERROR_NOT_READY) e2e::CheckCuda(query, "cuStreamQuery");
      ncclResult_t async_error = ncclSuccess;
      NCCLCHECK(ncclCommGetAsyncError(g_gpus[i].comm, &async_error));
      NCCLCHECK(async_error);
    }
    const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
    if (waited.count() > timeout_seconds) {
      std::printf("Test timeout: the streams did not finish in %.0f s\n", timeout_seconds);
      std::fflush(stdout);
      AbortAll();
      std::exit(kTimeoutExitCode);
    }
    sched_yield();
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool group = false;
  double timeout_seconds = 30;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--group") == 0) group = true;
    if (std::strcmp(argv[i], "--timeout") == 0 && i + 1 < argc) timeout_seconds = std::atof(argv[++i]);
  }
  e2e::CheckCuda(cuInit(0), "cuInit");
  for (int i = 0; i < kGpus; ++i) Prepare(i);
  InitCommunicators(group);
  for (int iteration = 1; iteration <= kIterations; ++iteration) {
    NCCLCHECK(ncclGroupStart());
    for (Gpu& gpu : g_gpus) {
      void* data = reinterpret_cast<void*>(gpu.buffer);
      NCCLCHECK(ncclAllReduce(data, data, kCount, ncclFloat32, ncclSum, gpu.comm, gpu.stream));
    }
    NCCLCHECK(ncclGroupEnd());
    Synchronize(timeout_seconds);
    std::printf("iteration %d ok\n", iteration);
  }
  for (Gpu& gpu : g_gpus) NCCLCHECK(ncclCommDestroy(gpu.comm));
  return 0;
}
