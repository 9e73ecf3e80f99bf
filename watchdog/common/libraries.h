// How the core reaches the real NCCL and CUDA functions. The shim owns the NCCL libraries (which
// instance serves which wrapper, how a function is found) and installs them here when it is
// loaded; the core asks through this interface and never includes shim/.
#pragma once

#include <nccl.h>

#include <string>

#include "absl/functional/function_ref.h"
#include "watchdog/common/nccl_api.h"

namespace ncclguard {

class RealLibraries {
 public:
  // The real function of `api` in the NCCL library of `slot`; nullptr when that library lacks it
  // or no library can be found.
  virtual void* Function(int slot, Api api) noexcept = 0;
  // Path of the library in `slot` ("" while unknown), valid for the process's life, and its NCCL
  // version code (0 while unknown). Plain characters: libncclguard.so's front end and its core may
  // each have a C++ runtime of their own, so nothing one of them allocates crosses this interface.
  virtual const char* Path(int slot) noexcept = 0;
  virtual int Version(int slot) noexcept = 0;
  // glibc's dlsym(), for CUDA and NVML lookups: a lookup by name from inside libncclguard would
  // reach ncclguard's own interposed dlsym().
  virtual void* Symbol(void* handle, const char* name) noexcept = 0;
  // Gives a library the core dlopen()ed itself (a private instance of libnccl) a slot of its own,
  // so that Function(slot, api) reaches its functions; `dl_handle` must stay open for ever.
  // Returns the slot (the existing one when that library already has a slot), or -1 when no slot
  // is left or `dl_handle` is not an NCCL library.
  virtual int AdoptLibrary(void* dl_handle, const std::string& path) noexcept = 0;
  // Runs `call`, which calls functions of the library in `slot` directly, as the wrappers run a
  // call of `api` on it: the library's calls of its own exported functions, which bind to
  // ncclguard's wrappers, then reach that library too (not the process's default NCCL) and are
  // not reported as calls of their own.
  virtual void CallAs(int slot, Api api, absl::FunctionRef<void()> call) noexcept = 0;

 protected:
  // Never deleted through this interface; not virtual, so that the shim's instance, a global in
  // libncclguard.so, has no destructor to register when the library is loaded.
  ~RealLibraries() = default;
};

// Called by the shim before any call reaches the core. A program that links the core without the
// shim (a test, the command line tool) has no NCCL functions, and looks symbols up with dlsym().
void InstallRealLibraries(RealLibraries* libraries) noexcept;
RealLibraries& Real() noexcept;

// Calls NCCL's `api` of the library in `slot` as its wrapper would (RealLibraries::CallAs):
// `call` is given the function, as `void*`, and returns what it returned. ncclInvalidUsage when the
// library lacks the function.
template <typename Call>
ncclResult_t CallRealNccl(int slot, Api api, Call&& call) {
  void* function = Real().Function(slot, api);
  if (function == nullptr) return ncclInvalidUsage;
  ncclResult_t result = ncclInternalError;
  Real().CallAs(slot, api, [&] { result = call(function); });
  return result;
}

}  // namespace ncclguard
