// The data path: what a task does on its stream's worker. Collectives go through per-rank staging
// slots in rounds; Send/Recv stream bytes through per-pair rings. Every wait sleeps on a futex.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "comm.h"
#include "debug.h"
#include "faults.h"
#include "links.h"

namespace ncclemu {
namespace {

constexpr size_t kPage = 4096;

using Clock = std::chrono::steady_clock;

size_t roundUp(size_t value, size_t alignment) { return (value + alignment - 1) / alignment * alignment; }

struct Layout {
  size_t rank, boot, doorbell, channel, staging, ring, total;
  explicit Layout(int nranks) {
    const size_t n = static_cast<size_t>(nranks);
    rank = roundUp(sizeof(CommSegmentHeader), 64);
    boot = roundUp(rank + n * sizeof(RankInfo), 64);
    doorbell = boot + n * sizeof(BootSlot);
    channel = doorbell + n * sizeof(Doorbell);
    staging = roundUp(channel + n * n * sizeof(Channel), kPage);
    ring = staging + n * 2 * kStagingSlotBytes;
    total = ring + n * n * kRingBytes;
  }
};

bool interrupted(const CommCore& core) { return core.interrupted.load(std::memory_order_acquire); }

// Runs elements [begin, end) of one collective as rounds over the staging slots. In a round
// every rank fills its own slot (split into `parts` equal parts, one per destination where that
// matters), a barrier publishes it, then every rank consumes what it needs from any rank's slot.
// Two slots alternate, so one barrier per round suffices: nobody can refill a slot before
// everyone passed the next barrier, i.e. finished reading it. The parity comes from the barrier's
// generation, the same on all ranks.
template <class Fill, class Consume>
bool exchangeRounds(CommCore& core, size_t begin, size_t end, size_t parts, size_t element_size, Fill fill,
                    Consume consume) {
  const size_t per_part = std::max<size_t>(1, kStagingSlotBytes / parts / element_size);
  SharedBarrier& barrier = core.shared.header().collective;
  for (size_t offset = begin; offset < end; offset += per_part) {
    const size_t length = std::min(per_part, end - offset);
    const uint32_t parity = barrier.generation.load(std::memory_order_acquire) & 1;
    auto part = [&](int rank, size_t index) {
      return core.shared.staging(rank, parity) + index * per_part * element_size;
    };
    fill(part, offset, length);
    if (!barrierWait(barrier, core.nranks, [&] { return interrupted(core); })) return false;
    consume(part, offset, length);
  }
  return true;
}

// Elements [begin, end) of a collective (of each rank's block, where there are blocks).
bool runCollective(CommCore& core, const Operation& op, size_t begin, size_t end) {
  const size_t es = datatypeSize(op.datatype);
  const int n = core.nranks;
  const int me = core.rank;
  const int root = op.root_or_peer;
  const auto* send = static_cast<const char*>(op.send);
  auto* recv = static_cast<char*>(op.recv);
  std::vector<const void*> sources(n);
  auto reduce_from = [&](auto part, size_t index, char* dst, size_t length) {
    for (int r = 0; r < n; ++r) sources[r] = part(r, index);
    reduceElements(dst, sources.data(), n, length, op.datatype, op.reduction);
  };
  auto fill_own = [&](auto part, size_t offset, size_t length) {
    memcpy(part(me, 0), send + offset * es, length * es);
  };
  // One part per destination rank: block p of the send buffer goes to part p.
  auto fill_blocks = [&](auto part, size_t offset, size_t length) {
    for (int p = 0; p < n; ++p) memcpy(part(me, p), send + (p * op.count + offset) * es, length * es);
  };

  switch (op.kind) {
    case OpKind::AllReduce:
      return exchangeRounds(core, begin, end, 1, es, fill_own, [&](auto part, size_t offset, size_t length) {
        reduce_from(part, 0, recv + offset * es, length);
      });
    case OpKind::Reduce:
      return exchangeRounds(core, begin, end, 1, es, fill_own, [&](auto part, size_t offset, size_t length) {
        if (me == root) reduce_from(part, 0, recv + offset * es, length);
      });
    case OpKind::Broadcast:
      return exchangeRounds(
          core, begin, end, 1, es,
          [&](auto part, size_t offset, size_t length) {
            if (me == root) memcpy(part(me, 0), send + offset * es, length * es);
          },
          [&](auto part, size_t offset, size_t length) {
            if (me != root || send != recv) memcpy(recv + offset * es, part(root, 0), length * es);
          });
    case OpKind::AllGather:
      return exchangeRounds(core, begin, end, 1, es, fill_own, [&](auto part, size_t offset, size_t length) {
        for (int r = 0; r < n; ++r) memcpy(recv + (r * op.count + offset) * es, part(r, 0), length * es);
      });
    case OpKind::Gather:
      return exchangeRounds(core, begin, end, 1, es, fill_own, [&](auto part, size_t offset, size_t length) {
        if (me != root) return;
        for (int r = 0; r < n; ++r) memcpy(recv + (r * op.count + offset) * es, part(r, 0), length * es);
      });
    case OpKind::ReduceScatter:
      return exchangeRounds(core, begin, end, n, es, fill_blocks,
                            [&](auto part, size_t offset, size_t length) {
                              reduce_from(part, me, recv + offset * es, length);
                            });
    case OpKind::AlltoAll:
      return exchangeRounds(core, begin, end, n, es, fill_blocks,
                            [&](auto part, size_t offset, size_t length) {
                              for (int r = 0; r < n; ++r)
                                memcpy(recv + (r * op.count + offset) * es, part(r, me), length * es);
                            });
    case OpKind::Scatter:
      return exchangeRounds(
          core, begin, end, n, es,
          [&](auto part, size_t offset, size_t length) {
            if (me == root) fill_blocks(part, offset, length);
          },
          [&](auto part, size_t offset, size_t length) {
            memcpy(recv + offset * es, part(root, me), length * es);
          });
    case OpKind::Send:
    case OpKind::Recv:
      break;
  }
  return false;
}

struct PointToPoint {
  const Operation* op;
  KernelTrace* trace;
  size_t total_bytes;
  size_t done_bytes = 0;
  bool withheld = false;  // a stopped link (hang with peer=): never moves, never completes
  // With the link model, a Send's link carries one step at a time, each for step_time from when
  // the step went onto it (from when the step before arrived): posted steps went onto the link,
  // carried ones arrived, and only their bytes may move.
  std::chrono::nanoseconds step_time{0};
  Clock::time_point step_due{};  // when the step on the link arrives
  int steps = 1;
  int posted = 0;
  int carried = 0;
};

// Where step `step` of a transfer ends; rounded up, so that KernelTrace::progress counts it whole.
size_t stepEnd(const PointToPoint& transfer, int step) {
  return (transfer.total_bytes * step + transfer.steps - 1) / transfer.steps;
}

// The bytes a Send may have moved by `now`: those of the steps its link carried.
size_t carriedBytes(PointToPoint& transfer, Clock::time_point now) {
  if (transfer.step_time.count() <= 0) return transfer.total_bytes;
  if (transfer.carried < transfer.posted && now >= transfer.step_due) ++transfer.carried;
  return stepEnd(transfer, transfer.carried);
}

// Once a carried step's bytes have moved, the next step goes onto the link.
void postNextStep(PointToPoint& transfer) {
  if (transfer.step_time.count() <= 0 || transfer.posted != transfer.carried ||
      transfer.posted == transfer.steps || transfer.done_bytes < stepEnd(transfer, transfer.carried)) {
    return;
  }
  ++transfer.posted;
  transfer.step_due = Clock::now() + transfer.step_time;
  transfer.trace->postNextSend(0);
}

// How long until a Send's link carries the step it holds; at most `limit`.
std::chrono::nanoseconds nextCarried(const std::vector<PointToPoint>& transfers,
                                     std::chrono::nanoseconds limit) {
  const Clock::time_point now = Clock::now();
  for (const PointToPoint& transfer : transfers) {
    if (transfer.step_time.count() > 0 && !transfer.withheld && transfer.carried < transfer.posted) {
      limit = std::min(limit, std::chrono::duration_cast<std::chrono::nanoseconds>(transfer.step_due - now));
    }
  }
  return limit;
}

void ringDoorbell(CommCore& core, int rank) {
  Doorbell& bell = core.shared.doorbell(rank);
  bell.rings.fetch_add(1, std::memory_order_release);
  futexWakeAll(&bell.rings);
}

// Moves as many bytes as the ring allows; returns whether anything moved.
bool progress(CommCore& core, PointToPoint& transfer) {
  const Operation& op = *transfer.op;
  const bool sending = op.kind == OpKind::Send;
  const int from = sending ? core.rank : op.root_or_peer;
  const int to = sending ? op.root_or_peer : core.rank;
  Channel& channel = core.shared.channel(from, to);
  char* ring = core.shared.ring(from, to);
  const uint64_t written =
      channel.written.load(sending ? std::memory_order_relaxed : std::memory_order_acquire);
  const uint64_t consumed =
      channel.consumed.load(sending ? std::memory_order_acquire : std::memory_order_relaxed);
  const size_t available = sending ? kRingBytes - (written - consumed) : written - consumed;
  const size_t allowed = sending ? carriedBytes(transfer, Clock::now()) : transfer.total_bytes;
  size_t moved = std::min(available, allowed - std::min(allowed, transfer.done_bytes));
  if (moved == 0) return false;
  uint64_t position = sending ? written : consumed;
  for (size_t left = moved; left > 0;) {
    const size_t at = position % kRingBytes;
    const size_t piece = std::min(left, kRingBytes - at);
    if (sending)
      memcpy(ring + at, static_cast<const char*>(op.send) + transfer.done_bytes, piece);
    else
      memcpy(static_cast<char*>(op.recv) + transfer.done_bytes, ring + at, piece);
    transfer.done_bytes += piece;
    position += piece;
    left -= piece;
  }
  if (sending)
    channel.written.store(position, std::memory_order_release);
  else
    channel.consumed.store(position, std::memory_order_release);
  ringDoorbell(core, sending ? to : from);
  transfer.trace->progress(transfer.done_bytes, transfer.total_bytes);
  if (transfer.done_bytes == transfer.total_bytes) transfer.trace->completeAll();
  postNextStep(transfer);
  return true;
}

// All Send/Recv of a task progress together (a ring exchange must not deadlock); operations to
// the same peer in the same direction are matched in issue order. A withheld transfer keeps its
// place in that order and never moves: the task then ends only when interrupted.
bool runPointToPoint(CommCore& core, std::vector<PointToPoint>& transfers) {
  Doorbell& my_bell = core.shared.doorbell(core.rank);
  for (;;) {
    const uint32_t rings = my_bell.rings.load(std::memory_order_acquire);
    bool moved = false;
    bool pending = false;
    std::vector<std::pair<OpKind, int>> busy_channels;
    for (PointToPoint& transfer : transfers) {
      if (!transfer.withheld && transfer.done_bytes == transfer.total_bytes) continue;
      pending = true;
      const std::pair<OpKind, int> channel{transfer.op->kind, transfer.op->root_or_peer};
      if (std::find(busy_channels.begin(), busy_channels.end(), channel) != busy_channels.end()) continue;
      busy_channels.push_back(channel);
      if (!transfer.withheld) moved |= progress(core, transfer);
    }
    if (!pending) return true;
    if (interrupted(core)) return false;
    if (!moved) futexWaitFor(&my_bell.rings, rings, nextCarried(transfers, std::chrono::seconds(1)));
  }
}

bool faultApplies(const Fault& fault, const CommCore& core) {
  return (fault.rank < 0 || fault.rank == core.rank) &&
         (fault.comm_index == 0 || fault.comm_index == core.comm_index);
}

// What a P2P transport failure looks like in NCCL's log (transport/p2p.cc).
void warnPeerAccessFailure(const CommCore& core) {
  const int peer = (core.rank + 1) % core.nranks;
  const RankInfo& info = core.shared.rankInfo(peer);
  ::ncclemu::logWarn(
      "transport/p2p.cc", 300,
      "failed to peer with device %d(=%s): 217 peer access is not supported between these two devices",
      info.cuda_dev, info.bus_id);
}

// Faults that act before the operation starts: the rank dies, or starts late.
void applyStartFaults(CommCore& core, const Operation& op) {
  for (const Fault& fault : activeFaultPlan().faults) {
    if (!faultApplies(fault, core)) continue;
    if (fault.kind == FaultKind::Crash && fault.seq == op.seq) {
      // As the OOM killer would: no chance to clean up.
      kill(getpid(), SIGKILL);
    }
    if (fault.kind == FaultKind::Slow) {
      std::unique_lock<std::mutex> lock(core.mutex);
      core.changed.wait_for(lock, std::chrono::milliseconds(fault.delay_ms),
                            [&] { return core.interrupted.load(); });
    }
  }
}

// Returns false when the started operation must not run: it stalls as a whole (until an abort),
// or the communicator was interrupted.
bool passesStallFaults(CommCore& core, const Operation& op) {
  for (const Fault& fault : activeFaultPlan().faults) {
    if (!faultApplies(fault, core)) continue;
    const bool hang = fault.kind == FaultKind::Hang && fault.peer < 0 && fault.seq == op.seq;
    const bool async_error = fault.kind == FaultKind::AsyncError && fault.seq == op.seq;
    const bool p2p_stall = fault.kind == FaultKind::P2pStall && core.transport == Transport::P2P &&
                           core.nranks >= 2 && op.seq > fault.after;
    if (async_error) {
      warnPeerAccessFailure(core);
      core.setAsyncResult(fault.code);
    }
    if (hang || async_error || p2p_stall) {
      core.stallUntilInterrupted();
      return false;
    }
  }
  return !interrupted(core);
}

// hang with peer=: this rank's link to the peer stops in this operation (channel 0's part).
const Fault* stoppedLink(const CommCore& core, const Operation& op) {
  for (const Fault& fault : activeFaultPlan().faults) {
    if (faultApplies(fault, core) && fault.kind == FaultKind::Hang && fault.peer >= 0 &&
        fault.seq == op.seq) {
      return &fault;
    }
  }
  return nullptr;
}

// The data for the peer on channel 0 leaves the GPU, is posted to the network, and never arrives:
// this rank's kernel stays in the operation. The peer waits for the data, and so does everyone
// whose data depends on it.
bool stallOnLink(CommCore& core, KernelTrace& trace, const Fault& link) {
  trace.sendPosted(0, link.peer);
  core.stallUntilInterrupted();
  return false;
}

// AlltoAll, Gather and Scatter are Send/Recv tasks in NCCL; the emulator runs them as one exchange.
bool splitsIntoChannels(OpKind kind) {
  return kind == OpKind::AllReduce || kind == OpKind::Broadcast || kind == OpKind::Reduce ||
         kind == OpKind::AllGather || kind == OpKind::ReduceScatter;
}

size_t channelBegin(size_t count, int channel) { return count * channel / kCollectiveChannels; }

bool runTracedCollective(CommCore& core, const Operation& op) {
  applyStartFaults(core, op);
  KernelTrace trace(core, op);
  trace.start();
  if (!passesStallFaults(core, op)) return false;
  const Fault* link = stoppedLink(core, op);
  if (!splitsIntoChannels(op.kind)) {
    if (link) return stallOnLink(core, trace, *link);
    if (!runCollective(core, op, 0, op.count)) return false;
    if (linksModelled() && !waitExchangeLinks(core, op)) return false;
    trace.completeAll();
    return true;
  }
  // Each channel carries its own slice of the data. They run from the last down to channel 0,
  // so that a link stopped on channel 0 leaves the others complete, as independent GPU blocks
  // would.
  for (int channel = kCollectiveChannels - 1; channel >= 0; --channel) {
    if (link && channel == 0) return stallOnLink(core, trace, *link);
    const size_t begin = channelBegin(op.count, channel);
    if (!runCollective(core, op, begin, channelBegin(op.count, channel + 1))) return false;
    if (linksModelled() && !waitRingChannel(core, op, trace, channel)) return false;
    trace.completeChannel(channel);
  }
  return true;
}

// The Send's first step goes onto its link; its data moves as the link carries it.
void timeSend(const CommCore& core, const Operation& send, PointToPoint& transfer) {
  const std::chrono::nanoseconds link_time = sendLinkTime(core, send);
  if (link_time.count() <= 0) return;
  transfer.steps = proxyStepCount(transfer.total_bytes);
  transfer.step_time = link_time / transfer.steps;
  postNextStep(transfer);
}

void runTracedPointToPoint(CommCore& core, const std::vector<const Operation*>& operations) {
  std::vector<KernelTrace> traces;
  traces.reserve(operations.size());  // the transfers point into it
  std::vector<PointToPoint> transfers;
  for (const Operation* op : operations) {
    applyStartFaults(core, *op);
    traces.emplace_back(core, *op);
    KernelTrace& trace = traces.back();
    trace.start();
    if (!passesStallFaults(core, *op)) return;
    transfers.push_back({op, &trace, op->count * datatypeSize(op->datatype)});
    const Fault* link = stoppedLink(core, *op);
    // Only a Send to the peer uses the link; any other operation of the rank stalls whole.
    if (link && !(op->kind == OpKind::Send && op->root_or_peer == link->peer)) {
      stallOnLink(core, trace, *link);
      return;
    }
    if (link) {
      trace.sendPosted(0, link->peer);
      transfers.back().withheld = true;
    } else if (transfers.back().total_bytes == 0) {
      trace.completeAll();
    } else if (op->kind == OpKind::Send && linksModelled()) {
      timeSend(core, *op, transfers.back());
    }
  }
  runPointToPoint(core, transfers);
}

void execute(CommCore& core, const std::vector<Operation>& operations) {
  LogDeviceScope log_device(core.cuda_dev);
  // Collectives in issue order, then the point-to-point operations together, as NCCL schedules a group.
  std::vector<const Operation*> point_to_point;
  for (const Operation& op : operations) {
    if (op.kind == OpKind::Send || op.kind == OpKind::Recv) {
      point_to_point.push_back(&op);
      continue;
    }
    if (!runTracedCollective(core, op)) return;
  }
  if (!point_to_point.empty()) runTracedPointToPoint(core, point_to_point);
}

}  // namespace

size_t CommShared::bytesFor(int nranks) { return Layout(nranks).total; }

void CommShared::attach(int nranks) {
  const Layout layout(nranks);
  nranks_ = nranks;
  rank_offset_ = layout.rank;
  boot_offset_ = layout.boot;
  doorbell_offset_ = layout.doorbell;
  channel_offset_ = layout.channel;
  staging_offset_ = layout.staging;
  ring_offset_ = layout.ring;
}

void CUDA_CB runTask(void* raw_task) {
  std::unique_ptr<Task> task(static_cast<Task*>(raw_task));
  CommCore& core = *task->core;
  {
    std::unique_lock<std::mutex> lock(core.mutex);
    if (task->waits_only) {
      core.changed.wait(lock, [&] { return core.running_ticket > task->ticket || core.interrupted.load(); });
      --core.outstanding_tasks;
      core.changed.notify_all();
      return;
    }
    // The launching thread first reports the hand-over: the operations' events must exist before
    // their kernel reports under them.
    core.changed.wait(lock, [&] { return task->handed_over; });
    core.changed.wait(lock, [&] {
      return (core.running_ticket == task->ticket && !core.executing) || core.interrupted.load();
    });
    core.executing = true;
  }
  if (!interrupted(core)) execute(core, task->operations);
  std::lock_guard<std::mutex> lock(core.mutex);
  core.executing = false;
  core.running_ticket = std::max(core.running_ticket, task->ticket + 1);
  --core.outstanding_tasks;
  core.changed.notify_all();
}

// A graph's task takes no ticket: it runs whenever its stream reaches it, one task at a time.
void CUDA_CB runCapturedTask(void* raw_task) {
  const Task& task = *static_cast<const Task*>(raw_task);
  CommCore& core = *task.core;
  std::vector<Operation> operations = task.operations;
  {
    std::unique_lock<std::mutex> lock(core.mutex);
    core.changed.wait(lock, [&] { return !core.executing || core.interrupted.load(); });
    // Numbered as they run: every launch of the graph is new work for the faults' seq=.
    for (Operation& op : operations) op.seq = ++core.issued_operations;
    core.executing = true;
    ++core.outstanding_tasks;
  }
  // NCCL hands a captured plan with proxy work over at every replay, from a host callback.
  if (!interrupted(core) && profilerHasProxyWork(core, operations)) profilerHandOver(core, operations, true);
  if (!interrupted(core)) execute(core, operations);
  std::lock_guard<std::mutex> lock(core.mutex);
  core.executing = false;
  --core.outstanding_tasks;
  core.changed.notify_all();
}

}  // namespace ncclemu
