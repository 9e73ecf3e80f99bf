// Creates a four-rank communicator in one process, one rank per device (0..3), the ways JAX/XLA
// and NCCL's own benchmarks do: every ncclCommInitRank inside one group (`group`), each rank in a
// thread of its own inside its own group (`threads`), or non-blocking inside one group and
// completed through ncclCommGetAsyncError (`nonblocking`). Then one AllReduce on every rank.
//
// Prints what NCCL says of each rank ("rank R: rank R of 4 on device D"), whether the AllReduce
// delivered the expected sum, and the text of ncclGetLastError at the end ("last error: "...""),
// which the tests compare with and without ncclguard.
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/watchdog_e2e/program_support.h"

namespace {

constexpr int kRanks = 4;
constexpr size_t kCount = 256;

struct Rank {
  CUcontext context = nullptr;
  CUstream stream = nullptr;
  CUdeviceptr buffer = 0;
  ncclComm_t comm = nullptr;
};

void MakeCurrent(const Rank& rank) { e2e::CheckCuda(cuCtxSetCurrent(rank.context), "cuCtxSetCurrent"); }

// The device's primary context, a stream and a buffer holding rank + 1 everywhere.
Rank PrepareDevice(int device_index) {
  Rank rank;
  CUdevice device = 0;
  e2e::CheckCuda(cuDeviceGet(&device, device_index), "cuDeviceGet");
  e2e::CheckCuda(cuDevicePrimaryCtxRetain(&rank.context, device), "cuDevicePrimaryCtxRetain");
  MakeCurrent(rank);
  e2e::CheckCuda(cuStreamCreate(&rank.stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  std::vector<float> values(kCount, static_cast<float>(device_index + 1));
  e2e::CheckCuda(cuMemAlloc(&rank.buffer, kCount * sizeof(float)), "cuMemAlloc");
  e2e::CheckCuda(cuMemcpyHtoD(rank.buffer, values.data(), kCount * sizeof(float)), "cuMemcpyHtoD");
  return rank;
}

// A group's end: for non-blocking communicators NCCL may answer ncclInProgress, and each
// communicator says through ncclCommGetAsyncError when its part is done.
void EndGroup(const std::vector<Rank>& ranks, const char* what) {
  const ncclResult_t ended = ncclGroupEnd();
  if (ended != ncclInProgress) e2e::CheckNccl(ended, what);
  for (const Rank& rank : ranks) {
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress) e2e::CheckNccl(ncclCommGetAsyncError(rank.comm, &state), "ncclCommGetAsyncError");
    e2e::CheckNccl(state, what);
  }
}

void InitInOneGroup(std::vector<Rank>& ranks, const ncclUniqueId& id, ncclConfig_t* config) {
  e2e::CheckNccl(ncclGroupStart(), "ncclGroupStart");
  for (int r = 0; r < kRanks; ++r) {
    MakeCurrent(ranks[r]);
    e2e::CheckNccl(ncclCommInitRankConfig(&ranks[r].comm, kRanks, id, r, config), "ncclCommInitRankConfig");
  }
  EndGroup(ranks, "ncclGroupEnd of the initialisations");
}

void InitInThreads(std::vector<Rank>& ranks, const ncclUniqueId& id) {
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&ranks, &id, r] {
      MakeCurrent(ranks[r]);
      e2e::CheckNccl(ncclGroupStart(), "ncclGroupStart");
      e2e::CheckNccl(ncclCommInitRank(&ranks[r].comm, kRanks, id, r), "ncclCommInitRank");
      e2e::CheckNccl(ncclGroupEnd(), "ncclGroupEnd");
    });
  }
  for (std::thread& thread : threads) thread.join();
}

void AllReduce(std::vector<Rank>& ranks) {
  e2e::CheckNccl(ncclGroupStart(), "ncclGroupStart");
  for (Rank& rank : ranks) {
    MakeCurrent(rank);
    e2e::CheckNccl(ncclAllReduce(reinterpret_cast<void*>(rank.buffer), reinterpret_cast<void*>(rank.buffer), kCount,
                                 ncclFloat32, ncclSum, rank.comm, rank.stream),
                   "ncclAllReduce");
  }
  EndGroup(ranks, "ncclGroupEnd of the AllReduce");
  bool correct = true;
  for (Rank& rank : ranks) {
    MakeCurrent(rank);
    e2e::CheckCuda(cuStreamSynchronize(rank.stream), "cuStreamSynchronize");
    std::vector<float> values(kCount);
    e2e::CheckCuda(cuMemcpyDtoH(values.data(), rank.buffer, kCount * sizeof(float)), "cuMemcpyDtoH");
    for (const float value : values) correct = correct && value == kRanks * (kRanks + 1) / 2;
  }
  std::printf("allreduce %s\n", correct ? "ok" : "wrong");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 2 ? argv[1] : "";
  if (mode != "group" && mode != "threads" && mode != "nonblocking") {
    std::fprintf(stderr, "usage: %s group|threads|nonblocking\n", argv[0]);
    return 2;
  }
  e2e::CheckCuda(cuInit(0), "cuInit");
  std::vector<Rank> ranks;
  for (int r = 0; r < kRanks; ++r) ranks.push_back(PrepareDevice(r));
  ncclUniqueId id;
  e2e::CheckNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  if (mode == "threads") {
    InitInThreads(ranks, id);
  } else {
    InitInOneGroup(ranks, id, mode == "nonblocking" ? &config : nullptr);
  }
  for (int r = 0; r < kRanks; ++r) {
    int user_rank = -1, count = 0, device = -1;
    e2e::CheckNccl(ncclCommUserRank(ranks[r].comm, &user_rank), "ncclCommUserRank");
    e2e::CheckNccl(ncclCommCount(ranks[r].comm, &count), "ncclCommCount");
    e2e::CheckNccl(ncclCommCuDevice(ranks[r].comm, &device), "ncclCommCuDevice");
    std::printf("rank %d: rank %d of %d on device %d\n", r, user_rank, count, device);
  }
  AllReduce(ranks);
  std::printf("last error: \"%s\"\n", ncclGetLastError(nullptr));
  std::fflush(stdout);
  for (Rank& rank : ranks) {
    const ncclResult_t destroyed = ncclCommDestroy(rank.comm);
    if (destroyed != ncclInProgress) e2e::CheckNccl(destroyed, "ncclCommDestroy");
  }
  return 0;
}
