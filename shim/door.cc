// The core's door as libncclguard.so's front end sees it: every function of hooks.h is a
// trampoline through the table the core exports (record/door_entries.h). The core is loaded at the
// first call of any of them, which only an NCCL call (or a lookup of an NCCL function, or NCCL
// loading its profiler plugin) makes: a process that never calls NCCL never loads it, nor Abseil
// and the rest it needs. If it cannot be loaded, that is said once on stderr and every call is
// forwarded unchanged (the door's `without_core` answers). Only in the preload library: the tests
// and the command line tool link the core itself.
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "shim/libraries.h"
#include "watchdog/record/door_entries.h"

#ifndef NCCLGUARD_CORE_FILE
#error "NCCLGUARD_CORE_FILE must name the core's file (shim/CMakeLists.txt)"
#endif

namespace ncclguard::shim {
namespace {

std::atomic<const DoorEntries*> g_core{nullptr};
std::atomic<bool> g_core_failed{false};
pthread_mutex_t g_load_mutex = PTHREAD_MUTEX_INITIALIZER;
// The core's own initialisers run inside dlopen(): a door call they made would wait for itself.
thread_local bool t_loading = false;

void Say(const char* what, const char* path, const char* why) {
  char line[1536];
  const int length =
      std::snprintf(line, sizeof(line), "ncclguard: %s %s (%s); NCCL calls pass through unwatched\n", what,
                    path, why != nullptr ? why : "unknown error");
  if (length > 0)
    (void)!write(STDERR_FILENO, line, length < static_cast<int>(sizeof(line)) ? length : sizeof(line) - 1);
}

// The core's file: beside this library's real file (symbolic links resolved), never looked up
// through LD_LIBRARY_PATH. False when this library cannot name itself.
constexpr std::size_t kPathLength = 4096;  // Linux's PATH_MAX

bool CorePath(char (&path)[kPathLength]) {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&CorePath), &info) == 0 || info.dli_fname == nullptr) return false;
  char* own = realpath(info.dli_fname, nullptr);
  if (own == nullptr) return false;
  char* slash = std::strrchr(own, '/');
  int length = -1;
  if (slash != nullptr) {
    *slash = '\0';
    length = std::snprintf(path, sizeof(path), "%s/%s", own, NCCLGUARD_CORE_FILE);
  }
  free(own);
  return length > 0 && length < static_cast<int>(sizeof(path));
}

// Called with g_load_mutex held: the core's table, or nullptr after saying why there is none.
const DoorEntries* Load() {
  char path[kPathLength];
  if (!CorePath(path)) {
    Say("cannot find its core", NCCLGUARD_CORE_FILE, "libncclguard.so cannot name its own file");
    return nullptr;
  }
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    Say("cannot load its core", path, dlerror());
    return nullptr;
  }
  const auto* entries = static_cast<const DoorEntries*>(RealDlsym()(handle, kDoorEntriesSymbol));
  const char* refused = nullptr;
  if (entries == nullptr) {
    refused = "it has no ncclguard_core_entries";
  } else if (entries->abi != DoorAbi()) {
    refused = "it comes from another build of ncclguard than libncclguard.so";
  }
  if (refused != nullptr) {
    Say("cannot use its core", path, refused);
    dlclose(handle);  // nothing of it was called
    return nullptr;
  }
  return entries;  // the handle stays open for the process's life
}

// NCCLGUARD_DISABLE asks for NCCL untouched: the core is not even loaded, so that a process under
// the kill switch maps nothing of ncclguard but this front end. Spelled as the core reads its
// booleans (common/config.cc); a value it would refuse is not "disabled", and the core says so.
bool DisabledByEnvironment() {
  const char* value = std::getenv("NCCLGUARD_DISABLE");
  if (value == nullptr) return false;
  for (const char* yes : {"1", "true", "yes", "on"}) {
    if (strcasecmp(value, yes) == 0) return true;
  }
  return false;
}

// A fork() while another thread loads the core must not leave the child's mutex locked.
void RegisterForkHandlersOnce() {
  static std::atomic<bool> registered{false};
  if (registered.exchange(true)) return;
  pthread_atfork([] { pthread_mutex_lock(&g_load_mutex); }, [] { pthread_mutex_unlock(&g_load_mutex); },
                 [] { pthread_mutex_unlock(&g_load_mutex); });
}

const DoorEntries* LoadOnce() noexcept {
  if (g_core_failed.load(std::memory_order_acquire) || t_loading) return nullptr;
  RegisterForkHandlersOnce();
  pthread_mutex_lock(&g_load_mutex);
  const DoorEntries* core = g_core.load(std::memory_order_acquire);
  if (core == nullptr && !g_core_failed.load(std::memory_order_acquire)) {
    t_loading = true;
    core = DisabledByEnvironment() ? nullptr : Load();
    t_loading = false;
    if (core != nullptr) {
      g_core.store(core, std::memory_order_release);
    } else {
      g_core_failed.store(true, std::memory_order_release);
    }
  }
  pthread_mutex_unlock(&g_load_mutex);
  return core;
}

// The core's table, loaded on first use; nullptr when it cannot be loaded.
inline const DoorEntries* Core() noexcept {
  const DoorEntries* core = g_core.load(std::memory_order_acquire);
  if (core != nullptr) [[likely]]
    return core;
  return LoadOnce();
}

}  // namespace
}  // namespace ncclguard::shim

// The trampolines, one per line of the list: hooks.h's declarations, defined here.
// NOLINTBEGIN(bugprone-macro-parentheses): `result` is a type and `parameters` a parameter list.
#define NCCLGUARD_DOOR_TRAMPOLINE(field, function, result, parameters, arguments, without_core) \
  auto ::ncclguard::function parameters noexcept->result {                                      \
    const DoorEntries* core = ::ncclguard::shim::Core();                                        \
    if (core == nullptr) return without_core;                                                   \
    return core->field arguments;                                                               \
  }
// NOLINTEND(bugprone-macro-parentheses)
NCCLGUARD_FOR_EACH_DOOR_FUNCTION(NCCLGUARD_DOOR_TRAMPOLINE)
#undef NCCLGUARD_DOOR_TRAMPOLINE
