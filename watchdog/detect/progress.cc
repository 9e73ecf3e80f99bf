#include "watchdog/detect/progress.h"

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "watchdog/common/nccl_api.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/state/gpu_events.h"
#include "watchdog/state/records.h"
#include "watchdog/state/registry.h"

namespace ncclguard {
namespace {

constexpr std::size_t kMaxStreamsPerComm = 16;

// A stall's time counts only while the process ran: said when that is less than its whole age.
constexpr const char* kSinceResumed = " since this process last resumed from a stop or starvation";

// Streams on which an unfinished operation was found this round: later operations on them
// cannot have completed, so they are not asked about.
class BlockedStreams {
 public:
  bool Contains(std::uint64_t stream) const {
    return std::find(streams_, streams_ + size_, stream) != streams_ + size_;
  }
  void Add(std::uint64_t stream) {
    if (size_ < kMaxStreamsPerComm) streams_[size_++] = stream;
  }

 private:
  std::uint64_t streams_[kMaxStreamsPerComm] = {};
  std::size_t size_ = 0;
};

void RaiseTo(std::atomic<std::uint64_t>& value, std::uint64_t candidate) {
  std::uint64_t current = value.load(std::memory_order_relaxed);
  while (current < candidate && !value.compare_exchange_weak(current, candidate, std::memory_order_release)) {
  }
}

// The first sequence number that may still be in the ring.
std::uint64_t FirstInRing(const CommState& comm, std::uint64_t last) {
  return last >= comm.ring_size ? last - comm.ring_size + 1 : 1;
}

Stall Describe(const CommState& comm, const OpRecord& op, std::uint64_t seq) {
  Stall stall;
  stall.comm_id = comm.id;
  stall.rank = comm.rank.load(std::memory_order_relaxed);
  stall.nranks = comm.nranks.load(std::memory_order_relaxed);
  stall.seq = seq;
  stall.api = op.api.load(std::memory_order_relaxed);
  stall.datatype = op.datatype.load(std::memory_order_relaxed);
  stall.count = op.count.load(std::memory_order_relaxed);
  stall.reduction = op.reduction.load(std::memory_order_relaxed);
  stall.root_or_peer = op.root_or_peer.load(std::memory_order_relaxed);
  return stall;
}

// An operation NCCL's profiler times: its kernel channels' counts, which the proxy thread keeps in
// the record (state/profiles.cc), say where it is. Whether it finished.
bool AdvanceProfiled(CommState& comm, OpRecord& op, OpState state, std::uint64_t seq, std::int64_t now_ns) {
  if (state == OpState::kEnqueued && ProfiledStarted(op)) {
    op.start_ns.store(now_ns, std::memory_order_relaxed);
    if (op.state.compare_exchange_strong(state, OpState::kStarted, std::memory_order_acq_rel)) {
      state = OpState::kStarted;
      RaiseTo(comm.last_started, seq);
    }
  }
  // As with events: channels that an abort stopped say nothing of completion.
  if (state != OpState::kStarted || !ProfiledCompleted(op) || comm.cut_short.load(std::memory_order_seq_cst))
    return false;
  op.end_ns.store(now_ns, std::memory_order_relaxed);
  op.gpu_ms.store(ProfiledGpuMs(op), std::memory_order_relaxed);
  if (!op.state.compare_exchange_strong(state, OpState::kCompleted, std::memory_order_acq_rel)) return false;
  RaiseTo(comm.last_completed, seq);
  return true;
}

}  // namespace

std::string_view StallKindName(Stall::Kind kind) {
  switch (kind) {
    case Stall::Kind::kNotCompleted:
      return "not_completed";
    case Stall::Kind::kNotStarted:
      return "not_started";
    case Stall::Kind::kInit:
      return "init";
  }
  return "unknown";
}

void AdvanceOperations(CommState& comm, GpuEvents& events, std::int64_t now_ns) {
  const std::uint64_t last = comm.last_enqueued.load(std::memory_order_acquire);
  comm.watch_cursor = std::max(comm.watch_cursor, FirstInRing(comm, last));
  BlockedStreams blocked;
  for (std::uint64_t seq = comm.watch_cursor; seq <= last; ++seq) {
    OpRecord& op = comm.Slot(seq);
    OpState state = op.state.load(std::memory_order_acquire);
    const bool recorded = op.seq.load(std::memory_order_relaxed) == seq;
    if (!recorded || IsFinished(state)) {
      if (seq == comm.watch_cursor) ++comm.watch_cursor;
      continue;
    }
    const std::uint64_t stream = op.stream.load(std::memory_order_relaxed);
    if (blocked.Contains(stream)) continue;
    if (op.profiled.load(std::memory_order_relaxed)) {
      if (AdvanceProfiled(comm, op, state, seq, now_ns)) {
        if (seq == comm.watch_cursor) ++comm.watch_cursor;
      } else {
        blocked.Add(stream);
      }
      continue;
    }
    // A non-blocking communicator took the launch later (ncclInProgress): once it is no longer in
    // progress the kernels are queued, and events recorded now land after them (late, never early).
    if (op.launch_pending.load(std::memory_order_acquire) &&
        !op.end_recorded.load(std::memory_order_acquire) &&
        comm.async_error.load(std::memory_order_acquire) != ncclInProgress) {
      auto* gpu_stream = reinterpret_cast<GpuStream>(stream);
      if (!op.start_recorded.load(std::memory_order_acquire)) {
        op.start_recorded.store(events.Record(op.start_event, gpu_stream), std::memory_order_release);
      }
      op.end_recorded.store(events.Record(op.end_event, gpu_stream), std::memory_order_release);
    }
    if (state == OpState::kEnqueued && op.start_recorded.load(std::memory_order_acquire) &&
        events.Query(comm.context, op.start_event) == EventStatus::kReached) {
      op.start_ns.store(now_ns, std::memory_order_relaxed);
      if (op.state.compare_exchange_strong(state, OpState::kStarted, std::memory_order_acq_rel)) {
        state = OpState::kStarted;
        RaiseTo(comm.last_started, seq);
      }
    }
    // Read after the query: an end that an abort brought about is seen with the abort's flag set.
    if (state == OpState::kStarted && op.end_recorded.load(std::memory_order_acquire) &&
        events.Query(comm.context, op.end_event) == EventStatus::kReached &&
        !comm.cut_short.load(std::memory_order_seq_cst)) {
      op.end_ns.store(now_ns, std::memory_order_relaxed);
      op.gpu_ms.store(events.ElapsedMs(comm.context, op.start_event, op.end_event),
                      std::memory_order_relaxed);
      if (op.state.compare_exchange_strong(state, OpState::kCompleted, std::memory_order_acq_rel)) {
        RaiseTo(comm.last_completed, seq);
        if (seq == comm.watch_cursor) ++comm.watch_cursor;
        continue;
      }
    }
    blocked.Add(stream);
  }
}

bool LateRound(std::int64_t due_ns, std::int64_t now_ns, std::int64_t poll_interval_ns,
               std::int64_t timeout_ns) {
  const std::int64_t allowed_ns =
      std::max(2 * poll_interval_ns, std::min<std::int64_t>(1'000'000'000, timeout_ns / 4));
  return now_ns - due_ns > allowed_ns;
}

std::optional<Stall> FindOperationStall(const CommState& comm, std::int64_t now_ns, std::int64_t timeout_ns,
                                        std::int64_t counted_from_ns) {
  const std::uint64_t last = comm.last_enqueued.load(std::memory_order_acquire);
  for (std::uint64_t seq = std::max(comm.watch_cursor, FirstInRing(comm, last)); seq <= last; ++seq) {
    const OpRecord& op = comm.ring[seq % comm.ring_size];
    const OpState state = op.state.load(std::memory_order_acquire);
    if (op.seq.load(std::memory_order_relaxed) != seq || IsFinished(state)) continue;
    // The oldest unfinished operation decides: everything after it waits for it.
    const bool started = state == OpState::kStarted;
    // One queued behind a replay waits from the replay's end: the stall before it was reported.
    const std::int64_t unfinished_since = started
                                              ? op.start_ns.load(std::memory_order_relaxed)
                                              : std::max(op.enqueue_ns.load(std::memory_order_relaxed),
                                                         comm.recovered_ns.load(std::memory_order_acquire));
    const std::int64_t since = std::max(unfinished_since, counted_from_ns);
    if (now_ns - since <= timeout_ns) return std::nullopt;
    Stall stall = Describe(comm, op, seq);
    stall.kind = started ? Stall::Kind::kNotCompleted : Stall::Kind::kNotStarted;
    stall.seconds = static_cast<double>(now_ns - since) / 1e9;
    stall.since_resumed = counted_from_ns > unfinished_since;
    return stall;
  }
  return std::nullopt;
}

std::optional<Stall> FindInitStall(const PendingInit& init, std::int64_t now_ns, std::int64_t timeout_ns,
                                   std::int64_t counted_from_ns) {
  const std::int64_t since = std::max(init.start_ns, counted_from_ns);
  if (now_ns - since <= timeout_ns) return std::nullopt;
  Stall stall;
  stall.kind = Stall::Kind::kInit;
  stall.comm_id = init.comm_id;
  stall.rank = init.rank;
  stall.nranks = init.nranks;
  stall.api = init.api;
  stall.seconds = static_cast<double>(now_ns - since) / 1e9;
  stall.since_resumed = counted_from_ns > init.start_ns;
  return stall;
}

std::string StallMessage(const Stall& stall) {
  const std::string who = fmt::format("rank {} comm {}", stall.rank, stall.comm_id);
  if (stall.kind == Stall::Kind::kInit) {
    return fmt::format("{}: {} (rank {} of {}) has not completed after {:.1f} s{}", who,
                       Describe(stall.api).name, stall.rank, stall.nranks, stall.seconds,
                       stall.since_resumed ? kSinceResumed : "");
  }
  std::string details = fmt::format("{} × {}", DatatypeName(stall.datatype), stall.count);
  if (const std::string reduction = ReductionName(stall.reduction); !reduction.empty()) {
    details += ", " + reduction;
  }
  const ApiKind kind = Describe(stall.api).kind;
  if (stall.root_or_peer >= 0) {
    details += fmt::format(", {} {}", kind == ApiKind::kPointToPoint ? "peer" : "root", stall.root_or_peer);
  }
  const char* what = nullptr;
  if (stall.since_resumed) {
    what = stall.kind == Stall::Kind::kNotCompleted
               ? "started on the GPU and has not completed after {:.1f} s{}"
               : "was enqueued and has not started on the GPU after {:.1f} s{} (queued behind earlier work "
                 "on its stream)";
  } else {
    what =
        stall.kind == Stall::Kind::kNotCompleted
            ? "started on the GPU {:.1f} s ago and has not completed{}"
            : "was enqueued {:.1f} s ago and has not started on the GPU{} (queued behind earlier work on its "
              "stream)";
  }
  return fmt::format(
      "{}: {} #{} ({}) {}", who, OperationName(stall.api), stall.seq, details,
      fmt::format(fmt::runtime(what), stall.seconds, stall.since_resumed ? kSinceResumed : ""));
}

StallSnapshot ToSnapshot(const Stall& stall, const std::string& message) {
  StallSnapshot copy;
  copy.kind = std::string(StallKindName(stall.kind));
  copy.comm_id = stall.comm_id;
  copy.seq = stall.seq;
  copy.seconds = stall.seconds;
  copy.message = message;
  return copy;
}

}  // namespace ncclguard
