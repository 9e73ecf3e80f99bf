// The CPU libcudart over the emulated driver: what the runtime API promises, checked through the
// runtime alone (and the driver where the two must agree).
#include <cuda.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

void addOne(void* counter) { static_cast<std::atomic<int>*>(counter)->fetch_add(1); }

void CUDART_CB countCallback(cudaStream_t /*stream*/, cudaError_t status, void* counter) {
  if (status == cudaSuccess) addOne(counter);
}

}  // namespace

TEST_CASE("cudart: devices, properties and the per-thread current device", "[cudart]") {
  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  REQUIRE(count == 4);
  cudaDeviceProp prop;
  REQUIRE(cudaGetDeviceProperties(&prop, 2) == cudaSuccess);
  CHECK(std::string(prop.name) == "NVIDIA H100 80GB HBM3");
  CHECK(prop.major == 9);
  CHECK(prop.totalGlobalMem == size_t{81559} << 20);
  CHECK(cudaGetDeviceProperties(&prop, 4) == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaSuccess);  // taking the last error clears it

  REQUIRE(cudaSetDevice(3) == cudaSuccess);
  int device = -1;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  CHECK(device == 3);
  // The runtime made device 3's primary context current for the driver too.
  CUdevice driver_device = -1;
  REQUIRE(cuCtxGetDevice(&driver_device) == CUDA_SUCCESS);
  CHECK(driver_device == 3);
  std::thread([] {
    int other = -1;
    cudaGetDevice(&other);
    CHECK(other == 0);  // a new thread starts on device 0
  }).join();
  CHECK(cudaSetDevice(9) == cudaErrorInvalidDevice);
  std::thread([] {
    // A context made current through the driver is the runtime's current device, as in CUDA.
    CUcontext primary = nullptr;
    REQUIRE(cuDevicePrimaryCtxRetain(&primary, 2) == CUDA_SUCCESS);
    REQUIRE(cuCtxSetCurrent(primary) == CUDA_SUCCESS);
    int adopted = -1;
    REQUIRE(cudaGetDevice(&adopted) == cudaSuccess);
    CHECK(adopted == 2);
    void* buffer = nullptr;
    REQUIRE(cudaMalloc(&buffer, 64) == cudaSuccess);
    cudaPointerAttributes attributes;
    REQUIRE(cudaPointerGetAttributes(&attributes, buffer) == cudaSuccess);
    CHECK(attributes.device == 2);
    REQUIRE(cudaFree(buffer) == cudaSuccess);
    REQUIRE(cuDevicePrimaryCtxRelease(2) == CUDA_SUCCESS);
  }).join();
  char bus_id[32];
  REQUIRE(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), 1) == cudaSuccess);
  int by_bus = -1;
  REQUIRE(cudaDeviceGetByPCIBusId(&by_bus, bus_id) == cudaSuccess);
  CHECK(by_bus == 1);
  int version = 0;
  REQUIRE(cudaRuntimeGetVersion(&version) == cudaSuccess);
  CHECK(version == CUDART_VERSION);
}

