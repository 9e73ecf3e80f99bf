#include "watchdog/state/profiles.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "watchdog/common/clock.h"
#include "watchdog/common/mutex.h"
#include "watchdog/common/profile_events.h"
#include "watchdog/state/pace_links.h"
#include "watchdog/state/records.h"

namespace ncclguard {

namespace {
constexpr auto kRelaxed = std::memory_order_relaxed;
// A proxy operation's reference's `index`: a send counted in its block's pace links.
constexpr std::int32_t kCountedSend = 1;
}  // namespace

CommProfile::Op* CommProfile::Find(const ProfileRef& ref) {
  if (!ref.valid() || ref.slot >= kProfiledOps) return nullptr;
  Op& op = ref.comm->ops_[static_cast<std::size_t>(ref.slot)];
  return op.generation.load(std::memory_order_acquire) == ref.generation ? &op : nullptr;
}

CommProfile::ProxyOp* CommProfile::FindProxy(const ProfileRef& ref) {
  Op* op = Find(ref);
  if (op == nullptr || ref.proxy < 0 || ref.proxy >= kProfiledProxyOps) return nullptr;
  ProxyOp& proxy = op->proxies[static_cast<std::size_t>(ref.proxy)];
  return proxy.owner.load(std::memory_order_acquire) == ref.generation ? &proxy : nullptr;
}

ProfileRef CommProfile::StartApi(CommProfile* profile, bool graph_captured) noexcept {
  CommState* comm = profile != nullptr ? profile->state() : nullptr;
  if (comm == nullptr || comm->timing.load(std::memory_order_relaxed) != TimingSource::kProfiler) return {};
  // NCCL's calls on one communicator do not overlap, and the call claimed its record before it
  // reached NCCL: the newest is its own, unless the ring had no room for it.
  const std::uint64_t seq = comm->last_enqueued.load(std::memory_order_acquire);
  OpRecord& op = comm->Slot(seq);
  if (op.seq.load(std::memory_order_relaxed) != seq || !op.profiled.load(std::memory_order_relaxed))
    return {};
  if (graph_captured) {
    // Captured, never run now: each replay's events come from a later host callback, with this
    // call's handles as parents, and are not tied to it.
    OpState enqueued = OpState::kEnqueued;
    op.state.compare_exchange_strong(enqueued, OpState::kCaptured, std::memory_order_acq_rel);
    return {};
  }
  op.profile_linked.store(true, std::memory_order_release);
  return ProfileRef{.comm = profile, .record = &op, .record_seq = seq};
}

namespace {

// The record `ref` ties to, while it still holds that operation and is unfinished.
OpRecord* TiedRecord(const ProfileRef& ref) {
  if (ref.record == nullptr || ref.record->seq.load(std::memory_order_relaxed) != ref.record_seq)
    return nullptr;
  return IsFinished(ref.record->state.load(std::memory_order_acquire)) ? nullptr : ref.record;
}

void LowerTo(std::atomic<std::int64_t>& value, std::int64_t candidate) {
  std::int64_t current = value.load(std::memory_order_relaxed);
  while ((current == 0 || candidate < current) &&
         !value.compare_exchange_weak(current, candidate, std::memory_order_relaxed)) {
  }
}

void RaiseTo(std::atomic<std::int64_t>& value, std::int64_t candidate) {
  std::int64_t current = value.load(std::memory_order_relaxed);
  while (candidate > current && !value.compare_exchange_weak(current, candidate, std::memory_order_relaxed)) {
  }
}

}  // namespace

ProfileRef CommProfile::StartOp(const ProfiledOpStart& start, const ProfileRef& api) noexcept {
  ProfileRef tied;
  if (OpRecord* record = TiedRecord(api)) {
    // Before any of its channels can start: NCCL hands the plan's proxy operations over after
    // starting its task events.
    record->channels_expected.fetch_add(static_cast<std::uint32_t>(std::max(start.channels, 0)),
                                        std::memory_order_release);
    tied.record = record;
    tied.record_seq = api.record_seq;
  }
  const auto slot = static_cast<std::int16_t>(started_.fetch_add(1, kRelaxed) % kProfiledOps);
  Op& op = ops_[static_cast<std::size_t>(slot)];
  // A sequence lock's writer: odd while the slot changes, then the next even generation.
  const std::uint32_t replacing = op.generation.load(kRelaxed) | 1U;
  op.generation.store(replacing, kRelaxed);
  std::atomic_thread_fence(std::memory_order_release);
  op.func.store(start.func != nullptr ? start.func : "", kRelaxed);
  op.algo.store(start.algo != nullptr ? start.algo : "", kRelaxed);
  op.proto.store(start.proto != nullptr ? start.proto : "", kRelaxed);
  op.nccl_seq.store(start.nccl_seq, kRelaxed);
  op.seq.store(tied.record_seq, kRelaxed);
  op.channels.store(start.channels, kRelaxed);
  op.peer.store(start.peer, kRelaxed);
  op.start_ns.store(WallNowNs(), kRelaxed);
  op.kernel_started.store(0, kRelaxed);
  op.proxy_count.store(0, kRelaxed);
  const std::uint32_t generation = replacing + 1;
  op.generation.store(generation, std::memory_order_release);
  tied.comm = this;
  tied.generation = generation;
  tied.slot = slot;
  return tied;
}

ProfileRef CommProfile::StartChannel(const ProfileRef& op_ref, int channel, std::int64_t gpu_ns) noexcept {
  // The record first: the profile's slot may already hold a newer operation (a long queue).
  if (OpRecord* record = TiedRecord(op_ref)) {
    LowerTo(record->gpu_start_ns, gpu_ns);
    record->channels_started.fetch_add(1, std::memory_order_release);
  }
  // Not kept in the profile (a channel out of its range, an operation a newer one replaced): its
  // stop still counts in the record.
  const ProfileRef record_only{.record = op_ref.record, .record_seq = op_ref.record_seq};
  if (!op_ref.valid() || channel < 0 || channel >= kProfiledChannels) return record_only;
  Op* op = Find(op_ref);
  if (op == nullptr) return record_only;
  Channel& kernel = op->kernel[static_cast<std::size_t>(channel)];
  kernel.stopped.store(false, kRelaxed);
  kernel.gpu_start_ns.store(gpu_ns, kRelaxed);
  kernel.gpu_stop_ns.store(0, kRelaxed);
  op->kernel_started.fetch_or(1U << channel, std::memory_order_release);  // publishes the channel
  ProfileRef ref = op_ref;
  ref.index = channel;
  return ref;
}

void CommProfile::StopChannel(const ProfileRef& channel, std::int64_t gpu_ns) noexcept {
  if (OpRecord* record = TiedRecord(channel)) {
    RaiseTo(record->gpu_stop_ns, gpu_ns);
    record->channels_stopped.fetch_add(1, std::memory_order_release);  // publishes the stop time
  }
  if (!channel.valid()) return;
  Op* op = Find(channel);
  if (op == nullptr || channel.index < 0 || channel.index >= kProfiledChannels) return;
  Channel& kernel = op->kernel[static_cast<std::size_t>(channel.index)];
  kernel.gpu_stop_ns.store(gpu_ns, kRelaxed);
  kernel.stopped.store(true, std::memory_order_release);
}

ProfileRef CommProfile::StartProxyOp(const ProfileRef& op_ref, int channel, int peer, bool send,
                                     int steps) noexcept {
  // A send is counted before anything else: the watchdog waits for the block's open sends.
  ProfileRef counted;
  if (send && op_ref.comm != nullptr && op_ref.record_seq != 0) {
    op_ref.comm->pace_links_.Open(op_ref.record_seq);
    counted = ProfileRef{.comm = op_ref.comm, .index = kCountedSend, .record_seq = op_ref.record_seq};
  }
  Op* op = Find(op_ref);
  if (op == nullptr) return counted;
  const int index = op->proxy_count.fetch_add(1, kRelaxed);
  if (index >= kProfiledProxyOps) return counted;
  ProxyOp& proxy = op->proxies[static_cast<std::size_t>(index)];
  proxy.owner.store(0, kRelaxed);
  std::atomic_thread_fence(std::memory_order_release);
  proxy.channel.store(channel, kRelaxed);
  proxy.peer.store(peer, kRelaxed);
  proxy.send.store(send, kRelaxed);
  proxy.steps.store(steps, kRelaxed);
  proxy.steps_done.store(0, kRelaxed);
  proxy.stopped.store(false, kRelaxed);
  proxy.network_ns.store(0, kRelaxed);
  proxy.network_bytes.store(0, kRelaxed);
  proxy.network_steps.store(0, kRelaxed);
  for (Step& step : proxy.in_flight) {
    step.step.store(-1, kRelaxed);
    step.wait.store(StepWait::kNone, kRelaxed);
  }
  proxy.owner.store(op_ref.generation, std::memory_order_release);
  ProfileRef ref = op_ref;
  ref.proxy = static_cast<std::int16_t>(index);
  ref.index = counted.index;
  return ref;
}

void CommProfile::StopProxyOp(const ProfileRef& proxy_ref) noexcept {
  ProxyOp* proxy = FindProxy(proxy_ref);
  // NCCL may stop an event twice: its figures count once.
  if (proxy != nullptr && proxy->stopped.exchange(true, std::memory_order_acq_rel)) return;
  if (proxy_ref.index != kCountedSend) return;  // a receive, or an operation not tied to its record
  // Not kept, or replaced while it ran (a newer operation took its slot): its figures are gone.
  if (proxy == nullptr) {
    proxy_ref.comm->pace_links_.Close(proxy_ref.record_seq, nullptr, /*lost=*/true);
    return;
  }
  const ProxyNetworkFigures figures{.peer = proxy->peer.load(kRelaxed),
                                    .channel = proxy->channel.load(kRelaxed),
                                    .network_ns = proxy->network_ns.load(kRelaxed),
                                    .network_bytes = proxy->network_bytes.load(kRelaxed),
                                    .network_steps = proxy->network_steps.load(kRelaxed)};
  proxy_ref.comm->pace_links_.Close(proxy_ref.record_seq, &figures);
}

ProfileRef CommProfile::StartStep(const ProfileRef& proxy_ref, int step) noexcept {
  ProxyOp* proxy = FindProxy(proxy_ref);
  if (proxy == nullptr || step < 0) return {};
  Step& slot = proxy->in_flight[static_cast<std::size_t>(step % kStepsInFlight)];
  slot.wait.store(StepWait::kNone, kRelaxed);
  slot.since_ns.store(WallNowNs(), kRelaxed);
  slot.step.store(step, std::memory_order_release);
  ProfileRef ref = proxy_ref;
  ref.index = step;
  return ref;
}

CommProfile::Step* CommProfile::FindStep(ProxyOp* proxy, int step) {
  if (proxy == nullptr || step < 0) return nullptr;
  Step& slot = proxy->in_flight[static_cast<std::size_t>(step % kStepsInFlight)];
  return slot.step.load(kRelaxed) == step ? &slot : nullptr;
}

void CommProfile::EndNetworkWait(ProxyOp& proxy, Step& slot, std::int64_t now_ns) {
  if (slot.wait.load(kRelaxed) != StepWait::kSendNet) return;
  proxy.network_ns.fetch_add(std::max<std::int64_t>(0, now_ns - slot.since_ns.load(kRelaxed)), kRelaxed);
}

void CommProfile::SetStepWait(const ProfileRef& step_ref, StepWait wait, std::size_t bytes) noexcept {
  ProxyOp* proxy = FindProxy(step_ref);
  if (Step* slot = FindStep(proxy, step_ref.index)) {
    const std::int64_t now_ns = WallNowNs();
    EndNetworkWait(*proxy, *slot, now_ns);
    if (wait == StepWait::kSendNet && slot->wait.load(kRelaxed) != StepWait::kSendNet) {
      proxy->network_bytes.fetch_add(bytes, kRelaxed);
      proxy->network_steps.fetch_add(1, kRelaxed);
    }
    slot->since_ns.store(now_ns, kRelaxed);
    slot->wait.store(wait, std::memory_order_release);
  }
}

void CommProfile::StopStep(const ProfileRef& step_ref) noexcept {
  ProxyOp* proxy = FindProxy(step_ref);
  int step = step_ref.index;
  Step* slot = FindStep(proxy, step);
  if (slot == nullptr) return;
  EndNetworkWait(*proxy, *slot, WallNowNs());
  slot->wait.store(StepWait::kNone, kRelaxed);
  if (slot->step.compare_exchange_strong(step, -1)) proxy->steps_done.fetch_add(1, std::memory_order_release);
}

OpProfileSnapshot CommProfile::Copy(const Op& op, std::uint32_t generation) {
  OpProfileSnapshot out;
  out.func = op.func.load(kRelaxed);
  out.nccl_seq = op.nccl_seq.load(kRelaxed);
  out.seq = op.seq.load(kRelaxed);
  out.algo = op.algo.load(kRelaxed);
  out.proto = op.proto.load(kRelaxed);
  out.channels = op.channels.load(kRelaxed);
  out.peer = op.peer.load(kRelaxed);
  out.start_ns = op.start_ns.load(kRelaxed);
  const std::uint32_t started = op.kernel_started.load(std::memory_order_acquire);
  for (int channel = 0; channel < kProfiledChannels; ++channel) {
    if ((started & (1U << channel)) == 0) continue;
    const Channel& kernel = op.kernel[static_cast<std::size_t>(channel)];
    const bool stopped = kernel.stopped.load(std::memory_order_acquire);
    out.kernel_channels.push_back(ChannelSnapshot{.channel = channel,
                                                  .stopped = stopped,
                                                  .gpu_start_ns = kernel.gpu_start_ns.load(kRelaxed),
                                                  .gpu_stop_ns = kernel.gpu_stop_ns.load(kRelaxed)});
  }
  const int proxies = std::min(op.proxy_count.load(kRelaxed), kProfiledProxyOps);
  for (int index = 0; index < proxies; ++index) {
    const ProxyOp& proxy = op.proxies[static_cast<std::size_t>(index)];
    if (proxy.owner.load(std::memory_order_acquire) != generation) continue;  // not written yet
    ProxyOpSnapshot& copy =
        out.proxy_ops.emplace_back(ProxyOpSnapshot{.channel = proxy.channel.load(kRelaxed),
                                                   .peer = proxy.peer.load(kRelaxed),
                                                   .send = proxy.send.load(kRelaxed),
                                                   .steps = proxy.steps.load(kRelaxed),
                                                   .steps_done = proxy.steps_done.load(kRelaxed),
                                                   .stopped = proxy.stopped.load(kRelaxed),
                                                   .network_ns = proxy.network_ns.load(kRelaxed),
                                                   .network_bytes = proxy.network_bytes.load(kRelaxed),
                                                   .network_steps = proxy.network_steps.load(kRelaxed)});
    // The step in flight longest is the one the link waits on.
    for (const Step& step : proxy.in_flight) {
      const int number = step.step.load(std::memory_order_acquire);
      if (number < 0 || (copy.waiting_step >= 0 && number > copy.waiting_step)) continue;
      copy.waiting_step = number;
      copy.waiting = step.wait.load(std::memory_order_acquire);
      copy.waiting_since_ns = step.since_ns.load(kRelaxed);
    }
  }
  return out;
}

CommProfileSnapshot CommProfile::Snapshot() const {
  CommProfileSnapshot snapshot;
  snapshot.comm_id = comm_id_;
  snapshot.rank = rank_;
  const std::uint64_t started = started_.load(std::memory_order_acquire);
  const std::uint64_t first = started > kProfiledOps ? started - kProfiledOps : 0;
  for (std::uint64_t number = first; number < started; ++number) {
    const Op& op = ops_[number % kProfiledOps];
    // A sequence lock's reader: a copy taken while the slot changed is dropped.
    const std::uint32_t generation = op.generation.load(std::memory_order_acquire);
    if (generation == 0 || (generation & 1U) != 0) continue;
    OpProfileSnapshot copy = Copy(op, generation);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (op.generation.load(kRelaxed) == generation) snapshot.ops.push_back(std::move(copy));
  }
  return snapshot;
}

}  // namespace ncclguard

