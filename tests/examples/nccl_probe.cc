// A minimal LD_PRELOAD interposer of ncclAllReduce for the loader tests: it says once whether it
// was reached and whether dlsym(RTLD_NEXT) finds the library's definition, then forwards.
#include <nccl.h>

#include <dlfcn.h>

#include <cstdio>

namespace {

using AllReduceFn = decltype(&ncclAllReduce);

AllReduceFn find_next() {
  void* next = dlsym(RTLD_NEXT, "ncclAllReduce");
  std::fprintf(stderr, "probe: ncclAllReduce intercepted; RTLD_NEXT %s\n", next != nullptr ? "finds libnccl" : "does not find libnccl");
  if (next == nullptr) {
    // libnccl is loaded, just not in the global scope: ask for it by name.
    void* library = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
    next = library != nullptr ? dlsym(library, "ncclAllReduce") : nullptr;
  }
  return reinterpret_cast<AllReduceFn>(next);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                                                             ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                                                             cudaStream_t stream) {
  static const AllReduceFn next = find_next();
  return next != nullptr ? next(sendbuff, recvbuff, count, datatype, op, comm, stream) : ncclSystemError;
}
