// Captures an AllReduce of a one-rank communicator into a CUDA graph, launches the graph several
// times with new input each time and checks every result. The capture stays open for a while
// (argv[1] seconds) so that the watchdog polls during it, and the program lingers afterwards
// (argv[2] seconds) for longer than the stall timeout a test sets: a captured operation taken
// for a queued one would be reported.
//
// Prints "capture ok" when every launch of the graph's AllReduce delivered the expected data.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tests/watchdog_e2e/program_support.h"

namespace {

constexpr size_t kCount = 1024;
constexpr int kLaunches = 3;

void Pause(const char* seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(std::strtod(seconds, nullptr)));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s CAPTURE_SECONDS LINGER_SECONDS\n", argv[0]);
    return 2;
  }
  const e2e::Gpu gpu = e2e::StartOneRank();
  std::vector<float> input(kCount);
  const CUdeviceptr send = e2e::AllocateFloats(kCount);
  const CUdeviceptr receive = e2e::AllocateFloats(kCount);

  // Global mode: the strictest, under which another thread's cuEventQuery or cuStreamQuery
  // during the capture would invalidate it.
  e2e::CheckCuda(cuStreamBeginCapture(gpu.stream, CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture");
  e2e::CheckNccl(ncclAllReduce(reinterpret_cast<void*>(send), reinterpret_cast<void*>(receive), kCount,
                               ncclFloat, ncclSum, gpu.comm, gpu.stream),
                 "ncclAllReduce");
  Pause(argv[1]);
  CUgraph graph = nullptr;
  e2e::CheckCuda(cuStreamEndCapture(gpu.stream, &graph), "cuStreamEndCapture");
  CUgraphExec executable = nullptr;
  e2e::CheckCuda(cuGraphInstantiate(&executable, graph, 0), "cuGraphInstantiate");

  for (int launch = 0; launch < kLaunches; ++launch) {
    for (size_t i = 0; i < kCount; ++i) input[i] = static_cast<float>(launch * 1000 + i % 97);
    e2e::CheckCuda(cuMemcpyHtoD(send, input.data(), kCount * sizeof(float)), "cuMemcpyHtoD");
    e2e::CheckCuda(cuGraphLaunch(executable, gpu.stream), "cuGraphLaunch");
    e2e::CheckCuda(cuStreamSynchronize(gpu.stream), "cuStreamSynchronize");
    std::vector<float> output(kCount);
    e2e::CheckCuda(cuMemcpyDtoH(output.data(), receive, kCount * sizeof(float)), "cuMemcpyDtoH");
    if (output != input) {
      std::fprintf(stderr, "launch %d of the graph's AllReduce delivered wrong data\n", launch + 1);
      return 1;
    }
  }
  e2e::CheckCuda(cuGraphExecDestroy(executable), "cuGraphExecDestroy");
  e2e::CheckCuda(cuGraphDestroy(graph), "cuGraphDestroy");
  std::printf("capture ok\n");
  std::fflush(stdout);
  Pause(argv[2]);
  e2e::CheckNccl(ncclCommDestroy(gpu.comm), "ncclCommDestroy");
  e2e::CheckCuda(cuDevicePrimaryCtxRelease(0), "cuDevicePrimaryCtxRelease");
  return 0;
}
