#include "cli/synthetic_job.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "watchdog/common/clock.h"
#include "watchdog/common/pace.h"
#include "watchdog/report/dump.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/job_board.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {
namespace {

constexpr std::int64_t kNsPerMs = 1'000'000;
constexpr std::int64_t kNsPerSecond = 1'000'000'000;
// One training step per AllReduce: issued every 100 ms, 20 µs to reach the GPU, 5 ms on it.
constexpr std::int64_t kStepNs = 100 * kNsPerMs;
constexpr std::int64_t kLaunchNs = 20'000;
constexpr std::int64_t kRunNs = 5 * kNsPerMs;
constexpr std::uint64_t kCount = 1 << 20;  // float32 elements: a 4 MiB gradient bucket
// kSlowLink's links: 10 GB/s (0.1 ms per MB) in NCCL's 512 KiB steps.
constexpr double kLinkMsPerMb = 0.1;
constexpr std::uint64_t kStepBytes = std::uint64_t{512} * 1024;

OpSnapshot AllReduce(std::uint64_t seq, std::int64_t enqueue_ns, bool completed) {
  OpSnapshot op;
  op.seq = seq;
  op.op = "AllReduce";
  op.dtype = "float32";
  op.count = kCount;
  op.bytes = kCount * 4;
  op.reduction = "sum";
  op.stream = 0x7f00000010;
  op.enqueue_ns = enqueue_ns;
  op.start_ns = enqueue_ns + kLaunchNs;
  if (completed) {
    op.end_ns = op.start_ns + kRunNs;
    op.gpu_ms = static_cast<double>(kRunNs) / kNsPerMs;
    op.state = "completed";
  } else {
    op.state = "started";
  }
  return op;
}

ProcessFacts Facts(const SyntheticJob& job, int rank) {
  ProcessFacts facts;
  facts.host = absl::StrCat("node", rank / job.ranks_per_host);
  facts.pid = 20000 + rank;
  facts.ppid = 19999;
  facts.program = "/usr/bin/python3";
  facts.command_line = {"python3", "train.py"};
  facts.launcher = {{"LOCAL_RANK", absl::StrCat(rank % job.ranks_per_host)},
                    {"RANK", absl::StrCat(rank)},
                    {"WORLD_SIZE", absl::StrCat(job.ranks)}};
  facts.kernel_release = "6.1.0-28-amd64";
  facts.driver_version = "550.127.05";
  facts.nccl_version = 22809;
  facts.cuda.driver_version = 12040;
  GpuFacts gpu;
  gpu.device = rank % job.ranks_per_host;
  gpu.name = "NVIDIA H100 80GB HBM3";
  gpu.pci_bus_id = absl::StrCat("0000:", 0x18 + gpu.device, ":00.0");
  gpu.memory_free_bytes = 40LL << 30;
  gpu.memory_total_bytes = 80LL << 30;
  facts.cuda.gpus.push_back(gpu);
  facts.host_memory_total_bytes = 2048LL << 30;
  facts.host_memory_available_bytes = 1500LL << 30;
  facts.rss_bytes = 12LL << 30;
  facts.peak_rss_bytes = 14LL << 30;
  return facts;
}

// When each operation of the synthetic job was issued: #N at base + N steps, the last one started
// `stalled_seconds` before now.
struct Timeline {
  std::int64_t now_ns;
  std::uint64_t last;  // the job's highest operation
  std::int64_t base_ns;
  std::int64_t EnqueueTime(std::uint64_t seq) const {
    return base_ns + static_cast<std::int64_t>(seq) * kStepNs;
  }
};

// A deterministic jitter in [-0.1, 0.1] for the figure named by (rank, block, item).
double Jitter(int rank, std::uint64_t block, int item) {
  std::uint64_t x =
      (static_cast<std::uint64_t>(rank) << 32) ^ (block << 8) ^ static_cast<std::uint64_t>(item);
  x ^= x >> 33;  // splitmix64's finaliser
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return (static_cast<double>(x % 20001) / 10000.0 - 1.0) * 0.1;
}

// kSlowLink: the rank's pace blocks up to operation `completed`, the latest kPaceBlocks of them.
std::vector<PaceBlockSnapshot> RankPace(const SyntheticJob& job, int rank, std::uint64_t completed) {
  std::vector<PaceBlockSnapshot> pace;
  const std::uint64_t complete_blocks = completed / kPaceBlockOps;
  const std::uint64_t first_block = complete_blocks > kPaceBlocks ? complete_blocks - kPaceBlocks : 0;
  const int channels = 2 + rank % 3;
  // A ring AllReduce sends about twice the buffer, over the channels.
  const std::uint64_t bytes = kPaceBlockOps * 2 * kCount * 4 / static_cast<std::uint64_t>(channels);
  for (std::uint64_t block = first_block; block < complete_blocks; ++block) {
    PaceBlockSnapshot snapshot;
    snapshot.first_seq = block * kPaceBlockOps + 1;
    snapshot.collectives = static_cast<int>(kPaceBlockOps);
    snapshot.wait_ms = static_cast<double>(kPaceBlockOps * kRunNs) / kNsPerMs * (1 + Jitter(rank, block, 0));
    snapshot.span_ms = static_cast<double>((kPaceBlockOps - 1) * kStepNs + kLaunchNs + kRunNs) / kNsPerMs;
    for (int channel = 0; channel < channels; ++channel) {
      PaceLinkSnapshot link;
      link.peer = (rank + 1) % job.ranks;
      link.channel = channel;
      link.bytes = bytes;
      link.steps = static_cast<int>(bytes / kStepBytes);
      link.network_ms =
          static_cast<double>(bytes) / 1e6 * kLinkMsPerMb * (1 + Jitter(rank, block, 1 + channel));
      if (rank == job.slow_link_rank && channel == job.slow_link_channel)
        link.network_ms *= job.slow_link_factor;
      snapshot.links.push_back(link);
    }
    pace.push_back(std::move(snapshot));
  }
  return pace;
}

// What rank `rank` recorded of the communicator: operations up to `issued`, the last completed or not.
CommSnapshot RankComm(const SyntheticJob& job, const Timeline& timeline, int rank, std::uint64_t issued,
                      bool last_issued_completed) {
  CommSnapshot comm;
  comm.id = job.comm_id;
  comm.handle = 0x55550000 + static_cast<std::uint64_t>(rank);
  comm.rank = rank;
  comm.nranks = job.ranks;
  comm.device = rank % job.ranks_per_host;
  comm.created_by = "ncclCommInitRank";
  comm.library_path = "/usr/lib/x86_64-linux-gnu/libnccl.so.2";
  comm.nccl_version = 22809;
  comm.state = "ready";
  comm.init_start_ns = timeline.base_ns - 2 * kNsPerSecond;
  comm.init_end_ns = timeline.base_ns - kNsPerSecond;
  comm.last_enqueued = issued;
  comm.last_started = issued;
  comm.last_completed = last_issued_completed ? issued : issued - 1;
  const std::uint64_t first_kept =
      issued > static_cast<std::uint64_t>(job.ring_entries) ? issued - job.ring_entries + 1 : 1;
  for (std::uint64_t seq = first_kept; seq <= issued; ++seq) {
    comm.ring.push_back(AllReduce(seq, timeline.EnqueueTime(seq), seq < issued || last_issued_completed));
  }
  if (job.scenario == SyntheticJob::Scenario::kSlowLink) comm.pace = RankPace(job, rank, comm.last_completed);
  return comm;
}

// Rank `rank`'s snapshot: healthy, stalled in the last operation, or the late rank.
ProcessSnapshot RankSnapshot(const SyntheticJob& job, const Timeline& timeline, int rank) {
  const bool faulty = job.scenario == SyntheticJob::Scenario::kRankNotJoined ||
                      job.scenario == SyntheticJob::Scenario::kAllStuck;
  const bool late = job.scenario == SyntheticJob::Scenario::kRankNotJoined && rank == job.late_rank;
  // The highest operation this rank issued, and whether that one completed.
  const std::uint64_t issued = late ? timeline.last - 1 : timeline.last;
  ProcessSnapshot snapshot;
  snapshot.rank = rank;
  snapshot.comms.push_back(RankComm(job, timeline, rank, issued, !faulty || late));
  snapshot.time_ns = timeline.now_ns - kNsPerSecond / 2;
  snapshot.reason = "signal";
  if (faulty && !late) {
    snapshot.reason = "stall";
    StallSnapshot stall;
    stall.kind = "not_completed";
    stall.comm_id = job.comm_id;
    stall.seq = timeline.last;
    stall.seconds = job.stalled_seconds;
    stall.message = absl::StrCat("rank ", rank, " comm ", job.comm_id, ": AllReduce #", timeline.last,
                                 " (float32 x ", kCount, ", sum) started on the GPU ", job.stalled_seconds,
                                 " s ago and has not completed");
    snapshot.stall = std::move(stall);
  } else if (late) {
    snapshot.reason = "peer_request";
    // A rank that left the loop or died stopped writing shortly after its last operation.
    const std::int64_t stopped_ns = timeline.EnqueueTime(issued) + kNsPerSecond;
    if (job.late_rank_state == SyntheticJob::LateRank::kExited) {
      snapshot.reason = "exit";
      snapshot.exiting = true;
      snapshot.time_ns = stopped_ns;
    } else if (job.late_rank_state == SyntheticJob::LateRank::kGone) {
      snapshot.time_ns = stopped_ns;
    }
  }
  return snapshot;
}

// Rank `rank`'s status, and its dump unless it is the rank that is gone.
absl::Status WriteRank(JobBoard& board, const SyntheticJob& job, const Timeline& timeline, int rank) {
  const ProcessSnapshot snapshot = RankSnapshot(job, timeline, rank);
  const ProcessFacts facts = Facts(job, rank);
  if (absl::Status status = board.PublishStatus(snapshot, facts); !status.ok()) return status;
  const bool late = job.scenario == SyntheticJob::Scenario::kRankNotJoined && rank == job.late_rank;
  const bool dead = late && job.late_rank_state == SyntheticJob::LateRank::kGone;
  if (dead) return absl::OkStatus();
  return WriteDump(board.Directory(), snapshot, facts).status();
}

}  // namespace

