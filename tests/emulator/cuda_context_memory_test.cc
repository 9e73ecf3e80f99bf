// Contexts, memory (frees by default and with NCCLEMU_FREES_WAIT=0), error names and
// cuGetProcAddress.
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <vector>

#include "cuda_test_support.h"

using emutest::Gate;
using emutest::PrimaryContext;
using namespace std::chrono_literals;

namespace {

// A stream parked at a cuStreamWaitValue32 on a page-locked word until the test writes it: the
// gate ncclguard's recovery holds an application stream at.
class ParkedStream {
 public:
  ParkedStream() {
    REQUIRE(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    void* host = nullptr;
    REQUIRE(cuMemAllocHost(&host, sizeof(cuuint32_t)) == CUDA_SUCCESS);
    word_ = static_cast<cuuint32_t*>(host);
    *word_ = 0;
    REQUIRE(cuStreamWaitValue32(stream_, reinterpret_cast<CUdeviceptr>(word_), 1, CU_STREAM_WAIT_VALUE_GEQ) ==
            CUDA_SUCCESS);
  }
  ~ParkedStream() {
    open();
    cuStreamSynchronize(stream_);
    cuStreamDestroy(stream_);
    cuMemFreeHost(word_);
  }
  ParkedStream(const ParkedStream&) = delete;
  ParkedStream& operator=(const ParkedStream&) = delete;

  void open() { std::atomic_ref<cuuint32_t>(*word_).store(1); }
  bool parked() { return cuStreamQuery(stream_) == CUDA_ERROR_NOT_READY; }

 private:
  CUstream stream_ = nullptr;
  cuuint32_t* word_ = nullptr;
};

// Runs a free on another thread, with the context current there too.
std::future<CUresult> freeOnAnotherThread(CUcontext context, CUresult (*free)(void*), void* memory) {
  return std::async(std::launch::async, [context, free, memory] {
    cuCtxSetCurrent(context);
    return free(memory);
  });
}

CUresult freeDevice(void* memory) { return cuMemFree(reinterpret_cast<CUdeviceptr>(memory)); }
CUresult freeHost(void* memory) { return cuMemFreeHost(memory); }

}  // namespace

TEST_CASE("primary contexts are retained, shared and released", "[contexts]") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CUcontext first = nullptr, second = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&first, 1) == CUDA_SUCCESS);
  REQUIRE(cuDevicePrimaryCtxRetain(&second, 1) == CUDA_SUCCESS);
  CHECK(first == second);
  unsigned flags = 1;
  int active = 0;
  REQUIRE(cuDevicePrimaryCtxGetState(1, &flags, &active) == CUDA_SUCCESS);
  CHECK(active == 1);

  REQUIRE(cuCtxSetCurrent(first) == CUDA_SUCCESS);
  CUdevice device = -1;
  REQUIRE(cuCtxGetDevice(&device) == CUDA_SUCCESS);
  CHECK(device == 1);

  REQUIRE(cuDevicePrimaryCtxRelease(1) == CUDA_SUCCESS);
  REQUIRE(cuDevicePrimaryCtxRelease(1) == CUDA_SUCCESS);
  REQUIRE(cuDevicePrimaryCtxGetState(1, &flags, &active) == CUDA_SUCCESS);
  CHECK(active == 0);
  // The thread still names the context, but it is gone.
  CHECK(cuCtxGetDevice(&device) == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(cuDevicePrimaryCtxRelease(1) == CUDA_ERROR_INVALID_CONTEXT);
  REQUIRE(cuCtxSetCurrent(nullptr) == CUDA_SUCCESS);
}

