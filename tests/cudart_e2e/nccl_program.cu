// An NCCL program as NCCL's own benchmarks are written: the CUDA runtime (linked shared, so the
// runtime of the machine runs it), one communicator rank per device of this process, either one
// thread driving every device through a group ("group") or one thread per device ("threads").
// It runs collectives, checks their results, captures an AllReduce into a CUDA graph and
// launches the graph several times, checking each launch, and launches a kernel. With --warmup N
// it first queues N AllReduces back to back, out-of-place and in-place by turns, and waits once,
// as the benchmarks' warm-up iterations do.
//
//   nccl_program group|threads [--steps N] [--warmup N] [--timeout SECONDS]
//
// Prints "ok" and exits 0 when every result is right; exits 1 on a wrong result or a failed
// call, 3 when a stream has not finished within the timeout (a hang), 2 on bad usage.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t kCount = 1024;
constexpr int kGraphLaunches = 3;

struct Options {
  bool one_thread_per_device = false;
  int steps = 3;
  int warmup = 0;
  double timeout_seconds = 60;
};

struct Rank {
  int index = 0;
  int nranks = 0;
  cudaStream_t stream = nullptr;
  ncclComm_t comm = nullptr;
  float* send = nullptr;
  float* reduced = nullptr;
  float* broadcast = nullptr;
  float* gathered = nullptr;
};

Options g_options;

void checkCuda(cudaError_t result, const char* what) {
  if (result == cudaSuccess) return;
  std::fprintf(stderr, "%s failed: %s (%s)\n", what, cudaGetErrorName(result), cudaGetErrorString(result));
  std::exit(1);
}

void checkNccl(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return;
  std::fprintf(stderr, "%s failed: %s\n", what, ncclGetErrorString(result));
  std::exit(1);
}

void fail(const Rank& rank, const char* what, size_t index, float got, float expected) {
  std::fprintf(stderr, "rank %d: %s[%zu] is %g, expected %g\n", rank.index, what, index, got, expected);
  std::exit(1);
}

