#include "links.h"

#include <sys/prctl.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "comm.h"
#include "datatypes.h"
#include "profiler.h"

namespace ncclemu {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::nanoseconds;

// Linux lets a thread's timed waits end up to its timer slack late, 50 us by default: as much as
// a step of a fast link. The stream's worker (the GPU here) asks for 1 us.
void preciseTimers() {
  static thread_local const bool asked = prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL) == 0;
  (void)asked;
}

// Sleeps as applyStartFaults's slow fault does: an abort or revoke wakes it at once.
bool sleepUntil(CommCore& core, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(core.mutex);
  return !core.changed.wait_until(lock, deadline, [&] { return core.interrupted.load(); });
}

size_t blockBytes(const Operation& op) { return op.count * datatypeSize(op.datatype); }

// On the stream's worker, before it waits for the time computed.
nanoseconds timeOf(const CommCore& core, const Operation& op, int from, int to, int channel, size_t bytes) {
  preciseTimers();
  return linkTime(activeLinkModel(), activeFaultPlan().faults,
                  LinkUse{from, to, channel, op.seq, bytes, core.comm_index});
}

// Whether the ring link from `from` to its successor carries data: not where NCCL's chain
// patterns need no connection (as KernelTrace::addRingConnections).
bool ringLinkCarries(const Operation& op, int from, int nranks) {
  const int to = (from + 1) % nranks;
  if (op.kind == OpKind::Broadcast) return to != op.root_or_peer;
  if (op.kind == OpKind::Reduce) return from != op.root_or_peer;
  return true;
}

// The proxy's side of a ring channel's wait, from `start`: the receive steps complete as the
// upstream link delivers them, evenly over the last `upstream` of `total`; the send steps go onto
// the rank's own link one at a time from `total - own` on, each for `own / steps` from when it
// went (a late wake-up delays the next step rather than shortening it: what a step spends in
// SendWait is the link's time, as a network would show it). Returns false when interrupted.
bool runProxySteps(CommCore& core, KernelTrace& trace, int channel, Clock::time_point start,
                   nanoseconds total, nanoseconds own, nanoseconds upstream, int steps) {
  const int sends = own.count() > 0 ? steps : 0;
  const int receives = upstream.count() > 0 ? steps : 0;
  int sent = 0, received = 0;
  bool on_link = false;  // a send step is on the link
  Clock::time_point send_due = start + (total - own);
  while (sent < sends || received < receives) {
    const Clock::time_point receive_due = start + (total - upstream) + upstream * (received + 1) / steps;
    const bool send_next = sent < sends && (received == receives || send_due <= receive_due);
    if (!sleepUntil(core, send_next ? send_due : receive_due)) return false;
    if (!send_next) {
      trace.completeNetSteps(channel, false, ++received);
      continue;
    }
    if (on_link) trace.completeNetSteps(channel, true, ++sent);
    on_link = sent < sends;
    if (on_link) trace.postNextSend(channel);
    send_due = Clock::now() + own / steps;
  }
  return true;
}

}  // namespace

bool waitRingChannel(CommCore& core, const Operation& op, KernelTrace& trace, int channel) {
  const int n = core.nranks;
  const size_t bytes = channelShare(blockBytes(op), channel, kCollectiveChannels);
  if (n < 2 || bytes == 0) return true;
  const int me = core.rank;
  const int prev = (me - 1 + n) % n;
  nanoseconds total{0}, own{0}, upstream{0};
  for (int from = 0; from < n; ++from) {
    if (!ringLinkCarries(op, from, n)) continue;
    const nanoseconds time = timeOf(core, op, from, (from + 1) % n, channel, bytes);
    total = std::max(total, time);
    if (from == me) own = time;
    if (from == prev) upstream = time;
  }
  const Clock::time_point start = Clock::now();
  return runProxySteps(core, trace, channel, start, total, own, upstream, proxyStepCount(bytes)) &&
         sleepUntil(core, start + total);
}

bool waitExchangeLinks(CommCore& core, const Operation& op) {
  const int n = core.nranks;
  const size_t bytes = blockBytes(op);
  if (n < 2 || bytes == 0) return true;
  nanoseconds total{0};
  for (int from = 0; from < n; ++from) {
    for (int to = 0; to < n; ++to) {
      const bool used = op.kind == OpKind::AlltoAll || (op.kind == OpKind::Gather && to == op.root_or_peer) ||
                        (op.kind == OpKind::Scatter && from == op.root_or_peer);
      if (from != to && used) total = std::max(total, timeOf(core, op, from, to, 0, bytes));
    }
  }
  return sleepUntil(core, Clock::now() + total);
}

nanoseconds sendLinkTime(const CommCore& core, const Operation& send) {
  const size_t bytes = blockBytes(send);
  if (send.root_or_peer == core.rank || bytes == 0) return nanoseconds{0};
  return timeOf(core, send, core.rank, send.root_or_peer, 0, bytes);
}

}  // namespace ncclemu
