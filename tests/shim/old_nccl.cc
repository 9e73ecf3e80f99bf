// A stand-in for an older libnccl (2.18.5): it lacks every function added since, so ncclguard's
// tolerance of missing functions can be tested. Like real NCCL, ncclBcast calls ncclBroadcast
// through the PLT (the symbols are weak and exported).
#include <nccl.h>

#include <cstring>

#define OLD_NCCL_API extern "C" __attribute__((visibility("default"), weak))

OLD_NCCL_API ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = 21805;
  return ncclSuccess;
}
OLD_NCCL_API ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return ncclInvalidArgument;
  std::memset(id, 0x5a, sizeof(*id));
  return ncclSuccess;
}
OLD_NCCL_API ncclResult_t ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int) {
  return ncclUnhandledCudaError;
}
OLD_NCCL_API const char* ncclGetLastError(ncclComm_t) { return "old nccl has no GPU"; }
OLD_NCCL_API const char* ncclGetErrorString(ncclResult_t result) {
  return result == ncclSuccess ? "no error" : "some error";
}
OLD_NCCL_API ncclResult_t ncclBroadcast(const void*, void*, size_t, ncclDataType_t, int,
                                        ncclComm_t comm, cudaStream_t) {
  return comm == nullptr ? ncclInvalidArgument : ncclSuccess;
}
OLD_NCCL_API ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                                    ncclComm_t comm, cudaStream_t stream) {
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}
