#include "watchdog/state/gpu_events.h"

#include <cuda.h>
#include <dlfcn.h>

#include <atomic>
#include <mutex>

#include "watchdog/common/libraries.h"

namespace ncclguard {
namespace {

// The driver functions used, under the names cuda.h maps them to (cuEventDestroy is
// cuEventDestroy_v2, ...): the stringification happens after macro expansion.
// clang-format off: one function a line (clang-format 14 does not settle on one layout here)
#define NCCLGUARD_DRIVER_FUNCTIONS(X) \
  X(cuCtxGetCurrent)                  \
  X(cuCtxPushCurrent)                 \
  X(cuCtxPopCurrent)                  \
  X(cuStreamIsCapturing)              \
  X(cuEventCreate)                    \
  X(cuEventRecord)                    \
  X(cuEventQuery)                     \
  X(cuEventElapsedTime)               \
  X(cuEventDestroy)                   \
  X(cuThreadExchangeStreamCaptureMode)
// clang-format on
#define NCCLGUARD_STRINGIFY_EXPANDED(name) NCCLGUARD_STRINGIFY(name)
#define NCCLGUARD_STRINGIFY(name) #name

class DriverEventsImpl final : public GpuEvents {
 public:
  bool Available() override { return Load(); }

  GpuContext CurrentContext() override {
    CUcontext context = nullptr;
    if (!Load() || cuCtxGetCurrent_(&context) != CUDA_SUCCESS) return nullptr;
    return context;
  }

  bool IsCapturing(GpuStream stream) override {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (!Load()) return false;
    const CUresult result = cuStreamIsCapturing_(static_cast<CUstream>(stream), &status);
    // An error here is itself a sign of capture (e.g. an invalidated capture): stay off it.
    return result != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE;
  }

  GpuEvent Create() override {
    CUevent event = nullptr;
    if (!Load() || cuEventCreate_(&event, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return nullptr;
    return event;
  }

  bool Record(GpuEvent event, GpuStream stream) override {
    return Load() &&
           cuEventRecord_(static_cast<CUevent>(event), static_cast<CUstream>(stream)) == CUDA_SUCCESS;
  }

  EventStatus Query(GpuContext context, GpuEvent event) override {
    if (!Load()) return EventStatus::kError;
    ContextScope scope(*this, context);
    switch (cuEventQuery_(static_cast<CUevent>(event))) {
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
    ContextScope scope(*this, context);
    if (cuEventElapsedTime_(&milliseconds, static_cast<CUevent>(start), static_cast<CUevent>(end)) !=
        CUDA_SUCCESS) {
      return -1;
    }
    return milliseconds;
  }

  void Destroy(GpuContext context, GpuEvent event) override {
    if (!Load()) return;
    ContextScope scope(*this, context);
    cuEventDestroy_(static_cast<CUevent>(event));
  }

  void PrepareWatchdogThread() override {
    if (!Load()) return;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    cuThreadExchangeStreamCaptureMode_(&mode);
  }

 private:
  // Makes the event's context current on the watchdog thread for the duration of a call.
  class ContextScope {
   public:
    ContextScope(DriverEventsImpl& driver, GpuContext context)
        : driver_(driver),
          pushed_(context != nullptr &&
                  driver.cuCtxPushCurrent_(static_cast<CUcontext>(context)) == CUDA_SUCCESS) {}
    ~ContextScope() {
      CUcontext popped = nullptr;
      if (pushed_) driver_.cuCtxPopCurrent_(&popped);
    }

   private:
    DriverEventsImpl& driver_;
    bool pushed_;
  };

  bool Load() {
    const int state = state_.load(std::memory_order_acquire);
    if (state != kUnknown) return state == kLoaded;
    std::lock_guard<std::mutex> lock(load_mutex_);  // once per process: the pointers are then fixed
    if (state_.load(std::memory_order_acquire) != kUnknown) return state_.load() == kLoaded;
    // The application's own libcuda (NCCL has loaded it); else the system's, as NCCL would.
    void* handle = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (handle == nullptr) handle = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    bool complete = handle != nullptr;
#define NCCLGUARD_RESOLVE(name)                                                                            \
  name##_ =                                                                                                \
      complete                                                                                             \
          ? reinterpret_cast<decltype(&::name)>(Real().Symbol(handle, NCCLGUARD_STRINGIFY_EXPANDED(name))) \
          : nullptr;                                                                                       \
  complete = complete && name##_ != nullptr;
    NCCLGUARD_DRIVER_FUNCTIONS(NCCLGUARD_RESOLVE)
#undef NCCLGUARD_RESOLVE
    state_.store(complete ? kLoaded : kMissing, std::memory_order_release);
    return complete;
  }

  static constexpr int kUnknown = 0, kLoaded = 1, kMissing = 2;
  std::atomic<int> state_{kUnknown};
  std::mutex load_mutex_;
#define NCCLGUARD_POINTER(name) decltype(&::name) name##_ = nullptr;
  NCCLGUARD_DRIVER_FUNCTIONS(NCCLGUARD_POINTER)
#undef NCCLGUARD_POINTER
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
