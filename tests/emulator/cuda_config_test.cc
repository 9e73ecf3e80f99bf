// NCCLEMU_* configuration as the driver reports it. The variables are read once per process, so
// CTest runs each tagged case in a process of its own with the environment it needs
// (tests/emulator/CMakeLists.txt).
#include <unistd.h>

#include <cstdio>
#include <string>

#include "cuda_test_support.h"

namespace {

constexpr size_t kMegabyte = size_t{1} << 20;

std::string deviceName(CUdevice device) {
  char name[128];
  REQUIRE(cuDeviceGetName(name, sizeof name, device) == CUDA_SUCCESS);
  return name;
}

int canAccessPeer(CUdevice device, CUdevice peer) {
  int access = -1;
  REQUIRE(cuDeviceCanAccessPeer(&access, device, peer) == CUDA_SUCCESS);
  return access;
}

int attribute(CUdevice_attribute which, CUdevice device = 0) {
  int value = -1;
  REQUIRE(cuDeviceGetAttribute(&value, which, device) == CUDA_SUCCESS);
  return value;
}

// What the driver writes to stderr while it first reads its configuration.
std::string stderrOfFirstCall() {
  std::FILE* captured = std::tmpfile();
  REQUIRE(captured != nullptr);
  std::fflush(stderr);
  int saved = dup(STDERR_FILENO);
  dup2(fileno(captured), STDERR_FILENO);
  CUresult init = cuInit(0);
  std::fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  REQUIRE(init == CUDA_SUCCESS);
  std::rewind(captured);
  std::string text;
  for (int c = std::fgetc(captured); c != EOF; c = std::fgetc(captured)) text += static_cast<char>(c);
  std::fclose(captured);
  return text;
}

}  // namespace

TEST_CASE("without configuration the machine is eight H100s with full P2P", "[config_default]") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  int count = 0;
  REQUIRE(cuDeviceGetCount(&count) == CUDA_SUCCESS);
  CHECK(count == 8);
  CHECK(deviceName(7) == "NVIDIA H100 80GB HBM3");
  size_t total = 0;
  REQUIRE(cuDeviceTotalMem(&total, 0) == CUDA_SUCCESS);
  CHECK(total == 81559 * kMegabyte);
  CHECK(canAccessPeer(0, 7) == 1);
  CHECK(canAccessPeer(3, 3) == 0);
  CHECK(attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) == 9);
  int version = 0;
  REQUIRE(cuDriverGetVersion(&version) == CUDA_SUCCESS);
  CHECK(version == 13000);
}

TEST_CASE("the configuration variables shape the machine", "[config_custom]") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  int count = 0;
  REQUIRE(cuDeviceGetCount(&count) == CUDA_SUCCESS);
  CHECK(count == 3);
  CHECK(deviceName(2) == "NVIDIA GeForce RTX 4090");
  CHECK(attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) == 8);
  CHECK(attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) == 9);
  size_t total = 0;
  REQUIRE(cuDeviceTotalMem(&total, 0) == CUDA_SUCCESS);
  CHECK(total == 24564 * kMegabyte);
  // NCCLEMU_P2P_ACCESS=011,100,100: device 0 reaches 1 and 2; 1 and 2 reach only 0.
  CHECK(canAccessPeer(0, 1) == 1);
  CHECK(canAccessPeer(0, 2) == 1);
  CHECK(canAccessPeer(1, 0) == 1);
  CHECK(canAccessPeer(1, 2) == 0);
  CHECK(canAccessPeer(2, 1) == 0);
  int version = 0;
  REQUIRE(cuDriverGetVersion(&version) == CUDA_SUCCESS);
  CHECK(version == 12030);

  CUcontext context;
  REQUIRE(cuDevicePrimaryCtxRetain(&context, 1) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(context) == CUDA_SUCCESS);
  size_t free = 0;
  REQUIRE(cuMemGetInfo(&free, &total) == CUDA_SUCCESS);
  CHECK(total == 24564 * kMegabyte);
  CUdeviceptr buffer;
  CHECK(cuMemAlloc(&buffer, 25000 * kMegabyte) == CUDA_ERROR_OUT_OF_MEMORY);
}

TEST_CASE("bad values are named on stderr and replaced by the defaults", "[config_bad]") {
  const std::string messages = stderrOfFirstCall();
  INFO(messages);
  CHECK(messages.find("NCCLEMU_DEVICES='many'") != std::string::npos);
  CHECK(messages.find("NCCLEMU_GPU_MEMORY_MB='-5'") != std::string::npos);
  CHECK(messages.find("NCCLEMU_P2P_ACCESS='01,1x'") != std::string::npos);
  CHECK(messages.find("NCCLEMU_CUDA_DRIVER_VERSION='twelve'") != std::string::npos);
  CHECK(messages.find("NCCLEMU_FREES_WAIT='yes'") != std::string::npos);
  int count = 0;
  REQUIRE(cuDeviceGetCount(&count) == CUDA_SUCCESS);
  CHECK(count == 8);
  size_t total = 0;
  REQUIRE(cuDeviceTotalMem(&total, 0) == CUDA_SUCCESS);
  CHECK(total == 81559 * kMegabyte);
  CHECK(canAccessPeer(0, 1) == 1);
  int version = 0;
  REQUIRE(cuDriverGetVersion(&version) == CUDA_SUCCESS);
  CHECK(version == 13000);
}

TEST_CASE("with NCCLEMU_DEVICES=0 there is no device", "[config_no_device]") {
  CHECK(cuInit(0) == CUDA_ERROR_NO_DEVICE);
  int count = -1;
  CHECK(cuDeviceGetCount(&count) == CUDA_ERROR_NOT_INITIALIZED);
}

TEST_CASE("before cuInit only the version and error queries work", "[uninitialized]") {
  int count = -1;
  CHECK(cuDeviceGetCount(&count) == CUDA_ERROR_NOT_INITIALIZED);
  CUcontext context = nullptr;
  CHECK(cuDevicePrimaryCtxRetain(&context, 0) == CUDA_ERROR_NOT_INITIALIZED);
  CHECK(cuLaunchHostFunc(nullptr, emutest::countRun, nullptr) == CUDA_ERROR_NOT_INITIALIZED);
  CHECK(cuEventQuery(nullptr) == CUDA_ERROR_NOT_INITIALIZED);
  int version = 0;
  CHECK(cuDriverGetVersion(&version) == CUDA_SUCCESS);
  const char* name = nullptr;
  CHECK(cuGetErrorName(CUDA_ERROR_NOT_INITIALIZED, &name) == CUDA_SUCCESS);
  void* function = nullptr;
  CHECK(cuGetProcAddress("cuInit", &function, 13000, 0, nullptr) == CUDA_SUCCESS);
  CHECK(function == reinterpret_cast<void*>(&cuInit));

  CHECK(cuInit(1) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CHECK(cuDeviceGetCount(&count) == CUDA_SUCCESS);
  CHECK(cuCtxGetDevice(nullptr) == CUDA_ERROR_INVALID_VALUE);
  CUdevice device;
  CHECK(cuCtxGetDevice(&device) == CUDA_ERROR_INVALID_CONTEXT);
}
