// What serving NCCL's profiler plugin API costs NCCL per collective: the calls NCCL 2.28 makes into
// ncclguard's plugin (shim/profiler.cc) for one AllReduce, in NCCL's order, with what ncclguard
// records of them. Per variant: the API and hand-over events only (the mask without ncclguard's
// bits), with the kernel's channels, and with the proxy's operations and steps over the network.
#include <unistd.h>

#include <array>
#include <cstdint>

#include <benchmark/benchmark.h>

#include "shim/nccl_profiler.h"
#include "watchdog/common/pace.h"
#include "watchdog/common/profile_events.h"
#include "watchdog/state/profiles.h"
#include "watchdog/state/records.h"

extern "C" const ncclProfiler_t ncclProfiler_v5;

namespace {

constexpr int kChannels = 2;
constexpr int kSteps = 8;  // per proxy operation: a 1 MiB AllReduce in 128 KiB steps
constexpr std::array kSendStates = {ncclProfilerProxyStepSendGPUWait, ncclProfilerProxyStepSendPeerWait,
                                    ncclProfilerProxyStepSendWait};
constexpr std::array kRecvStates = {ncclProfilerProxyStepRecvWait, ncclProfilerProxyStepRecvFlushWait,
                                    ncclProfilerProxyStepRecvGPUWait};

ncclProfilerEventDescr_t Descriptor(std::uint64_t type, void* parent) {
  ncclProfilerEventDescr_t descriptor{};
  descriptor.type = type;
  descriptor.parentObj = parent;
  return descriptor;
}

void* Start(void* context, ncclProfilerEventDescr_t descriptor) {
  void* handle = nullptr;
  ncclProfiler_v5.startEvent(context, &handle, &descriptor);
  return handle;
}

// One AllReduce as NCCL reports it: API, launch and hand-over events, then per channel the kernel
// channel and, with `proxy`, a send and a receive of kSteps steps each.
void OneAllReduce(void* context, std::uint64_t seq, bool kernel, bool proxy) {
  const ncclProfiler_t& plugin = ncclProfiler_v5;
  void* group_api = Start(context, Descriptor(ncclProfileGroupApi, nullptr));
  void* coll_api = Start(context, Descriptor(ncclProfileCollApi, group_api));
  plugin.stopEvent(coll_api);
  void* group = Start(context, Descriptor(ncclProfileGroup, nullptr));
  ncclProfilerEventDescr_t coll = Descriptor(ncclProfileColl, coll_api);
  coll.coll.func = "AllReduce";
  coll.coll.seqNumber = seq;
  coll.coll.algo = "RING";
  coll.coll.proto = "SIMPLE";
  coll.coll.nChannels = kChannels;
  void* task = Start(context, coll);
  plugin.stopEvent(task);
  plugin.stopEvent(group);
  plugin.stopEvent(group_api);
  for (int channel = 0; channel < kChannels; ++channel) {
    if (kernel) {
      ncclProfilerEventDescr_t start = Descriptor(ncclProfileKernelCh, task);
      start.kernelCh.channelId = static_cast<std::uint8_t>(channel);
      void* handle = Start(context, start);
      ncclProfilerEventStateArgs_t stop{};
      plugin.recordEventState(handle, ncclProfilerKernelChStop, &stop);
      plugin.stopEvent(handle);
    }
    for (int send = 0; proxy && send < 2; ++send) {
      ncclProfilerEventDescr_t start = Descriptor(ncclProfileProxyOp, task);
      start.proxyOp.pid = getpid();
      start.proxyOp.channelId = static_cast<std::uint8_t>(channel);
      start.proxyOp.peer = 1;
      start.proxyOp.nSteps = kSteps;
      start.proxyOp.isSend = send;
      void* op = Start(context, start);
      for (int step = 0; step < kSteps; ++step) {
        ncclProfilerEventDescr_t step_start = Descriptor(ncclProfileProxyStep, op);
        step_start.proxyStep.step = step;
        void* handle = Start(context, step_start);
        ncclProfilerEventStateArgs_t arguments{};
        for (const ncclProfilerEventState_t state : send != 0 ? kSendStates : kRecvStates)
          plugin.recordEventState(handle, state, &arguments);
        plugin.stopEvent(handle);
      }
      plugin.stopEvent(op);
    }
  }
}

void BM_AllReduceEvents(benchmark::State& state) {
  void* context = nullptr;
  int mask = 0;
  ncclProfiler_v5.init(&context, 1, &mask, nullptr, 1, 2, 0, nullptr);
  std::uint64_t seq = 0;
  for (auto _ : state) OneAllReduce(context, seq++, state.range(0) >= 1, state.range(0) >= 2);
  ncclProfiler_v5.finalize(context);
  state.SetLabel(state.range(0) == 0   ? "api and hand-over events"
                 : state.range(0) == 1 ? "+ kernel channels"
                                       : "+ proxy steps");
}
BENCHMARK(BM_AllReduceEvents)->Arg(0)->Arg(1)->Arg(2);

// Per callback, by the thread NCCL makes it on (per_callback: CPU seconds over callbacks).
void PerCallback(benchmark::State& state, int callbacks_per_iteration) {
  state.counters["per_callback"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * callbacks_per_iteration,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// The calling thread's: a collective's CollApi event (start, stop) inside its call and its Coll
// event (start, stop) at the launch.
void BM_CallingThreadCallbacks(benchmark::State& state) {
  void* context = nullptr;
  int mask = 0;
  ncclProfiler_v5.init(&context, 1, &mask, nullptr, 1, 2, 0, nullptr);
  std::uint64_t seq = 0;
  for (auto _ : state) {
    void* coll_api = Start(context, Descriptor(ncclProfileCollApi, nullptr));
    ncclProfiler_v5.stopEvent(coll_api);
    ncclProfilerEventDescr_t coll = Descriptor(ncclProfileColl, coll_api);
    coll.coll.func = "AllReduce";
    coll.coll.seqNumber = seq++;
    coll.coll.nChannels = kChannels;
    ncclProfiler_v5.stopEvent(Start(context, coll));
  }
  ncclProfiler_v5.finalize(context);
  PerCallback(state, 4);
}
BENCHMARK(BM_CallingThreadCallbacks);

// The proxy thread's, under an AllReduce started once: a kernel channel (start, stop state, stop)
// with state.range(0) == 0; a network step (start, 3 states, stop) with 1.
void BM_ProxyThreadCallbacks(benchmark::State& state) {
  void* context = nullptr;
  int mask = 0;
  ncclProfiler_v5.init(&context, 1, &mask, nullptr, 1, 2, 0, nullptr);
  ncclProfilerEventDescr_t coll = Descriptor(ncclProfileColl, nullptr);
  coll.coll.func = "AllReduce";
  coll.coll.nChannels = kChannels;
  void* task = Start(context, coll);
  ncclProfilerEventDescr_t proxy = Descriptor(ncclProfileProxyOp, task);
  proxy.proxyOp.pid = getpid();
  proxy.proxyOp.nSteps = kSteps;
  proxy.proxyOp.isSend = 1;
  void* op = Start(context, proxy);
  const bool steps = state.range(0) == 1;
  int step = 0;
  for (auto _ : state) {
    ncclProfilerEventStateArgs_t arguments{};
    if (steps) {
      ncclProfilerEventDescr_t start = Descriptor(ncclProfileProxyStep, op);
      start.proxyStep.step = step++;
      void* handle = Start(context, start);
      for (const ncclProfilerEventState_t state_now : kSendStates)
        ncclProfiler_v5.recordEventState(handle, state_now, &arguments);
      ncclProfiler_v5.stopEvent(handle);
    } else {
      ncclProfilerEventDescr_t start = Descriptor(ncclProfileKernelCh, task);
      void* handle = Start(context, start);
      ncclProfiler_v5.recordEventState(handle, ncclProfilerKernelChStop, &arguments);
      ncclProfiler_v5.stopEvent(handle);
    }
  }
  ncclProfiler_v5.finalize(context);
  state.SetLabel(steps ? "proxy step: start, 3 states, stop" : "kernel channel: start, stop state, stop");
  PerCallback(state, steps ? 5 : 3);
}
BENCHMARK(BM_ProxyThreadCallbacks)->Arg(0)->Arg(1);

// The proxy thread's proxy operations of an AllReduce tied to its ring record (as NCCL's API
// event ties it): per channel a send and a receive, start and stop, the stop counting a send's
// network figures in its pace block. The watchdog's take of each block is in the loop too.
void BM_TiedProxyOpCallbacks(benchmark::State& state) {
  using ncclguard::CommProfile;
  using ncclguard::ProfileRef;
  CommProfile profile("c0ffee", 0);
  ncclguard::OpRecord record;
  record.state.store(ncclguard::OpState::kEnqueued);
  std::uint64_t seq = 0;
  for (auto _ : state) {
    record.seq.store(++seq, std::memory_order_relaxed);
    const ProfileRef op = profile.StartOp({.func = "AllReduce", .channels = kChannels},
                                          ProfileRef{.record = &record, .record_seq = seq});
    for (int channel = 0; channel < kChannels; ++channel) {
      for (const bool send : {true, false})
        CommProfile::StopProxyOp(CommProfile::StartProxyOp(op, channel, 1, send, kSteps));
    }
    if (seq % ncclguard::kPaceBlockOps == 0)
      benchmark::DoNotOptimize(profile.pace_links().Take((seq - 1) / 8));
  }
  state.SetLabel("proxy operation: start, stop");
  PerCallback(state, kChannels * 2 * 2);
}
BENCHMARK(BM_TiedProxyOpCallbacks);

}  // namespace

BENCHMARK_MAIN();
