#include "watchdog/detect/dump_spacing.h"

#include <algorithm>
#include <cstdint>

#include "watchdog/detect/progress.h"

namespace ncclguard {

StallDumpSpacing::Operation StallDumpSpacing::Of(const Stall& stall) {
  return Operation{.comm_id = stall.comm_id,
                   .kind = stall.kind,
                   .api = stall.api,
                   .datatype = stall.datatype,
                   .count = stall.count,
                   .reduction = stall.reduction,
                   .root_or_peer = stall.root_or_peer};
}

StallDumpSpacing::Decision StallDumpSpacing::Decide(const Stall& stall, std::int64_t now_ns,
                                                    std::int64_t first_spacing_ns,
                                                    std::int64_t max_spacing_ns) {
  const Operation operation = Of(stall);
  if (last_ != operation) {
    last_ = operation;
    spacing_ns_ = first_spacing_ns;
    next_dump_ns_ = now_ns + spacing_ns_;
    skipped_ = 0;
    return Decision{.dump = true, .skipped = 0, .next_dump_ns = next_dump_ns_};
  }
  if (now_ns < next_dump_ns_) {
    ++skipped_;
    return Decision{.dump = false, .skipped = skipped_, .next_dump_ns = next_dump_ns_};
  }
  const int skipped = skipped_;
  skipped_ = 0;
  spacing_ns_ = std::min(2 * spacing_ns_, std::max(max_spacing_ns, first_spacing_ns));
  next_dump_ns_ = now_ns + spacing_ns_;
  return Decision{.dump = true, .skipped = skipped, .next_dump_ns = next_dump_ns_};
}

}  // namespace ncclguard
