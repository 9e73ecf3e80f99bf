#include "watchdog/state/pace.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "watchdog/common/mutex.h"
#include "watchdog/common/nccl_api.h"
#include "watchdog/common/pace.h"
#include "watchdog/state/pace_links.h"
#include "watchdog/state/profiles.h"
#include "watchdog/state/records.h"

namespace ncclguard {
namespace {

// Microseconds are all a judgement needs; the digits beyond would lengthen every status.
double ToMicroseconds(double ms) { return std::round(ms * 1000) / 1000; }

// Milliseconds on the network per MB (per step where NCCL gave no sizes): higher is slower.
double SlownessOf(const PaceLinkSnapshot& link) {
  if (link.bytes > 0) return link.network_ms * 1e6 / static_cast<double>(link.bytes);
  return link.steps > 0 ? link.network_ms / link.steps : 0;
}

// NCCL reports a send's proxy steps until the network completed them, which may be after the
// kernel stopped: a block whose proxy operations still run is folded once they stopped, or once
// its last operation ended this long ago.
constexpr std::int64_t kProxyGraceNs = 1'000'000'000;

}  // namespace

void PaceLog::Add(std::uint64_t seq, bool collective, double gpu_ms, std::int64_t enqueue_ns,
                  std::int64_t end_ns) {
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
}

void PaceLog::SetLinks(std::uint64_t seq, std::vector<PaceLinkSnapshot> links) {
  if (seq == 0) return;
  const std::uint64_t number = (seq - 1) / kPaceBlockOps;
  MutexLock lock(mutex_);
  Block& block = blocks_[number % blocks_.size()];
  if (block.pace.first_seq == number * kPaceBlockOps + 1) block.pace.links = std::move(links);
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

namespace {

// Operations whose blocks' links are not needed: those the ring overwrote before the watchdog saw
// them, [from, to). Their blocks' places in the table are made ready for the blocks after.
void DropLinks(PaceLinkTable& links, std::uint64_t from, std::uint64_t to) {
  const std::uint64_t first = (from - 1) / kPaceBlockOps;
  const std::uint64_t end = (to - 1) / kPaceBlockOps;  // its block is still to come
  for (std::uint64_t number = std::max(first, end > kPaceLinkBlocks ? end - kPaceLinkBlocks : 0);
       number < end; ++number)
    links.Take(number);
}

}  // namespace

void FoldPace(CommState& comm, std::int64_t now_ns) {
  if (comm.ring == nullptr) return;
  const std::uint64_t finished_before = comm.watch_cursor;  // every earlier operation is finished
  CommProfile* profile = comm.profile.load(std::memory_order_acquire);
  PaceLinkTable* links = profile != nullptr ? &profile->pace_links() : nullptr;
  if (finished_before > comm.ring_size && comm.pace_cursor < finished_before - comm.ring_size) {
    if (links != nullptr) DropLinks(*links, comm.pace_cursor, finished_before - comm.ring_size);
    comm.pace_cursor = finished_before - comm.ring_size;
  }
  for (; comm.pace_cursor < finished_before; ++comm.pace_cursor) {
    const std::uint64_t seq = comm.pace_cursor;
    const std::uint64_t number = (seq - 1) / kPaceBlockOps;
    const bool closes_block = seq % kPaceBlockOps == 0;
    const OpRecord& op = comm.Slot(seq);
    if (op.seq.load(std::memory_order_relaxed) != seq) {  // overwritten: its block stays incomplete
      if (closes_block && links != nullptr) links->Take(number);
      continue;
    }
    const OpState state = op.state.load(std::memory_order_acquire);
    const std::int64_t end_ns = op.end_ns.load(std::memory_order_relaxed);
    if (closes_block && links != nullptr && links->Running(number) > 0 && now_ns - end_ns < kProxyGraceNs)
      return;
    const bool collective = Describe(op.api.load(std::memory_order_relaxed)).kind == ApiKind::kCollective;
    const double gpu_ms = state == OpState::kCompleted ? op.gpu_ms.load(std::memory_order_relaxed) : -1.0;
    comm.pace.Add(seq, collective, gpu_ms, op.enqueue_ns.load(std::memory_order_relaxed), end_ns);
    if (closes_block && links != nullptr) comm.pace.SetLinks(seq, links->Take(number));
  }
}

}  // namespace ncclguard
