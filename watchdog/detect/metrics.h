// Fleet metrics (NCCLGUARD_METRICS_DIR): what the watchdog saw and did, as a Prometheus
// text-format file per process, for the node exporter's textfile collector. Counters only grow for
// the life of the process; the file is rewritten whole (a temporary renamed over it), never
// appended to, so the collector never reads half a file. docs/metrics.md lists the metrics.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "watchdog/common/mutex.h"
#include "watchdog/recover/in_process.h"
#include "watchdog/state/registry.h"

namespace ncclguard {

// The counts a process publishes; every field only grows.
struct WatchdogCounts {
  std::uint64_t operation_stalls = 0;
  std::uint64_t init_stalls = 0;
  // The cross-rank verdict of each stall reported, by name ("unknown" when none could be made).
  std::map<std::string, std::uint64_t, std::less<>> stall_verdicts;
  std::uint64_t async_errors = 0;
  std::uint64_t dumps_written = 0;
  std::uint64_t dumps_not_written = 0;
  std::uint64_t recoveries_recovered = 0;
  std::uint64_t recoveries_fell_back = 0;
  std::uint64_t recoveries_failed = 0;
  std::uint64_t aborts = 0;  // communicators ncclguard aborted (NCCLGUARD_ACTION=abort)
  std::uint64_t exits = 0;   // exits for a restart (NCCLGUARD_ACTION=exit or reinit)
  std::uint64_t late_rounds = 0;
};

// One publication: the counts with what is read from the state at that moment.
struct MetricsSample {
  WatchdogCounts counts;
  std::uint64_t operations = 0;  // every operation recorded, closed communicators' included
  int communicators = 0;         // open now
  std::uint64_t rounds = 0;      // the watchdog's rounds (its heartbeat)
  bool stalled = false;          // a stall is reported and its operation has not completed
  bool running = true;           // false in the last publication, at exit
  std::int64_t wall_ns = 0;
  // The process that judges the job's pace: its fail-slow verdicts held now, and reported since it
  // started, by kind (slow_link, slow_rank); empty elsewhere.
  std::map<std::string, std::uint64_t> fail_slow_held;
  std::map<std::string, std::uint64_t> fail_slow_reported;
};

// What every metric of a process is labelled with.
struct MetricsLabels {
  std::string job;
  std::string host;
  int pid = 0;
  int rank = -1;  // the launcher's rank, else the first communicator's; -1 when unknown
};

// The watchdog's counts and the tally of operations across communicators that come and go. Each
// method is called from the watchdog's thread, or at exit from the exiting thread.
class WatchdogMetrics {
 public:
  void CountStall(bool init, std::string_view verdict);
  void CountDump(bool written);
  void CountAsyncError();
  void CountRecovery(RecoveryOutcome::Result result);
  void CountAbort();
  void CountExit();
  void CountLateRound();
  MetricsSample Sample(const Registry& registry, std::uint64_t rounds, bool stalled, bool running,
                       std::int64_t wall_ns);

 private:
  Mutex mutex_;
  WatchdogCounts counts_ ABSL_GUARDED_BY(mutex_);
  // The operations of each communicator as last seen, and those of communicators gone since: a
  // counter never goes down when a communicator is freed.
  std::map<const CommState*, std::uint64_t> seen_operations_ ABSL_GUARDED_BY(mutex_);
  std::uint64_t gone_operations_ ABSL_GUARDED_BY(mutex_) = 0;
};

// The sample in Prometheus's text exposition format (version 0.0.4).
std::string PrometheusText(const MetricsSample& sample, const MetricsLabels& labels);

// ncclguard_<job>_<host>_<pid>.prom, each part reduced to a file name's safe characters.
std::string MetricsFileName(const MetricsLabels& labels);

// Writes `text` as directory/name for another user's reader (the node exporter): a temporary of
// mode 0644 in `directory`, never through a symbolic link, renamed over `name`. The directory is
// the administrator's, taken as given. Bounded by `deadline` (a file system that hangs costs a
// thread, never the watchdog).
absl::Status WriteMetricsFile(const std::string& directory, const std::string& name, const std::string& text,
                              std::chrono::milliseconds deadline);

}  // namespace ncclguard
