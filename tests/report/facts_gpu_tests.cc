// GPU facts through the driver API, on the emulated libcuda and NVML (ctest sets
// NCCLEMU_DEVICES=4, NCCLEMU_GPU_MEMORY_MB=1024, NCCLEMU_DRIVER_VERSION=550.54.15 and
// LD_LIBRARY_PATH to the emulator's libraries). ncclguard finds the driver the application loaded
// and reads it without creating a context or changing the calling thread's current one.
#include <cuda.h>

#include <catch2/catch.hpp>

#include "watchdog/report/facts.h"

namespace ncclguard {
namespace {

constexpr std::int64_t kMiB = 1024 * 1024;

const GpuFacts* FindDevice(const CudaFacts& facts, int device) {
  for (const GpuFacts& gpu : facts.gpus) {
    if (gpu.device == device) return &gpu;
  }
  return nullptr;
}

TEST_CASE("GPU facts of the devices in use, from the application's driver", "[facts]") {
  FactSources sources = RealFactSources();
  const ProcessFacts before_init = CollectProcessFacts(sources, {0});
  CHECK(before_init.cuda.driver_version == 13000);  // answered before cuInit
  CHECK(before_init.cuda.gpus.empty());             // and CUDA was not initialised for us
  CHECK(before_init.driver_version == "550.54.15");

  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CUdevice device2 = 0;
  REQUIRE(cuDeviceGet(&device2, 2) == CUDA_SUCCESS);
  CUcontext context2 = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&context2, device2) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(context2) == CUDA_SUCCESS);
  CUdeviceptr allocation = 0;
  REQUIRE(cuMemAlloc(&allocation, 256 * kMiB) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(nullptr) == CUDA_SUCCESS);  // memory is read even when not current

  const ProcessFacts facts = CollectProcessFacts(sources, {3});
  REQUIRE(facts.cuda.gpus.size() == 2);
  const GpuFacts* in_use = FindDevice(facts.cuda, 2);
  REQUIRE(in_use != nullptr);
  char name[128] = {};
  REQUIRE(cuDeviceGetName(name, sizeof(name), device2) == CUDA_SUCCESS);
  CHECK(in_use->name == name);
  char bus_id[32] = {};
  REQUIRE(cuDeviceGetPCIBusId(bus_id, sizeof(bus_id), device2) == CUDA_SUCCESS);
  CHECK(in_use->pci_bus_id == bus_id);
  CHECK(in_use->memory_total_bytes == 1024 * kMiB);
  CHECK(in_use->memory_free_bytes == 768 * kMiB);

  // Named by a communicator but without an active primary context: no memory, no new context.
  const GpuFacts* listed = FindDevice(facts.cuda, 3);
  REQUIRE(listed != nullptr);
  CHECK(listed->pci_bus_id != "unknown");
  CHECK(listed->memory_total_bytes == -1);
  CUdevice device3 = 0;
  REQUIRE(cuDeviceGet(&device3, 3) == CUDA_SUCCESS);
  unsigned int flags = 0;
  int active = 1;
  REQUIRE(cuDevicePrimaryCtxGetState(device3, &flags, &active) == CUDA_SUCCESS);
  CHECK(active == 0);
  CUcontext current = reinterpret_cast<CUcontext>(0x1);
  REQUIRE(cuCtxGetCurrent(&current) == CUDA_SUCCESS);
  CHECK(current == nullptr);  // the context pushed to read memory was popped again

  REQUIRE(cuCtxSetCurrent(context2) == CUDA_SUCCESS);
  CHECK(cuMemFree(allocation) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(nullptr) == CUDA_SUCCESS);
  CHECK(cuDevicePrimaryCtxRelease(device2) == CUDA_SUCCESS);
}

}  // namespace
}  // namespace ncclguard
