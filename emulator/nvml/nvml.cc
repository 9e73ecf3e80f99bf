// The emulated libnvidia-ml.so.1: the system and device queries that tools use to learn the
// driver version and the GPUs, answered from the same NCCLEMU_* variables as the emulated libcuda.
#pragma GCC visibility push(default)
#include "nvml_subset.h"
#pragma GCC visibility pop

#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <strings.h>
#include <vector>

#include "../cuda/device_config.h"

struct nvmlDevice_st {
  int index;
};

namespace {

struct Machine {
  std::string driver_version;
  int cuda_driver_version;
  std::string gpu_name;
  unsigned long long gpu_memory_bytes;
  std::vector<nvmlDevice_st> devices;
};

std::mutex g_mutex;
Machine* g_machine = nullptr;  // read at the first nvmlInit, then kept for the process's life
unsigned g_init_count = 0;

// The machine, if NVML is initialised.
const Machine* machine() {
  std::lock_guard lock(g_mutex);
  return g_init_count > 0 ? g_machine : nullptr;
}

nvmlReturn_t copyString(const std::string& text, char* out, unsigned length) {
  if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (text.size() + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::memcpy(out, text.c_str(), text.size() + 1);
  return NVML_SUCCESS;
}

int deviceIndex(const Machine& m, nvmlDevice_t device) {
  for (const nvmlDevice_st& candidate : m.devices) {
    if (&candidate == device) return candidate.index;
  }
  return -1;
}

}  // namespace

nvmlReturn_t nvmlInit_v2(void) {
  std::lock_guard lock(g_mutex);
  if (g_machine == nullptr) {
    int count = ncclemu::readDeviceCount();
    g_machine = new Machine{ncclemu::readDriverVersionString(), ncclemu::readCudaDriverVersion(), ncclemu::readGpuName(),
                            ncclemu::readGpuMemoryBytes(), {}};
    for (int index = 0; index < count; ++index) g_machine->devices.push_back(nvmlDevice_st{index});
  }
  ++g_init_count;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }

nvmlReturn_t nvmlShutdown(void) {
  std::lock_guard lock(g_mutex);
  if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED;
  --g_init_count;
  return NVML_SUCCESS;
}

const char* nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "ECC is not supported on vGPU";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
  }
  return "Unknown Error";
}

nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  const Machine* m = machine();
  if (m == nullptr) return NVML_ERROR_UNINITIALIZED;
  return copyString(m->driver_version, version, length);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char* version, unsigned int length) {
  const Machine* m = machine();
  if (m == nullptr) return NVML_ERROR_UNINITIALIZED;
  // NVML's own version is the CUDA major version followed by the driver version.
  return copyString(std::to_string(m->cuda_driver_version / 1000) + "." + m->driver_version, version, length);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int* cudaDriverVersion) {
  const Machine* m = machine();
  if (m == nullptr) return NVML_ERROR_UNINITIALIZED;
  if (cudaDriverVersion == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *cudaDriverVersion = m->cuda_driver_version;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* cudaDriverVersion) { return nvmlSystemGetCudaDriverVersion(cudaDriverVersion); }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* deviceCount) {
  const Machine* m = machine();
  if (m == nullptr) return NVML_ERROR_UNINITIALIZED;
  if (deviceCount == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *deviceCount = static_cast<unsigned>(m->devices.size());
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  const Machine* m = machine();
  if (m == nullptr) return NVML_ERROR_UNINITIALIZED;
  if (device == nullptr || index >= m->devices.size()) return NVML_ERROR_INVALID_ARGUMENT;
  *device = const_cast<nvmlDevice_t>(&m->devices[index]);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* pciBusId, nvmlDevice_t* device) {
  const Machine* m = machine();
  if (m == nullptr) return NVML_ERROR_UNINITIALIZED;
  if (pciBusId == nullptr || device == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  for (const nvmlDevice_st& candidate : m->devices) {
    // Both the CUDA form (4-digit domain) and NVML's own (8-digit domain) are accepted.
    std::string cuda_form = ncclemu::pciBusId(candidate.index);
    std::string nvml_form = "0000" + cuda_form;
    if (strcasecmp(pciBusId, cuda_form.c_str()) == 0 || strcasecmp(pciBusId, nvml_form.c_str()) == 0) {
      *device = const_cast<nvmlDevice_t>(&candidate);
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int* index) {
  const Machine* m = machine();
  if (m == nullptr) return NVML_ERROR_UNINITIALIZED;
  int found = deviceIndex(*m, device);
  if (found < 0 || index == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *index = static_cast<unsigned>(found);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) {
  const Machine* m = machine();
  if (m == nullptr) return NVML_ERROR_UNINITIALIZED;
  if (deviceIndex(*m, device) < 0) return NVML_ERROR_INVALID_ARGUMENT;
  return copyString(m->gpu_name, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) {
  const Machine* m = machine();
  if (m == nullptr) return NVML_ERROR_UNINITIALIZED;
  int index = deviceIndex(*m, device);
  if (index < 0) return NVML_ERROR_INVALID_ARGUMENT;
  // The same 16 bytes cuDeviceGetUuid reports, in NVML's "GPU-8-4-4-4-12" form.
  unsigned char bytes[16];
  ncclemu::deviceUuid(index, bytes);
  std::string text = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
    char hex[3];
    std::snprintf(hex, sizeof hex, "%02x", bytes[i]);
    text += hex;
  }
  return copyString(text, uuid, length);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  const Machine* m = machine();
  if (m == nullptr) return NVML_ERROR_UNINITIALIZED;
  int index = deviceIndex(*m, device);
  if (index < 0 || pci == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const ncclemu::PciLocation location = ncclemu::pciLocation(index);
  const std::string cuda_form = ncclemu::pciBusId(index);
  std::memset(pci, 0, sizeof *pci);
  std::snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", cuda_form.c_str());
  std::snprintf(pci->busId, sizeof pci->busId, "0000%s", cuda_form.c_str());
  pci->domain = location.domain;
  pci->bus = location.bus;
  pci->device = location.device;
  constexpr unsigned kNvidiaVendorId = 0x10de;
  pci->pciDeviceId = (static_cast<unsigned>(ncclemu::gpuModelForName(m->gpu_name).pci_device_id) << 16) | kNvidiaVendorId;
  return NVML_SUCCESS;
}

// The emulator has no view of other processes' allocations: the whole memory reads as free.
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  const Machine* m = machine();
  if (m == nullptr) return NVML_ERROR_UNINITIALIZED;
  if (deviceIndex(*m, device) < 0 || memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  memory->total = m->gpu_memory_bytes;
  memory->free = m->gpu_memory_bytes;
  memory->used = 0;
  return NVML_SUCCESS;
}
