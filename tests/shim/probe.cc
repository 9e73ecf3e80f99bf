// Calls NCCL the way a framework does, chosen at build time:
//   PROBE_LINKED      the program links libnccl (plain C/C++ programs, MPI codes);
//   PROBE_DLOPEN      dlopen("libnccl.so.2") + dlsym on the handle (Paddle, JAX/XLA, vLLM);
//   PROBE_RTLD_LOCAL  dlopen(RTLD_LOCAL) of a library that links libnccl (PyTorch wheels);
//   PROBE_BRIDGE      that library itself.
// Prints what NCCL answered, one fact per line, so runs with and without ncclguard compare.
#include <dlfcn.h>
#include <nccl.h>
#include <strings.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

struct NcclFunctions {
  decltype(&ncclGetVersion) get_version;
  decltype(&ncclGetUniqueId) get_unique_id;
  decltype(&ncclCommInitRank) comm_init_rank;
  decltype(&ncclGetLastError) get_last_error;
  decltype(&ncclGetErrorString) get_error_string;
  decltype(&ncclBcast) bcast;
};

const char* ObjectOf(void* function) {
  Dl_info info;
  return dladdr(function, &info) != 0 && info.dli_fname != nullptr ? info.dli_fname : "?";
}

// Where NCCL 2.28 looks for its profiler plugin at its first communicator, which fails before it
// gets there without a GPU: the library NCCL_PROFILER_PLUGIN names (STATIC_PLUGIN: the process
// itself), and the names of the plugin structures it finds there ("-" for none).
void PrintProfilerLookup() {
  const char* value = std::getenv("NCCL_PROFILER_PLUGIN");
  if (value == nullptr) {
    std::printf("profiler_lookup unset\n");
    return;
  }
  void* handle = strncasecmp(value, "STATIC_PLUGIN", std::strlen(value)) == 0
                     ? dlopen(nullptr, RTLD_NOW)
                     : dlopen(value, RTLD_NOW | RTLD_LOCAL);
  auto name_of = [&](const char* symbol) {
    // The structure's first member is the plugin's name.
    auto* const* plugin =
        handle != nullptr ? static_cast<const char* const*>(dlsym(handle, symbol)) : nullptr;
    return plugin != nullptr ? *plugin : "-";
  };
  std::printf("profiler_lookup %s %s %s %s\n", value, name_of("ncclProfiler_v4"), name_of("ncclProfiler_v5"),
              name_of("ncclProfiler_v6"));
}

[[maybe_unused]] int RunProbe(const NcclFunctions& nccl) {
  int version = 0;
  const ncclResult_t version_result = nccl.get_version(&version);
  std::printf("version %s %d\n", nccl.get_error_string(version_result), version);
  std::printf("get_version_from %s\n", ObjectOf(reinterpret_cast<void*>(nccl.get_version)));
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  std::printf("unique_id %d\n", static_cast<int>(nccl.get_unique_id(&id)));
  ncclComm_t comm = nullptr;
  std::printf("init %d\n", static_cast<int>(nccl.comm_init_rank(&comm, 1, id, 0)));
  std::printf("last_error %s\n", nccl.get_last_error(nullptr));
  // NCCL's ncclBcast calls ncclBroadcast through its PLT: one call, re-entering an interposer.
  std::printf("bcast %d\n", static_cast<int>(nccl.bcast(nullptr, 1, ncclFloat, 0, nullptr, nullptr)));
  PrintProfilerLookup();
  return 0;
}

#if defined(PROBE_LINKED) || defined(PROBE_BRIDGE)
NcclFunctions LinkedFunctions() {
  return {&ncclGetVersion,   &ncclGetUniqueId,    &ncclCommInitRank,
          &ncclGetLastError, &ncclGetErrorString, &ncclBcast};
}
#endif

}  // namespace

#if defined(PROBE_BRIDGE)
extern "C" __attribute__((visibility("default"))) int probe_bridge_run() {
  return RunProbe(LinkedFunctions());
}
#else
int main(int argc, char** argv) {
#if defined(PROBE_LINKED)
  (void)argc;
  (void)argv;
  return RunProbe(LinkedFunctions());
#elif defined(PROBE_DLOPEN)
  const char* library = argc > 1 ? argv[1] : "libnccl.so.2";
  void* handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::fprintf(stderr, "dlopen %s: %s\n", library, dlerror());
    return 2;
  }
  NcclFunctions nccl{};
  nccl.get_version = reinterpret_cast<decltype(nccl.get_version)>(dlsym(handle, "ncclGetVersion"));
  nccl.get_unique_id = reinterpret_cast<decltype(nccl.get_unique_id)>(dlsym(handle, "ncclGetUniqueId"));
  nccl.comm_init_rank = reinterpret_cast<decltype(nccl.comm_init_rank)>(dlsym(handle, "ncclCommInitRank"));
  nccl.get_last_error = reinterpret_cast<decltype(nccl.get_last_error)>(dlsym(handle, "ncclGetLastError"));
  nccl.get_error_string =
      reinterpret_cast<decltype(nccl.get_error_string)>(dlsym(handle, "ncclGetErrorString"));
  nccl.bcast = reinterpret_cast<decltype(nccl.bcast)>(dlsym(handle, "ncclBcast"));
  // A function the library may lack: dlsym must answer exactly as without ncclguard.
  std::printf("has_comm_shrink %d\n", dlsym(handle, "ncclCommShrink") != nullptr);
  return RunProbe(nccl);
#elif defined(PROBE_RTLD_LOCAL)
  if (argc < 2) return 2;
  void* bridge = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (bridge == nullptr) {
    std::fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
    return 2;
  }
  auto run = reinterpret_cast<int (*)()>(dlsym(bridge, "probe_bridge_run"));
  return run != nullptr ? run() : 2;
#endif
}
#endif
