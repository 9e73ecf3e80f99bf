// Creates and destroys one-rank communicators, one AllReduce each, and prints the process's
// resident memory after the first 1,000 cycles and after all of them (argv[1], default 10000):
//   "rss_kb after 1000 cycles: N" and "rss_kb after C cycles: N"
// Each time after a second's pause, in which a watchdog releases what was closed. argv[2]: a pause
// after each cycle in microseconds (default 0), as a real initialisation takes far longer.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "tests/watchdog_e2e/program_support.h"

namespace {

long ResidentKilobytes() {
  FILE* status = std::fopen("/proc/self/status", "r");
  if (status == nullptr) return -1;
  char line[256];
  long kilobytes = -1;
  while (std::fgets(line, sizeof(line), status) != nullptr) {
    if (std::strncmp(line, "VmRSS:", 6) == 0) kilobytes = std::strtol(line + 6, nullptr, 10);
  }
  std::fclose(status);
  return kilobytes;
}

}  // namespace

int main(int argc, char** argv) {
  const long cycles = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 10000;
  const long pause_us = argc > 2 ? std::strtol(argv[2], nullptr, 10) : 0;
  const e2e::Gpu gpu = e2e::StartOneRank();
  e2e::CheckNccl(ncclCommDestroy(gpu.comm), "ncclCommDestroy");
  constexpr size_t kCount = 64;
  const CUdeviceptr buffer = e2e::AllocateFloats(kCount);
  const auto data = reinterpret_cast<void*>(buffer);
  for (long cycle = 1; cycle <= cycles; ++cycle) {
    ncclUniqueId id;
    e2e::CheckNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    ncclComm_t comm = nullptr;
    e2e::CheckNccl(ncclCommInitRank(&comm, 1, id, 0), "ncclCommInitRank");
    e2e::CheckNccl(ncclAllReduce(data, data, kCount, ncclFloat, ncclSum, comm, gpu.stream), "ncclAllReduce");
    e2e::CheckCuda(cuStreamSynchronize(gpu.stream), "cuStreamSynchronize");
    e2e::CheckNccl(ncclCommDestroy(comm), "ncclCommDestroy");
    if (pause_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
    if (cycle == 1000 || cycle == cycles) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      std::printf("rss_kb after %ld cycles: %ld\n", cycle, ResidentKilobytes());
      std::fflush(stdout);
    }
  }
  return 0;
}
