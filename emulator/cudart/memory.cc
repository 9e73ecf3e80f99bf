// Memory: device and host allocations, copies and fills, pointer attributes. Device memory is
// memory of the process (the emulated driver's), so every copy is a memory copy in one address
// space and the copy kinds only need to be valid.
#pragma GCC visibility push(default)
#include <cuda_runtime_api.h>
#pragma GCC visibility pop

#include "runtime_state.h"

using cudartemu::onDevice;
using cudartemu::remember;

namespace {

bool validKind(cudaMemcpyKind kind) { return kind >= cudaMemcpyHostToHost && kind <= cudaMemcpyDefault; }

CUdeviceptr address(const void* pointer) { return reinterpret_cast<CUdeviceptr>(pointer); }

}  // namespace

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  if (devPtr == nullptr) return remember(cudaErrorInvalidValue);
  if (size == 0) {
    *devPtr = nullptr;
    return onDevice([] { return CUDA_SUCCESS; });
  }
  return onDevice([&] { return cuMemAlloc(reinterpret_cast<CUdeviceptr*>(devPtr), size); });
}

// cudaFree(nullptr) is the classic way to create the context: it must succeed.
cudaError_t cudaFree(void* devPtr) {
  return onDevice([&] { return devPtr == nullptr ? CUDA_SUCCESS : cuMemFree(address(devPtr)); });
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  return onDevice([&] { return cuMemAllocHost(ptr, size); });
}

// cudaHostAlloc's flags carry the driver's CU_MEMHOSTALLOC_* values.
cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
  return onDevice([&] { return cuMemHostAlloc(pHost, size, flags); });
}

cudaError_t cudaFreeHost(void* ptr) {
  return onDevice([&] { return ptr == nullptr ? CUDA_SUCCESS : cuMemFreeHost(ptr); });
}

// Registration is the driver's (cudaHostRegister's flags carry the CU_MEMHOSTREGISTER_* values),
// so the driver's stream memory operations accept registered memory.
cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  return onDevice([&] { return cuMemHostRegister(ptr, size, flags); });
}

cudaError_t cudaHostUnregister(void* ptr) {
  return onDevice([&] { return cuMemHostUnregister(ptr); });
}

// With unified addressing the device pointer of page-locked or registered memory is its address.
cudaError_t cudaHostGetDevicePointer(void** pDevice, void* pHost, unsigned int flags) {
  if (pDevice == nullptr) return remember(cudaErrorInvalidValue);
  return onDevice([&] { return cuMemHostGetDevicePointer(reinterpret_cast<CUdeviceptr*>(pDevice), pHost, flags); });
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (!validKind(kind)) return remember(cudaErrorInvalidMemcpyDirection);
  return onDevice([&] { return cuMemcpy(address(dst), address(src), count); });
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  if (!validKind(kind)) return remember(cudaErrorInvalidMemcpyDirection);
  return onDevice([&] { return cuMemcpyAsync(address(dst), address(src), count, stream); });
}

cudaError_t cudaMemcpyPeer(void* dst, int /*dstDevice*/, const void* src, int /*srcDevice*/, size_t count) {
  return onDevice([&] { return cuMemcpy(address(dst), address(src), count); });
}

cudaError_t cudaMemcpyPeerAsync(void* dst, int /*dstDevice*/, const void* src, int /*srcDevice*/, size_t count,
                                cudaStream_t stream) {
  return onDevice([&] { return cuMemcpyAsync(address(dst), address(src), count, stream); });
}

cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  return onDevice([&] { return cuMemsetD8(address(devPtr), static_cast<unsigned char>(value), count); });
}

cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  return onDevice(
      [&] { return cuMemsetD8Async(address(devPtr), static_cast<unsigned char>(value), count, stream); });
}

// Memory the driver does not know is "unregistered", not an error, as in CUDA 11 and later.
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  if (attributes == nullptr) return remember(cudaErrorInvalidValue);
  return onDevice([&] {
    *attributes = cudaPointerAttributes{};
    attributes->device = -2;
    unsigned memory_type = 0;
    if (cuPointerGetAttribute(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, address(ptr)) != CUDA_SUCCESS) {
      attributes->type = cudaMemoryTypeUnregistered;
      return CUDA_SUCCESS;
    }
    int ordinal = 0;
    cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address(ptr));
    attributes->device = ordinal;
    attributes->type = memory_type == CU_MEMORYTYPE_HOST ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
    attributes->devicePointer = const_cast<void*>(ptr);
    if (memory_type == CU_MEMORYTYPE_HOST) attributes->hostPointer = const_cast<void*>(ptr);
    return CUDA_SUCCESS;
  });
}
