#include "shim/libraries.h"

#include <dlfcn.h>
#include <link.h>
#include <nccl.h>
#include <pthread.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "watchdog/common/nccl_api.h"
#include "watchdog/record/hooks.h"

// glibc's dlsym, found on first use; dlsym.cc's trampoline jumps through it.
extern "C" {
__attribute__((visibility("hidden"))) void* ncclguard_real_dlsym = nullptr;
}

namespace ncclguard::shim {

// Sanitizer runtimes look up their interceptors with dlsym() before their shadow memory exists,
// so this path must not be instrumented.
__attribute__((NCCLGUARD_UNINSTRUMENTED)) DlsymFunction RealDlsym() noexcept {
  void* real = __atomic_load_n(&ncclguard_real_dlsym, __ATOMIC_ACQUIRE);
  if (real == nullptr) {
    // A versioned lookup skips every interposer, ncclguard's included. GLIBC_2.34 is where dlsym
    // moved into libc; older glibc and other architectures know only their base version.
    // Plain indexing only: at -O0 even std::initializer_list's accessors are out-of-line,
    // instrumented calls.
    static const char* const kVersions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (unsigned i = 0; real == nullptr && i < sizeof(kVersions) / sizeof(kVersions[0]); ++i) {
      real = dlvsym(RTLD_NEXT, "dlsym", kVersions[i]);
    }
    __atomic_store_n(&ncclguard_real_dlsym, real, __ATOMIC_RELEASE);
  }
  return reinterpret_cast<DlsymFunction>(real);
}

namespace {

struct Library {
  std::atomic<bool> known{false};
  // Written once before `known` is published with release ordering.
  void* handle = nullptr;  // for lazy lookups: a dlopen handle, or RTLD_NEXT
  const link_map* identity = nullptr;
  char path[1024] = {};
  std::atomic<int> version{0};
  std::atomic<void*> functions[kApiCount] = {};
};

// Zero-initialised at load time: no constructor runs before the first NCCL call.
Library g_libraries[kMaxLibraries];
std::mutex g_registry_mutex;  // cold path only: the first sight of a library
char g_missing_marker;        // cached answer "this library lacks the function"

void* MissingMarker() { return &g_missing_marker; }

// A fork() while another thread registers a library must not leave the child's mutex locked.
void RegisterForkHandlersOnce() {
  static std::atomic<bool> registered{false};
  if (registered.exchange(true)) return;
  pthread_atfork([] { g_registry_mutex.lock(); }, [] { g_registry_mutex.unlock(); },
                 [] { g_registry_mutex.unlock(); });
}

const link_map* LinkMapOf(const void* address) {
  Dl_info info;
  link_map* map = nullptr;
  if (dladdr1(address, &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) == 0) return nullptr;
  return map;
}

const link_map* OwnLinkMap() {
  static const link_map* own = LinkMapOf(reinterpret_cast<const void*>(&OwnLinkMap));
  return own;
}

void Publish(Library& library, void* handle, const link_map* identity, const char* path) {
  library.handle = handle;
  library.identity = identity;
  std::strncpy(library.path, path != nullptr ? path : "", sizeof(library.path) - 1);
  library.known.store(true, std::memory_order_release);
}

// An object of the process that defines ncclGetVersion itself (not through a dependency).
bool FindLoadedNccl(void** handle_out, const link_map** identity_out) {
  std::vector<std::string> candidates;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        // The main program has an empty name; NCCL is a shared library.
        if (info->dlpi_name != nullptr && info->dlpi_name[0] != '\0') {
          static_cast<std::vector<std::string>*>(data)->emplace_back(info->dlpi_name);
        }
        return 0;
      },
      &candidates);
  for (const std::string& name : candidates) {
    void* handle = dlopen(name.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (handle == nullptr) continue;
    const link_map* map = nullptr;
    void* get_version = RealDlsym()(handle, "ncclGetVersion");
    if (get_version != nullptr && dlinfo(handle, RTLD_DI_LINKMAP, static_cast<void*>(&map)) == 0 &&
        map != OwnLinkMap() && LinkMapOf(get_version) == map) {
      *handle_out = handle;  // keeps the library loaded for as long as we may call into it
      *identity_out = map;
      return true;
    }
    dlclose(handle);
  }
  return false;
}

// The library NCCLGUARD_NCCL_LIBRARY names, when it loads and defines ncclGetVersion itself (not
// through a dependency, and not ncclguard itself); otherwise nullptr and why, after dlclose().
void* OpenConfiguredNccl(const std::string& path, std::string* problem) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    *problem = std::string("cannot be loaded (") + (why != nullptr ? why : "unknown error") + ")";
    return nullptr;
  }
  const link_map* map = nullptr;
  void* get_version = RealDlsym()(handle, "ncclGetVersion");
  if (get_version != nullptr && dlinfo(handle, RTLD_DI_LINKMAP, static_cast<void*>(&map)) == 0 &&
      map != OwnLinkMap() && LinkMapOf(get_version) == map) {
    return handle;
  }
  dlclose(handle);
  *problem = "is not an NCCL library (it does not define ncclGetVersion)";
  return nullptr;
}

