// A process that uses NCCL, then forks a child that uses NCCL on its own: a fresh driver, its
// own unique id and one-rank communicator. The child's second AllReduce is the one a test makes
// hang (NCCLEMU_FAULTS=hang:rank=0,seq=2); the parent's communicator never gets that far.
//
// Prints "parent pid P", "child pid C", what the child's stream synchronisation returned once
// something ended the hang, and "child exited with code X" (or "child killed by signal S").
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "tests/watchdog_e2e/program_support.h"

namespace {

constexpr size_t kCount = 256;

void AllReduce(const e2e::Gpu& gpu, CUdeviceptr buffer) {
  const auto data = reinterpret_cast<void*>(buffer);
  e2e::CheckNccl(ncclAllReduce(data, data, kCount, ncclFloat, ncclSum, gpu.comm, gpu.stream), "ncclAllReduce");
}

[[noreturn]] void RunChild() {
  const e2e::Gpu gpu = e2e::StartOneRank();
  const CUdeviceptr buffer = e2e::AllocateFloats(kCount);
  AllReduce(gpu, buffer);
  AllReduce(gpu, buffer);
  const CUresult synchronized = cuStreamSynchronize(gpu.stream);
  std::printf("child stream synchronize returned %d\n", static_cast<int>(synchronized));
  std::fflush(stdout);
  ncclCommDestroy(gpu.comm);
  std::exit(0);
}

}  // namespace

int main() {
  const e2e::Gpu gpu = e2e::StartOneRank();
  const CUdeviceptr buffer = e2e::AllocateFloats(kCount);
  AllReduce(gpu, buffer);
  e2e::CheckCuda(cuStreamSynchronize(gpu.stream), "cuStreamSynchronize");
  std::printf("parent pid %d\n", static_cast<int>(getpid()));
  std::fflush(stdout);  // or the child would print the parent's buffered lines again

  const pid_t child = fork();
  if (child < 0) {
    std::perror("fork");
    return 1;
  }
  if (child == 0) RunChild();
  std::printf("child pid %d\n", static_cast<int>(child));
  std::fflush(stdout);
  int status = 0;
  if (waitpid(child, &status, 0) != child) {
    std::perror("waitpid");
    return 1;
  }
  if (WIFEXITED(status)) {
    std::printf("child exited with code %d\n", WEXITSTATUS(status));
  } else {
    std::printf("child killed by signal %d\n", WTERMSIG(status));
  }
  e2e::CheckNccl(ncclCommDestroy(gpu.comm), "ncclCommDestroy");
  return 0;
}
