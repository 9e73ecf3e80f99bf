// Devices, their properties, peer access and versions.
#pragma GCC visibility push(default)
#include <cuda_runtime_api.h>
#pragma GCC visibility pop

#include <cstring>
#include <mutex>
#include <set>
#include <utility>

#include "runtime_state.h"

using cudartemu::onDevice;
using cudartemu::remember;

namespace {

int attribute(CUdevice device, CUdevice_attribute which) {
  int value = 0;
  cuDeviceGetAttribute(&value, which, device);
  return value;
}

void fillProperties(cudaDeviceProp& prop, CUdevice device) {
  std::memset(&prop, 0, sizeof(prop));
  cuDeviceGetName(prop.name, sizeof(prop.name), device);
  cuDeviceGetUuid(reinterpret_cast<CUuuid*>(&prop.uuid), device);
  cuDeviceTotalMem(&prop.totalGlobalMem, device);
  prop.major = attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  prop.minor = attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  prop.multiProcessorCount = attribute(device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  prop.pciBusID = attribute(device, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
  prop.pciDeviceID = attribute(device, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID);
  prop.pciDomainID = attribute(device, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID);
  prop.warpSize = attribute(device, CU_DEVICE_ATTRIBUTE_WARP_SIZE);
  prop.maxThreadsPerBlock = attribute(device, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  prop.maxThreadsDim[0] = attribute(device, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X);
  prop.maxThreadsDim[1] = attribute(device, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y);
  prop.maxThreadsDim[2] = attribute(device, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z);
  prop.maxGridSize[0] = attribute(device, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X);
  prop.maxGridSize[1] = attribute(device, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y);
  prop.maxGridSize[2] = attribute(device, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z);
  prop.unifiedAddressing = attribute(device, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING);
  prop.managedMemory = attribute(device, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY);
  prop.canMapHostMemory = 1;  // host memory is what the emulated device reads
}

bool validDevice(int device) { return device >= 0 && device < cudartemu::deviceCount(); }

// Peer access the application enabled, per (device, peer): CUDA tracks it per context.
struct PeerAccess {
  std::mutex mutex;
  std::set<std::pair<int, int>> enabled;
};

PeerAccess& peerAccess() {
  static PeerAccess* instance = new PeerAccess();
  return *instance;
}

}  // namespace

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return remember(cudaErrorInvalidValue);
  *count = 0;
  if (cudaError_t error = cudartemu::startDriver(); error != cudaSuccess) return remember(error);
  *count = cudartemu::deviceCount();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) { return remember(cudartemu::selectDevice(device)); }

cudaError_t cudaInitDevice(int device, unsigned int /*deviceFlags*/, unsigned int /*flags*/) {
  if (cudaError_t error = cudartemu::startDriver(); error != cudaSuccess) return remember(error);
  return remember(validDevice(device) ? cudaSuccess : cudaErrorInvalidDevice);
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return remember(cudaErrorInvalidValue);
  if (cudaError_t error = cudartemu::startDriver(); error != cudaSuccess) return remember(error);
  *device = cudartemu::currentDevice();
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return remember(cudaErrorInvalidValue);
  if (cudaError_t error = cudartemu::startDriver(); error != cudaSuccess) return remember(error);
  if (!validDevice(device)) return remember(cudaErrorInvalidDevice);
  fillProperties(*prop, device);
  return cudaSuccess;
}

// The runtime's attribute numbers are the driver's.
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (cudaError_t error = cudartemu::startDriver(); error != cudaSuccess) return remember(error);
  return remember(cuDeviceGetAttribute(value, static_cast<CUdevice_attribute>(attr), device));
}

cudaError_t cudaDeviceGetPCIBusId(char* pciBusId, int len, int device) {
  if (cudaError_t error = cudartemu::startDriver(); error != cudaSuccess) return remember(error);
  return remember(cuDeviceGetPCIBusId(pciBusId, len, device));
}

cudaError_t cudaDeviceGetByPCIBusId(int* device, const char* pciBusId) {
  if (cudaError_t error = cudartemu::startDriver(); error != cudaSuccess) return remember(error);
  return remember(cuDeviceGetByPCIBusId(device, pciBusId));
}

cudaError_t cudaDeviceSynchronize() {
  return onDevice([] { return cuCtxSynchronize(); });
}

cudaError_t cudaDeviceReset() {
  if (cudaError_t error = cudartemu::startDriver(); error != cudaSuccess) return remember(error);
  return remember(cudartemu::resetDevice(cudartemu::currentDevice()));
}

cudaError_t cudaSetDeviceFlags(unsigned int flags) {
  if (cudaError_t error = cudartemu::startDriver(); error != cudaSuccess) return remember(error);
  return remember(cuDevicePrimaryCtxSetFlags(cudartemu::currentDevice(), flags & ~cudaDeviceMapHost));
}

cudaError_t cudaGetDeviceFlags(unsigned int* flags) {
  if (flags == nullptr) return remember(cudaErrorInvalidValue);
  if (cudaError_t error = cudartemu::startDriver(); error != cudaSuccess) return remember(error);
  int active = 0;
  const CUresult result = cuDevicePrimaryCtxGetState(cudartemu::currentDevice(), flags, &active);
  if (result != CUDA_SUCCESS) return remember(result);
  *flags |= cudaDeviceMapHost;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  return onDevice([&] { return cuCtxGetStreamPriorityRange(leastPriority, greatestPriority); });
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  return onDevice([&] { return cuMemGetInfo(free, total); });
}

cudaError_t cudaDeviceCanAccessPeer(int* canAccessPeer, int device, int peerDevice) {
  if (cudaError_t error = cudartemu::startDriver(); error != cudaSuccess) return remember(error);
  return remember(cuDeviceCanAccessPeer(canAccessPeer, device, peerDevice));
}

cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags) {
  if (cudaError_t error = cudartemu::useCurrentDevice(); error != cudaSuccess) return remember(error);
  const int device = cudartemu::currentDevice();
  if (flags != 0) return remember(cudaErrorInvalidValue);
  if (!validDevice(peerDevice)) return remember(cudaErrorInvalidDevice);
  int allowed = 0;
  cuDeviceCanAccessPeer(&allowed, device, peerDevice);
  if (!allowed) return remember(cudaErrorPeerAccessUnsupported);
  PeerAccess& access = peerAccess();
  std::lock_guard lock(access.mutex);
  return remember(access.enabled.emplace(device, peerDevice).second ? cudaSuccess : cudaErrorPeerAccessAlreadyEnabled);
}