namespace ncclguard {

CommProfile* ProfileTable::Open(std::string comm_id, int rank, bool api_events) {
  MutexLock lock(mutex_);
  // Finalized profiles stay for the dumps, up to the bound: the oldest of them go first.
  while (profiles_.size() >= kMaxProfiles) {
    const auto closed =
        std::find_if(profiles_.begin(), profiles_.end(), [](const Entry& entry) { return entry.closed; });
    if (closed == profiles_.end()) return nullptr;
    profiles_.erase(closed);
  }
  return profiles_
      .emplace_back(Entry{std::make_unique<CommProfile>(std::move(comm_id), rank, api_events), false})
      .profile.get();
}

void ProfileTable::Close(CommProfile* profile) {
  MutexLock lock(mutex_);
  for (Entry& entry : profiles_) {
    if (entry.profile.get() != profile) continue;
    entry.closed = true;
    // NCCL sends nothing more for it; the state may be freed after this.
    profile->state_.store(nullptr, std::memory_order_release);
  }
}

CommProfile* ProfileTable::Link(CommState& comm) {
  MutexLock lock(mutex_);
  const int rank = comm.rank.load(std::memory_order_relaxed);
  for (auto entry = profiles_.rbegin(); entry != profiles_.rend(); ++entry) {
    CommProfile& profile = *entry->profile;
    if (entry->closed || profile.comm_id() != comm.id || profile.rank() != rank ||
        profile.state_.load(std::memory_order_relaxed) != nullptr)
      continue;
    profile.state_.store(&comm, std::memory_order_release);
    comm.profile.store(&profile, std::memory_order_release);
    return &profile;
  }
  return nullptr;
}

std::optional<CommProfileSnapshot> ProfileTable::Find(const std::string& comm_id, int rank) const {
  MutexLock lock(mutex_);
  for (auto entry = profiles_.rbegin(); entry != profiles_.rend(); ++entry) {
    if (entry->profile->comm_id() == comm_id && entry->profile->rank() == rank)
      return entry->profile->Snapshot();
  }
  return std::nullopt;
}

ProfileTable& GetProfileTable() {
  static auto* table = new ProfileTable;  // never destroyed: NCCL's threads may outlive exit
  return *table;
}

}  // namespace ncclguard
