// What scripts/gpu-check.sh's check `parked` runs on one GPU, with the real driver and NCCL (and,
// to rehearse, on the emulator, by default and with NCCLEMU_FREES_WAIT=0): how the driver and NCCL
// treat a stream parked at a cuStreamWaitValue32 gate on a page-locked word, the gate ncclguard's
// in-process recovery holds an application stream at while it aborts a communicator.
//
//   gpu_check_parked LIMIT_SECONDS
//
//   gate       a host function on one stream writes the word another stream waits for: does the
//              waiting stream go on, and how long after the write
//   cuMemFree  called while a stream of the context is parked: does it return then, or only once
//              the gate opens
//   cudaFree   the same through the CUDA runtime (skipped when no libcudart can be loaded)
//   abort      ncclCommAbort of a one-rank communicator whose AllReduce was queued on the stream
//              before the gate
//
// A call still running after LIMIT_SECONDS is let go by opening the gate: answer
// waits_for_parked_stream; still running LIMIT_SECONDS later: never_returns. Each scenario prints
// one line, its name and then "key=value" pairs; the last line is "parked done". Exit 1 when a call
// fails, never returns, or a stream stays stuck once its gate is open: the answers themselves are
// facts, not failures.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "tests/watchdog_e2e/program_support.h"

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::duration;

double MillisecondsBetween(Clock::time_point start, Clock::time_point end) {
  return duration<double, std::milli>(end - start).count();
}

const char* CudaName(CUresult result) {
  const char* name = nullptr;
  return cuGetErrorName(result, &name) == CUDA_SUCCESS && name != nullptr ? name : "unnamed CUDA error";
}

// A page-locked word, mapped for the device, that streams are parked at until it reads 1.
// Deliberately never freed: a free may itself wait for the device, and a stream still parked at
// the word must not read freed memory.
class GateWord {
 public:
  GateWord() {
    void* host = nullptr;
    e2e::CheckCuda(
        cuMemHostAlloc(&host, sizeof(uint32_t), CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP),
        "cuMemHostAlloc");
    word_ = static_cast<uint32_t*>(host);
    *word_ = 0;
    e2e::CheckCuda(cuMemHostGetDevicePointer(&device_, host, 0), "cuMemHostGetDevicePointer");
  }

