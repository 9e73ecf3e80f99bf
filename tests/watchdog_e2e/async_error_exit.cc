// A program that watches its communicator itself, as frameworks do: after every AllReduce of a
// one-rank communicator it polls ncclCommGetAsyncError until the stream is done or NCCL reports an
// error. On an error it aborts the communicator and exits at once (exit code 3), before any
// watchdog with a long poll interval has looked.
//
// With --invalid-call it makes one AllReduce with an invalid datatype instead, and exits at once
// when NCCL refuses it (exit code 4).
//
// With --abort it ends with abort() instead of exit() (as an uncaught exception does): no atexit
// handler runs.
//
// Prints "step N ok" per AllReduce and "asynchronous error E at step N" when it stops.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tests/watchdog_e2e/program_support.h"

namespace {

constexpr size_t kCount = 1024;
constexpr int kSteps = 20;
constexpr int kErrorExitCode = 3;
constexpr int kFailedCallExitCode = 4;
bool g_abort = false;

[[noreturn]] void Stop(int exit_code) {
  std::fflush(stdout);
  if (g_abort) std::abort();
  std::exit(exit_code);
}

bool HasFlag(int argc, char** argv, const char* flag) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], flag) == 0) return true;
  }
  return false;
}

// ncclSuccess once the stream is done, else the asynchronous error NCCL reported meanwhile.
ncclResult_t WaitForStep(const e2e::Gpu& gpu) {
  for (;;) {
    ncclResult_t error = ncclSuccess;
    e2e::CheckNccl(ncclCommGetAsyncError(gpu.comm, &error), "ncclCommGetAsyncError");
    if (error != ncclSuccess && error != ncclInProgress) return error;
    const CUresult query = cuStreamQuery(gpu.stream);
    if (query == CUDA_SUCCESS) return ncclSuccess;
    if (query != CUDA_ERROR_NOT_READY) e2e::CheckCuda(query, "cuStreamQuery");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const e2e::Gpu gpu = e2e::StartOneRank();
  const CUdeviceptr buffer = e2e::AllocateFloats(kCount);
  void* data = reinterpret_cast<void*>(buffer);
  g_abort = HasFlag(argc, argv, "--abort");
  if (HasFlag(argc, argv, "--invalid-call")) {
    const auto invalid = static_cast<ncclDataType_t>(255);
    const ncclResult_t result = ncclAllReduce(data, data, kCount, invalid, ncclSum, gpu.comm, gpu.stream);
    std::printf("AllReduce with an invalid datatype: %s\n", ncclGetErrorString(result));
    Stop(result == ncclSuccess ? 0 : kFailedCallExitCode);
  }
  for (int step = 1; step <= kSteps; ++step) {
    e2e::CheckNccl(ncclAllReduce(data, data, kCount, ncclFloat32, ncclSum, gpu.comm, gpu.stream), "ncclAllReduce");
    if (const ncclResult_t error = WaitForStep(gpu); error != ncclSuccess) {
      std::printf("asynchronous error %s at step %d\n", ncclGetErrorString(error), step);
      ncclCommAbort(gpu.comm);
      Stop(kErrorExitCode);
    }
    std::printf("step %d ok\n", step);
  }
  e2e::CheckNccl(ncclCommDestroy(gpu.comm), "ncclCommDestroy");
  return 0;
}
