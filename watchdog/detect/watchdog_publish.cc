// What the watchdog publishes apart from its dumps: the status on the job board, and the metrics
// (NCCLGUARD_METRICS_DIR).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "watchdog/common/mutex.h"
#include "watchdog/detect/metrics.h"
#include "watchdog/detect/progress.h"
#include "watchdog/detect/watchdog.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/report/snapshot_builder.h"
#include "watchdog/state/pace.h"
#include "watchdog/state/records.h"
#include "watchdog/state/registry.h"

namespace ncclguard {

void Watchdog::WriteStatusNow(std::int64_t now_ns) {
  if (!effects_.JobDirectoryKnown()) return;
  MutexLock lock(status_mutex_);
  ProcessSnapshot status = BuildSnapshot(registry_, "status", false, now_ns, effects_.WallNowNs());
  if (reported_stall_) {
    const bool over =
        std::any_of(status.comms.begin(), status.comms.end(),
                    [this](const CommSnapshot& comm) ABSL_EXCLUSIVE_LOCKS_REQUIRED(status_mutex_) {
                      return comm.id == reported_stall_->comm_id &&
                             comm.last_completed >= reported_stall_->seq && reported_stall_->seq != 0;
                    });
    if (over) reported_stall_.reset();
  }
  status.stall = reported_stall_;
  status.fail_slow = fail_slow_.Current();
  effects_.WriteStatus(status);
}

void Watchdog::PublishMetrics(bool running) {
  bool stalled = false;
  std::map<std::string, std::uint64_t> fail_slow_held;
  std::map<std::string, std::uint64_t> fail_slow_reported;
  {
    MutexLock lock(status_mutex_);
    stalled = reported_stall_.has_value();
    fail_slow_held = fail_slow_.HeldByKind();
    fail_slow_reported = fail_slow_.ReportedByKind();
  }
  MetricsSample sample = metrics_.Sample(registry_, heartbeat(), stalled, running, effects_.WallNowNs());
  sample.fail_slow_held = std::move(fail_slow_held);
  sample.fail_slow_reported = std::move(fail_slow_reported);
  effects_.WriteMetrics(sample);
}

ProcessSnapshot Watchdog::FinalStatus(std::int64_t now_ns) {
  for (CommState* comm : registry_.All()) {
    const CommLifecycle lifecycle = comm->lifecycle.load(std::memory_order_acquire);
    if (lifecycle != CommLifecycle::kDestroyed && lifecycle != CommLifecycle::kAborted &&
        !comm->aborted_by_ncclguard.load(std::memory_order_acquire)) {
      AdvanceOperations(*comm, events_, now_ns);
      FoldPace(*comm, now_ns);
    }
  }
  ProcessSnapshot status = BuildSnapshot(registry_, "status", false, now_ns, effects_.WallNowNs());
  MutexLock lock(status_mutex_);
  status.stall = reported_stall_;
  status.fail_slow = fail_slow_.Current();
  status.exiting = true;
  return status;
}

}  // namespace ncclguard