cudaError_t cudaDeviceDisablePeerAccess(int peerDevice) {
  if (cudaError_t error = cudartemu::useCurrentDevice(); error != cudaSuccess) return remember(error);
  if (!validDevice(peerDevice)) return remember(cudaErrorInvalidDevice);
  PeerAccess& access = peerAccess();
  std::lock_guard lock(access.mutex);
  const bool was_enabled = access.enabled.erase({cudartemu::currentDevice(), peerDevice}) != 0;
  return remember(was_enabled ? cudaSuccess : cudaErrorPeerAccessNotEnabled);
}

cudaError_t cudaDriverGetVersion(int* driverVersion) {
  if (driverVersion == nullptr) return remember(cudaErrorInvalidValue);
  return remember(cuDriverGetVersion(driverVersion));
}

cudaError_t cudaRuntimeGetVersion(int* runtimeVersion) {
  if (runtimeVersion == nullptr) return remember(cudaErrorInvalidValue);
  *runtimeVersion = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr, unsigned int cudaVersion,
                                             unsigned long long flags,
                                             cudaDriverEntryPointQueryResult* driverStatus) {
  if (cudaError_t error = cudartemu::startDriver(); error != cudaSuccess) return remember(error);
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  const CUresult result = cuGetProcAddress(symbol, funcPtr, static_cast<int>(cudaVersion), flags, &status);
  if (driverStatus != nullptr) *driverStatus = static_cast<cudaDriverEntryPointQueryResult>(status);
  // As the runtime does, a symbol that is not found is reported through driverStatus.
  return result == CUDA_ERROR_NOT_FOUND ? cudaSuccess : remember(result);
}
