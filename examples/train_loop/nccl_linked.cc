// Loading for train_loop_linked, which is linked with -lnccl: the dynamic linker loaded libnccl
// before main, and the addresses below are resolved by the ordinary global symbol lookup, so an
// LD_PRELOADed library that defines nccl* functions is what the job calls, as in any program
// linked with NCCL.
#include "nccl_api.h"

#include <cstdio>
#include <cstdlib>

bool executable_links_nccl() { return true; }

NcclApi load_nccl(NcclLoader loader) {
  if (loader != NcclLoader::linked) {
    std::fprintf(stderr, "train_loop_linked: --nccl-loader %s needs the train_loop executable\n",
                 loader_name(loader).data());
    std::exit(EXIT_FAILURE);
  }
  return NcclApi{
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
