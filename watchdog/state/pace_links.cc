#include "watchdog/state/pace_links.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "watchdog/common/pace.h"

namespace ncclguard {
namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;

std::uint64_t BlockOf(std::uint64_t seq) { return (seq - 1) / kPaceBlockOps; }

// A link's key: never 0. Peers past 2^23 and channels past 255 have none (NCCL has at most 64
// channels).
constexpr std::uint32_t kNoKey = 0;
std::uint32_t KeyOf(int peer, int channel) {
  if (peer < 0 || peer >= (1 << 23) || channel < 0 || channel > 255) return kNoKey;
  return ((static_cast<std::uint32_t>(peer) << 8) | static_cast<std::uint32_t>(channel)) + 1;
}

}  // namespace

PaceLinkTable::PaceLinkTable() {
  for (std::size_t place = 0; place < blocks_.size(); ++place)
    blocks_[place].counts.store(place + 1, kRelaxed);
}

PaceLinkTable::Block* PaceLinkTable::Enter(std::uint64_t seq) noexcept {
  if (seq == 0) return nullptr;
  const std::uint64_t number = BlockOf(seq);
  Block& block = blocks_[number % blocks_.size()];
  // With Take's store of 0 and its load of `writers`, both sequentially consistent: either this
  // writer sees the place closed, or Take waits for it to leave.
  block.writers.fetch_add(1, std::memory_order_seq_cst);
  if (block.counts.load(std::memory_order_seq_cst) == number + 1) return &block;
  Leave(block);
  dropped_.fetch_add(1, kRelaxed);
  return nullptr;
}

void PaceLinkTable::Open(std::uint64_t seq) noexcept {
  if (Block* block = Enter(seq)) {
    block->open.fetch_add(1, kRelaxed);
    Leave(*block);
  }
}

bool PaceLinkTable::Add(Block& block, const ProxyNetworkFigures& figures) noexcept {
  const std::uint32_t key = KeyOf(figures.peer, figures.channel);
  if (key == kNoKey) return false;
  // Links are claimed in slot order and never freed while a writer is inside: two writers of one
  // link race for the same first free slot, and the loser finds the winner's key there.
  for (Link& link : block.links) {
    std::uint32_t held = link.key.load(kRelaxed);
    if (held == kNoKey && link.key.compare_exchange_strong(held, key, kRelaxed)) held = key;
    if (held != key) continue;
    link.steps.fetch_add(figures.network_steps, kRelaxed);
    link.network_ns.fetch_add(figures.network_ns, kRelaxed);
    link.bytes.fetch_add(figures.network_bytes, kRelaxed);
    return true;
  }
  return false;
}

void PaceLinkTable::Close(std::uint64_t seq, const ProxyNetworkFigures* figures, bool lost) noexcept {
  Block* block = Enter(seq);
  if (block == nullptr) return;
  if (lost || (figures != nullptr && figures->network_steps > 0 && !Add(*block, *figures)))
    dropped_.fetch_add(1, kRelaxed);
  block->open.fetch_sub(1, kRelaxed);
  Leave(*block);
}

int PaceLinkTable::Running(std::uint64_t number) const {
  const Block& block = blocks_[number % blocks_.size()];
  if (block.counts.load(std::memory_order_acquire) != number + 1) return 0;
  // Below 0 when NCCL stopped a proxy operation twice after the profile lost it.
  const int open = block.open.load(kRelaxed);
  return open > 0 ? open : 0;
}

std::vector<PaceLinkSnapshot> PaceLinkTable::Take(std::uint64_t number) {
  std::vector<PaceLinkSnapshot> links;
  Block& block = blocks_[number % blocks_.size()];
  if (block.counts.load(std::memory_order_acquire) > number + 1) return links;
  const bool counted = block.counts.exchange(0, std::memory_order_seq_cst) == number + 1;
  // A writer inside does a few atomics and leaves: short, unless its thread was preempted.
  while (block.writers.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
  for (Link& link : block.links) {
    const std::uint32_t key = link.key.load(kRelaxed);
    if (key == kNoKey) break;
    if (counted) {
      links.push_back(
          PaceLinkSnapshot{.peer = static_cast<int>((key - 1) >> 8),
                           .channel = static_cast<int>((key - 1) & 0xFF),
                           .bytes = link.bytes.load(kRelaxed),
                           .steps = link.steps.load(kRelaxed),
                           .network_ms = static_cast<double>(link.network_ns.load(kRelaxed)) / 1e6});
    }
    link.key.store(kNoKey, kRelaxed);
    link.steps.store(0, kRelaxed);
    link.network_ns.store(0, kRelaxed);
    link.bytes.store(0, kRelaxed);
  }
  block.open.store(0, kRelaxed);
  // Publishes the cleared place to the writers of its next block.
  block.counts.store(number + kPaceLinkBlocks + 1, std::memory_order_release);
  return links;
}

}  // namespace ncclguard
