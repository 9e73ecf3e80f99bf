// The emulated NVML: driver version, devices, and agreement with the emulated CUDA driver. Cases
// tagged by configuration run in processes of their own (tests/emulator/CMakeLists.txt).
#include <nvml_subset.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "cuda_test_support.h"

namespace {

std::string driverVersion() {
  char version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
  REQUIRE(nvmlSystemGetDriverVersion(version, sizeof version) == NVML_SUCCESS);
  return version;
}

nvmlDevice_t device(unsigned index) {
  nvmlDevice_t handle = nullptr;
  REQUIRE(nvmlDeviceGetHandleByIndex_v2(index, &handle) == NVML_SUCCESS);
  return handle;
}

}  // namespace

TEST_CASE("NVML answers only between init and shutdown", "[nvml]") {
  char version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
  CHECK(nvmlSystemGetDriverVersion(version, sizeof version) == NVML_ERROR_UNINITIALIZED);
  CHECK(nvmlShutdown() == NVML_ERROR_UNINITIALIZED);
  REQUIRE(nvmlInit_v2() == NVML_SUCCESS);
  CHECK(nvmlSystemGetDriverVersion(version, 4) == NVML_ERROR_INSUFFICIENT_SIZE);
  REQUIRE(nvmlShutdown() == NVML_SUCCESS);
  CHECK(nvmlSystemGetDriverVersion(version, sizeof version) == NVML_ERROR_UNINITIALIZED);
  CHECK(std::string(nvmlErrorString(NVML_ERROR_UNINITIALIZED)) == "Uninitialized");
}

TEST_CASE("NVML describes the same devices as the CUDA driver", "[nvml]") {
  REQUIRE(nvmlInit_v2() == NVML_SUCCESS);
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  unsigned count = 0;
  REQUIRE(nvmlDeviceGetCount_v2(&count) == NVML_SUCCESS);
  int cuda_count = 0;
  REQUIRE(cuDeviceGetCount(&cuda_count) == CUDA_SUCCESS);
  CHECK(count == static_cast<unsigned>(cuda_count));
  nvmlDevice_t handle = nullptr;
  CHECK(nvmlDeviceGetHandleByIndex_v2(count, &handle) == NVML_ERROR_INVALID_ARGUMENT);

  for (unsigned index = 0; index < count; ++index) {
    char cuda_bus_id[32];
    REQUIRE(cuDeviceGetPCIBusId(cuda_bus_id, sizeof cuda_bus_id, static_cast<CUdevice>(index)) == CUDA_SUCCESS);
    nvmlPciInfo_t pci;
    REQUIRE(nvmlDeviceGetPciInfo_v3(device(index), &pci) == NVML_SUCCESS);
    CHECK(std::string(pci.busIdLegacy) == cuda_bus_id);
    CHECK(std::string(pci.busId) == std::string("0000") + cuda_bus_id);
    CHECK((pci.pciDeviceId & 0xffff) == 0x10de);
    nvmlDevice_t by_bus_id = nullptr;
    REQUIRE(nvmlDeviceGetHandleByPciBusId_v2(cuda_bus_id, &by_bus_id) == NVML_SUCCESS);
    CHECK(by_bus_id == device(index));
    unsigned found_index = count;
    REQUIRE(nvmlDeviceGetIndex(by_bus_id, &found_index) == NVML_SUCCESS);
    CHECK(found_index == index);

    char nvml_name[NVML_DEVICE_NAME_V2_BUFFER_SIZE], cuda_name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    REQUIRE(nvmlDeviceGetName(device(index), nvml_name, sizeof nvml_name) == NVML_SUCCESS);
    REQUIRE(cuDeviceGetName(cuda_name, sizeof cuda_name, static_cast<CUdevice>(index)) == CUDA_SUCCESS);
    CHECK(std::string(nvml_name) == cuda_name);

    nvmlMemory_t memory;
    REQUIRE(nvmlDeviceGetMemoryInfo(device(index), &memory) == NVML_SUCCESS);
    size_t cuda_total = 0;
    REQUIRE(cuDeviceTotalMem(&cuda_total, static_cast<CUdevice>(index)) == CUDA_SUCCESS);
    CHECK(memory.total == cuda_total);
    CHECK(memory.free + memory.used == memory.total);
  }
  char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
  REQUIRE(nvmlDeviceGetUUID(device(0), uuid, sizeof uuid) == NVML_SUCCESS);
  CHECK(std::string(uuid).rfind("GPU-", 0) == 0);
  CHECK(nvmlDeviceGetHandleByPciBusId_v2("0000:01:00.0", &handle) == NVML_ERROR_NOT_FOUND);
  REQUIRE(nvmlShutdown() == NVML_SUCCESS);
}

TEST_CASE("without configuration NVML reports driver 580.65.06 and CUDA 13.0", "[nvml_default]") {
  REQUIRE(nvmlInit_v2() == NVML_SUCCESS);
  CHECK(driverVersion() == "580.65.06");
  int cuda_version = 0;
  REQUIRE(nvmlSystemGetCudaDriverVersion_v2(&cuda_version) == NVML_SUCCESS);
  CHECK(cuda_version == 13000);
  unsigned count = 0;
  REQUIRE(nvmlDeviceGetCount_v2(&count) == NVML_SUCCESS);
  CHECK(count == 8);
  REQUIRE(nvmlShutdown() == NVML_SUCCESS);
}

TEST_CASE("NVML reports the configured driver, devices and CUDA version", "[nvml_custom]") {
  REQUIRE(nvmlInit() == NVML_SUCCESS);
  CHECK(driverVersion() == "545.23.08");
  int cuda_version = 0;
  REQUIRE(nvmlSystemGetCudaDriverVersion(&cuda_version) == NVML_SUCCESS);
  CHECK(cuda_version == 12030);
  char nvml_version[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE];
  REQUIRE(nvmlSystemGetNVMLVersion(nvml_version, sizeof nvml_version) == NVML_SUCCESS);
  CHECK(std::string(nvml_version) == "12.545.23.08");
  unsigned count = 0;
  REQUIRE(nvmlDeviceGetCount_v2(&count) == NVML_SUCCESS);
  CHECK(count == 3);
  char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
  REQUIRE(nvmlDeviceGetName(device(1), name, sizeof name) == NVML_SUCCESS);
  CHECK(std::string(name) == "NVIDIA GeForce RTX 4090");
  nvmlPciInfo_t pci;
  REQUIRE(nvmlDeviceGetPciInfo_v3(device(0), &pci) == NVML_SUCCESS);
  CHECK(pci.pciDeviceId == 0x268410deu);
  REQUIRE(nvmlShutdown() == NVML_SUCCESS);
}

TEST_CASE("a bad driver version is named on stderr and replaced by the default", "[nvml_bad]") {
  std::FILE* captured = std::tmpfile();
  REQUIRE(captured != nullptr);
  int saved = dup(STDERR_FILENO);
  dup2(fileno(captured), STDERR_FILENO);
  nvmlReturn_t init = nvmlInit_v2();
  std::fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  REQUIRE(init == NVML_SUCCESS);
  std::rewind(captured);
  std::string messages;
  for (int c = std::fgetc(captured); c != EOF; c = std::fgetc(captured)) messages += static_cast<char>(c);
  std::fclose(captured);
  INFO(messages);
  CHECK(messages.find("NCCLEMU_DRIVER_VERSION='545.x'") != std::string::npos);
  CHECK(driverVersion() == "580.65.06");
  REQUIRE(nvmlShutdown() == NVML_SUCCESS);
}
