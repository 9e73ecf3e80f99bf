#include "watchdog/state/cuda_driver.h"

#include <cuda.h>
#include <dlfcn.h>

#include <atomic>
#include <new>

#include "watchdog/common/libraries.h"

namespace ncclguard {
namespace {

#define NCCLGUARD_STRINGIFY_EXPANDED(name) NCCLGUARD_STRINGIFY(name)
#define NCCLGUARD_STRINGIFY(name) #name

CudaDriver* Load() {
  // The application's own libcuda (NCCL has loaded it); else the system's, as NCCL would.
  void* handle = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) handle = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (handle == nullptr) return nullptr;
  auto* driver = new (std::nothrow) CudaDriver;  // deliberately leaked: used until exit
  if (driver == nullptr) return nullptr;
  bool events = true;
  bool probation = true;
// `name` is a member and a function name, `found` a variable: neither can be parenthesised.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define NCCLGUARD_RESOLVE(name, found)                                                                \
  driver->name =                                                                                      \
      reinterpret_cast<decltype(&::name)>(Real().Symbol(handle, NCCLGUARD_STRINGIFY_EXPANDED(name))); \
  found = found && driver->name != nullptr;
#define NCCLGUARD_RESOLVE_EVENT(name) NCCLGUARD_RESOLVE(name, events)
#define NCCLGUARD_RESOLVE_PROBATION(name) NCCLGUARD_RESOLVE(name, probation)
  NCCLGUARD_CUDA_EVENT_FUNCTIONS(NCCLGUARD_RESOLVE_EVENT)
  NCCLGUARD_CUDA_PROBATION_FUNCTIONS(NCCLGUARD_RESOLVE_PROBATION)
#undef NCCLGUARD_RESOLVE_PROBATION
#undef NCCLGUARD_RESOLVE_EVENT
#undef NCCLGUARD_RESOLVE
  // NOLINTEND(bugprone-macro-parentheses)
  if (!events) {
    delete driver;
    return nullptr;
  }
  driver->probation = probation;
  return driver;
}

std::atomic<const CudaDriver*> g_test_driver{nullptr};

}  // namespace

const CudaDriver* LoadCudaDriver() noexcept {
  if (const CudaDriver* driver = g_test_driver.load(std::memory_order_acquire)) return driver;
  // A function-local static: one lookup, however many threads ask first.
  static const CudaDriver* const driver = Load();
  return driver;
}

void ReplaceCudaDriverForTesting(const CudaDriver* driver) noexcept {
  g_test_driver.store(driver, std::memory_order_release);
}

CudaContextScope::CudaContextScope(const CudaDriver& driver, CUcontext context)
    : driver_(driver), pushed_(context != nullptr && driver.cuCtxPushCurrent(context) == CUDA_SUCCESS) {}

CudaContextScope::~CudaContextScope() {
  CUcontext popped = nullptr;
  if (pushed_) driver_.cuCtxPopCurrent(&popped);
}

}  // namespace ncclguard
