// The latest pace blocks of one communicator (common/pace.h), filled by the watchdog thread as
// operations finish and read by the snapshots on any thread.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "watchdog/common/mutex.h"
#include "watchdog/common/pace.h"
#include "watchdog/common/profile_events.h"

namespace ncclguard {

struct CommState;

class PaceLog {
 public:
  // Finished operation `seq`. `gpu_ms` < 0: not timed (failed, aborted, captured, untimed): it fills
  // its place in the block and adds nothing. `proxies`: what NCCL's profiler told of its proxy
  // operations (none when the communicator has no profile, or it was gone).
  void Add(std::uint64_t seq, bool collective, double gpu_ms, std::int64_t enqueue_ns, std::int64_t end_ns,
           const std::vector<ProxyOpSnapshot>& proxies);
  // The complete blocks kept, oldest first.
  std::vector<PaceBlockSnapshot> Blocks() const;

 private:
  struct Block {
    PaceBlockSnapshot pace;
    std::uint64_t ops = 0;  // how many of its operations were added
    std::int64_t first_enqueue_ns = 0;
    std::int64_t last_end_ns = 0;
  };
  static void AddLinks(Block& block, const std::vector<ProxyOpSnapshot>& proxies);

  mutable Mutex mutex_;
  std::array<Block, kPaceBlocks + 1> blocks_ ABSL_GUARDED_BY(mutex_){};  // by block number; one filling
};

// Adds the communicator's operations that finished since the last call to its pace (watchdog
// thread only), as of `now_ns` (steady). Operations the ring overwrote before they were seen leave their
// block incomplete.
void FoldPace(CommState& comm, std::int64_t now_ns);

}  // namespace ncclguard