TEST_CASE("cudart: memory, copies, streams and events", "[cudart]") {
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  REQUIRE(cudaFree(nullptr) == cudaSuccess);
  const size_t count = 1 << 16;
  float* device_buffer = nullptr;
  float* host_buffer = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&device_buffer), count * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&host_buffer), count * sizeof(float)) == cudaSuccess);
  cudaPointerAttributes attributes;
  REQUIRE(cudaPointerGetAttributes(&attributes, device_buffer) == cudaSuccess);
  CHECK(attributes.type == cudaMemoryTypeDevice);
  CHECK(attributes.device == 1);
  int on_stack = 0;
  REQUIRE(cudaPointerGetAttributes(&attributes, &on_stack) == cudaSuccess);
  CHECK(attributes.type == cudaMemoryTypeUnregistered);

  cudaStream_t stream;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t start, end;
  REQUIRE(cudaEventCreate(&start) == cudaSuccess);
  REQUIRE(cudaEventCreate(&end) == cudaSuccess);
  for (size_t i = 0; i < count; ++i) host_buffer[i] = static_cast<float>(i);
  REQUIRE(cudaEventRecord(start, stream) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(device_buffer, host_buffer, count * sizeof(float), cudaMemcpyHostToDevice, stream) ==
          cudaSuccess);
  REQUIRE(cudaMemsetAsync(host_buffer, 0, count * sizeof(float), stream) == cudaSuccess);
  REQUIRE(cudaEventRecord(end, stream) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK(cudaStreamQuery(stream) == cudaSuccess);
  CHECK(cudaEventQuery(end) == cudaSuccess);
  float ms = -1;
  REQUIRE(cudaEventElapsedTime(&ms, start, end) == cudaSuccess);
  CHECK(ms >= 0);
  CHECK(host_buffer[7] == 0.0f);
  std::vector<float> back(count);
  REQUIRE(cudaMemcpy(back.data(), device_buffer, count * sizeof(float), cudaMemcpyDefault) == cudaSuccess);
  CHECK(back[count - 1] == static_cast<float>(count - 1));
  CHECK(cudaMemcpy(back.data(), device_buffer, 4, static_cast<cudaMemcpyKind>(9)) == cudaErrorInvalidMemcpyDirection);
  size_t free_bytes = 0, total_bytes = 0;
  REQUIRE(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess);
  CHECK(total_bytes - free_bytes >= count * sizeof(float));
  REQUIRE(cudaEventDestroy(start) == cudaSuccess);
  REQUIRE(cudaEventDestroy(end) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
  REQUIRE(cudaFree(device_buffer) == cudaSuccess);
  REQUIRE(cudaFreeHost(host_buffer) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

TEST_CASE("cudart: registered and mapped host memory gate a runtime stream through the driver", "[cudart]") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  alignas(64) static uint32_t words[16];
  void* device_pointer = nullptr;
  CHECK(cudaHostGetDevicePointer(&device_pointer, words, 0) == cudaErrorInvalidValue);
  REQUIRE(cudaHostRegister(words, sizeof(words), cudaHostRegisterMapped) == cudaSuccess);
  CHECK(cudaHostRegister(words, sizeof(words), cudaHostRegisterDefault) ==
        cudaErrorHostMemoryAlreadyRegistered);
  REQUIRE(cudaHostGetDevicePointer(&device_pointer, words, 0) == cudaSuccess);
  CHECK(device_pointer == static_cast<void*>(words));

  cudaStream_t stream;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  std::atomic<int> runs{0};
  REQUIRE(cuStreamWaitValue32(stream, reinterpret_cast<CUdeviceptr>(device_pointer), 1,
                              CU_STREAM_WAIT_VALUE_EQ) == CUDA_SUCCESS);
  REQUIRE(cudaLaunchHostFunc(stream, addOne, &runs) == cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(cudaStreamQuery(stream) == cudaErrorNotReady);
  CHECK(runs == 0);
  std::atomic_ref<uint32_t>(words[0]).store(1);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK(runs == 1);
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
  REQUIRE(cudaHostUnregister(words) == cudaSuccess);
  CHECK(cudaHostUnregister(words) == cudaErrorHostMemoryNotRegistered);

  void* mapped = nullptr;
  REQUIRE(cudaHostAlloc(&mapped, 64, cudaHostAllocMapped | cudaHostAllocPortable) == cudaSuccess);
  REQUIRE(cudaHostGetDevicePointer(&device_pointer, mapped, 0) == cudaSuccess);
  CHECK(device_pointer == mapped);
  unsigned flags = 0;
  REQUIRE(cuMemHostGetFlags(&flags, mapped) == CUDA_SUCCESS);
  CHECK(flags == (CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  REQUIRE(cudaFreeHost(mapped) == cudaSuccess);
  cudaGetLastError();
}

TEST_CASE("cudart: stream callbacks run once, in order; not in a capture", "[cudart]") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  cudaStream_t stream;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  std::atomic<int> runs{0};
  REQUIRE(cudaStreamAddCallback(stream, countCallback, &runs, 0) == cudaSuccess);
  REQUIRE(cudaStreamAddCallback(stream, countCallback, &runs, 0) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK(runs == 2);
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  CHECK(cudaStreamAddCallback(stream, countCallback, &runs, 0) == cudaErrorStreamCaptureUnsupported);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
  CHECK(cudaProfilerStart() == cudaSuccess);
  CHECK(cudaProfilerStop() == cudaSuccess);
}

TEST_CASE("cudart: a captured graph runs at every launch", "[cudart]") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  cudaStream_t stream;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  std::atomic<int> runs{0};
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  REQUIRE(cudaStreamIsCapturing(stream, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusActive);
  REQUIRE(cudaLaunchHostFunc(stream, addOne, &runs) == cudaSuccess);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  cudaGraphExec_t executable = nullptr;
  REQUIRE(cudaGraphInstantiate(&executable, graph, 0) == cudaSuccess);
  CHECK(runs == 0);
  for (int i = 0; i < 3; ++i) REQUIRE(cudaGraphLaunch(executable, stream) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK(runs == 3);
  REQUIRE(cudaGraphExecDestroy(executable) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
}

TEST_CASE("cudart: peer access, kernels and error texts", "[cudart]") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  int can_access = 0;
  REQUIRE(cudaDeviceCanAccessPeer(&can_access, 0, 1) == cudaSuccess);
  CHECK(can_access == 1);
  CHECK(cudaDeviceDisablePeerAccess(1) == cudaErrorPeerAccessNotEnabled);
  REQUIRE(cudaDeviceEnablePeerAccess(1, 0) == cudaSuccess);
  CHECK(cudaDeviceEnablePeerAccess(1, 0) == cudaErrorPeerAccessAlreadyEnabled);
  REQUIRE(cudaDeviceDisablePeerAccess(1) == cudaSuccess);
  cudaGetLastError();

  // Device code cannot run on the CPU: a clear error, which also becomes the last error.
  CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(&addOne), dim3(1), dim3(1), nullptr, 0, nullptr) ==
        cudaErrorNotSupported);
  CHECK(cudaPeekAtLastError() == cudaErrorNotSupported);
  CHECK(cudaGetLastError() == cudaErrorNotSupported);

  CHECK(std::string(cudaGetErrorName(cudaErrorInvalidValue)) == "cudaErrorInvalidValue");
  CHECK(std::string(cudaGetErrorName(cudaErrorStreamCaptureInvalidated)) == "cudaErrorStreamCaptureInvalidated");
  CHECK(std::string(cudaGetErrorString(cudaErrorMemoryAllocation)) == "out of memory");
  CHECK(std::string(cudaGetErrorString(cudaErrorInvalidMemcpyDirection)) == "invalid copy direction for memcpy");
  CHECK(std::string(cudaGetErrorString(cudaErrorNotSupported)) == "operation not supported");
  CHECK(std::string(cudaGetErrorString(static_cast<cudaError_t>(12345))) == "unrecognized error code");
}

TEST_CASE("cudart: without a device, every call says so", "[cudart_no_device]") {
  int count = -1;
  CHECK(cudaGetDeviceCount(&count) == cudaErrorNoDevice);
  CHECK(count == 0);
  void* pointer = nullptr;
  CHECK(cudaMalloc(&pointer, 16) == cudaErrorNoDevice);
}
