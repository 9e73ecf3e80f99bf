// The latest pace blocks of one communicator (common/pace.h), filled by the watchdog thread as
// operations finish and read by the snapshots on any thread.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "watchdog/common/mutex.h"
#include "watchdog/common/pace.h"

namespace ncclguard {

struct CommState;

class PaceLog {
 public:
  // Finished operation `seq`. `gpu_ms` < 0: not timed (failed, aborted, captured, untimed): it fills
  // its place in the block and adds nothing.
  void Add(std::uint64_t seq, bool collective, double gpu_ms, std::int64_t enqueue_ns, std::int64_t end_ns);
  // The send links of the block that holds operation `seq`, their totals over the block's
  // operations (PaceLinkTable::Take), after its operations were added.
  void SetLinks(std::uint64_t seq, std::vector<PaceLinkSnapshot> links);
  // The complete blocks kept, oldest first.
  std::vector<PaceBlockSnapshot> Blocks() const;

 private:
  struct Block {
    PaceBlockSnapshot pace;
    std::uint64_t ops = 0;  // how many of its operations were added
    std::int64_t first_enqueue_ns = 0;
    std::int64_t last_end_ns = 0;
  };
  mutable Mutex mutex_;
  std::array<Block, kPaceBlocks + 1> blocks_ ABSL_GUARDED_BY(mutex_){};  // by block number; one filling
};

// Adds the communicator's operations that finished since the last call to its pace (watchdog
// thread only), as of `now_ns` (steady), and each complete block's send links from its profile's
// PaceLinkTable. Operations the ring overwrote before they were seen leave their block incomplete.
void FoldPace(CommState& comm, std::int64_t now_ns);

}  // namespace ncclguard
