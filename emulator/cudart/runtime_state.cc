#include "runtime_state.h"

#include <mutex>
#include <vector>

namespace cudartemu {
namespace {

struct Devices {
  std::mutex mutex;
  cudaError_t start_result = cudaSuccess;
  std::vector<CUcontext> primary;  // null until the device's first use
};

Devices& devices() {
  // Never destroyed: programs (and preloaded libraries) call the runtime from atexit handlers.
  static Devices* instance = new Devices();
  return *instance;
}

thread_local int t_device = 0;
thread_local cudaError_t t_last_error = cudaSuccess;

}  // namespace

cudaError_t toRuntimeError(CUresult result) { return static_cast<cudaError_t>(result); }

cudaError_t remember(cudaError_t error) {
  if (error != cudaSuccess) t_last_error = error;
  return error;
}

cudaError_t takeLastError() {
  const cudaError_t error = t_last_error;
  t_last_error = cudaSuccess;
  return error;
}

cudaError_t peekLastError() { return t_last_error; }

cudaError_t startDriver() {
  static std::once_flag started;
  std::call_once(started, [] {
    Devices& all = devices();
    int count = 0;
    CUresult result = cuInit(0);
    if (result == CUDA_SUCCESS) result = cuDeviceGetCount(&count);
    all.start_result = result == CUDA_ERROR_NO_DEVICE ? cudaErrorNoDevice : toRuntimeError(result);
    all.primary.assign(count, nullptr);
  });
  return devices().start_result;
}

namespace {

// The primary context of `device`, retained at its first use.
cudaError_t primaryContext(int device, CUcontext& context) {
  Devices& all = devices();
  if (device < 0 || device >= static_cast<int>(all.primary.size())) return cudaErrorInvalidDevice;
  std::lock_guard lock(all.mutex);
  CUcontext& primary = all.primary[device];
  if (primary == nullptr) {
    if (CUresult result = cuDevicePrimaryCtxRetain(&primary, device); result != CUDA_SUCCESS) {
      primary = nullptr;
      return toRuntimeError(result);
    }
  }
  context = primary;
  return cudaSuccess;
}

cudaError_t makePrimaryCurrent(int device) {
  CUcontext context = nullptr;
  if (cudaError_t error = primaryContext(device, context); error != cudaSuccess) return error;
  CUcontext current = nullptr;
  if (cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == context) return cudaSuccess;
  return toRuntimeError(cuCtxSetCurrent(context));
}

}  // namespace

int deviceCount() { return startDriver() == cudaSuccess ? static_cast<int>(devices().primary.size()) : 0; }

// As in CUDA, a context the thread made current through the driver is the runtime's current
// device too; without one, the thread's device (0 until cudaSetDevice) is used.
int currentDevice() {
  CUcontext current = nullptr;
  CUdevice device = 0;
  if (cuCtxGetCurrent(&current) == CUDA_SUCCESS && current != nullptr && cuCtxGetDevice(&device) == CUDA_SUCCESS) {
    return device;
  }
  return t_device;
}

cudaError_t selectDevice(int device) {
  if (cudaError_t error = startDriver(); error != cudaSuccess) return error;
  if (device < 0 || device >= deviceCount()) return cudaErrorInvalidDevice;
  t_device = device;
  return makePrimaryCurrent(device);
}

cudaError_t useCurrentDevice() {
  if (cudaError_t error = startDriver(); error != cudaSuccess) return error;
  CUcontext current = nullptr;
  if (cuCtxGetCurrent(&current) == CUDA_SUCCESS && current != nullptr) return cudaSuccess;
  return makePrimaryCurrent(t_device);
}

cudaError_t resetDevice(int device) {
  Devices& all = devices();
  std::lock_guard lock(all.mutex);
  if (device < 0 || device >= static_cast<int>(all.primary.size())) return cudaErrorInvalidDevice;
  // The retained primary context stays retained: reset only drops what it owns.
  if (all.primary[device] == nullptr) return cudaSuccess;
  return toRuntimeError(cuDevicePrimaryCtxReset(device));
}

}  // namespace cudartemu
