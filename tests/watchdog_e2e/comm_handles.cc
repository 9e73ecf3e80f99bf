// Creates communicators every way that does not need a launcher, in one process of four devices:
// ncclCommInitAll, ncclCommSplit of those (rank 3 with NCCL_SPLIT_NOCOLOR), ncclCommShrink of them
// without rank 3, an AllReduce on each, then closes them (the splits and shrunk ones destroyed, the
// first communicator aborted, the rest destroyed).
//
// Prints the address of every communicator the application holds ("comm R: 0x..."), what NCCL
// says of each ("rank R: rank R of N"; "split R: rank r of n" or "split R: none"; "shrink R: ..."),
// and whether each AllReduce delivered the expected sum. The tests compare the addresses with
// those ncclguard's wrappers passed to NCCL (NCCLGUARD_LOG_LEVEL=trace).
#include <cstdio>
#include <vector>

#include "tests/watchdog_e2e/program_support.h"

namespace {

constexpr int kRanks = 4;
constexpr size_t kCount = 256;

struct Device {
  CUcontext context = nullptr;
  CUstream stream = nullptr;
  CUdeviceptr buffer = 0;
};

void MakeCurrent(const Device& device) { e2e::CheckCuda(cuCtxSetCurrent(device.context), "cuCtxSetCurrent"); }

Device PrepareDevice(int index) {
  Device prepared;
  CUdevice device = 0;
  e2e::CheckCuda(cuDeviceGet(&device, index), "cuDeviceGet");
  e2e::CheckCuda(cuDevicePrimaryCtxRetain(&prepared.context, device), "cuDevicePrimaryCtxRetain");
  MakeCurrent(prepared);
  e2e::CheckCuda(cuStreamCreate(&prepared.stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  prepared.buffer = e2e::AllocateFloats(kCount);
  return prepared;
}

// Every rank of `comms` that has a communicator contributes rank + 1; prints whether each got the
// sum of its communicator's contributions (`expected[rank]`).
void AllReduce(const char* what, std::vector<Device>& devices, const std::vector<ncclComm_t>& comms,
               const std::vector<float>& expected) {
  e2e::CheckNccl(ncclGroupStart(), "ncclGroupStart");
  for (int r = 0; r < kRanks; ++r) {
    if (comms[r] == nullptr) continue;
    MakeCurrent(devices[r]);
    std::vector<float> values(kCount, static_cast<float>(r + 1));
    e2e::CheckCuda(cuMemcpyHtoD(devices[r].buffer, values.data(), kCount * sizeof(float)), "cuMemcpyHtoD");
    e2e::CheckNccl(
        ncclAllReduce(reinterpret_cast<void*>(devices[r].buffer), reinterpret_cast<void*>(devices[r].buffer),
                      kCount, ncclFloat32, ncclSum, comms[r], devices[r].stream),
        "ncclAllReduce");
  }
  e2e::CheckNccl(ncclGroupEnd(), "ncclGroupEnd");
  bool correct = true;
  for (int r = 0; r < kRanks; ++r) {
    if (comms[r] == nullptr) continue;
    MakeCurrent(devices[r]);
    e2e::CheckCuda(cuStreamSynchronize(devices[r].stream), "cuStreamSynchronize");
    std::vector<float> values(kCount);
    e2e::CheckCuda(cuMemcpyDtoH(values.data(), devices[r].buffer, kCount * sizeof(float)), "cuMemcpyDtoH");
    for (const float value : values) correct = correct && value == expected[r];
  }
  std::printf("%s allreduce %s\n", what, correct ? "ok" : "wrong");
}

}  // namespace

int main() {
  e2e::CheckCuda(cuInit(0), "cuInit");
  std::vector<Device> devices;
  for (int r = 0; r < kRanks; ++r) devices.push_back(PrepareDevice(r));

  std::vector<ncclComm_t> comms(kRanks, nullptr);
  e2e::CheckNccl(ncclCommInitAll(comms.data(), kRanks, nullptr), "ncclCommInitAll");
  for (int r = 0; r < kRanks; ++r) {
    int user_rank = -1, count = 0;
    e2e::CheckNccl(ncclCommUserRank(comms[r], &user_rank), "ncclCommUserRank");
    e2e::CheckNccl(ncclCommCount(comms[r], &count), "ncclCommCount");
    std::printf("comm %d: %p\nrank %d: rank %d of %d\n", r, static_cast<void*>(comms[r]), r, user_rank,
                count);
  }
  AllReduce("world", devices, comms, std::vector<float>(kRanks, kRanks * (kRanks + 1) / 2));

  // Even ranks and odd ranks, rank 3 left out: {0, 2} and {1}.
  std::vector<ncclComm_t> splits(kRanks, nullptr);
  e2e::CheckNccl(ncclGroupStart(), "ncclGroupStart");
  for (int r = 0; r < kRanks; ++r) {
    MakeCurrent(devices[r]);
    const int color = r == 3 ? NCCL_SPLIT_NOCOLOR : r % 2;
    e2e::CheckNccl(ncclCommSplit(comms[r], color, r, &splits[r], nullptr), "ncclCommSplit");
  }
  e2e::CheckNccl(ncclGroupEnd(), "ncclGroupEnd");
  for (int r = 0; r < kRanks; ++r) {
    if (splits[r] == nullptr) {
      std::printf("split %d: none\n", r);
      continue;
    }
    int user_rank = -1, count = 0;
    e2e::CheckNccl(ncclCommUserRank(splits[r], &user_rank), "ncclCommUserRank");
    e2e::CheckNccl(ncclCommCount(splits[r], &count), "ncclCommCount");
    std::printf("comm split %d: %p\nsplit %d: rank %d of %d\n", r, static_cast<void*>(splits[r]), r,
                user_rank, count);
  }
  AllReduce("split", devices, splits, {1 + 3, 2, 1 + 3, 0});

  // Ranks 0 to 2 without rank 3, which does not take part.
  std::vector<ncclComm_t> shrunk(kRanks, nullptr);
  int excluded[] = {3};
  e2e::CheckNccl(ncclGroupStart(), "ncclGroupStart");
  for (int r = 0; r < kRanks - 1; ++r) {
    MakeCurrent(devices[r]);
    e2e::CheckNccl(ncclCommShrink(comms[r], excluded, 1, &shrunk[r], nullptr, NCCL_SHRINK_DEFAULT),
                   "ncclCommShrink");
  }
  e2e::CheckNccl(ncclGroupEnd(), "ncclGroupEnd");
  for (int r = 0; r < kRanks - 1; ++r) {
    int user_rank = -1, count = 0;
    e2e::CheckNccl(ncclCommUserRank(shrunk[r], &user_rank), "ncclCommUserRank");
    e2e::CheckNccl(ncclCommCount(shrunk[r], &count), "ncclCommCount");
    std::printf("comm shrink %d: %p\nshrink %d: rank %d of %d\n", r, static_cast<void*>(shrunk[r]), r,
                user_rank, count);
  }
  AllReduce("shrink", devices, shrunk, {6, 6, 6, 0});

  for (ncclComm_t comm : splits) {
    if (comm != nullptr) e2e::CheckNccl(ncclCommDestroy(comm), "ncclCommDestroy");
  }
  for (ncclComm_t comm : shrunk) {
    if (comm != nullptr) e2e::CheckNccl(ncclCommDestroy(comm), "ncclCommDestroy");
  }
  e2e::CheckNccl(ncclCommAbort(comms[0]), "ncclCommAbort");
  for (int r = 1; r < kRanks; ++r) e2e::CheckNccl(ncclCommDestroy(comms[r]), "ncclCommDestroy");
  std::printf("closed\n");
  return 0;
}