absl::Status WriteSyntheticJob(const std::string& job_dir, const SyntheticJob& job) {
  absl::StatusOr<std::shared_ptr<JobBoard>> board = OpenJobBoard("", job_dir, "", BoardIdentity{});
  if (!board.ok()) return board.status();
  return WriteSyntheticJob(*board, job);
}

absl::Status WriteSyntheticJob(const std::shared_ptr<JobBoard>& board, const SyntheticJob& job) {
  if (job.ranks < 1 || job.operations < 1 || job.ring_entries < 1 || job.ranks_per_host < 1) {
    return absl::InvalidArgumentError(
        "a synthetic job needs at least one rank, operation, ring entry and rank per host");
  }
  if (job.scenario == SyntheticJob::Scenario::kRankNotJoined &&
      (job.late_rank < 0 || job.late_rank >= job.ranks)) {
    return absl::InvalidArgumentError("the late rank is not a rank of the job");
  }
  const bool slow_link = job.scenario == SyntheticJob::Scenario::kSlowLink;
  if (slow_link && (job.slow_link_rank < 0 || job.slow_link_rank >= job.ranks || job.slow_link_channel < 0 ||
                    job.slow_link_channel > 1)) {
    return absl::InvalidArgumentError("the slow link is not a link of the job (channel 0 or 1 of a rank)");
  }
  Timeline timeline;
  timeline.now_ns = job.now_ns != 0 ? job.now_ns : WallNowNs();
  timeline.last = static_cast<std::uint64_t>(job.operations);
  // A job that runs issued its last operation a step ago, after enough for every pace block.
  if (slow_link) timeline.last = std::max<std::uint64_t>(timeline.last, kPaceBlocks * kPaceBlockOps);
  const std::int64_t stalled_ns =
      slow_link ? kStepNs : static_cast<std::int64_t>(job.stalled_seconds * kNsPerSecond);
  timeline.base_ns =
      timeline.now_ns - stalled_ns - kLaunchNs - static_cast<std::int64_t>(timeline.last) * kStepNs;

  // Side by side, as a job's ranks write theirs: each dump is fsync()ed (file and directory), and
  // one writer after another would wait for every flush alone. Fewer writers than the file work a
  // process may run at once (files.h).
  constexpr int kWriters = 3;
  std::atomic<int> next_rank{0};
  std::mutex failure_mutex;
  absl::Status failure;
  const auto write_ranks = [&] {
    for (int rank = next_rank.fetch_add(1); rank < job.ranks; rank = next_rank.fetch_add(1)) {
      absl::Status written = WriteRank(*board, job, timeline, rank);
      if (written.ok()) continue;
      const std::lock_guard<std::mutex> lock(failure_mutex);
      if (failure.ok()) failure = std::move(written);
      next_rank.store(job.ranks);  // the others stop too
      return;
    }
  };
  std::vector<std::thread> writers;
  writers.reserve(kWriters);
  for (int i = 0; i < kWriters; ++i) writers.emplace_back(write_ranks);
  for (std::thread& writer : writers) writer.join();
  return failure;
}

}  // namespace ncclguard
