#include "watchdog/state/pace.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "watchdog/common/mutex.h"
#include "watchdog/common/nccl_api.h"
#include "watchdog/common/pace.h"
#include "watchdog/common/profile_events.h"
#include "watchdog/state/profiles.h"
#include "watchdog/state/records.h"

namespace ncclguard {
namespace {

// Links a block gathers before the slowest kPaceLinksPerBlock are kept: a proxy operation each.
constexpr std::size_t kGatheredLinks = kProfiledProxyOps;

// Microseconds are all a judgement needs; the digits beyond would lengthen every status.
double ToMicroseconds(double ms) { return std::round(ms * 1000) / 1000; }

// Milliseconds on the network per MB (per step where NCCL gave no sizes): higher is slower.
double SlownessOf(const PaceLinkSnapshot& link) {
  if (link.bytes > 0) return link.network_ms * 1e6 / static_cast<double>(link.bytes);
  return link.steps > 0 ? link.network_ms / link.steps : 0;
}

// NCCL reports a send's proxy steps until the network completed them, which may be after the
// kernel stopped: an operation whose proxy operations still run is folded once they stopped, or
// once it ended this long ago.
constexpr std::int64_t kProxyGraceNs = 1'000'000'000;

const OpProfileSnapshot* ProfileOf(const std::optional<CommProfileSnapshot>& profile, std::uint64_t seq) {
  if (!profile) return nullptr;
  for (const OpProfileSnapshot& op : profile->ops) {
    if (op.seq == seq) return &op;
  }
  return nullptr;
}

}  // namespace

void PaceLog::AddLinks(Block& block, const std::vector<ProxyOpSnapshot>& proxies) {
  for (const ProxyOpSnapshot& proxy : proxies) {
    if (!proxy.send || proxy.network_steps <= 0) continue;
    std::vector<PaceLinkSnapshot>& links = block.pace.links;
    auto link = std::find_if(links.begin(), links.end(), [&](const PaceLinkSnapshot& known) {
      return known.peer == proxy.peer && known.channel == proxy.channel;
    });
    if (link == links.end()) {
      if (links.size() >= kGatheredLinks) continue;
      link = links.insert(links.end(), PaceLinkSnapshot{.peer = proxy.peer, .channel = proxy.channel});
    }
    link->bytes += proxy.network_bytes;
    link->steps += proxy.network_steps;
    link->network_ms += static_cast<double>(proxy.network_ns) / 1e6;
  }
}

void PaceLog::Add(std::uint64_t seq, bool collective, double gpu_ms, std::int64_t enqueue_ns,
                  std::int64_t end_ns, const std::vector<ProxyOpSnapshot>& proxies) {
  if (seq == 0) return;
  const std::uint64_t number = (seq - 1) / kPaceBlockOps;
  MutexLock lock(mutex_);
  Block& block = blocks_[number % blocks_.size()];
  if (block.pace.first_seq != number * kPaceBlockOps + 1) {
    block = Block{};
    block.pace.first_seq = number * kPaceBlockOps + 1;
  }
  ++block.ops;
  if (enqueue_ns > 0 && (block.first_enqueue_ns == 0 || enqueue_ns < block.first_enqueue_ns)) {
    block.first_enqueue_ns = enqueue_ns;
  }
  block.last_end_ns = std::max(block.last_end_ns, end_ns);
  if (collective && gpu_ms >= 0) {
    ++block.pace.collectives;
    block.pace.wait_ms += gpu_ms;
  }
  AddLinks(block, proxies);
}

std::vector<PaceBlockSnapshot> PaceLog::Blocks() const {
  std::vector<PaceBlockSnapshot> blocks;
  MutexLock lock(mutex_);
  for (const Block& block : blocks_) {
    if (block.ops != kPaceBlockOps) continue;
    PaceBlockSnapshot& copy = blocks.emplace_back(block.pace);
    copy.wait_ms = ToMicroseconds(copy.wait_ms);
    if (block.first_enqueue_ns > 0 && block.last_end_ns > block.first_enqueue_ns) {
      copy.span_ms = ToMicroseconds(static_cast<double>(block.last_end_ns - block.first_enqueue_ns) / 1e6);
    }
    for (PaceLinkSnapshot& link : copy.links) link.network_ms = ToMicroseconds(link.network_ms);
    std::sort(copy.links.begin(), copy.links.end(), [](const PaceLinkSnapshot& a, const PaceLinkSnapshot& b) {
      return SlownessOf(a) > SlownessOf(b);
    });
    if (copy.links.size() > kPaceLinksPerBlock) copy.links.resize(kPaceLinksPerBlock);
  }
  std::sort(blocks.begin(), blocks.end(),
            [](const PaceBlockSnapshot& a, const PaceBlockSnapshot& b) { return a.first_seq < b.first_seq; });
  // The block being filled when the ring wrapped is the oldest: kPaceBlocks at most.
  if (blocks.size() > kPaceBlocks) blocks.erase(blocks.begin());
  return blocks;
}

void FoldPace(CommState& comm, std::int64_t now_ns) {
  if (comm.ring == nullptr) return;
  const std::uint64_t finished_before = comm.watch_cursor;  // every earlier operation is finished
  if (finished_before > comm.ring_size)
    comm.pace_cursor = std::max(comm.pace_cursor, finished_before - comm.ring_size);
  if (comm.pace_cursor >= finished_before) return;
  std::optional<CommProfileSnapshot> profile;
  if (CommProfile* source = comm.profile.load(std::memory_order_acquire)) profile = source->Snapshot();
  static const std::vector<ProxyOpSnapshot> kNoProxies;
  for (; comm.pace_cursor < finished_before; ++comm.pace_cursor) {
    const std::uint64_t seq = comm.pace_cursor;
    const OpRecord& op = comm.Slot(seq);
    if (op.seq.load(std::memory_order_relaxed) != seq) continue;  // overwritten: its block stays incomplete
    const OpState state = op.state.load(std::memory_order_acquire);
    const std::int64_t end_ns = op.end_ns.load(std::memory_order_relaxed);
    const OpProfileSnapshot* profiled = ProfileOf(profile, seq);
    if (profiled != nullptr && StillRunning(*profiled) && now_ns - end_ns < kProxyGraceNs) return;
    const bool collective = Describe(op.api.load(std::memory_order_relaxed)).kind == ApiKind::kCollective;
    const double gpu_ms = state == OpState::kCompleted ? op.gpu_ms.load(std::memory_order_relaxed) : -1.0;
    comm.pace.Add(seq, collective, gpu_ms, op.enqueue_ns.load(std::memory_order_relaxed), end_ns,
                  profiled != nullptr ? profiled->proxy_ops : kNoProxies);
  }
}

}  // namespace ncclguard