TEST_CASE("created contexts form a per-thread stack", "[contexts]") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CUcontext created = nullptr, current = nullptr;
  REQUIRE(cuCtxCreate(&created, nullptr, 0, 2) == CUDA_SUCCESS);
  REQUIRE(cuCtxGetCurrent(&current) == CUDA_SUCCESS);
  CHECK(current == created);

  CUcontext primary = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&primary, 0) == CUDA_SUCCESS);
  REQUIRE(cuCtxPushCurrent(primary) == CUDA_SUCCESS);
  CUdevice device = -1;
  REQUIRE(cuCtxGetDevice(&device) == CUDA_SUCCESS);
  CHECK(device == 0);
  CUcontext popped = nullptr;
  REQUIRE(cuCtxPopCurrent(&popped) == CUDA_SUCCESS);
  CHECK(popped == primary);
  REQUIRE(cuCtxGetDevice(&device) == CUDA_SUCCESS);
  CHECK(device == 2);

  REQUIRE(cuCtxDestroy(created) == CUDA_SUCCESS);
  REQUIRE(cuCtxGetCurrent(&current) == CUDA_SUCCESS);
  CHECK(current == nullptr);
  CHECK(cuCtxDestroy(created) == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(cuCtxPushCurrent(created) == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(cuCtxPopCurrent(&popped) == CUDA_ERROR_INVALID_CONTEXT);
  REQUIRE(cuDevicePrimaryCtxRelease(0) == CUDA_SUCCESS);
}

TEST_CASE("devices are described and checked", "[contexts]") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  int count = 0;
  REQUIRE(cuDeviceGetCount(&count) == CUDA_SUCCESS);
  REQUIRE(count >= 2);
  CUdevice device;
  CHECK(cuDeviceGet(&device, count) == CUDA_ERROR_INVALID_DEVICE);
  char name[8];
  CHECK(cuDeviceGetName(name, sizeof name, count) == CUDA_ERROR_INVALID_DEVICE);
  REQUIRE(cuDeviceGetName(name, sizeof name, 0) == CUDA_SUCCESS);
  CHECK(std::strlen(name) == sizeof name - 1);  // truncated, still terminated

  char first_bus[32], second_bus[32];
  REQUIRE(cuDeviceGetPCIBusId(first_bus, sizeof first_bus, 0) == CUDA_SUCCESS);
  REQUIRE(cuDeviceGetPCIBusId(second_bus, sizeof second_bus, 1) == CUDA_SUCCESS);
  CHECK(std::string(first_bus) != std::string(second_bus));
  REQUIRE(cuDeviceGetByPCIBusId(&device, second_bus) == CUDA_SUCCESS);
  CHECK(device == 1);
  int bus = -1;
  REQUIRE(cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 1) == CUDA_SUCCESS);
  CHECK(std::stoi(std::string(second_bus).substr(5, 2), nullptr, 16) == bus);
  int unified = 0;
  REQUIRE(cuDeviceGetAttribute(&unified, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0) == CUDA_SUCCESS);
  CHECK(unified == 1);
  CHECK(cuDeviceGetAttribute(&unified, CU_DEVICE_ATTRIBUTE_MAX, 0) == CUDA_ERROR_INVALID_VALUE);

  CUuuid first_uuid, second_uuid;
  REQUIRE(cuDeviceGetUuid(&first_uuid, 0) == CUDA_SUCCESS);
  REQUIRE(cuDeviceGetUuid(&second_uuid, 1) == CUDA_SUCCESS);
  CHECK(std::memcmp(first_uuid.bytes, second_uuid.bytes, sizeof first_uuid.bytes) != 0);
  int access = -1;
  CHECK(cuDeviceCanAccessPeer(&access, 0, count) == CUDA_ERROR_INVALID_DEVICE);
}

TEST_CASE("memory info reflects allocations and copies move the bytes", "[memory]") {
  PrimaryContext context;
  size_t free_before = 0, total = 0;
  REQUIRE(cuMemGetInfo(&free_before, &total) == CUDA_SUCCESS);
  CHECK(free_before <= total);

  constexpr size_t kCount = 1000;
  CUdeviceptr device_buffer = 0;
  REQUIRE(cuMemAlloc(&device_buffer, kCount * sizeof(int)) == CUDA_SUCCESS);
  CHECK(device_buffer % 256 == 0);
  size_t free_after = 0;
  REQUIRE(cuMemGetInfo(&free_after, &total) == CUDA_SUCCESS);
  CHECK(free_before - free_after >= kCount * sizeof(int));

  int ordinal = -1;
  REQUIRE(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, device_buffer + 100) ==
          CUDA_SUCCESS);
  CHECK(ordinal == 0);
  CUcontext owner = nullptr;
  REQUIRE(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, device_buffer) == CUDA_SUCCESS);
  CHECK(owner == context.get());

  std::vector<int> source(kCount), result(kCount, -1);
  for (size_t i = 0; i < kCount; ++i) source[i] = static_cast<int>(i * 7);
  REQUIRE(cuMemcpyHtoD(device_buffer, source.data(), kCount * sizeof(int)) == CUDA_SUCCESS);
  REQUIRE(cuMemcpyDtoH(result.data(), device_buffer, kCount * sizeof(int)) == CUDA_SUCCESS);
  CHECK(result == source);
  REQUIRE(cuMemsetD32(device_buffer, 0x01020304u, kCount) == CUDA_SUCCESS);
  REQUIRE(cuMemcpyDtoH(result.data(), device_buffer, kCount * sizeof(int)) == CUDA_SUCCESS);
  CHECK(result == std::vector<int>(kCount, 0x01020304));

  REQUIRE(cuMemFree(device_buffer) == CUDA_SUCCESS);
  REQUIRE(cuMemGetInfo(&free_after, &total) == CUDA_SUCCESS);
  CHECK(free_after == free_before);
  CHECK(cuMemFree(device_buffer) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemAlloc(&device_buffer, total + 1) == CUDA_ERROR_OUT_OF_MEMORY);
}

