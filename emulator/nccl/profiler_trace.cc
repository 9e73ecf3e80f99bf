// What NCCL's proxy thread reports while a kernel runs: KernelCh events from the GPU's per-channel
// timestamps, and, for network connections only, ProxyOp events per channel and peer with one
// ProxyStep per network transfer. Here the stream's worker is both the GPU and the proxy.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "comm.h"
#include "profiler.h"

namespace ncclemu {
namespace {

// NCCL_STEPS: the proxy posts at most this many steps of a connection ahead; the emulator keeps
// every operation within it, so all its steps are posted when it starts.
constexpr int kMaxSteps = 8;
// The emulator's transfer size: small operations take one step, larger ones up to kMaxSteps.
constexpr size_t kMinChunkBytes = size_t{128} << 10;

// The kernel's timestamps (NCCL: the GPU's globaltimer, in ns).
uint64_t nowNanoseconds() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1000000000ull + static_cast<uint64_t>(now.tv_nsec);
}

size_t chunkBytes(size_t bytes) {
  return std::min<size_t>(INT_MAX, std::max(kMinChunkBytes, (bytes + kMaxSteps - 1) / kMaxSteps));
}

}  // namespace

size_t channelShare(size_t bytes, int channel, int channels) {
  return bytes * (channel + 1) / channels - bytes * channel / channels;
}

int proxyStepCount(size_t bytes) {
  return std::max<int>(1, static_cast<int>((bytes + chunkBytes(bytes) - 1) / chunkBytes(bytes)));
}

KernelTrace::KernelTrace(CommCore& core, const Operation& op) : core_(&core) {
  for (const ProfiledTask& task : op.profiled) {
    Traced traced{
        &task, std::vector<void*>(task.channels, nullptr), std::vector<bool>(task.channels, false), {}};
    // Only network connections have a proxy that reports; P2P and SHM move data from the kernel.
    if (core.transport == Transport::NET) {
      if (!task.p2p) {
        addRingConnections(traced, op);
      } else if (task.root_or_peer != core.rank) {  // a rank's Send/Recv to itself is a local copy
        ProxySub sub;
        sub.peer = task.root_or_peer;
        sub.send = strcmp(task.func, "Send") == 0;
        sub.bytes = task.bytes;
        traced.subs.push_back(sub);
      }
    }
    for (ProxySub& sub : traced.subs) {
      sub.chunk = static_cast<int>(chunkBytes(sub.bytes));
      sub.steps = proxyStepCount(sub.bytes);
    }
    traced_.push_back(std::move(traced));
  }
}

// A ring collective receives from the previous rank and sends to the next on every channel,
// except where NCCL's chain patterns need no proxy: Broadcast's root receives nothing and its
// predecessor sends nothing; Reduce's root sends nothing and its successor receives nothing.
void KernelTrace::addRingConnections(Traced& traced, const Operation& op) {
  const int n = core_->nranks;
  const int me = core_->rank;
  const int next = (me + 1) % n;
  const int prev = (me - 1 + n) % n;
  const int root = op.root_or_peer;
  bool receives = true;
  bool sends = true;
  if (op.kind == OpKind::Broadcast) {
    receives = root != me;
    sends = root != next;
  } else if (op.kind == OpKind::Reduce) {
    receives = root != prev;
    sends = root != me;
  }
  const ProfiledTask& task = *traced.task;
  for (int channel = 0; channel < task.channels; ++channel) {
    ProxySub sub;
    sub.channel = channel;
    sub.bytes = channelShare(task.bytes, channel, task.channels);
    if (receives) {
      sub.peer = prev;
      sub.send = false;
      traced.subs.push_back(sub);
    }
    if (sends) {
      sub.peer = next;
      sub.send = true;
      traced.subs.push_back(sub);
    }
  }
}

void KernelTrace::startSub(const Traced& traced, ProxySub& sub) {
  const ProfiledTask& task = *traced.task;
  if (task.mask & kProxyOpEvents) {
    ncclProfilerEventDescr_t descr{};
    descr.type = ncclProfileProxyOp;
    descr.parentObj = task.event;
    descr.rank = core_->rank;
    descr.proxyOp = {getpid(),        static_cast<uint8_t>(sub.channel), sub.peer, sub.steps, sub.chunk,
                     sub.send ? 1 : 0};
    sub.event = profilerStartEvent(*core_, descr);
    ncclProfilerEventStateArgs_t none{};
    profilerRecordState(*core_, sub.event, ncclProfilerProxyOpInProgress, &none);
  }
  sub.step_events.assign(sub.steps, nullptr);
  for (int step = 0; step < sub.steps; ++step) {
    if (task.mask & kProxyStepEvents) {
      ncclProfilerEventDescr_t descr{};
      descr.type = ncclProfileProxyStep;
      descr.parentObj = sub.event;
      descr.rank = core_->rank;
      descr.proxyStep.step = step;
      sub.step_events[step] = profilerStartEvent(*core_, descr);
    }
    recordStep(sub, step, sub.send ? ncclProfilerProxyStepSendGPUWait : ncclProfilerProxyStepRecvWait);
  }
}

