// How often the stalls of one operation are dumped. A persistent straggler slower than
// NCCLGUARD_TIMEOUT stalls the same collective at every step: a dump of every waiting process (and
// of the straggler, at their request) at every step would fill the job directory with copies of
// one story and cost every step the time of taking every thread's stack.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "watchdog/detect/progress.h"

namespace ncclguard {

// The first stall of an operation is dumped. A stall of the same operation (communicator,
// collective, type, count, reduction, root or peer; any #N) found less than the spacing after the
// last one dumped is only logged, and counted. The spacing starts at `first_spacing_ns`
// (NCCLGUARD_TIMEOUT: never more than one dump per timeout) and doubles with each dump of the same
// operation, up to `max_spacing_ns`, so that a straggler that persists costs a number of dumps
// that grows with the logarithm of the time. Another operation's stall starts afresh.
class StallDumpSpacing {
 public:
  struct Decision {
    bool dump = true;
    // The stalls of the operation not dumped since its last dump (with this one when it is not).
    int skipped = 0;
    std::int64_t next_dump_ns = 0;  // the earliest time a stall of it is dumped again
  };

  Decision Decide(const Stall& stall, std::int64_t now_ns, std::int64_t first_spacing_ns,
                  std::int64_t max_spacing_ns);

 private:
  struct Operation {
    std::string comm_id;
    Stall::Kind kind = Stall::Kind::kNotCompleted;
    Api api = Api::ncclAllReduce;
    int datatype = -1;
    std::uint64_t count = 0;
    int reduction = -1;
    int root_or_peer = -1;
    bool operator==(const Operation&) const = default;
  };
  static Operation Of(const Stall& stall);

  std::optional<Operation> last_;
  std::int64_t next_dump_ns_ = 0;
  std::int64_t spacing_ns_ = 0;
  int skipped_ = 0;
};

}  // namespace ncclguard
