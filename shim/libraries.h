// The NCCL libraries that serve ncclguard's wrappers, and how their real functions are found.
//
// A process may hold more than one NCCL library instance: the one the application linked, one a
// framework dlopen()ed with RTLD_LOCAL, a second copy loaded on purpose. Each instance occupies a
// slot. Slot 0 serves the nccl* functions ncclguard exports (the process's default NCCL); slots
// 1.. serve the wrappers that ncclguard's dlsym() hands out for lookups on other instances'
// handles. Every wrapper is bound to one slot, so a call always reaches the instance the
// application asked for.
#pragma once

#include <string>

#include "watchdog/common/libraries.h"
#include "watchdog/common/nccl_api.h"

// For what runs before a sanitizer's runtime is ready (its own early dlsym() lookups): not
// instrumented at all. clang's no_sanitize("thread") still calls the runtime at the function's
// entry and exit, which crashes there; its disable_sanitizer_instrumentation does not.
#if defined(__clang__) && __has_attribute(disable_sanitizer_instrumentation)
#define NCCLGUARD_UNINSTRUMENTED disable_sanitizer_instrumentation
#else
#define NCCLGUARD_UNINSTRUMENTED no_sanitize("address", "undefined", "thread")
#endif

namespace ncclguard::shim {

inline constexpr int kMaxLibraries = 4;

// glibc's dlsym(), never ncclguard's own. Must be used for every lookup ncclguard makes: a call to
// dlsym() by name from inside the library would reach ncclguard's interposed dlsym().
using DlsymFunction = void* (*)(void* handle, const char* name);
DlsymFunction RealDlsym() noexcept;

// The real function of `api` in the library of `slot`, resolved on first use and cached;
// nullptr when that library lacks the function (an older NCCL) or no library can be found.
void* RealFunction(int slot, Api api) noexcept;

// For ncclguard's dlsym(): the slot of the library that defines `real_function`, found by a lookup
// of `api` on `handle`. Registers a new library instance on first sight. Returns -1 when the
// function is ncclguard's own or no slot is left (the caller then hands out the real function).
int SlotForLookup(void* handle, Api api, void* real_function) noexcept;

// A library the core dlopen()ed itself, given a slot of its own (RealLibraries::AdoptLibrary).
int AdoptLibrary(void* dl_handle, const std::string& path) noexcept;

// Path of the library in `slot` ("" while unknown; never changes once known) and its NCCL version
// code (0 while unknown).
const char* LibraryPath(int slot) noexcept;
int LibraryVersion(int slot) noexcept;

// The functions above, as the core's way to the real libraries (handed to it at its start);
// defined with the wrappers (wrappers.cc), whose call scope it uses.
RealLibraries& Libraries() noexcept;

}  // namespace ncclguard::shim
