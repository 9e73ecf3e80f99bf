// What an honest process leaves in its job directory, for the tests of hostile ones: a snapshot
// with full flight recorders and the facts of a real process.
#pragma once

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "watchdog/report/facts.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard::testing {

inline constexpr std::int64_t kHonestNow = 1'700'000'000'000'000'000;

// Rank `rank` of a `nranks`-rank job, with `communicators` communicators whose rings hold
// `ring_entries` completed AllReduces each and one more started and not completed.
inline ProcessSnapshot HonestSnapshot(int rank, int nranks, int communicators, int ring_entries) {
  ProcessSnapshot snapshot;
  snapshot.reason = "stall";
  snapshot.time_ns = kHonestNow;
  snapshot.rank = rank;
  snapshot.in_nccl_call = "ncclAllReduce";
  for (int index = 0; index < communicators; ++index) {
    CommSnapshot comm;
    comm.id = "c0ffee00000000" + std::to_string(10 + index);
    comm.handle = 0x55d0c0de00 + static_cast<std::uint64_t>(index);
    comm.rank = rank;
    comm.nranks = nranks;
    comm.created_by = "ncclCommInitRank";
    comm.library_path = "/usr/lib/x86_64-linux-gnu/libnccl.so.2";
    comm.nccl_version = 22809;
    comm.state = "ready";
    const std::uint64_t last = 100'000 + static_cast<std::uint64_t>(ring_entries);
    for (std::uint64_t seq = last - static_cast<std::uint64_t>(ring_entries) + 1; seq <= last; ++seq) {
      OpSnapshot op;
      op.seq = seq;
      op.op = "AllReduce";
      op.dtype = "float32";
      op.count = 1 << 20;
      op.bytes = 4 << 20;
      op.reduction = "sum";
      op.stream = 0x7f3a5c001000;
      op.host_thread = 123456;
      op.enqueue_ns = kHonestNow - 60'000'000'000 + static_cast<std::int64_t>(seq) * 1000;
      op.start_ns = op.enqueue_ns + 20'000;
      op.end_ns = seq == last ? 0 : op.start_ns + 1'234'567;
      op.gpu_ms = seq == last ? 0 : 1.234567;
      op.state = seq == last ? "started" : "completed";
      comm.ring.push_back(op);
    }
    comm.last_enqueued = comm.last_started = last;
    comm.last_completed = last - 1;
    snapshot.comms.push_back(comm);
  }
  return snapshot;
}

inline ProcessFacts HonestFacts(const std::string& host, int pid) {
  ProcessFacts facts;
  facts.host = host;
  facts.pid = pid;
  facts.ppid = 1;
  facts.program = "/usr/bin/python3";
  facts.command_line = {"python3", "-u", "train.py", "--epochs", "90", "--batch-size", "256"};
  facts.launcher = {{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}};
  facts.environment = {{"NCCL_DEBUG", "WARN"}, {"NCCL_SOCKET_IFNAME", "eth0"}, {"CUDA_VISIBLE_DEVICES", "0,1,2,3"}};
  facts.kernel_release = "6.1.0-18-amd64";
  facts.driver_version = "550.54.15";
  facts.cuda.driver_version = 12040;
  facts.cuda.device_count = 4;
  for (int device = 0; device < 4; ++device) {
    facts.cuda.gpus.push_back(GpuFacts{.device = device,
                                       .name = "NVIDIA H100 80GB HBM3",
                                       .pci_bus_id = "0000:1" + std::to_string(device) + ":00.0",
                                       .memory_free_bytes = 80'000'000'000,
                                       .memory_total_bytes = 85'000'000'000});
  }
  facts.cuda.peer_access = {{0, 1, 1, 1}, {1, 0, 1, 1}, {1, 1, 0, 1}, {1, 1, 1, 0}};
  return facts;
}

// Runs `work` on a thread of its own and waits at most `limit`: a read that blocks for ever
// fails the test instead of hanging it (the thread is then abandoned).
template <typename T>
std::optional<T> WithinSeconds(double limit, std::function<T()> work) {
  auto promise = std::make_shared<std::promise<T>>();
  std::future<T> result = promise->get_future();
  std::thread([promise, work = std::move(work)] { promise->set_value(work()); }).detach();
  if (result.wait_for(std::chrono::duration<double>(limit)) != std::future_status::ready) return std::nullopt;
  return result.get();
}

}  // namespace ncclguard::testing
