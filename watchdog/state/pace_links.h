// Each send link's time on the network, by pace block (common/pace.h), counted as NCCL's proxy
// operations stop. The profile (state/profiles.h) keeps only a communicator's latest kProfiledOps
// operations, which a job issuing hundreds of operations a second replaces many times between two
// of the watchdog's looks: a proxy operation's final figures go here instead, into the block of
// the operation it belongs to, and the watchdog takes a block's totals once all its operations
// have finished (FoldPace).
//
// NCCL's proxy threads write with a few atomics per proxy operation, no lock. A block's place in
// the table is made ready by the watchdog when it takes the place's previous block: figures for a
// block that has no place (too far ahead of the watchdog, or stopped after the watchdog took it),
// or for a link beyond the kPaceLinkSlots a block counts, are dropped and counted in dropped(),
// never added to another block or link.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "watchdog/common/pace.h"

namespace ncclguard {

// Blocks counted at once, from the oldest the watchdog has not taken: kPaceLinkBlocks ×
// kPaceBlockOps operations (512) between two folds, 5,000 a second at the default poll interval.
inline constexpr std::size_t kPaceLinkBlocks = 64;
// Send links (peer, channel) a block counts: a ring's or a tree's few peers on NCCL's channels.
inline constexpr std::size_t kPaceLinkSlots = 16;

// A send proxy operation's figures once it stopped.
struct ProxyNetworkFigures {
  int peer = -1;
  int channel = 0;
  std::int64_t network_ns = 0;
  std::uint64_t network_bytes = 0;
  int network_steps = 0;
};

class PaceLinkTable {
 public:
  PaceLinkTable();
  PaceLinkTable(const PaceLinkTable&) = delete;
  PaceLinkTable& operator=(const PaceLinkTable&) = delete;

  // NCCL's proxy thread: a send proxy operation of ncclguard's operation `seq` started; it stopped,
  // with its network figures, or `lost` when the profile lost them.
  void Open(std::uint64_t seq) noexcept;
  void Close(std::uint64_t seq, const ProxyNetworkFigures* figures, bool lost = false) noexcept;

  // The watchdog thread: how many send proxy operations of block `number` started and did not stop.
  int Running(std::uint64_t number) const;
  // Block `number`'s send links with their totals (those with steps on the network), in the
  // order first seen; its place then counts block number + kPaceLinkBlocks. Nothing for a block
  // whose place has moved past it.
  std::vector<PaceLinkSnapshot> Take(std::uint64_t number);
  // Figures dropped so far (see the header): proxy operations, and links past a block's slots.
  std::uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  struct Link {
    std::atomic<std::uint32_t> key{0};  // 0: free; else peer and channel (KeyOf)
    std::atomic<std::int32_t> steps{0};
    std::atomic<std::int64_t> network_ns{0};
    std::atomic<std::uint64_t> bytes{0};
  };
  struct Block {
    // The block number + 1 this place counts now; 0 while the watchdog takes it.
    std::atomic<std::uint64_t> counts{0};
    // Proxy threads inside an update: the watchdog waits for none before it reads and clears.
    std::atomic<std::int32_t> writers{0};
    std::atomic<std::int32_t> open{0};
    std::array<Link, kPaceLinkSlots> links{};
  };

  // The place of operation `seq`'s block with a writer entered, or null (then counted dropped).
  Block* Enter(std::uint64_t seq) noexcept;
  static void Leave(Block& block) noexcept { block.writers.fetch_sub(1, std::memory_order_release); }
  bool Add(Block& block, const ProxyNetworkFigures& figures) noexcept;

  std::array<Block, kPaceLinkBlocks> blocks_{};
  std::atomic<std::uint64_t> dropped_{0};
};

}  // namespace ncclguard
