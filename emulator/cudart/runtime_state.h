// The CPU runtime's own state, over the emulated driver as the real runtime sits over libcuda:
// each device's primary context, retained at its first use; each thread's current device: the
// device of the context current on the thread if it has one (set through the driver, or by
// cudaSetDevice), else the thread's device (0 until cudaSetDevice), whose primary context the
// runtime then makes current; each thread's last error.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

namespace cudartemu {

// The driver's result as the runtime reports it: the runtime's codes carry the driver's numbers
// for everything the emulated driver returns (invalid value 1, not ready 600, capture 900s, ...).
cudaError_t toRuntimeError(CUresult result);

// Remembers a failure as the thread's last error (cudaGetLastError) and returns it.
cudaError_t remember(cudaError_t error);
inline cudaError_t remember(CUresult result) { return remember(toRuntimeError(result)); }
cudaError_t takeLastError();
cudaError_t peekLastError();

// Starts the driver once per process; cudaErrorNoDevice when it has no device.
cudaError_t startDriver();
// Gives the calling thread a current context: the one it has, else its device's primary context.
cudaError_t useCurrentDevice();
int currentDevice();
cudaError_t selectDevice(int device);
// Drops what the device's primary context owns (cudaDeviceReset).
cudaError_t resetDevice(int device);
int deviceCount();

// Runs a driver call on the calling thread's current device, as the runtime does: the device's
// primary context is made current first; a failure becomes the thread's last error.
template <class Call>
cudaError_t onDevice(Call call) {
  if (cudaError_t error = useCurrentDevice(); error != cudaSuccess) return remember(error);
  return remember(call());
}

}  // namespace cudartemu
