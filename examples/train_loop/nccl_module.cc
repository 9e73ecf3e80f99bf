// libtrain_nccl_module.so: a library linked with -lnccl that train_loop dlopens with RTLD_LOCAL,
// the way Python loads a framework's CUDA extension (PyTorch's libtorch_cuda) that links libnccl.
// libnccl then lives only in this library's local scope: it is not in the global scope, so
// dlsym(RTLD_NEXT, "ncclAllReduce") from a preloaded library does not find it. The addresses
// handed out here are resolved like this library's own calls to NCCL: global scope first (a
// preloaded definition wins), then this library's dependencies.
#include "nccl_api.h"

#include <type_traits>

extern "C" __attribute__((visibility("default"))) void train_nccl_module_api(NcclApi* api) {
  *api = NcclApi{
      .getVersion = &ncclGetVersion,
      .getUniqueId = &ncclGetUniqueId,
      .commInitRank = &ncclCommInitRank,
      .broadcast = &ncclBroadcast,
      .allReduce = &ncclAllReduce,
      .commDestroy = &ncclCommDestroy,
      .getErrorString = &ncclGetErrorString,
      .getLastError = &ncclGetLastError,
  };
}

static_assert(std::is_same_v<decltype(train_nccl_module_api), FillNcclApiFn>);
