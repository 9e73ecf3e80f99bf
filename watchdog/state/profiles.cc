#include "watchdog/state/profiles.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "watchdog/common/clock.h"
#include "watchdog/common/mutex.h"
#include "watchdog/common/profile_events.h"
#include "watchdog/state/records.h"

namespace ncclguard {

CommProfile::Op* CommProfile::Find(const ProfileRef& ref) {
  if (!ref.valid() || ref.slot >= kProfiledOps) return nullptr;
  Op& op = ref.comm->ops_[static_cast<std::size_t>(ref.slot)];
  return op.used && op.generation == ref.generation ? &op : nullptr;
}

CommProfile::ProxyOp* CommProfile::FindProxy(const ProfileRef& ref) {
  Op* op = Find(ref);
  if (op == nullptr || ref.proxy < 0 || ref.proxy >= op->proxy_count) return nullptr;
  return &op->proxies[static_cast<std::size_t>(ref.proxy)];
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
  MutexLock lock(mutex_);
  const auto slot = static_cast<std::int16_t>(started_++ % kProfiledOps);
  Op& op = ops_[static_cast<std::size_t>(slot)];
  const std::uint32_t generation = op.generation + 1;
  op = Op{};
  op.generation = generation;
  op.used = true;
  op.func = start.func != nullptr ? start.func : "";
  op.algo = start.algo != nullptr ? start.algo : "";
  op.proto = start.proto != nullptr ? start.proto : "";
  op.nccl_seq = start.nccl_seq;
  op.seq = tied.record_seq;
  op.channels = start.channels;
  op.peer = start.peer;
  op.start_ns = WallNowNs();
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
  MutexLock lock(op_ref.comm->mutex_);
  Op* op = Find(op_ref);
  if (op == nullptr) return record_only;
  op->kernel_started |= 1U << channel;
  op->kernel[static_cast<std::size_t>(channel)] = ChannelSnapshot{.channel = channel, .gpu_start_ns = gpu_ns};
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
  MutexLock lock(channel.comm->mutex_);
  Op* op = Find(channel);
  if (op == nullptr || channel.index < 0 || channel.index >= kProfiledChannels) return;
  ChannelSnapshot& kernel = op->kernel[static_cast<std::size_t>(channel.index)];
  kernel.stopped = true;
  kernel.gpu_stop_ns = gpu_ns;
}

ProfileRef CommProfile::StartProxyOp(const ProfileRef& op_ref, int channel, int peer, bool send,
                                     int steps) noexcept {
  if (!op_ref.valid()) return {};
  MutexLock lock(op_ref.comm->mutex_);
  Op* op = Find(op_ref);
  if (op == nullptr || op->proxy_count >= kProfiledProxyOps) return {};
  const int index = op->proxy_count++;
  ProxyOp& proxy = op->proxies[static_cast<std::size_t>(index)];
  proxy = ProxyOp{.channel = channel, .peer = peer, .send = send, .steps = steps};
  ProfileRef ref = op_ref;
  ref.proxy = static_cast<std::int16_t>(index);
  return ref;
}

void CommProfile::StopProxyOp(const ProfileRef& proxy_ref) noexcept {
  if (!proxy_ref.valid()) return;
  MutexLock lock(proxy_ref.comm->mutex_);
  if (ProxyOp* proxy = FindProxy(proxy_ref)) proxy->stopped = true;
}

ProfileRef CommProfile::StartStep(const ProfileRef& proxy_ref, int step) noexcept {
  if (!proxy_ref.valid()) return {};
  MutexLock lock(proxy_ref.comm->mutex_);
  ProxyOp* proxy = FindProxy(proxy_ref);
  if (proxy == nullptr || step < 0) return {};
  Step& slot = proxy->in_flight[static_cast<std::size_t>(step % kStepsInFlight)];
  slot = Step{.step = step, .since_ns = WallNowNs()};
  ProfileRef ref = proxy_ref;
  ref.index = step;
  return ref;
}

CommProfile::Step* CommProfile::FindStep(ProxyOp* proxy, int step) {
  if (proxy == nullptr || step < 0) return nullptr;
  Step& slot = proxy->in_flight[static_cast<std::size_t>(step % kStepsInFlight)];
  return slot.step == step ? &slot : nullptr;
}

void CommProfile::SetStepWait(const ProfileRef& step_ref, StepWait wait) noexcept {
  if (!step_ref.valid()) return;
  MutexLock lock(step_ref.comm->mutex_);
  if (Step* slot = FindStep(FindProxy(step_ref), step_ref.index)) {
    slot->wait = wait;
    slot->since_ns = WallNowNs();
  }
}

void CommProfile::StopStep(const ProfileRef& step_ref) noexcept {
  if (!step_ref.valid()) return;
  MutexLock lock(step_ref.comm->mutex_);
  ProxyOp* proxy = FindProxy(step_ref);
  if (Step* slot = FindStep(proxy, step_ref.index)) {
    *slot = Step{};
    ++proxy->steps_done;
  }
}

CommProfileSnapshot CommProfile::Snapshot() const {
  CommProfileSnapshot snapshot;
  snapshot.comm_id = comm_id_;
  snapshot.rank = rank_;
  MutexLock lock(mutex_);
  const std::uint64_t first = started_ > kProfiledOps ? started_ - kProfiledOps : 0;
  for (std::uint64_t started = first; started < started_; ++started) {
    const Op& op = ops_[started % kProfiledOps];
    if (!op.used) continue;
    OpProfileSnapshot& out = snapshot.ops.emplace_back();
    out.func = op.func;
    out.nccl_seq = op.nccl_seq;
    out.seq = op.seq;
    out.algo = op.algo;
    out.proto = op.proto;
    out.channels = op.channels;
    out.peer = op.peer;
    out.start_ns = op.start_ns;
    for (int channel = 0; channel < kProfiledChannels; ++channel) {
      if ((op.kernel_started & (1U << channel)) != 0) out.kernel_channels.push_back(op.kernel[channel]);
    }
    for (int index = 0; index < op.proxy_count; ++index) {
      const ProxyOp& proxy = op.proxies[static_cast<std::size_t>(index)];
      ProxyOpSnapshot& copy = out.proxy_ops.emplace_back(ProxyOpSnapshot{.channel = proxy.channel,
                                                                         .peer = proxy.peer,
                                                                         .send = proxy.send,
                                                                         .steps = proxy.steps,
                                                                         .steps_done = proxy.steps_done,
                                                                         .stopped = proxy.stopped});
      // The step in flight longest is the one the link waits on.
      for (const Step& step : proxy.in_flight) {
        if (step.step < 0 || (copy.waiting_step >= 0 && step.step > copy.waiting_step)) continue;
        copy.waiting_step = step.step;
        copy.waiting = step.wait;
        copy.waiting_since_ns = step.since_ns;
      }
    }
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
