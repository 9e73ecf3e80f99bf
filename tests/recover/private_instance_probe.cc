// Run by private_instance_tests in a process of its own, on the emulator: two ranks of one
// communicator on the process's NCCL, then two ranks on a private instance of the same library
// created with P2P turned off, an AllReduce on them, and the environment afterwards. Each phase is
// announced on stdout, where NCCL writes its INFO lines (NCCL_DEBUG=INFO), so the test can tell
// which instance chose which transport.
//
//   private_instance_probe <copies directory>
#include <cuda.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "watchdog/common/nccl_api.h"
#include "watchdog/recover/private_instance.h"

namespace {

constexpr int kRanks = 2;
constexpr int kCount = 4;

struct NcclFunctions {
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclCommInitRank) init_rank = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
};

void Say(const std::string& line) {
  std::printf("probe: %s\n", line.c_str());
  std::fflush(stdout);
}

int Fail(const std::string& what) {
  Say("FAILED " + what);
  return 1;
}

// Two ranks, one per device, created from this thread inside one group as a multi-GPU program
// does. NCCL reads its P2P settings during this.
ncclResult_t CreateRanks(const NcclFunctions& nccl, CUcontext* contexts, ncclComm_t* comms) {
  ncclUniqueId id;
  if (ncclResult_t result = nccl.get_unique_id(&id); result != ncclSuccess) return result;
  nccl.group_start();
  for (int rank = 0; rank < kRanks; ++rank) {
    cuCtxSetCurrent(contexts[rank]);
    nccl.init_rank(&comms[rank], kRanks, id, rank);
  }
  return nccl.group_end();
}

// A sum of the ranks' (rank + 1): 3 in every element on both ranks.
bool AllReduceWorks(const NcclFunctions& nccl, CUcontext* contexts, ncclComm_t* comms) {
  CUstream streams[kRanks];
  CUdeviceptr buffers[kRanks];
  for (int rank = 0; rank < kRanks; ++rank) {
    cuCtxSetCurrent(contexts[rank]);
    float values[kCount];
    for (float& value : values) value = static_cast<float>(rank + 1);
    if (cuStreamCreate(&streams[rank], CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
        cuMemAlloc(&buffers[rank], sizeof(values)) != CUDA_SUCCESS ||
        cuMemcpyHtoD(buffers[rank], values, sizeof(values)) != CUDA_SUCCESS) {
      return false;
    }
  }
  nccl.group_start();
  for (int rank = 0; rank < kRanks; ++rank) {
    void* buffer = reinterpret_cast<void*>(buffers[rank]);
    nccl.all_reduce(buffer, buffer, kCount, ncclFloat, ncclSum, comms[rank], streams[rank]);
  }
  if (nccl.group_end() != ncclSuccess) return false;
  for (int rank = 0; rank < kRanks; ++rank) {
    cuCtxSetCurrent(contexts[rank]);
    float values[kCount] = {};
    if (cuStreamSynchronize(streams[rank]) != CUDA_SUCCESS ||
        cuMemcpyDtoH(values, buffers[rank], sizeof(values)) != CUDA_SUCCESS) {
      return false;
    }
    for (const float value : values) {
      if (value != 3.0F) return false;
    }
  }
  return true;
}

void SayVariable(const char* name) {
  const char* value = std::getenv(name);
  Say(std::string("after: ") + name + (value != nullptr ? "=" + std::string(value) : " unset"));
}

}  // namespace

int main(int argc, char** argv) {
  using ncclguard::Api;
  if (argc != 2) return Fail("usage: private_instance_probe <copies directory>");
  CUcontext contexts[kRanks];
  if (cuInit(0) != CUDA_SUCCESS) return Fail("cuInit");
  for (int rank = 0; rank < kRanks; ++rank) {
    if (cuDevicePrimaryCtxRetain(&contexts[rank], rank) != CUDA_SUCCESS)
      return Fail("cuDevicePrimaryCtxRetain");
  }

  Say("phase default");
  const NcclFunctions process_nccl{&ncclGetUniqueId, &ncclGroupStart, &ncclGroupEnd, &ncclCommInitRank,
                                   &ncclAllReduce};
  ncclComm_t default_comms[kRanks] = {};
  if (CreateRanks(process_nccl, contexts, default_comms) != ncclSuccess) return Fail("default init");

  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&ncclGetVersion), &info) == 0) return Fail("dladdr");
  auto instance = ncclguard::PrivateNcclInstance::Load(info.dli_fname, argv[1]);
  if (!instance.ok()) return Fail(std::string(instance.status().message()));
  Say("phase private " + (*instance)->CopyPath() + " version " + std::to_string((*instance)->Version()));
  NcclFunctions private_nccl;
  private_nccl.get_unique_id =
      reinterpret_cast<decltype(&ncclGetUniqueId)>((*instance)->Function(Api::ncclGetUniqueId));
  private_nccl.group_start =
      reinterpret_cast<decltype(&ncclGroupStart)>((*instance)->Function(Api::ncclGroupStart));
  private_nccl.group_end =
      reinterpret_cast<decltype(&ncclGroupEnd)>((*instance)->Function(Api::ncclGroupEnd));
  private_nccl.init_rank =
      reinterpret_cast<decltype(&ncclCommInitRank)>((*instance)->Function(Api::ncclCommInitRank));
  private_nccl.all_reduce =
      reinterpret_cast<decltype(&ncclAllReduce)>((*instance)->Function(Api::ncclAllReduce));
  if (private_nccl.init_rank == &ncclCommInitRank) return Fail("the private instance is the process's");
  ncclComm_t private_comms[kRanks] = {};
  const ncclResult_t created = ncclguard::PrivateNcclInstance::WithP2pDisabled(
      [&] { return CreateRanks(private_nccl, contexts, private_comms); });
  if (created != ncclSuccess) return Fail("private init");
  Say("phase after");
  SayVariable("NCCL_P2P_DISABLE");
  SayVariable("NCCL_P2P_LEVEL");
  Say(std::string("private allreduce ") +
      (AllReduceWorks(private_nccl, contexts, private_comms) ? "ok" : "wrong"));
  (*instance)->Release();
  Say("released");
  return 0;
}