// A hung collective must end the program, not the test's patience: poll with a deadline.
void waitForStream(const Rank& rank) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(g_options.timeout_seconds);
  for (;;) {
    const cudaError_t state = cudaStreamQuery(rank.stream);
    if (state == cudaSuccess) return;
    if (state != cudaErrorNotReady) checkCuda(state, "cudaStreamQuery");
    if (std::chrono::steady_clock::now() >= deadline) {
      std::printf("timed out: rank %d's stream has not finished after %g s\n", rank.index, g_options.timeout_seconds);
      std::fflush(stdout);
      std::_Exit(3);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

float inputValue(int rank, int step, size_t i) {
  return static_cast<float>(rank * 100 + step * 10 + static_cast<int>(i % 7));
}

void setInput(const Rank& rank, int step) {
  std::vector<float> input(kCount);
  for (size_t i = 0; i < kCount; ++i) input[i] = inputValue(rank.index, step, i);
  checkCuda(cudaMemcpy(rank.send, input.data(), kCount * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
}

std::vector<float> copyBack(const float* device_buffer, size_t count) {
  std::vector<float> host(count);
  checkCuda(cudaMemcpy(host.data(), device_buffer, count * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return host;
}

void checkReduced(const Rank& rank, int step) {
  const std::vector<float> reduced = copyBack(rank.reduced, kCount);
  for (size_t i = 0; i < kCount; ++i) {
    float expected = 0;
    for (int r = 0; r < rank.nranks; ++r) expected += inputValue(r, step, i);
    if (reduced[i] != expected) fail(rank, "AllReduce", i, reduced[i], expected);
  }
}

void checkStep(const Rank& rank, int step) {
  checkReduced(rank, step);
  const int root = step % rank.nranks;
  const std::vector<float> broadcast = copyBack(rank.broadcast, kCount);
  const std::vector<float> gathered = copyBack(rank.gathered, kCount * rank.nranks);
  for (size_t i = 0; i < kCount; ++i) {
    if (broadcast[i] != inputValue(root, step, i)) fail(rank, "Broadcast", i, broadcast[i], inputValue(root, step, i));
    for (int r = 0; r < rank.nranks; ++r) {
      const size_t at = r * kCount + i;
      if (gathered[at] != inputValue(r, step, i)) fail(rank, "AllGather", at, gathered[at], inputValue(r, step, i));
    }
  }
}

void enqueueStep(const Rank& rank, int step) {
  checkNccl(ncclAllReduce(rank.send, rank.reduced, kCount, ncclFloat, ncclSum, rank.comm, rank.stream), "ncclAllReduce");
  checkNccl(ncclBroadcast(rank.send, rank.broadcast, kCount, ncclFloat, step % rank.nranks, rank.comm, rank.stream),
            "ncclBroadcast");
  checkNccl(ncclAllGather(rank.send, rank.gathered, kCount, ncclFloat, rank.comm, rank.stream), "ncclAllGather");
}

constexpr int kWarmupStep = 50;

// Out-of-place from the input, then in-place on the result: after an even number the result is
// nranks times the sum, which only holds if every in-place one reduced the previous result once.
void enqueueWarmup(const Rank& rank, int iteration) {
  const float* source = iteration % 2 == 0 ? rank.send : rank.reduced;
  checkNccl(ncclAllReduce(source, rank.reduced, kCount, ncclFloat, ncclSum, rank.comm, rank.stream), "ncclAllReduce");
}

void checkWarmup(const Rank& rank) {
  const std::vector<float> reduced = copyBack(rank.reduced, kCount);
  const float factor = g_options.warmup % 2 == 0 ? static_cast<float>(rank.nranks) : 1.0f;
  for (size_t i = 0; i < kCount; ++i) {
    float expected = 0;
    for (int r = 0; r < rank.nranks; ++r) expected += inputValue(r, kWarmupStep, i);
    if (reduced[i] != factor * expected) fail(rank, "warm-up AllReduce", i, reduced[i], factor * expected);
  }
}

void allocate(Rank& rank) {
  checkCuda(cudaSetDevice(rank.index), "cudaSetDevice");
  checkCuda(cudaStreamCreate(&rank.stream), "cudaStreamCreate");
  checkCuda(cudaMalloc(reinterpret_cast<void**>(&rank.send), kCount * sizeof(float)), "cudaMalloc");
  checkCuda(cudaMalloc(reinterpret_cast<void**>(&rank.reduced), kCount * sizeof(float)), "cudaMalloc");
  checkCuda(cudaMalloc(reinterpret_cast<void**>(&rank.broadcast), kCount * sizeof(float)), "cudaMalloc");
  checkCuda(cudaMalloc(reinterpret_cast<void**>(&rank.gathered), kCount * rank.nranks * sizeof(float)), "cudaMalloc");
}

void release(Rank& rank) {
  checkCuda(cudaSetDevice(rank.index), "cudaSetDevice");
  checkNccl(ncclCommDestroy(rank.comm), "ncclCommDestroy");
  for (float* buffer : {rank.send, rank.reduced, rank.broadcast, rank.gathered}) checkCuda(cudaFree(buffer), "cudaFree");
  checkCuda(cudaStreamDestroy(rank.stream), "cudaStreamDestroy");
}

// Captures one AllReduce per rank; the caller launches the graphs.
std::vector<cudaGraphExec_t> captureAllReduce(std::vector<Rank*> ranks, cudaStreamCaptureMode mode) {
  for (Rank* rank : ranks) checkCuda(cudaStreamBeginCapture(rank->stream, mode), "cudaStreamBeginCapture");
  checkNccl(ncclGroupStart(), "ncclGroupStart");
  for (Rank* rank : ranks) {
    checkNccl(ncclAllReduce(rank->send, rank->reduced, kCount, ncclFloat, ncclSum, rank->comm, rank->stream),
              "ncclAllReduce");
  }
  checkNccl(ncclGroupEnd(), "ncclGroupEnd");
  std::vector<cudaGraphExec_t> executables;
  for (Rank* rank : ranks) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t executable = nullptr;
    checkCuda(cudaStreamEndCapture(rank->stream, &graph), "cudaStreamEndCapture");
    checkCuda(cudaGraphInstantiate(&executable, graph, 0), "cudaGraphInstantiate");
    checkCuda(cudaGraphDestroy(graph), "cudaGraphDestroy");
    executables.push_back(executable);
  }
  return executables;
}

__global__ void fillKernel(float* data, float value, size_t count) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < count) data[i] = value;
}

// On a GPU the kernel runs; on a machine that cannot run device code the launch must fail cleanly.
void launchKernel(const Rank& rank) {
  checkCuda(cudaSetDevice(rank.index), "cudaSetDevice");
  fillKernel<<<(kCount + 255) / 256, 256, 0, rank.stream>>>(rank.reduced, 42.0f, kCount);
  const cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess) {
    std::printf("rank %d: kernel launch refused: %s\n", rank.index, cudaGetErrorName(launched));
    return;
  }
  waitForStream(rank);
  const std::vector<float> filled = copyBack(rank.reduced, kCount);
  if (filled[kCount - 1] != 42.0f) fail(rank, "kernel output", kCount - 1, filled[kCount - 1], 42.0f);
  std::printf("rank %d: kernel ran\n", rank.index);
}

void runGroup(std::vector<Rank>& ranks) {
  ncclUniqueId id;
  checkNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  checkNccl(ncclGroupStart(), "ncclGroupStart");
  for (Rank& rank : ranks) {
    checkCuda(cudaSetDevice(rank.index), "cudaSetDevice");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    checkNccl(ncclCommInitRankConfig(&rank.comm, rank.nranks, id, rank.index, &config), "ncclCommInitRankConfig");
  }
  checkNccl(ncclGroupEnd(), "ncclGroupEnd");
  if (g_options.warmup > 0) {
    for (Rank& rank : ranks) setInput(rank, kWarmupStep);
    for (int iteration = 0; iteration < g_options.warmup; ++iteration) {
      checkNccl(ncclGroupStart(), "ncclGroupStart");
      for (Rank& rank : ranks) enqueueWarmup(rank, iteration);
      checkNccl(ncclGroupEnd(), "ncclGroupEnd");
    }
    for (Rank& rank : ranks) waitForStream(rank);
    for (Rank& rank : ranks) checkWarmup(rank);
  }
  for (int step = 0; step < g_options.steps; ++step) {
    for (Rank& rank : ranks) setInput(rank, step);
    checkNccl(ncclGroupStart(), "ncclGroupStart");
    for (Rank& rank : ranks) enqueueStep(rank, step);
    checkNccl(ncclGroupEnd(), "ncclGroupEnd");
    for (Rank& rank : ranks) waitForStream(rank);
    for (Rank& rank : ranks) checkStep(rank, step);
  }
  std::vector<Rank*> all;
  for (Rank& rank : ranks) all.push_back(&rank);
  const std::vector<cudaGraphExec_t> graphs = captureAllReduce(all, cudaStreamCaptureModeGlobal);
  for (int launch = 0; launch < kGraphLaunches; ++launch) {
    const int step = 100 + launch;
    for (Rank& rank : ranks) setInput(rank, step);
    for (size_t r = 0; r < ranks.size(); ++r) checkCuda(cudaGraphLaunch(graphs[r], ranks[r].stream), "cudaGraphLaunch");
    for (Rank& rank : ranks) waitForStream(rank);
    for (Rank& rank : ranks) checkReduced(rank, step);
  }
  for (cudaGraphExec_t graph : graphs) checkCuda(cudaGraphExecDestroy(graph), "cudaGraphExecDestroy");
}

// One thread per device. The threads do the same steps; each waits only for its own stream.
void runThread(Rank& rank, const ncclUniqueId& id) {
  checkCuda(cudaSetDevice(rank.index), "cudaSetDevice");
  checkNccl(ncclCommInitRank(&rank.comm, rank.nranks, id, rank.index), "ncclCommInitRank");
  if (g_options.warmup > 0) {
    setInput(rank, kWarmupStep);
    for (int iteration = 0; iteration < g_options.warmup; ++iteration) enqueueWarmup(rank, iteration);
    waitForStream(rank);
    checkWarmup(rank);
  }
  for (int step = 0; step < g_options.steps; ++step) {
    setInput(rank, step);
    enqueueStep(rank, step);
    waitForStream(rank);
    checkStep(rank, step);
  }
  // Thread-local mode: the other threads' synchronisation must not invalidate this capture.
  const cudaGraphExec_t graph = captureAllReduce({&rank}, cudaStreamCaptureModeThreadLocal)[0];
  for (int launch = 0; launch < kGraphLaunches; ++launch) {
    const int step = 100 + launch;
    setInput(rank, step);
    checkCuda(cudaGraphLaunch(graph, rank.stream), "cudaGraphLaunch");
    waitForStream(rank);
    // Every rank sets its input before its launch and keeps it until its own launch is done, so
    // this launch's AllReduce saw every rank's input of the same launch.
    checkReduced(rank, step);
  }
  checkCuda(cudaGraphExecDestroy(graph), "cudaGraphExecDestroy");
}

void runThreads(std::vector<Rank>& ranks) {
  ncclUniqueId id;
  checkNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  std::vector<std::thread> threads;
  for (Rank& rank : ranks) threads.emplace_back(runThread, std::ref(rank), std::cref(id));
  for (std::thread& thread : threads) thread.join();
}

bool parse(int argc, char** argv) {
  if (argc < 2) return false;
  const std::string mode = argv[1];
  if (mode != "group" && mode != "threads") return false;
  g_options.one_thread_per_device = mode == "threads";
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string name = argv[i];
    if (name == "--steps") g_options.steps = std::atoi(argv[i + 1]);
    else if (name == "--warmup") g_options.warmup = std::atoi(argv[i + 1]);
    else if (name == "--timeout") g_options.timeout_seconds = std::atof(argv[i + 1]);
    else return false;
  }
  return argc % 2 == 0 && g_options.steps > 0 && g_options.warmup >= 0 && g_options.timeout_seconds > 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (!parse(argc, argv)) {
    std::fprintf(stderr, "usage: %s group|threads [--steps N] [--warmup N] [--timeout SECONDS]\n", argv[0]);
    return 2;
  }
  int devices = 0;
  checkCuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  int runtime_version = 0;
  checkCuda(cudaRuntimeGetVersion(&runtime_version), "cudaRuntimeGetVersion");
  std::printf("%d devices, CUDA runtime %d, %s\n", devices, runtime_version, argv[1]);
  std::fflush(stdout);
  std::vector<Rank> ranks(devices);
  for (int d = 0; d < devices; ++d) {
    ranks[d].index = d;
    ranks[d].nranks = devices;
    allocate(ranks[d]);
  }
  if (g_options.one_thread_per_device) runThreads(ranks);
  else runGroup(ranks);
  launchKernel(ranks[0]);
  for (Rank& rank : ranks) release(rank);
  std::printf("ok\n");
  return 0;
}
