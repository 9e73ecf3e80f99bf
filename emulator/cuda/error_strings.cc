// cuGetErrorName / cuGetErrorString for every CUresult of cuda.h 13.0.
#pragma GCC visibility push(default)
#include <cuda.h>
#pragma GCC visibility pop

#include <cstddef>

namespace {

struct ErrorText {
  CUresult code;
  const char* name;
  const char* description;
};

// The name is spelled through the preprocessor so that it always matches the enumerator.
#define NCCLEMU_ERROR(code, description) {code, #code, description}
constexpr ErrorText kErrors[] = {
    NCCLEMU_ERROR(CUDA_SUCCESS, "no error"),
    NCCLEMU_ERROR(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    NCCLEMU_ERROR(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    NCCLEMU_ERROR(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    NCCLEMU_ERROR(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    NCCLEMU_ERROR(CUDA_ERROR_PROFILER_DISABLED, "profiler disabled while using external profiling tool"),
    NCCLEMU_ERROR(CUDA_ERROR_PROFILER_NOT_INITIALIZED, "profiler not initialized: call cudaProfilerInitialize()"),
    NCCLEMU_ERROR(CUDA_ERROR_PROFILER_ALREADY_STARTED, "profiler already started"),
    NCCLEMU_ERROR(CUDA_ERROR_PROFILER_ALREADY_STOPPED, "profiler already stopped"),
    NCCLEMU_ERROR(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library"),
    NCCLEMU_ERROR(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, "API call requires a newer CUDA driver"),
    NCCLEMU_ERROR(CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA-capable device(s) is/are busy or unavailable"),
    NCCLEMU_ERROR(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    NCCLEMU_ERROR(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    NCCLEMU_ERROR(CUDA_ERROR_DEVICE_NOT_LICENSED, "device doesn't have valid Grid license"),
    NCCLEMU_ERROR(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"),
    NCCLEMU_ERROR(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    NCCLEMU_ERROR(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current"),
    NCCLEMU_ERROR(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed"),
    NCCLEMU_ERROR(CUDA_ERROR_UNMAP_FAILED, "unmapping of buffer object failed"),
    NCCLEMU_ERROR(CUDA_ERROR_ARRAY_IS_MAPPED, "array is mapped"),
    NCCLEMU_ERROR(CUDA_ERROR_ALREADY_MAPPED, "resource already mapped"),
    NCCLEMU_ERROR(CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for execution on the device"),
    NCCLEMU_ERROR(CUDA_ERROR_ALREADY_ACQUIRED, "resource already acquired"),
    NCCLEMU_ERROR(CUDA_ERROR_NOT_MAPPED, "resource not mapped"),
    NCCLEMU_ERROR(CUDA_ERROR_NOT_MAPPED_AS_ARRAY, "resource not mapped as array"),
    NCCLEMU_ERROR(CUDA_ERROR_NOT_MAPPED_AS_POINTER, "resource not mapped as pointer"),
    NCCLEMU_ERROR(CUDA_ERROR_ECC_UNCORRECTABLE, "uncorrectable ECC error encountered"),
    NCCLEMU_ERROR(CUDA_ERROR_UNSUPPORTED_LIMIT, "limit is not supported on this architecture"),
    NCCLEMU_ERROR(CUDA_ERROR_CONTEXT_ALREADY_IN_USE, "exclusive-thread device already in use by a different thread"),
    NCCLEMU_ERROR(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "peer access is not supported between these two devices"),
    NCCLEMU_ERROR(CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed"),
    NCCLEMU_ERROR(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, "invalid OpenGL or DirectX context"),
    NCCLEMU_ERROR(CUDA_ERROR_NVLINK_UNCORRECTABLE, "uncorrectable NVLink error detected during the execution"),
    NCCLEMU_ERROR(CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "PTX JIT compiler library not found"),
    NCCLEMU_ERROR(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "the provided PTX was compiled with an unsupported toolchain."),
    NCCLEMU_ERROR(CUDA_ERROR_JIT_COMPILATION_DISABLED, "PTX JIT compilation was disabled"),
    NCCLEMU_ERROR(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, "the provided execution affinity is not supported"),
    NCCLEMU_ERROR(CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC, "the provided PTX contains unsupported call to cudaDeviceSynchronize"),
    NCCLEMU_ERROR(CUDA_ERROR_CONTAINED, "an exception occurred on the device that is now contained by the GPU's error containment capability"),
    NCCLEMU_ERROR(CUDA_ERROR_INVALID_SOURCE, "device kernel image is invalid"),
    NCCLEMU_ERROR(CUDA_ERROR_FILE_NOT_FOUND, "file not found"),
    NCCLEMU_ERROR(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, "shared object symbol not found"),
    NCCLEMU_ERROR(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, "shared object initialization failed"),
    NCCLEMU_ERROR(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS"),
    NCCLEMU_ERROR(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    NCCLEMU_ERROR(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state"),
    NCCLEMU_ERROR(CUDA_ERROR_LOSSY_QUERY, "attempted introspection would be semantically lossy"),
    NCCLEMU_ERROR(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    NCCLEMU_ERROR(CUDA_ERROR_NOT_READY, "device not ready"),
    NCCLEMU_ERROR(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
    NCCLEMU_ERROR(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch"),
    NCCLEMU_ERROR(CUDA_ERROR_LAUNCH_TIMEOUT, "the launch timed out and was terminated"),
    NCCLEMU_ERROR(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING, "launch uses incompatible texturing mode"),
    NCCLEMU_ERROR(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access is already enabled"),
    NCCLEMU_ERROR(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access has not been enabled"),
    NCCLEMU_ERROR(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "cannot set while device is active in this process"),
    NCCLEMU_ERROR(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"),
    NCCLEMU_ERROR(CUDA_ERROR_ASSERT, "device-side assert triggered"),
    NCCLEMU_ERROR(CUDA_ERROR_TOO_MANY_PEERS, "peer mapping resources exhausted"),
    NCCLEMU_ERROR(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "part or all of the requested memory range is already mapped"),
    NCCLEMU_ERROR(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "pointer does not correspond to a registered memory region"),
    NCCLEMU_ERROR(CUDA_ERROR_HARDWARE_STACK_ERROR, "hardware stack error"),
    NCCLEMU_ERROR(CUDA_ERROR_ILLEGAL_INSTRUCTION, "an illegal instruction was encountered"),
    NCCLEMU_ERROR(CUDA_ERROR_MISALIGNED_ADDRESS, "misaligned address"),
    NCCLEMU_ERROR(CUDA_ERROR_INVALID_ADDRESS_SPACE, "operation not supported on global/shared address space"),
    NCCLEMU_ERROR(CUDA_ERROR_INVALID_PC, "invalid program counter"),
    NCCLEMU_ERROR(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
    NCCLEMU_ERROR(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "too many blocks in cooperative launch"),
    NCCLEMU_ERROR(CUDA_ERROR_TENSOR_MEMORY_LEAK, "tensor memory not completely freed"),
    NCCLEMU_ERROR(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
    NCCLEMU_ERROR(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    NCCLEMU_ERROR(CUDA_ERROR_SYSTEM_NOT_READY, "system not yet initialized"),
    NCCLEMU_ERROR(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "system has unsupported display driver / cuda driver combination"),
    NCCLEMU_ERROR(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, "forward compatibility was attempted on non supported HW"),
    NCCLEMU_ERROR(CUDA_ERROR_MPS_CONNECTION_FAILED, "MPS client failed to connect to the MPS control daemon or the MPS server"),
    NCCLEMU_ERROR(CUDA_ERROR_MPS_RPC_FAILURE, "the remote procedural call between the MPS server and the MPS client failed"),
    NCCLEMU_ERROR(CUDA_ERROR_MPS_SERVER_NOT_READY, "MPS server is not ready to accept new MPS client requests"),
    NCCLEMU_ERROR(CUDA_ERROR_MPS_MAX_CLIENTS_REACHED, "the hardware resources required to create MPS client have been exhausted"),
    NCCLEMU_ERROR(CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED, "the hardware resources required to support device connections have been exhausted"),
    NCCLEMU_ERROR(CUDA_ERROR_MPS_CLIENT_TERMINATED, "the MPS client has been terminated by the server"),
    NCCLEMU_ERROR(CUDA_ERROR_CDP_NOT_SUPPORTED, "is using CUDA Dynamic Parallelism, but the current configuration does not support it"),
    NCCLEMU_ERROR(CUDA_ERROR_CDP_VERSION_MISMATCH, "unsupported interaction between different versions of CUDA Dynamic Parallelism"),
    NCCLEMU_ERROR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing"),
    NCCLEMU_ERROR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "operation failed due to a previous error during capture"),
    NCCLEMU_ERROR(CUDA_ERROR_STREAM_CAPTURE_MERGE, "operation would result in a merge of separate capture sequences"),
    NCCLEMU_ERROR(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "capture was not ended in the same stream as it began"),
    NCCLEMU_ERROR(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "capturing stream has unjoined work"),
    NCCLEMU_ERROR(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "dependency created on uncaptured work in another stream"),
    NCCLEMU_ERROR(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "operation would make the legacy stream depend on a capturing blocking stream"),
    NCCLEMU_ERROR(CUDA_ERROR_CAPTURED_EVENT, "operation not permitted on an event last recorded in a capturing stream"),
    NCCLEMU_ERROR(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "attempt to terminate a thread-local capture sequence from another thread"),
    NCCLEMU_ERROR(CUDA_ERROR_TIMEOUT, "wait operation timed out"),
    NCCLEMU_ERROR(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update"),
    NCCLEMU_ERROR(CUDA_ERROR_EXTERNAL_DEVICE, "an async error has occurred in external entity outside of CUDA"),
    NCCLEMU_ERROR(CUDA_ERROR_INVALID_CLUSTER_SIZE, "a kernel launch error has occurred due to cluster misconfiguration"),
    NCCLEMU_ERROR(CUDA_ERROR_FUNCTION_NOT_LOADED, "the function handle is not loaded when calling an API that requires a loaded function"),
    NCCLEMU_ERROR(CUDA_ERROR_INVALID_RESOURCE_TYPE, "one or more resources passed in are not valid resource types for the operation"),
    NCCLEMU_ERROR(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, "one or more resources are insufficient or non-applicable for the operation"),
    NCCLEMU_ERROR(CUDA_ERROR_KEY_ROTATION, "an error happened during the key rotation sequence"),
    NCCLEMU_ERROR(CUDA_ERROR_UNKNOWN, "unknown error"),
};
#undef NCCLEMU_ERROR

const ErrorText* findError(CUresult code) {
  for (const ErrorText& error : kErrors) {
    if (error.code == code) return &error;
  }
  return nullptr;
}

}  // namespace

// Both work before cuInit, as on CUDA, so a failed cuInit can be reported.
CUresult cuGetErrorName(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* found = findError(error);
  *pStr = found != nullptr ? found->name : nullptr;
  return found != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* found = findError(error);
  *pStr = found != nullptr ? found->description : nullptr;
  return found != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