TEST_CASE("asynchronous copies wait for earlier work on their stream", "[memory]") {
  PrimaryContext context;
  CUstream stream;
  REQUIRE(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUdeviceptr device_buffer;
  REQUIRE(cuMemAlloc(&device_buffer, 64) == CUDA_SUCCESS);
  unsigned char host[64] = {};
  Gate gate;
  REQUIRE(cuMemsetD8Async(device_buffer, 0xab, 64, stream) == CUDA_SUCCESS);
  REQUIRE(cuLaunchHostFunc(stream, Gate::hostFunction, &gate) == CUDA_SUCCESS);
  REQUIRE(cuMemcpyDtoHAsync(host, device_buffer, 64, stream) == CUDA_SUCCESS);
  gate.waitUntilEntered();
  CHECK(host[0] == 0);
  gate.open();
  REQUIRE(cuStreamSynchronize(stream) == CUDA_SUCCESS);
  CHECK(host[0] == 0xab);
  CHECK(host[63] == 0xab);
  cuMemFree(device_buffer);
  cuStreamDestroy(stream);
}

// Run by the ctest entry emulator.cuda.frees_return, with NCCLEMU_FREES_WAIT=0.
TEST_CASE("with frees that return, a free returns while a stream of its context is parked",
          "[.frees_return]") {
  PrimaryContext context;
  ParkedStream parked;
  CUdeviceptr device_buffer = 0;
  REQUIRE(cuMemAlloc(&device_buffer, 256) == CUDA_SUCCESS);
  void* host_buffer = nullptr;
  REQUIRE(cuMemAllocHost(&host_buffer, 256) == CUDA_SUCCESS);
  auto freed = freeOnAnotherThread(context.get(), freeDevice, reinterpret_cast<void*>(device_buffer));
  REQUIRE(freed.wait_for(5s) == std::future_status::ready);
  CHECK(freed.get() == CUDA_SUCCESS);
  freed = freeOnAnotherThread(context.get(), freeHost, host_buffer);
  REQUIRE(freed.wait_for(5s) == std::future_status::ready);
  CHECK(freed.get() == CUDA_SUCCESS);
  CHECK(parked.parked());
}

TEST_CASE("by default a free waits for the parked stream until its word is written", "[memory]") {
  PrimaryContext context;
  size_t free_before = 0, total = 0;
  REQUIRE(cuMemGetInfo(&free_before, &total) == CUDA_SUCCESS);
  CUdeviceptr device_buffer = 0;
  REQUIRE(cuMemAlloc(&device_buffer, 4096) == CUDA_SUCCESS);
  // Before the stream: a failed check opens the gate before the future waits for the free.
  std::future<CUresult> freed;
  ParkedStream parked;

  freed = freeOnAnotherThread(context.get(), freeDevice, reinterpret_cast<void*>(device_buffer));
  CHECK(freed.wait_for(200ms) == std::future_status::timeout);
  // The memory is still the waiting free's: a second free of it is refused at once.
  CHECK(cuMemFree(device_buffer) == CUDA_ERROR_INVALID_VALUE);
  // Work queued after the free began is not waited for: a second stream held by a host function.
  CUstream later;
  REQUIRE(cuStreamCreate(&later, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  Gate gate;
  REQUIRE(cuLaunchHostFunc(later, Gate::hostFunction, &gate) == CUDA_SUCCESS);
  gate.waitUntilEntered();
  CHECK(freed.wait_for(100ms) == std::future_status::timeout);

  parked.open();
  REQUIRE(freed.wait_for(5s) == std::future_status::ready);
  CHECK(freed.get() == CUDA_SUCCESS);
  size_t free_after = 0;
  REQUIRE(cuMemGetInfo(&free_after, &total) == CUDA_SUCCESS);
  CHECK(free_after == free_before);

  // cuMemFreeHost waits the same way, here for the stream held by the host function.
  void* host_buffer = nullptr;
  REQUIRE(cuMemAllocHost(&host_buffer, 256) == CUDA_SUCCESS);
  freed = freeOnAnotherThread(context.get(), freeHost, host_buffer);
  CHECK(freed.wait_for(200ms) == std::future_status::timeout);
  gate.open();
  REQUIRE(freed.wait_for(5s) == std::future_status::ready);
  CHECK(freed.get() == CUDA_SUCCESS);

  // With the context idle a free returns at once.
  REQUIRE(cuStreamSynchronize(later) == CUDA_SUCCESS);
  REQUIRE(cuMemAlloc(&device_buffer, 256) == CUDA_SUCCESS);
  CHECK(cuMemFree(device_buffer) == CUDA_SUCCESS);
  cuStreamDestroy(later);
}

TEST_CASE("every error code has a name and a description", "[errors]") {
  const CUresult returned[] = {CUDA_SUCCESS,
                               CUDA_ERROR_INVALID_VALUE,
                               CUDA_ERROR_OUT_OF_MEMORY,
                               CUDA_ERROR_NOT_INITIALIZED,
                               CUDA_ERROR_NO_DEVICE,
                               CUDA_ERROR_INVALID_DEVICE,
                               CUDA_ERROR_INVALID_CONTEXT,
                               CUDA_ERROR_INVALID_HANDLE,
                               CUDA_ERROR_ILLEGAL_STATE,
                               CUDA_ERROR_NOT_FOUND,
                               CUDA_ERROR_NOT_READY,
                               CUDA_ERROR_NOT_SUPPORTED,
                               CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                               CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                               CUDA_ERROR_STREAM_CAPTURE_MERGE,
                               CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
                               CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
                               CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                               CUDA_ERROR_CAPTURED_EVENT,
                               CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
                               CUDA_ERROR_UNKNOWN};
  for (CUresult code : returned) {
    const char* name = nullptr;
    const char* description = nullptr;
    REQUIRE(cuGetErrorName(code, &name) == CUDA_SUCCESS);
    REQUIRE(cuGetErrorString(code, &description) == CUDA_SUCCESS);
    CHECK(std::string(name).rfind("CUDA_", 0) == 0);
    CHECK(std::strlen(description) > 0);
  }
  const char* name = nullptr;
  REQUIRE(cuGetErrorName(CUDA_ERROR_NOT_READY, &name) == CUDA_SUCCESS);
  CHECK(std::string(name) == "CUDA_ERROR_NOT_READY");
  const char* description = nullptr;
  REQUIRE(cuGetErrorString(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, &description) == CUDA_SUCCESS);
  CHECK(std::string(description) == "operation not permitted when stream is capturing");
  CHECK(cuGetErrorName(static_cast<CUresult>(12345), &name) == CUDA_ERROR_INVALID_VALUE);
  CHECK(name == nullptr);
}

TEST_CASE("cuGetProcAddress returns the revision the requested CUDA version names", "[errors]") {
  void* function = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  REQUIRE(cuGetProcAddress("cuEventQuery", &function, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status) ==
          CUDA_SUCCESS);
  CHECK(status == CU_GET_PROC_ADDRESS_SUCCESS);
  CHECK(function == reinterpret_cast<void*>(&cuEventQuery));

  REQUIRE(cuGetProcAddress("cuStreamGetCaptureInfo", &function, 13000, 0, &status) == CUDA_SUCCESS);
  CHECK(function == reinterpret_cast<void*>(&cuStreamGetCaptureInfo));  // the _v3 symbol
  void* older = nullptr;
  REQUIRE(cuGetProcAddress("cuStreamGetCaptureInfo", &older, 11080, 0, &status) == CUDA_SUCCESS);
  CHECK(older != nullptr);
  CHECK(older != function);
  REQUIRE(cuGetProcAddress("cuMemAlloc", &function, 12000, 0, &status) == CUDA_SUCCESS);
  CHECK(function == reinterpret_cast<void*>(&cuMemAlloc));  // cuMemAlloc_v2

  CHECK(cuGetProcAddress("cuNoSuchFunction", &function, 13000, 0, &status) == CUDA_ERROR_NOT_FOUND);
  CHECK(status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  CHECK(function == nullptr);
  CHECK(cuGetProcAddress("cuStreamGetCaptureInfo", &function, 10000, 0, &status) == CUDA_ERROR_NOT_FOUND);
  CHECK(status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
}
