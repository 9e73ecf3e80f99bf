#include "watchdog/state/gpu_events.h"

#include <cuda.h>

#include <atomic>

#include "watchdog/state/cuda_driver.h"

namespace ncclguard {
namespace {

// Each call looks the driver up once (LoadCudaDriver, a load and a check after the first call):
// the records are on every collective's path.
class DriverEventsImpl final : public GpuEvents {
 public:
  bool Available() override { return LoadCudaDriver() != nullptr; }

  GpuContext CurrentContext() override {
    const CudaDriver* driver = LoadCudaDriver();
    CUcontext context = nullptr;
    if (driver == nullptr || driver->cuCtxGetCurrent(&context) != CUDA_SUCCESS) return nullptr;
    return context;
  }

  bool IsCapturing(GpuStream stream) override {
    const CudaDriver* driver = LoadCudaDriver();
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (driver == nullptr) return false;
    const CUresult result = driver->cuStreamIsCapturing(static_cast<CUstream>(stream), &status);
    // An error here is itself a sign of capture (e.g. an invalidated capture): stay off it.
    return result != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE;
  }

  GpuEvent Create() override {
    const CudaDriver* driver = LoadCudaDriver();
    CUevent event = nullptr;
    if (driver == nullptr || driver->cuEventCreate(&event, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return nullptr;
    return event;
  }

  bool Record(GpuEvent event, GpuStream stream) override {
    const CudaDriver* driver = LoadCudaDriver();
    return driver != nullptr &&
           driver->cuEventRecord(static_cast<CUevent>(event), static_cast<CUstream>(stream)) == CUDA_SUCCESS;
  }

  EventStatus Query(GpuContext context, GpuEvent event) override {
    const CudaDriver* driver = LoadCudaDriver();
    if (driver == nullptr) return EventStatus::kError;
    CudaContextScope scope(*driver, static_cast<CUcontext>(context));
    switch (driver->cuEventQuery(static_cast<CUevent>(event))) {
      case CUDA_SUCCESS:
        return EventStatus::kReached;
      case CUDA_ERROR_NOT_READY:
        return EventStatus::kNotReached;
      default:
        return EventStatus::kError;
    }
  }

  float ElapsedMs(GpuContext context, GpuEvent start, GpuEvent end) override {
    const CudaDriver* driver = LoadCudaDriver();
    float milliseconds = -1;
    if (driver == nullptr) return -1;
    CudaContextScope scope(*driver, static_cast<CUcontext>(context));
    if (driver->cuEventElapsedTime(&milliseconds, static_cast<CUevent>(start), static_cast<CUevent>(end)) !=
        CUDA_SUCCESS) {
      return -1;
    }
    return milliseconds;
  }

  void Destroy(GpuContext context, GpuEvent event) override {
    const CudaDriver* driver = LoadCudaDriver();
    if (driver == nullptr) return;
    CudaContextScope scope(*driver, static_cast<CUcontext>(context));
    driver->cuEventDestroy(static_cast<CUevent>(event));
  }

  void PrepareWatchdogThread() override {
    const CudaDriver* driver = LoadCudaDriver();
    if (driver == nullptr) return;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    driver->cuThreadExchangeStreamCaptureMode(&mode);
  }
};

}  // namespace

namespace {
std::atomic<GpuEvents*> g_test_events{nullptr};
}  // namespace

GpuEvents& DriverEvents() {
  if (GpuEvents* events = g_test_events.load(std::memory_order_acquire)) return *events;
  static DriverEventsImpl* events = new DriverEventsImpl;  // deliberately leaked: used until exit
  return *events;
}

void ReplaceGpuEventsForTesting(GpuEvents* events) { g_test_events.store(events, std::memory_order_release); }

}  // namespace ncclguard
