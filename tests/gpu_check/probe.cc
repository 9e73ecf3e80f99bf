// What scripts/gpu-check.sh runs on a real GPU (and, to rehearse, on the emulator): one-rank
// communicators on device 0 through the driver API, each mode printing what it measured.
//
//   gpu_check_probe timing COUNT REPEATS   AllReduces of COUNT floats, one at a time: per
//                                          operation its host (wall) window and its time between
//                                          CUDA events recorded around it by this program
//   gpu_check_probe stall SECONDS          the stream is held by a host function for SECONDS
//                                          before an AllReduce: the collective waits, not started
//   gpu_check_probe abort SECONDS          the same, and the communicator is aborted meanwhile
//   gpu_check_probe profiler COUNT REPEATS AllReduces of COUNT floats, then the rank's Send and
//                                          Recv to itself in a group, each REPEATS times: what
//                                          NCCL's profiler reports of them is in the exit dump
//
// Lines are "key=value" pairs; the last line is "<mode> done". Exit 1 on a failed call.
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "tests/watchdog_e2e/program_support.h"

namespace {

long long WallNs() {
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<long long>(now.tv_sec) * 1000000000LL + now.tv_nsec;
}

struct Buffers {
  CUdeviceptr send = 0;
  CUdeviceptr receive = 0;
  size_t count = 0;
};

// The communicator stays alive to the end, so that a dump taken at exit holds its operations,
// and the watchdog gets a moment (several poll intervals of the check) to see the last one finish.
void LeaveForTheExitDump() { std::this_thread::sleep_for(std::chrono::milliseconds(500)); }

Buffers Allocate(size_t count) { return Buffers{e2e::AllocateFloats(count), e2e::AllocateFloats(count), count}; }

void AllReduce(const e2e::Gpu& gpu, const Buffers& buffers) {
  e2e::CheckNccl(ncclAllReduce(reinterpret_cast<void*>(buffers.send), reinterpret_cast<void*>(buffers.receive),
                               buffers.count, ncclFloat, ncclSum, gpu.comm, gpu.stream),
                 "ncclAllReduce");
}

int Timing(size_t count, int repeats) {
  const e2e::Gpu gpu = e2e::StartOneRank();
  const Buffers buffers = Allocate(count);
  CUevent before = nullptr, after = nullptr;
  e2e::CheckCuda(cuEventCreate(&before, CU_EVENT_DEFAULT), "cuEventCreate");
  e2e::CheckCuda(cuEventCreate(&after, CU_EVENT_DEFAULT), "cuEventCreate");
  for (int seq = 1; seq <= repeats; ++seq) {
    const long long host_start = WallNs();
    e2e::CheckCuda(cuEventRecord(before, gpu.stream), "cuEventRecord");
    AllReduce(gpu, buffers);
    e2e::CheckCuda(cuEventRecord(after, gpu.stream), "cuEventRecord");
    e2e::CheckCuda(cuStreamSynchronize(gpu.stream), "cuStreamSynchronize");
    const long long host_end = WallNs();
    float event_ms = 0;
    e2e::CheckCuda(cuEventElapsedTime(&event_ms, before, after), "cuEventElapsedTime");
    std::printf("seq=%d bytes=%zu host_start_ns=%lld host_end_ns=%lld event_ms=%.4f\n", seq, count * sizeof(float),
                host_start, host_end, event_ms);
  }
  LeaveForTheExitDump();
  std::printf("timing done\n");
  return 0;
}

// Holds the stream in a host function, as a stuck kernel ahead of the collective would.
struct StreamHold {
  double seconds = 0;
  std::atomic<long long> released_ns{0};

