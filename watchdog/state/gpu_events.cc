#include "watchdog/state/gpu_events.h"

#include <cuda.h>

#include <atomic>

#include "watchdog/state/cuda_driver.h"

namespace ncclguard {
namespace {

class DriverEventsImpl final : public GpuEvents {
 public:
  bool Available() override { return Load(); }

  GpuContext CurrentContext() override {
    CUcontext context = nullptr;
    if (!Load() || Driver()->cuCtxGetCurrent(&context) != CUDA_SUCCESS) return nullptr;
    return context;
  }

  bool IsCapturing(GpuStream stream) override {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (!Load()) return false;
    const CUresult result = Driver()->cuStreamIsCapturing(static_cast<CUstream>(stream), &status);
    // An error here is itself a sign of capture (e.g. an invalidated capture): stay off it.
    return result != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE;
  }

  GpuEvent Create() override {
    CUevent event = nullptr;
    if (!Load() || Driver()->cuEventCreate(&event, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return nullptr;
    return event;
  }

  bool Record(GpuEvent event, GpuStream stream) override {
    return Load() && Driver()->cuEventRecord(static_cast<CUevent>(event), static_cast<CUstream>(stream)) ==
                         CUDA_SUCCESS;
  }

  EventStatus Query(GpuContext context, GpuEvent event) override {
    if (!Load()) return EventStatus::kError;
    CudaContextScope scope(*Driver(), static_cast<CUcontext>(context));
    switch (Driver()->cuEventQuery(static_cast<CUevent>(event))) {
      case CUDA_SUCCESS:
        return EventStatus::kReached;
      case CUDA_ERROR_NOT_READY:
        return EventStatus::kNotReached;
      default:
        return EventStatus::kError;
    }
  }

  float ElapsedMs(GpuContext context, GpuEvent start, GpuEvent end) override {
    float milliseconds = -1;
    if (!Load()) return -1;
    CudaContextScope scope(*Driver(), static_cast<CUcontext>(context));
    if (Driver()->cuEventElapsedTime(&milliseconds, static_cast<CUevent>(start), static_cast<CUevent>(end)) !=
        CUDA_SUCCESS) {
      return -1;
    }
    return milliseconds;
  }

  void Destroy(GpuContext context, GpuEvent event) override {
    if (!Load()) return;
    CudaContextScope scope(*Driver(), static_cast<CUcontext>(context));
    Driver()->cuEventDestroy(static_cast<CUevent>(event));
  }

  void PrepareWatchdogThread() override {
    if (!Load()) return;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    Driver()->cuThreadExchangeStreamCaptureMode(&mode);
  }

 private:
  static bool Load() { return Driver() != nullptr; }
  // Found at the first call; the answer never changes.
  static const CudaDriver* Driver() { return LoadCudaDriver(); }
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
