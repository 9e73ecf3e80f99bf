#include "watchdog/common/libraries.h"

#include <dlfcn.h>

#include <atomic>
#include <string>

#include "absl/functional/function_ref.h"
#include "watchdog/common/nccl_api.h"

namespace ncclguard {
namespace {

class NoLibraries final : public RealLibraries {
 public:
  void* Function(int, Api) noexcept override { return nullptr; }
  const char* Path(int) noexcept override { return ""; }
  int Version(int) noexcept override { return 0; }
  void* Symbol(void* handle, const char* name) noexcept override { return dlsym(handle, name); }
  int AdoptLibrary(void*, const std::string&) noexcept override { return -1; }
  void CallAs(int, Api, absl::FunctionRef<void()> call) noexcept override { call(); }
};

NoLibraries g_no_libraries;
std::atomic<RealLibraries*> g_libraries{nullptr};

}  // namespace

void InstallRealLibraries(RealLibraries* libraries) noexcept {
  g_libraries.store(libraries, std::memory_order_release);
}

RealLibraries& Real() noexcept {
  RealLibraries* libraries = g_libraries.load(std::memory_order_acquire);
  return libraries != nullptr ? *libraries : g_no_libraries;
}

}  // namespace ncclguard