  static void CUDA_CB Run(void* self) {
    auto* hold = static_cast<StreamHold*>(self);
    std::this_thread::sleep_for(std::chrono::duration<double>(hold->seconds));
    hold->released_ns.store(WallNs());
  }
};

// A first AllReduce runs normally (#1); the second (#2) waits behind the held stream.
e2e::Gpu StartHeld(StreamHold& hold) {
  e2e::Gpu gpu = e2e::StartOneRank();
  const Buffers buffers = Allocate(1024);
  AllReduce(gpu, buffers);
  e2e::CheckCuda(cuStreamSynchronize(gpu.stream), "cuStreamSynchronize");
  e2e::CheckCuda(cuLaunchHostFunc(gpu.stream, StreamHold::Run, &hold), "cuLaunchHostFunc");
  std::printf("held_at_ns=%lld\n", WallNs());
  std::fflush(stdout);
  AllReduce(gpu, buffers);
  return gpu;
}

int Stall(double seconds) {
  StreamHold hold;
  hold.seconds = seconds;
  const e2e::Gpu gpu = StartHeld(hold);
  e2e::CheckCuda(cuStreamSynchronize(gpu.stream), "cuStreamSynchronize");
  std::printf("released_at_ns=%lld synchronized_at_ns=%lld\n", hold.released_ns.load(), WallNs());
  LeaveForTheExitDump();
  std::printf("stall done\n");
  return 0;
}

int Abort(double seconds) {
  StreamHold hold;
  hold.seconds = seconds;
  const e2e::Gpu gpu = StartHeld(hold);
  const auto start = std::chrono::steady_clock::now();
  const ncclResult_t aborted = ncclCommAbort(gpu.comm);
  const double abort_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("abort_result=%s abort_seconds=%.3f\n", ncclGetErrorString(aborted), abort_seconds);
  std::fflush(stdout);
  // The aborted collective's output is garbage; the stream itself must still drain.
  const CUresult drained = cuStreamSynchronize(gpu.stream);
  const char* name = nullptr;
  cuGetErrorName(drained, &name);
  std::printf("stream_after_abort=%s\n", name != nullptr ? name : "unknown");
  std::printf("abort done\n");
  return aborted == ncclSuccess ? 0 : 1;
}

// What NCCL's profiler plugin API reports of a one-rank communicator's work: the collectives and
// a point-to-point transfer of the rank to itself (a group of a Send and a Recv, as PyTorch's
// send/recv pairs do).
void SendRecvToSelf(const e2e::Gpu& gpu, const Buffers& buffers) {
  e2e::CheckNccl(ncclGroupStart(), "ncclGroupStart");
  e2e::CheckNccl(
      ncclSend(reinterpret_cast<void*>(buffers.send), buffers.count, ncclFloat, 0, gpu.comm, gpu.stream),
      "ncclSend");
  e2e::CheckNccl(
      ncclRecv(reinterpret_cast<void*>(buffers.receive), buffers.count, ncclFloat, 0, gpu.comm, gpu.stream),
      "ncclRecv");
  e2e::CheckNccl(ncclGroupEnd(), "ncclGroupEnd");
}

// Then the cost: host time per group of a small Send and Recv to itself (what NCCL profiles on
// one rank), and wall time per group with the GPU, over many groups.
int Profiler(size_t count, int repeats) {
  const e2e::Gpu gpu = e2e::StartOneRank();
  const Buffers buffers = Allocate(count);
  for (int i = 0; i < repeats; ++i) AllReduce(gpu, buffers);
  e2e::CheckCuda(cuStreamSynchronize(gpu.stream), "cuStreamSynchronize");
  for (int i = 0; i < repeats; ++i) SendRecvToSelf(gpu, buffers);
  e2e::CheckCuda(cuStreamSynchronize(gpu.stream), "cuStreamSynchronize");

  constexpr int kTimedGroups = 2000;
  const Buffers small = Allocate(256);
  long long host_ns = 0;
  const long long wall_start = WallNs();
  for (int i = 0; i < kTimedGroups; ++i) {
    const long long start = WallNs();
    SendRecvToSelf(gpu, small);
    host_ns += WallNs() - start;
  }
  e2e::CheckCuda(cuStreamSynchronize(gpu.stream), "cuStreamSynchronize");
  std::printf("p2p_group_host_ns=%.1f p2p_group_wall_ns=%.1f\n", static_cast<double>(host_ns) / kTimedGroups,
              static_cast<double>(WallNs() - wall_start) / kTimedGroups);
  LeaveForTheExitDump();
  std::printf("profiler done\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "timing" && argc == 4) return Timing(std::strtoull(argv[2], nullptr, 10), std::atoi(argv[3]));
  if (mode == "stall" && argc == 3) return Stall(std::strtod(argv[2], nullptr));
  if (mode == "abort" && argc == 3) return Abort(std::strtod(argv[2], nullptr));
  if (mode == "profiler" && argc == 4) return Profiler(std::strtoull(argv[2], nullptr, 10), std::atoi(argv[3]));
  std::fprintf(stderr, "usage: %s timing COUNT REPEATS | stall SECONDS | abort SECONDS | profiler COUNT REPEATS\n",
               argv[0]);
  return 2;
}
