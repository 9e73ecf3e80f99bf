// The CUDA driver functions ncclguard calls, found once in the application's libcuda.so.1 (or the
// system's, as NCCL would load it): ncclguard never links libcuda.
#pragma once

#include <cuda.h>

namespace ncclguard {

// Under the names cuda.h maps them to (cuEventDestroy is cuEventDestroy_v2, ...): the
// stringification happens after macro expansion.
// clang-format off: one function a line (clang-format 14 does not settle on one layout here)
// Timing operations needs all of these.
#define NCCLGUARD_CUDA_EVENT_FUNCTIONS(X) \
  X(cuCtxGetCurrent)                      \
  X(cuCtxPushCurrent)                     \
  X(cuCtxPopCurrent)                      \
  X(cuStreamIsCapturing)                  \
  X(cuEventCreate)                        \
  X(cuEventRecord)                        \
  X(cuEventQuery)                         \
  X(cuEventElapsedTime)                   \
  X(cuEventDestroy)                       \
  X(cuThreadExchangeStreamCaptureMode)
// Probation and in-process recovery (NCCLGUARD_RECOVER=inprocess) need these too; an older driver
// may lack some, and then nothing is put on probation.
#define NCCLGUARD_CUDA_PROBATION_FUNCTIONS(X) \
  X(cuMemHostAlloc)                           \
  X(cuMemHostGetDevicePointer)                \
  X(cuStreamWaitValue32)                      \
  X(cuStreamWriteValue32)                     \
  X(cuLaunchHostFunc)                         \
  X(cuStreamCreate)                           \
  X(cuStreamWaitEvent)                        \
  X(cuMemAlloc)                               \
  X(cuMemcpyDtoDAsync)
// clang-format on

// Each member is named after its function: `driver.cuEventRecord(...)` reads as the call it is.
// NOLINTBEGIN(readability-identifier-naming,bugprone-macro-parentheses)
struct CudaDriver {
#define NCCLGUARD_CUDA_POINTER(name) decltype(&::name) name = nullptr;
  NCCLGUARD_CUDA_EVENT_FUNCTIONS(NCCLGUARD_CUDA_POINTER)
  NCCLGUARD_CUDA_PROBATION_FUNCTIONS(NCCLGUARD_CUDA_POINTER)
#undef NCCLGUARD_CUDA_POINTER
  bool probation = false;  // every probation function was found
};
// NOLINTEND(readability-identifier-naming,bugprone-macro-parentheses)

// The driver's functions, looked up at the first call; nullptr when no driver is found or it lacks
// one of the event functions. Thread-safe; the answer never changes afterwards.
const CudaDriver* LoadCudaDriver() noexcept;
// From now on LoadCudaDriver answers `driver` (nullptr: the real one again). For tests.
void ReplaceCudaDriverForTesting(const CudaDriver* driver) noexcept;

// Makes `context` current on this thread for the scope's lifetime (nothing when it is null).
class CudaContextScope {
 public:
  CudaContextScope(const CudaDriver& driver, CUcontext context);
  ~CudaContextScope();
  CudaContextScope(const CudaContextScope&) = delete;
  CudaContextScope& operator=(const CudaContextScope&) = delete;

 private:
  const CudaDriver& driver_;
  bool pushed_;
};

}  // namespace ncclguard