  void Park(CUstream stream) const {
    e2e::CheckCuda(cuStreamWaitValue32(stream, device_, 1, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32");
  }
  void Open() const { std::atomic_ref<uint32_t>(*word_).store(1); }

 private:
  uint32_t* word_ = nullptr;
  CUdeviceptr device_ = 0;
};

// What the stream said last within the limit: NOT_READY if it is still busy then.
CUresult WaitForStream(CUstream stream, double limit_seconds) {
  const auto deadline = Clock::now() + duration<double>(limit_seconds);
  CUresult state = cuStreamQuery(stream);
  while (state == CUDA_ERROR_NOT_READY && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    state = cuStreamQuery(stream);
  }
  return state;
}

struct CallResult {
  bool ok = false;
  std::string name;  // the call's own return code, named
  Clock::time_point finished;
};

// The call runs on a detached thread (with the context current there too), so that one that
// never returns cannot hold up the program; the future says whether and when it returned.
std::future<CallResult> StartDetached(CUcontext context, std::function<CallResult()> call) {
  auto promise = std::make_shared<std::promise<CallResult>>();
  std::future<CallResult> result = promise->get_future();
  std::thread([context, call = std::move(call), promise] {
    cuCtxSetCurrent(context);
    CallResult outcome = call();
    outcome.finished = Clock::now();
    promise->set_value(std::move(outcome));
  }).detach();
  return result;
}

// Calls `call` while `stream` is parked at `gate`, and prints whether it returned while parked,
// only once the gate opened, or never. False when there was nothing to measure (the stream was not
// parked), the call failed or never returned, or the stream is still busy once the gate is open.
bool MeasureWhileParked(const char* name, CUcontext context, CUstream stream, const GateWord& gate,
                        double limit_seconds, std::function<CallResult()> call) {
  const bool parked = cuStreamQuery(stream) == CUDA_ERROR_NOT_READY;
  const auto started = Clock::now();
  std::future<CallResult> pending = StartDetached(context, std::move(call));
  const bool returned_while_parked =
      pending.wait_for(duration<double>(limit_seconds)) == std::future_status::ready;
  const auto opened = Clock::now();
  gate.Open();
  const bool returned =
      returned_while_parked || pending.wait_for(duration<double>(limit_seconds)) == std::future_status::ready;
  const CUresult stream_after = WaitForStream(stream, limit_seconds);

  std::string figures;
  char text[160];
  bool ok = parked && returned && stream_after != CUDA_ERROR_NOT_READY;
  if (returned) {
    const CallResult outcome = pending.get();
    ok = ok && outcome.ok;
    if (returned_while_parked) {
      std::snprintf(text, sizeof text, "answer=returns_while_parked call_ms=%.3f",
                    MillisecondsBetween(started, outcome.finished));
    } else {
      std::snprintf(text, sizeof text, "answer=waits_for_parked_stream call_ms=%.3f after_open_ms=%.3f",
                    MillisecondsBetween(started, outcome.finished),
                    MillisecondsBetween(opened, outcome.finished));
    }
    figures = text;
    figures += " result=" + outcome.name;
  } else {
    std::snprintf(text, sizeof text, "answer=never_returns waited_ms=%.3f",
                  MillisecondsBetween(started, Clock::now()));
    figures = text;
  }
  std::printf("%s %s stream_parked=%s stream_after_open=%s\n", name, figures.c_str(), parked ? "yes" : "no",
              CudaName(stream_after));
  std::fflush(stdout);
  return ok;
}

// A host function on one stream opens the gate another stream is parked at.
struct GateTimes {
  const GateWord* gate = nullptr;
  std::atomic<int64_t> written_ns{0};
  std::atomic<int64_t> resumed_ns{0};
};

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

void CUDA_CB WriteGate(void* data) {
  auto* times = static_cast<GateTimes*>(data);
  times->written_ns.store(NowNs());
  times->gate->Open();
}

void CUDA_CB NoteResumed(void* data) { static_cast<GateTimes*>(data)->resumed_ns.store(NowNs()); }

bool MeasureGate(double limit_seconds) {
  CUstream waiting = nullptr, writing = nullptr;
  e2e::CheckCuda(cuStreamCreate(&waiting, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  e2e::CheckCuda(cuStreamCreate(&writing, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  GateWord gate;
  GateTimes times;
  times.gate = &gate;
  gate.Park(waiting);
  e2e::CheckCuda(cuLaunchHostFunc(waiting, NoteResumed, &times), "cuLaunchHostFunc");
  // Long enough for the wait to be reached on the device before anything writes the word.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const bool held = cuStreamQuery(waiting) == CUDA_ERROR_NOT_READY;
  e2e::CheckCuda(cuLaunchHostFunc(writing, WriteGate, &times), "cuLaunchHostFunc");
  const bool went_on = WaitForStream(waiting, limit_seconds) == CUDA_SUCCESS;
  if (went_on) {
    std::printf("gate held=%s went_on=yes latency_us=%.1f\n", held ? "yes" : "no",
                static_cast<double>(times.resumed_ns.load() - times.written_ns.load()) / 1000.0);
    std::fflush(stdout);
    return true;
  }
  // The host function's write did not let the stream go: does a write from this thread?
  gate.Open();
  const bool host_write_released = WaitForStream(waiting, limit_seconds) == CUDA_SUCCESS;
  std::printf("gate held=%s went_on=no host_function_ran=%s host_write_releases=%s\n", held ? "yes" : "no",
              times.written_ns.load() != 0 ? "yes" : "no", host_write_released ? "yes" : "no");
  std::fflush(stdout);
  return host_write_released;
}

bool MeasureCuMemFree(const e2e::Gpu& gpu, CUcontext context, double limit_seconds) {
  CUdeviceptr buffer = e2e::AllocateFloats(1 << 20);
  GateWord gate;
  gate.Park(gpu.stream);
  return MeasureWhileParked("cuMemFree", context, gpu.stream, gate, limit_seconds, [buffer] {
    const CUresult result = cuMemFree(buffer);
    return CallResult{result == CUDA_SUCCESS, CudaName(result), {}};
  });
}

// NVIDIA's runtime where one is installed; the emulator's under --emulator.
struct Runtime {
  decltype(&cudaSetDevice) set_device = nullptr;
  // Spelled out: cuda_runtime_api.h overloads cudaMalloc for C++.
  cudaError_t (*malloc)(void**, size_t) = nullptr;
  decltype(&cudaFree) free = nullptr;
  decltype(&cudaGetErrorName) error_name = nullptr;
  std::string library;
};

bool LoadRuntime(Runtime& runtime) {
  for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
    void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) continue;
    runtime.set_device = reinterpret_cast<decltype(&cudaSetDevice)>(dlsym(handle, "cudaSetDevice"));
    runtime.malloc = reinterpret_cast<decltype(runtime.malloc)>(dlsym(handle, "cudaMalloc"));
    runtime.free = reinterpret_cast<decltype(&cudaFree)>(dlsym(handle, "cudaFree"));
    runtime.error_name = reinterpret_cast<decltype(&cudaGetErrorName)>(dlsym(handle, "cudaGetErrorName"));
    runtime.library = name;
    return runtime.set_device != nullptr && runtime.malloc != nullptr && runtime.free != nullptr &&
           runtime.error_name != nullptr;
  }
  return false;
}

bool MeasureCudaFree(const e2e::Gpu& gpu, CUcontext context, double limit_seconds) {
  Runtime runtime;
  if (!LoadRuntime(runtime)) {
    std::printf("cudaFree answer=skipped reason=%s\n",
                runtime.library.empty() ? "no_libcudart_found" : "libcudart_lacks_cudaFree");
    std::fflush(stdout);
    return true;
  }
  // Device 0's primary context: the one the driver calls here use.
  void* buffer = nullptr;
  cudaError_t allocated = runtime.set_device(0);
  if (allocated == cudaSuccess) allocated = runtime.malloc(&buffer, size_t{4} << 20);
  if (allocated != cudaSuccess) {
    std::printf("cudaFree answer=error library=%s cudaMalloc=%s\n", runtime.library.c_str(),
                runtime.error_name(allocated));
    std::fflush(stdout);
    return false;
  }
  GateWord gate;
  gate.Park(gpu.stream);
  return MeasureWhileParked("cudaFree", context, gpu.stream, gate, limit_seconds, [runtime, buffer] {
    const cudaError_t result = runtime.free(buffer);
    return CallResult{result == cudaSuccess, runtime.error_name(result), {}};
  });
}

// The AllReduce is queued before the gate, as the application's collective would be when
// ncclguard parks its stream.
bool MeasureAbort(const e2e::Gpu& gpu, CUcontext context, double limit_seconds) {
  const CUdeviceptr send = e2e::AllocateFloats(1024);
  const CUdeviceptr receive = e2e::AllocateFloats(1024);
  e2e::CheckNccl(ncclAllReduce(reinterpret_cast<void*>(send), reinterpret_cast<void*>(receive), 1024,
                               ncclFloat, ncclSum, gpu.comm, gpu.stream),
                 "ncclAllReduce");
  GateWord gate;
  gate.Park(gpu.stream);
  const ncclComm_t comm = gpu.comm;
  return MeasureWhileParked("abort", context, gpu.stream, gate, limit_seconds, [comm] {
    const ncclResult_t result = ncclCommAbort(comm);
    return CallResult{
        result == ncclSuccess, result == ncclSuccess ? "ncclSuccess" : ncclGetErrorString(result), {}};
  });
}

}  // namespace

int main(int argc, char** argv) {
  const double limit_seconds = argc == 2 ? std::strtod(argv[1], nullptr) : 0;
  if (limit_seconds <= 0) {
    std::fprintf(stderr, "usage: %s LIMIT_SECONDS\n", argv[0]);
    return 2;
  }
  const e2e::Gpu gpu = e2e::StartOneRank();
  CUcontext context = nullptr;
  e2e::CheckCuda(cuCtxGetCurrent(&context), "cuCtxGetCurrent");
  bool ok = MeasureGate(limit_seconds);
  ok = MeasureCuMemFree(gpu, context, limit_seconds) && ok;
  ok = MeasureCudaFree(gpu, context, limit_seconds) && ok;
  ok = MeasureAbort(gpu, context, limit_seconds) && ok;
  std::printf("parked done\n");
  std::fflush(stdout);
  // A call that never returned still holds its thread: leave without waiting for it.
  std::_Exit(ok ? 0 : 1);
}
