// Helpers shared by the emulated CUDA driver's tests.
#pragma once

#include <cuda.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <mutex>
#include <string>

namespace Catch {
// Failures print CUDA_ERROR_NOT_READY instead of 600.
template <>
struct StringMaker<CUresult> {
  static std::string convert(CUresult result) {
    const char* name = nullptr;
    cuGetErrorName(result, &name);
    return name != nullptr ? name : "CUresult " + std::to_string(static_cast<int>(result));
  }
};
}  // namespace Catch

namespace emutest {

// A host function that blocks its stream until the test opens the gate: a stuck kernel.
class Gate {
 public:
  static void hostFunction(void* gate) { static_cast<Gate*>(gate)->pass(); }

  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }

  void waitUntilEntered() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [this] { return entered_; });
  }

 private:
  void pass() {
    std::unique_lock lock(mutex_);
    entered_ = true;
    changed_.notify_all();
    changed_.wait(lock, [this] { return open_; });
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  bool entered_ = false;
  bool open_ = false;
};

// A host function that counts its runs.
inline void countRun(void* counter) { static_cast<std::atomic<int>*>(counter)->fetch_add(1); }

// Initialises the driver and makes device 0's primary context current on the calling thread.
class PrimaryContext {
 public:
  explicit PrimaryContext(CUdevice device = 0) : device_(device) {
    REQUIRE(cuInit(0) == CUDA_SUCCESS);
    REQUIRE(cuDevicePrimaryCtxRetain(&context_, device_) == CUDA_SUCCESS);
    REQUIRE(cuCtxSetCurrent(context_) == CUDA_SUCCESS);
  }
  ~PrimaryContext() {
    cuCtxSetCurrent(nullptr);
    cuDevicePrimaryCtxRelease(device_);
  }
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;

  CUcontext get() const { return context_; }

 private:
  CUdevice device_;
  CUcontext context_ = nullptr;
};

}  // namespace emutest
