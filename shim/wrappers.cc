// Every NCCL function of the table, wrapped. A wrapper: pick the real function, pass nested calls
// straight through, report the call, return the real result. Nothing here decides anything.
#include "shim/wrappers.h"

#include <nccl.h>
#include <pthread.h>

#include <atomic>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/functional/function_ref.h"
#include "shim/calls.h"
#include "shim/libraries.h"
#include "watchdog/common/libraries.h"
#include "watchdog/common/nccl_api.h"
#include "watchdog/common/nccl_api_table.h"
#include "watchdog/record/hooks.h"

// ncclResetDebugInit is declared deprecated in nccl.h, yet applications may still call it.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace ncclguard::shim {
namespace {

template <Api A>
struct Signature;
#define NCCLGUARD_SIGNATURE(name, ret, kind, since, params, args) \
  template <>                                                     \
  struct Signature<Api::name> {                                   \
    using Function = decltype(&::name);                           \
    using Result = ret;                                           \
  };
NCCLGUARD_FOR_EACH_NCCL_API(NCCLGUARD_SIGNATURE)
#undef NCCLGUARD_SIGNATURE

// libnccl calls some of its own exported functions through the PLT (ncclBcast calls ncclBroadcast),
// which lands in ncclguard again. Such nested calls go straight to the library of the outermost
// call on this thread and are not reported: they are part of that one call.
struct ThreadCallState {
  int depth;
  int outer_library;
  Api outer_api;
};
// Plain data: no TLS constructor, no allocation. Initial-exec: the preloaded library's few bytes
// sit in the static TLS block (or its reserve, if the library is dlopen()ed), reached without a
// call into the loader on every NCCL call.
__attribute__((tls_model("initial-exec"))) thread_local ThreadCallState t_calls;

class CallScope {
 public:
  CallScope(Api api, int library) : previous_(t_calls) { t_calls = {previous_.depth + 1, library, api}; }
  ~CallScope() { t_calls = previous_; }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  ThreadCallState previous_;
};

// The same for a call that no other NCCL call on the thread encloses: nothing to restore.
class OutermostCallScope {
 public:
  OutermostCallScope(Api api, int library) { t_calls = {1, library, api}; }
  ~OutermostCallScope() { t_calls.depth = 0; }
  OutermostCallScope(const OutermostCallScope&) = delete;
  OutermostCallScope& operator=(const OutermostCallScope&) = delete;
};

// The core's way to the NCCL libraries (watchdog/common/libraries.h). Here rather than in
// libraries.cc, which the command line tool links without the wrappers, because CallAs runs a call
// in the wrappers' own call scope.
class ShimLibraries final : public RealLibraries {
 public:
  void* Function(int slot, Api api) noexcept override { return RealFunction(slot, api); }
  const char* Path(int slot) noexcept override { return LibraryPath(slot); }
  int Version(int slot) noexcept override { return LibraryVersion(slot); }
  void* Symbol(void* handle, const char* name) noexcept override { return RealDlsym()(handle, name); }
  int AdoptLibrary(void* dl_handle, const std::string& path) noexcept override {
    return shim::AdoptLibrary(dl_handle, path);
  }
  void CallAs(int slot, Api api, absl::FunctionRef<void()> call) noexcept override {
    CallScope scope(api, slot);
    call();
  }
};

// Constant-initialised: no constructor runs when the library is loaded.
constinit ShimLibraries g_shim_libraries;

template <typename Result>
Result MissingFunctionResult() {
  if constexpr (std::is_same_v<Result, ncclResult_t>) {
    return ncclInternalError;
  } else if constexpr (std::is_same_v<Result, const char*>) {
    return "ncclguard: this function is not provided by the NCCL library in use";
  }
}

// A communicator argument as NCCL must see it: the real communicator behind one of ncclguard's
// handles, with `*library` set to the slot that serves it. Any other argument is unchanged.
template <typename T>
T RealArgument(T value, int* library) noexcept {
  if constexpr (std::is_same_v<T, ncclComm_t>) {
    return hooks::ResolveCommunicator(value, library);
  } else {
    return value;
  }
}

// Whether communicator arguments go to the core to be resolved (in-process recovery, fixed once
// the core has started): asked once, so that a call without it crosses the door for none of them.
std::atomic<int> g_resolves_communicators{-1};  // -1: not asked yet

bool ResolvesCommunicators(bool active) noexcept {
  if (!active) return true;  // not started, or not watching: the core answers each one
  int known = g_resolves_communicators.load(std::memory_order_relaxed);
  if (known < 0) {
    known = hooks::ResolvesCommunicators() ? 1 : 0;
    g_resolves_communicators.store(known, std::memory_order_relaxed);
  }
  return known == 1;
}

// What the core answers once it has started holds for every later call: that it watches, and how
// much of each call the log wants (its level is set at the start). Kept here, so that a call
// crosses the door only to be recorded; asked again in a forked child, which starts over.
std::atomic<bool> g_core_active{false};
std::atomic<hooks::CallDetail> g_logged_detail{hooks::CallDetail::kNone};

bool CoreActive() noexcept {
  if (g_core_active.load(std::memory_order_acquire)) [[likely]]
    return true;
  if (!hooks::Active(Libraries())) return false;
  static std::atomic<bool> fork_handler{false};
  if (!fork_handler.exchange(true))
    pthread_atfork(nullptr, nullptr, [] { g_core_active.store(false, std::memory_order_relaxed); });
  g_logged_detail.store(hooks::LoggedCallDetail(), std::memory_order_relaxed);
  g_core_active.store(true, std::memory_order_release);
  return true;
}

template <Api A, int Library, typename... Args>
typename Signature<A>::Result Forward(Args... args) noexcept {
  using Function = typename Signature<A>::Function;
  using Result = typename Signature<A>::Result;
  const bool nested = t_calls.depth > 0;
  int library = nested ? t_calls.outer_library : Library;
  // Started before the real function is looked up, so that what the lookup says is logged, and
  // before communicators are resolved, so that in-process recovery is in place if it is asked for.
  const bool active = !nested && CoreActive();
  // Before the core sees them, so that it sees NCCL's communicators only. Nested calls come from
  // NCCL itself and carry their own.
  if (!nested && ResolvesCommunicators(active)) ((args = RealArgument(args, &library)), ...);
  auto real = reinterpret_cast<Function>(RealFunction(library, A));
  if (real == nullptr) {
    if (active) hooks::ReportMissingFunction(A, library);
    return MissingFunctionResult<Result>();
  }
  if (nested) {
    hooks::NestedCall(A, t_calls.outer_api);
    return real(args...);
  }
  if (!active) return real(args...);
  OutermostCallScope scope(A, library);
  const Ticket ticket = BeforeCall<A, Result>(library, args...);
  const hooks::CallDetail logged = g_logged_detail.load(std::memory_order_relaxed);
  if constexpr (std::is_void_v<Result>) {
    real(args...);
    AfterVoidCall<A>(ticket, library, logged, args...);
  } else {
    if constexpr (std::is_same_v<Result, ncclResult_t>) {
      if (!ticket.forward) return ticket.result;
      if (ticket.slot >= 0 && ticket.slot < kMaxLibraries && ticket.slot != library) {
        // The core sends this call to another library instance.
        library = ticket.slot;
        t_calls.outer_library = library;
        real = reinterpret_cast<Function>(RealFunction(library, A));
        if (real == nullptr) hooks::ReportMissingFunction(A, library);
      }
    }
    const Result result = real != nullptr ? real(args...) : MissingFunctionResult<Result>();
    AfterCall<A>(ticket, library, logged, result, args...);
    return result;
  }
}

// The wrappers handed out by dlsym() for NCCL libraries in slots 1 and up.
template <int Library>
struct LibraryWrappers {
#define NCCLGUARD_LIBRARY_WRAPPER(name, ret, kind, since, params, args) \
  static ret name params noexcept { return Forward<Api::name, Library> args; }
  NCCLGUARD_FOR_EACH_NCCL_API(NCCLGUARD_LIBRARY_WRAPPER)
#undef NCCLGUARD_LIBRARY_WRAPPER
};

template <int Library>
void* LibraryWrapper(Api api) {
  switch (api) {
#define NCCLGUARD_WRAPPER_CASE(name, ret, kind, since, params, args)     \
  case Api::name:                                                        \
    if constexpr (Library == 0) return reinterpret_cast<void*>(&::name); \
    return reinterpret_cast<void*>(&LibraryWrappers<Library>::name);
    NCCLGUARD_FOR_EACH_NCCL_API(NCCLGUARD_WRAPPER_CASE)
#undef NCCLGUARD_WRAPPER_CASE
  }
  return nullptr;
}

template <int... Libraries>
void* WrapperIn(int library, Api api, std::integer_sequence<int, Libraries...>) {
  void* wrapper = nullptr;
  ((library == Libraries ? (wrapper = LibraryWrapper<Libraries>(api)) : nullptr), ...);
  return wrapper;
}

}  // namespace

RealLibraries& Libraries() noexcept { return g_shim_libraries; }

void* Wrapper(int library, Api api) noexcept {
  return WrapperIn(library, api, std::make_integer_sequence<int, kMaxLibraries>());
}

}  // namespace ncclguard::shim

// The exported functions: slot 0, the process's default NCCL. Not declared noexcept (nccl.h's
// declarations are not), but Forward is: no exception leaves them. `ret` and `params` are a type
// and a parameter list, which parentheses would break.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define NCCLGUARD_EXPORTED_WRAPPER(name, ret, kind, since, params, args) \
  extern "C" __attribute__((visibility("default"))) ret name params {    \
    return ::ncclguard::shim::Forward<::ncclguard::Api::name, 0> args;   \
  }
// NOLINTEND(bugprone-macro-parentheses)
NCCLGUARD_FOR_EACH_NCCL_API(NCCLGUARD_EXPORTED_WRAPPER)
#undef NCCLGUARD_EXPORTED_WRAPPER
