// A job whose ranks each hold two communicators, as a program with a data-parallel and a
// model-parallel group does: every rank issues its first AllReduce on each, on a stream of each,
// and only then waits for both. With --crossed the odd ranks issue them in the other order (NCCL
// allows it: they are different communicators on different streams). With --split, each rank then
// splits the first communicator and runs an AllReduce on the child. With --reduce, the first
// communicator's operations are in-place Reduces to rank 0 instead (only rank 0's buffer is both
// input and output). With --exchange, the second communicator's operations are a ring exchange
// instead: each rank sends its buffer to the next rank and receives the previous rank's, in one
// group. With --late, each rank then creates a third communicator and runs an AllReduce on it.
// With --queued, every step's operations are issued back to back, on a buffer of their own, and
// the ranks wait only once at the end, as DDP queues its first broadcasts. The
// parent process makes the unique ids and forks the ranks; each rank
// checks every result and says so.
//
//   two_comms --ranks N [--count C] [--steps S] [--crossed] [--split] [--reduce] [--exchange]
//             [--late] [--queued]
#include <cuda.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/recovery_e2e/fork_ranks.h"

namespace {

struct Options {
  int ranks = 2;
  size_t count = 4096;
  int steps = 2;
  bool crossed = false;
  bool split = false;
  bool reduce = false;
  bool exchange = false;
  bool late = false;
  bool queued = false;
};

[[noreturn]] void Fail(int rank, const std::string& what) {
  std::printf("rank %d: FAILED: %s\n", rank, what.c_str());
  std::fflush(nullptr);
  _exit(1);
}

void CheckCuda(int rank, CUresult result, const char* call) {
  if (result != CUDA_SUCCESS) Fail(rank, std::string(call) + " failed with CUresult " + std::to_string(result));
}

void CheckNccl(int rank, ncclResult_t result, const char* call) {
  if (result != ncclSuccess) Fail(rank, std::string(call) + " failed: " + ncclGetErrorString(result));
}

struct Group {
  const char* name;
  ncclComm_t comm = nullptr;
  CUstream stream = nullptr;
  CUdeviceptr buffer = 0;
  float scale;  // rank r contributes (r + 1) * scale * (step + 1)
  bool reduce = false;  // an in-place Reduce to rank 0 rather than an AllReduce
  CUdeviceptr received = 0;  // a ring exchange's receive buffer, rather than an AllReduce
};

void Fill(int rank, Group& group, int step, size_t count) {
  std::vector<float> values(count, static_cast<float>(rank + 1) * group.scale * static_cast<float>(step + 1));
  // Synchronous: the host values go out of scope here. The stream is idle between steps.
  CheckCuda(rank, cuMemcpyHtoD(group.buffer, values.data(), count * sizeof(float)), "cuMemcpyHtoD");
}

void Issue(int rank, int ranks, Group& group, size_t count) {
  if (group.received != 0) {
    CheckNccl(rank, ncclGroupStart(), "ncclGroupStart");
    CheckNccl(rank,
              ncclSend(reinterpret_cast<const void*>(group.buffer), count, ncclFloat, (rank + 1) % ranks, group.comm,
                       group.stream),
              "ncclSend");
    CheckNccl(rank,
              ncclRecv(reinterpret_cast<void*>(group.received), count, ncclFloat, (rank + ranks - 1) % ranks,
                       group.comm, group.stream),
              "ncclRecv");
    CheckNccl(rank, ncclGroupEnd(), "ncclGroupEnd");
    return;
  }
  // In place, as DDP's gradient buckets are.
  if (group.reduce) {
    CheckNccl(rank,
              ncclReduce(reinterpret_cast<const void*>(group.buffer), reinterpret_cast<void*>(group.buffer), count,
                         ncclFloat, ncclSum, 0, group.comm, group.stream),
              "ncclReduce");
    return;
  }
  CheckNccl(rank,
            ncclAllReduce(reinterpret_cast<const void*>(group.buffer), reinterpret_cast<void*>(group.buffer), count,
                          ncclFloat, ncclSum, group.comm, group.stream),
            "ncclAllReduce");
}

void Verify(int rank, int ranks, const Group& group, int step, size_t count) {
  std::vector<float> values(count);
  const CUdeviceptr result = group.received != 0 ? group.received : group.buffer;
  CheckCuda(rank, cuMemcpyDtoH(values.data(), result, count * sizeof(float)), "cuMemcpyDtoH");
  // A Reduce leaves the other ranks' buffers as they were; an exchange brings the previous rank's.
  float contributions = static_cast<float>(ranks * (ranks + 1) / 2);
  if (group.reduce && rank != 0) contributions = static_cast<float>(rank + 1);
  if (group.received != 0) contributions = static_cast<float>((rank + ranks - 1) % ranks + 1);
  const float expected = contributions * group.scale * static_cast<float>(step + 1);
  for (size_t i = 0; i < count; ++i) {
    if (values[i] != expected) {
      Fail(rank, std::string("comm ") + group.name + " step " + std::to_string(step) + ": element " + std::to_string(i) +
                     " is " + std::to_string(values[i]) + ", expected " + std::to_string(expected));
    }
  }
}

int RunRank(const Options& options, int rank, const ncclUniqueId& id_a, const ncclUniqueId& id_b,
            const ncclUniqueId& id_c) {
  CheckCuda(rank, cuInit(0), "cuInit");
  int devices = 0;
  CheckCuda(rank, cuDeviceGetCount(&devices), "cuDeviceGetCount");
  CUdevice device = 0;
  CheckCuda(rank, cuDeviceGet(&device, rank % devices), "cuDeviceGet");
  CUcontext context = nullptr;
  CheckCuda(rank, cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
  CheckCuda(rank, cuCtxSetCurrent(context), "cuCtxSetCurrent");
  std::printf("rank %d/%d: pid %d\n", rank, options.ranks, static_cast<int>(getpid()));
  std::fflush(nullptr);

  Group groups[2] = {{"A", nullptr, nullptr, 0, 1.0f, options.reduce}, {"B", nullptr, nullptr, 0, 10.0f}};
  const ncclUniqueId* ids[2] = {&id_a, &id_b};
  for (int g = 0; g < 2; ++g) {
    CheckNccl(rank, ncclCommInitRank(&groups[g].comm, options.ranks, *ids[g], rank), "ncclCommInitRank");
    CheckCuda(rank, cuStreamCreate(&groups[g].stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    CheckCuda(rank, cuMemAlloc(&groups[g].buffer, options.count * sizeof(float)), "cuMemAlloc");
  }
  if (options.exchange) CheckCuda(rank, cuMemAlloc(&groups[1].received, options.count * sizeof(float)), "cuMemAlloc");
  const bool reversed = options.crossed && rank % 2 == 1;
  if (options.queued) {
    // Per step and group: a buffer, and for an exchange a receive buffer.
    std::vector<CUdeviceptr> buffers[2];
    std::vector<CUdeviceptr> received[2];
    for (int g = 0; g < 2; ++g) {
      buffers[g].push_back(groups[g].buffer);
      received[g].push_back(groups[g].received);
      for (int step = 1; step < options.steps; ++step) {
        CUdeviceptr buffer = 0;
        CheckCuda(rank, cuMemAlloc(&buffer, options.count * sizeof(float)), "cuMemAlloc");
        buffers[g].push_back(buffer);
        CUdeviceptr receive = 0;
        if (groups[g].received != 0)
          CheckCuda(rank, cuMemAlloc(&receive, options.count * sizeof(float)), "cuMemAlloc");
        received[g].push_back(receive);
      }
    }
    auto use = [&](int g, int step) {
      groups[g].buffer = buffers[g][step];
      groups[g].received = received[g][step];
    };
    for (int step = 0; step < options.steps; ++step) {
      for (int g = 0; g < 2; ++g) {
        use(g, step);
        Fill(rank, groups[g], step, options.count);
      }
    }
    for (int step = 0; step < options.steps; ++step) {
      for (int i = 0; i < 2; ++i) {
        use(reversed ? 1 - i : i, step);
        Issue(rank, options.ranks, groups[reversed ? 1 - i : i], options.count);
      }
    }
    for (Group& group : groups) CheckCuda(rank, cuStreamSynchronize(group.stream), "cuStreamSynchronize");
    for (int step = 0; step < options.steps; ++step) {
      for (int g = 0; g < 2; ++g) {
        use(g, step);
        Verify(rank, options.ranks, groups[g], step, options.count);
      }
    }
    use(0, 0);
    use(1, 0);
  }
  for (int step = 0; step < (options.queued ? 0 : options.steps); ++step) {
    for (Group& group : groups) Fill(rank, group, step, options.count);
    for (int i = 0; i < 2; ++i) Issue(rank, options.ranks, groups[reversed ? 1 - i : i], options.count);
    for (Group& group : groups) CheckCuda(rank, cuStreamSynchronize(group.stream), "cuStreamSynchronize");
    for (const Group& group : groups) Verify(rank, options.ranks, group, step, options.count);
  }
  std::printf("rank %d: %d steps on comms A and B%s%s correct\n", rank, options.steps,
              options.crossed ? " (crossed)" : "", options.queued ? " (queued)" : "");
  if (options.split) {
    Group child{"A/split", nullptr, groups[0].stream, groups[0].buffer, 100.0f, false};
    CheckNccl(rank, ncclCommSplit(groups[0].comm, 0, rank, &child.comm, nullptr), "ncclCommSplit");
    Fill(rank, child, 0, options.count);
    Issue(rank, options.ranks, child, options.count);
    CheckCuda(rank, cuStreamSynchronize(child.stream), "cuStreamSynchronize");
    Verify(rank, options.ranks, child, 0, options.count);
    CheckNccl(rank, ncclCommDestroy(child.comm), "ncclCommDestroy");
    std::printf("rank %d: split of comm A correct\n", rank);
  }
  if (options.late) {
    Group late{"C", nullptr, groups[0].stream, groups[0].buffer, 1000.0f, false};
    CheckNccl(rank, ncclCommInitRank(&late.comm, options.ranks, id_c, rank), "ncclCommInitRank");
    Fill(rank, late, 0, options.count);
    Issue(rank, options.ranks, late, options.count);
    CheckCuda(rank, cuStreamSynchronize(late.stream), "cuStreamSynchronize");
    Verify(rank, options.ranks, late, 0, options.count);
    CheckNccl(rank, ncclCommDestroy(late.comm), "ncclCommDestroy");
    std::printf("rank %d: comm C, created afterwards, correct\n", rank);
  }
  for (Group& group : groups) CheckNccl(rank, ncclCommDestroy(group.comm), "ncclCommDestroy");
  std::fflush(nullptr);
  return 0;
}

Options Parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const bool has_value = i + 1 < argc;
    if (flag == "--ranks" && has_value) {
      options.ranks = std::atoi(argv[++i]);
    } else if (flag == "--count" && has_value) {
      options.count = std::strtoul(argv[++i], nullptr, 10);
    } else if (flag == "--steps" && has_value) {
      options.steps = std::atoi(argv[++i]);
    } else if (flag == "--crossed") {
      options.crossed = true;
    } else if (flag == "--split") {
      options.split = true;
    } else if (flag == "--reduce") {
      options.reduce = true;
    } else if (flag == "--exchange") {
      options.exchange = true;
    } else if (flag == "--late") {
      options.late = true;
    } else if (flag == "--queued") {
      options.queued = true;
    } else {
      std::fprintf(stderr, "usage: two_comms --ranks N [--count C] [--steps S] [--crossed] [--split] [--reduce] [--exchange] [--late] [--queued]\n");
      std::exit(2);
    }
  }
  if (options.ranks < 2 || options.count == 0 || options.steps < 1) {
    std::fprintf(stderr, "two_comms: --ranks must be 2 or more, --count and --steps 1 or more\n");
    std::exit(2);
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = Parse(argc, argv);
  // The launcher's unique ids: it serves both rendezvous until every rank has joined.
  ncclUniqueId id_a;
  ncclUniqueId id_b;
  ncclUniqueId id_c;
  CheckNccl(-1, ncclGetUniqueId(&id_a), "ncclGetUniqueId");
  CheckNccl(-1, ncclGetUniqueId(&id_b), "ncclGetUniqueId");
  CheckNccl(-1, ncclGetUniqueId(&id_c), "ncclGetUniqueId");
  const int failed = ncclguard::testing::ForkRanks(
      "two_comms", options.ranks, [&](int rank) { return RunRank(options, rank, id_a, id_b, id_c); });
  std::printf("two_comms: %s\n", failed == 0 ? "all ranks correct" : "job failed");
  return failed == 0 ? 0 : 1;
}