// Finds the process's default NCCL (slot 0). Called with the registry mutex held.
void ResolveDefaultLibrary() {
  Library& library = g_libraries[0];
  if (library.known.load(std::memory_order_acquire)) return;

  const std::string configured = hooks::NcclLibraryOfUser();
  if (!configured.empty()) {
    std::string problem;
    if (void* handle = OpenConfiguredNccl(configured, &problem)) {
      const link_map* map = nullptr;
      dlinfo(handle, RTLD_DI_LINKMAP, static_cast<void*>(&map));
      Publish(library, handle, map, map != nullptr ? map->l_name : configured.c_str());
      return;
    }
    hooks::ReportNcclLibraryProblem(configured, problem);
  }

  // The usual case: the application or a library it loaded globally links libnccl.
  if (void* get_version = RealDlsym()(RTLD_NEXT, "ncclGetVersion")) {
    if (const link_map* map = LinkMapOf(get_version); map != nullptr && map != OwnLinkMap()) {
      Publish(library, RTLD_NEXT, map, map->l_name);
      return;
    }
  }
  // NCCL in a local scope (a framework's RTLD_LOCAL library, or dlopen()ed by the application):
  // its own internal calls still reach our exported functions, so find it among loaded objects.
  void* handle = nullptr;
  const link_map* map = nullptr;
  if (FindLoadedNccl(&handle, &map)) Publish(library, handle, map, map->l_name);
}

void* ResolveFunction(int slot, Api api) {
  Library& library = g_libraries[slot];
  if (!library.known.load(std::memory_order_acquire)) {
    if (slot != 0) return nullptr;
    RegisterForkHandlersOnce();
    std::lock_guard<std::mutex> lock(g_registry_mutex);
    ResolveDefaultLibrary();
    if (!library.known.load(std::memory_order_acquire)) return nullptr;  // retried on the next call
  }
  const std::string name(Describe(api).name);
  void* function = RealDlsym()(library.handle, name.c_str());
  if (function != nullptr && LinkMapOf(function) == OwnLinkMap()) function = nullptr;
  library.functions[static_cast<int>(api)].store(function != nullptr ? function : MissingMarker(),
                                                 std::memory_order_release);
  return function;
}

// Out of line: inlined, its frame would be set up on every call of every function.
[[gnu::noinline, gnu::cold]] void* ResolveFunctionOnce(int slot, Api api) noexcept {
  try {
    return ResolveFunction(slot, api);
  } catch (...) {
    return nullptr;
  }
}

}  // namespace

void* RealFunction(int slot, Api api) noexcept {
  void* function = g_libraries[slot].functions[static_cast<int>(api)].load(std::memory_order_acquire);
  if (function == MissingMarker()) return nullptr;
  if (function != nullptr) [[likely]]
    return function;
  return ResolveFunctionOnce(slot, api);
}

int SlotForLookup(void* handle, Api api, void* real_function) noexcept {
  const link_map* identity = LinkMapOf(real_function);
  if (identity == nullptr || identity == OwnLinkMap()) return -1;
  try {
    RegisterForkHandlersOnce();
    std::lock_guard<std::mutex> lock(g_registry_mutex);
    ResolveDefaultLibrary();
    int slot = -1;
    for (int i = 0; i < kMaxLibraries && slot < 0; ++i) {
      Library& library = g_libraries[i];
      if (library.known.load(std::memory_order_acquire) && library.identity == identity) slot = i;
    }
    for (int i = 1; i < kMaxLibraries && slot < 0; ++i) {
      Library& library = g_libraries[i];
      if (!library.known.load(std::memory_order_acquire)) {
        // The application's handle serves later lookups of functions it has not asked for yet
        // (NCCL's calls to its own exported functions, re-entering ncclguard).
        Publish(library, handle, identity, identity->l_name);
        slot = i;
      }
    }
    if (slot < 0) return -1;
    void* expected = nullptr;
    g_libraries[slot].functions[static_cast<int>(api)].compare_exchange_strong(expected, real_function,
                                                                               std::memory_order_acq_rel);
    return slot;
  } catch (...) {
    return -1;
  }
}

int AdoptLibrary(void* dl_handle, const std::string& path) noexcept {
  if (dl_handle == nullptr) return -1;
  const link_map* identity = nullptr;
  if (dlinfo(dl_handle, RTLD_DI_LINKMAP, static_cast<void*>(&identity)) != 0 || identity == nullptr ||
      identity == OwnLinkMap()) {
    return -1;
  }
  void* get_version = RealDlsym()(dl_handle, "ncclGetVersion");
  if (get_version == nullptr || LinkMapOf(get_version) != identity) return -1;
  try {
    RegisterForkHandlersOnce();
    std::lock_guard<std::mutex> lock(g_registry_mutex);
    ResolveDefaultLibrary();  // slot 0 stays the process's default NCCL
    for (int i = 0; i < kMaxLibraries; ++i) {
      const Library& library = g_libraries[i];
      if (library.known.load(std::memory_order_acquire) && library.identity == identity) return i;
    }
    for (int i = 1; i < kMaxLibraries; ++i) {
      Library& library = g_libraries[i];
      if (!library.known.load(std::memory_order_acquire)) {
        Publish(library, dl_handle, identity, path.c_str());
        return i;
      }
    }
  } catch (...) {
  }
  return -1;
}

const char* LibraryPath(int slot) noexcept {
  const Library& library = g_libraries[slot];
  return library.known.load(std::memory_order_acquire) ? library.path : "";
}

int LibraryVersion(int slot) noexcept {
  Library& library = g_libraries[slot];
  int version = library.version.load(std::memory_order_relaxed);
  if (version != 0) return version;
  using GetVersion = decltype(&::ncclGetVersion);
  auto get_version = reinterpret_cast<GetVersion>(RealFunction(slot, Api::ncclGetVersion));
  if (get_version != nullptr && get_version(&version) == ncclSuccess) {
    library.version.store(version, std::memory_order_relaxed);
    return version;
  }
  return 0;
}

}  // namespace ncclguard::shim
