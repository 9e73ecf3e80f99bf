// Process lifetime: forked children and exits while a stream worker is stuck.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "cuda_test_support.h"

using emutest::Gate;
using emutest::PrimaryContext;

namespace {

// Runs `child` in a forked process and returns its exit status, or -1 if it did not exit normally.
template <typename Child>
int exitStatusOfChild(Child child) {
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) std::exit(child());
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("a child forked while a stream worker is busy exits normally", "[fork]") {
  PrimaryContext context;
  CUstream stream;
  REQUIRE(cuStreamCreate(&stream, CU_STREAM_DEFAULT) == CUDA_SUCCESS);
  Gate gate;
  REQUIRE(cuLaunchHostFunc(stream, Gate::hostFunction, &gate) == CUDA_SUCCESS);
  std::atomic<int> runs{0};
  REQUIRE(cuLaunchHostFunc(CU_STREAM_PER_THREAD, emutest::countRun, &runs) == CUDA_SUCCESS);
  gate.waitUntilEntered();

  // Like a data-loader worker: it never touches CUDA and leaves through exit().
  CHECK(exitStatusOfChild([] { return 7; }) == 7);

  // A child that does use the driver starts from a fresh, uninitialised one.
  CHECK(exitStatusOfChild([] {
          CUcontext current = nullptr;
          if (cuCtxGetCurrent(&current) != CUDA_ERROR_NOT_INITIALIZED) return 1;
          if (cuInit(0) != CUDA_SUCCESS) return 2;
          CUcontext context = nullptr;
          if (cuDevicePrimaryCtxRetain(&context, 0) != CUDA_SUCCESS || cuCtxSetCurrent(context) != CUDA_SUCCESS) return 3;
          std::atomic<int> runs{0};
          if (cuLaunchHostFunc(nullptr, emutest::countRun, &runs) != CUDA_SUCCESS) return 4;
          if (cuStreamSynchronize(nullptr) != CUDA_SUCCESS || runs != 1) return 5;
          return 0;
        }) == 0);

  gate.open();
  REQUIRE(cuStreamSynchronize(stream) == CUDA_SUCCESS);
  cuStreamDestroy(stream);
}

TEST_CASE("a process exits while a stream worker is stuck in a host function", "[fork]") {
  CHECK(exitStatusOfChild([] {
          cuInit(0);
          CUcontext context = nullptr;
          cuDevicePrimaryCtxRetain(&context, 0);
          cuCtxSetCurrent(context);
          // Leaked: the stuck worker still waits on it while the process exits.
          auto* never_opened = new Gate;
          if (cuLaunchHostFunc(CU_STREAM_PER_THREAD, Gate::hostFunction, never_opened) != CUDA_SUCCESS) return 1;
          never_opened->waitUntilEntered();
          return 3;
        }) == 3);
}
