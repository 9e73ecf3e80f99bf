// A communicator's pace, as each rank measures it: its operations in blocks of kPaceBlockOps
// consecutive ones (by seq, so that every rank's block #k holds the same operations), how long the
// GPU spent in the block's collectives, and how long its send links took on the network. The
// watchdog keeps the latest blocks (state/pace.h); statuses and dumps carry them; the fail-slow
// rules compare them across ranks (diagnose/rules_pace.cc). Plain types, seen by state/ and report/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ncclguard {

inline constexpr std::uint64_t kPaceBlockOps = 8;
inline constexpr std::size_t kPaceBlocks = 8;         // kept per communicator, the newest
inline constexpr std::size_t kPaceLinksPerBlock = 8;  // send links per block, the slowest

// One send link of the rank over one block: NCCL's proxy steps to `peer` on `channel` while they
// were on the network (NCCL's SendWait state).
struct PaceLinkSnapshot {
  int peer = -1;
  int channel = 0;
  std::uint64_t bytes = 0;  // 0 when NCCL gave no step sizes
  int steps = 0;
  double network_ms = 0;
};

struct PaceBlockSnapshot {
  std::uint64_t first_seq = 0;  // k × kPaceBlockOps + 1
  // Its collectives that the GPU timed, and their GPU time summed: a rank that enters late finds
  // its peers there and spends the least; those who wait for it, the most.
  int collectives = 0;
  double wait_ms = 0;
  // From the block's first call to its last completion, on this rank's clock.
  double span_ms = 0;
  std::vector<PaceLinkSnapshot> links;
};

}  // namespace ncclguard
