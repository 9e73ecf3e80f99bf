// A stand-in for libnccl (tests and bench/handles_bench.cc) that tells which copy of it served a call: the
// test loads it from several file names, and each copy has its own `fake_nccl_id` and remembers the
// communicator it was given.
#include <nccl.h>

#include <cstdint>

extern "C" {

__attribute__((visibility("default"))) int fake_nccl_id = 0;
__attribute__((visibility("default"))) ncclComm_t fake_nccl_last_comm = nullptr;
__attribute__((visibility("default"))) int fake_nccl_destroyed = 0;

namespace {
// What this copy's ncclCommInitRank hands out: a communicator is just an address to the test.
std::uint64_t g_created_comm[4];
}  // namespace

__attribute__((visibility("default"))) ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  fake_nccl_last_comm = comm;
  *count = fake_nccl_id;
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  fake_nccl_last_comm = comm;
  *rank = 0;
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  fake_nccl_last_comm = comm;
  *device = 0;
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclResult_t ncclCommInitRank(ncclComm_t* comm, int, ncclUniqueId,
                                                                     int) {
  *comm = reinterpret_cast<ncclComm_t>(g_created_comm);
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* error) {
  *error = ncclSuccess;
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  fake_nccl_last_comm = comm;
  ++fake_nccl_destroyed;
  return ncclSuccess;
}

// Does nothing, as cheaply as possible: bench/handles_bench.cc measures the wrapper around it.
__attribute__((visibility("default"))) ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t,
                                                                  ncclRedOp_t, ncclComm_t, cudaStream_t) {
  return ncclSuccess;
}

__attribute__((visibility("default"))) const char* ncclGetLastError(ncclComm_t) { return ""; }

}  // extern "C"
