// Loading for train_loop, which has no libnccl among its NEEDED libraries: libnccl enters the
// process only when a rank loads it, either directly with dlopen + dlsym on the handle (as Paddle
// does) or through a module of ours opened with RTLD_LOCAL (as PyTorch loads libtorch_cuda).
// Both handles stay open for the life of the process, as in those frameworks.
#include "nccl_api.h"
#include "self_path.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>

bool executable_links_nccl() { return false; }

namespace {

[[noreturn]] void fail_loading(const std::string& what) {
  std::fprintf(stderr, "train_loop: %s: %s\n", what.c_str(), dlerror());
  std::exit(EXIT_FAILURE);
}

template <typename Function>
void resolve(void* handle, const char* name, Function& slot) {
  void* address = dlsym(handle, name);
  if (address == nullptr) fail_loading(std::string("dlsym(libnccl.so.2, ") + name + ")");
  slot = reinterpret_cast<Function>(address);
}

NcclApi load_with_dlsym() {
  void* handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) fail_loading("dlopen(libnccl.so.2)");
  NcclApi api{};
  resolve(handle, "ncclGetVersion", api.getVersion);
  resolve(handle, "ncclGetUniqueId", api.getUniqueId);
  resolve(handle, "ncclCommInitRank", api.commInitRank);
  resolve(handle, "ncclBroadcast", api.broadcast);
  resolve(handle, "ncclAllReduce", api.allReduce);
  resolve(handle, "ncclCommDestroy", api.commDestroy);
  resolve(handle, "ncclGetErrorString", api.getErrorString);
  resolve(handle, "ncclGetLastError", api.getLastError);
  return api;
}

NcclApi load_through_local_module() {
  const std::string path = executable_directory() + "/" + kModuleFileName;
  void* module = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (module == nullptr) fail_loading("dlopen(" + path + ", RTLD_LOCAL)");
  auto* fill = reinterpret_cast<FillNcclApiFn*>(dlsym(module, kModuleFillFunction));
  if (fill == nullptr) fail_loading(std::string("dlsym(") + kModuleFileName + ", " + kModuleFillFunction + ")");
  NcclApi api{};
  fill(&api);
  return api;
}

}  // namespace

NcclApi load_nccl(NcclLoader loader) {
  switch (loader) {
    case NcclLoader::dlopen:
      return load_with_dlsym();
    case NcclLoader::rtld_local:
      return load_through_local_module();
    case NcclLoader::linked:
      break;
  }
  std::fprintf(stderr, "train_loop: --nccl-loader linked needs the train_loop_linked executable\n");
  std::exit(EXIT_FAILURE);
}