// NCCL updates a step only while its ProxyOp event exists. Each state carries the connection's
// sub->transSize, which NCCL sets to a step's size just before that step enters SendWait (or,
// received, RecvFlushWait): the states before carry the previous step's size.
void KernelTrace::recordStep(ProxySub& sub, int step, ncclProfilerEventState_t state) {
  if (sub.event == nullptr) return;
  if (state == ncclProfilerProxyStepSendWait || state == ncclProfilerProxyStepRecvFlushWait) {
    sub.trans_size = channelShare(sub.bytes, step, sub.steps);
  }
  ncclProfilerEventStateArgs_t args{};
  args.proxyStep.transSize = sub.trans_size;
  profilerRecordState(*core_, sub.step_events[step], state, &args);
}

// Send: the GPU filled the step, the proxy sent it, the network completed it. Receive: the data
// arrived, was handed to the GPU, and the GPU consumed it.
void KernelTrace::completeSteps(ProxySub& sub, int upto) {
  for (; sub.completed < upto; ++sub.completed) {
    const int step = sub.completed;
    if (sub.send && step >= sub.posted) {
      recordStep(sub, step, ncclProfilerProxyStepSendPeerWait);
      recordStep(sub, step, ncclProfilerProxyStepSendWait);
    } else if (!sub.send) {
      recordStep(sub, step, ncclProfilerProxyStepRecvFlushWait);
      recordStep(sub, step, ncclProfilerProxyStepRecvGPUWait);
    }
    profilerStopEvent(*core_, sub.step_events[step]);
  }
  if (sub.completed == sub.steps && sub.event != nullptr) {
    profilerStopEvent(*core_, sub.event);
    sub.event = nullptr;
  }
}

void KernelTrace::start() {
  // The proxy posts its steps as soon as it has the operation, before the kernel reaches them.
  for (Traced& traced : traced_) {
    for (ProxySub& sub : traced.subs) startSub(traced, sub);
  }
  const uint64_t started = nowNanoseconds();
  for (Traced& traced : traced_) {
    if (!(traced.task->mask & ncclProfileKernelCh)) continue;
    for (int channel = 0; channel < traced.task->channels; ++channel) {
      ncclProfilerEventDescr_t descr{};
      descr.type = ncclProfileKernelCh;
      descr.parentObj = traced.task->event;
      descr.kernelCh.channelId = static_cast<uint8_t>(channel);
      descr.kernelCh.pTimer = started;
      traced.channel_events[channel] = profilerStartEvent(*core_, descr);
    }
  }
}

void KernelTrace::completeChannel(int channel) {
  for (Traced& traced : traced_) {
    if (channel >= traced.task->channels || traced.channel_done[channel]) continue;
    traced.channel_done[channel] = true;
    for (ProxySub& sub : traced.subs) {
      if (sub.channel == channel) completeSteps(sub, sub.steps);
    }
    void* event = traced.channel_events[channel];
    if (event == nullptr) continue;
    ncclProfilerEventStateArgs_t args{};
    args.kernelCh.pTimer = nowNanoseconds();
    profilerRecordState(*core_, event, ncclProfilerKernelChStop, &args);
    profilerStopEvent(*core_, event);
  }
}

void KernelTrace::completeAll() {
  for (int channel = 0; channel < kCollectiveChannels; ++channel) completeChannel(channel);
}

void KernelTrace::progress(size_t done, size_t total) {
  for (Traced& traced : traced_) {
    for (ProxySub& sub : traced.subs) {
      completeSteps(sub, total == 0 ? sub.steps : static_cast<int>(done * sub.steps / total));
    }
  }
}

void KernelTrace::postNextSend(int channel) {
  for (Traced& traced : traced_) {
    for (ProxySub& sub : traced.subs) {
      // One step at a time: the next once the network completed the one before.
      if (!sub.send || sub.channel != channel || sub.posted > sub.completed || sub.completed >= sub.steps)
        continue;
      sub.posted = sub.completed;
      recordStep(sub, sub.posted, ncclProfilerProxyStepSendPeerWait);
      recordStep(sub, sub.posted, ncclProfilerProxyStepSendWait);
      ++sub.posted;
    }
  }
}

void KernelTrace::completeNetSteps(int channel, bool send, int upto) {
  for (Traced& traced : traced_) {
    for (ProxySub& sub : traced.subs) {
      if (sub.send == send && sub.channel == channel) completeSteps(sub, std::min(upto, sub.steps));
    }
  }
}

void KernelTrace::sendPosted(int channel, int peer) {
  for (Traced& traced : traced_) {
    for (ProxySub& sub : traced.subs) {
      sub.posted = std::max(sub.posted, sub.completed);
      if (!sub.send || sub.channel != channel || sub.peer != peer || sub.posted >= sub.steps) continue;
      recordStep(sub, sub.posted, ncclProfilerProxyStepSendPeerWait);
      recordStep(sub, sub.posted, ncclProfilerProxyStepSendWait);
      ++sub.posted;
      return;
    }
  }
}

}  // namespace ncclemu
