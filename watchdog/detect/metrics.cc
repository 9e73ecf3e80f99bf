#include "watchdog/detect/metrics.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "watchdog/common/bounded_threads.h"
#include "watchdog/common/files.h"
#include "watchdog/common/log.h"
#include "watchdog/common/mutex.h"
#include "watchdog/common/temporaries.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/recover/in_process.h"
#include "watchdog/state/records.h"
#include "watchdog/state/registry.h"

namespace ncclguard {

void WatchdogMetrics::CountStall(bool init, std::string_view verdict) {
  MutexLock lock(mutex_);
  ++(init ? counts_.init_stalls : counts_.operation_stalls);
  auto [entry, inserted] = counts_.stall_verdicts.try_emplace(std::string(verdict), 0);
  ++entry->second;
}

void WatchdogMetrics::CountDump(bool written) {
  MutexLock lock(mutex_);
  ++(written ? counts_.dumps_written : counts_.dumps_not_written);
}

void WatchdogMetrics::CountAsyncError() {
  MutexLock lock(mutex_);
  ++counts_.async_errors;
}

void WatchdogMetrics::CountRecovery(RecoveryOutcome::Result result) {
  MutexLock lock(mutex_);
  switch (result) {
    case RecoveryOutcome::Result::kRecovered:
      ++counts_.recoveries_recovered;
      return;
    case RecoveryOutcome::Result::kFellBack:
      ++counts_.recoveries_fell_back;
      return;
    case RecoveryOutcome::Result::kBroken:
      ++counts_.recoveries_failed;
      return;
  }
}

void WatchdogMetrics::CountAbort() {
  MutexLock lock(mutex_);
  ++counts_.aborts;
}

void WatchdogMetrics::CountExit() {
  MutexLock lock(mutex_);
  ++counts_.exits;
}

void WatchdogMetrics::CountLateRound() {
  MutexLock lock(mutex_);
  ++counts_.late_rounds;
}

MetricsSample WatchdogMetrics::Sample(const Registry& registry, std::uint64_t rounds, bool stalled,
                                      bool running, std::int64_t wall_ns) {
  MutexLock lock(mutex_);
  MetricsSample sample{.counts = counts_,
                       .rounds = rounds,
                       .stalled = stalled,
                       .running = running,
                       .wall_ns = wall_ns,
                       .fail_slow_held = {},
                       .fail_slow_reported = {}};
  std::map<const CommState*, std::uint64_t> now_seen;
  for (const CommState* comm : registry.All()) {
    std::uint64_t operations = comm->last_enqueued.load(std::memory_order_acquire);
    const auto before = seen_operations_.find(comm);
    // Fewer than last time: a communicator freed since, whose state the new one reuses.
    if (before != seen_operations_.end() && operations < before->second) gone_operations_ += before->second;
    if (before != seen_operations_.end()) seen_operations_.erase(before);
    now_seen.emplace(comm, operations);
    const CommLifecycle lifecycle = comm->lifecycle.load(std::memory_order_acquire);
    if (lifecycle != CommLifecycle::kDestroyed && lifecycle != CommLifecycle::kAborted)
      ++sample.communicators;
  }
  for (const auto& [gone, operations] : seen_operations_) gone_operations_ += operations;
  seen_operations_ = std::move(now_seen);
  sample.operations = gone_operations_;
  for (const auto& [comm, operations] : seen_operations_) sample.operations += operations;
  return sample;
}

namespace {

// A label value as the exposition format quotes it; bytes it cannot carry (control characters,
// anything that would not be UTF-8 for certain) become '_', and it is cut at a bound.
std::string LabelValue(std::string_view value) {
  constexpr std::size_t kMaxLabelBytes = 200;
  std::string quoted;
  for (const char c : value.substr(0, kMaxLabelBytes)) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\\' || c == '"') {
      quoted += '\\';
      quoted += c;
    } else if (byte < 0x20 || byte >= 0x7f) {
      quoted += '_';
    } else {
      quoted += c;
    }
  }
  return quoted;
}

// Appends one metric family: its help, its type and one line per (extra label, value).
void AppendFamily(std::string& text, absl::string_view name, absl::string_view type, absl::string_view help,
                  const std::string& labels,
                  const std::vector<std::pair<std::string, std::uint64_t>>& series) {
  absl::StrAppend(&text, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  for (const auto& [extra, value] : series) {
    absl::StrAppend(&text, name, "{", labels, extra.empty() ? "" : ",", extra, "} ", value, "\n");
  }
}

}  // namespace

std::string PrometheusText(const MetricsSample& sample, const MetricsLabels& labels) {
  const std::string common =
      absl::StrCat("job=\"", LabelValue(labels.job), "\",host=\"", LabelValue(labels.host), "\",pid=\"",
                   labels.pid, "\",rank=\"", labels.rank, "\"");
  const WatchdogCounts& counts = sample.counts;
  std::string text;
  AppendFamily(text, "ncclguard_up", "gauge",
               "1 while the process runs under ncclguard, 0 once it has exited.", common,
               {{"", sample.running ? 1 : 0}});
  absl::StrAppend(&text,
                  "# HELP ncclguard_last_update_timestamp_seconds When this file was last written.\n"
                  "# TYPE ncclguard_last_update_timestamp_seconds gauge\n"
                  "ncclguard_last_update_timestamp_seconds{",
                  common, "} ", absl::StrFormat("%.3f", static_cast<double>(sample.wall_ns) / 1e9), "\n");
  AppendFamily(text, "ncclguard_stalls_total", "counter",
               "Operations (kind=operation) and communicator initialisations (kind=init) that stalled.",
               common,
               {{"kind=\"operation\"", counts.operation_stalls}, {"kind=\"init\"", counts.init_stalls}});
  AppendFamily(text, "ncclguard_stalled", "gauge", "1 while a reported stall's operation has not completed.",
               common, {{"", sample.stalled ? 1 : 0}});
  // Every kind, 0 until it happens: a series that appeared at 1 would show no increase().
  std::map<std::string, std::uint64_t, std::less<>> by_kind = counts.stall_verdicts;
  for (int kind = 0; kind <= static_cast<int>(VerdictKind::kUnknown); ++kind) {
    // A running job's pace is no stall's verdict: those have families of their own.
    if (kind == static_cast<int>(VerdictKind::kSlowLink) || kind == static_cast<int>(VerdictKind::kSlowRank))
      continue;
    by_kind.try_emplace(std::string(VerdictKindName(static_cast<VerdictKind>(kind))), 0);
  }
  std::vector<std::pair<std::string, std::uint64_t>> verdicts;
  verdicts.reserve(by_kind.size());
  for (const auto& [verdict, count] : by_kind) {
    verdicts.emplace_back(absl::StrCat("verdict=\"", LabelValue(verdict), "\""), count);
  }
  AppendFamily(text, "ncclguard_stall_verdicts_total", "counter",
               "The cross-rank verdict of each stall reported, by kind (docs/verdicts.md).", common,
               verdicts);
  std::vector<std::pair<std::string, std::uint64_t>> held;
  std::vector<std::pair<std::string, std::uint64_t>> reported;
  for (const VerdictKind kind : {VerdictKind::kSlowLink, VerdictKind::kSlowRank}) {
    const std::string name(VerdictKindName(kind));
    const std::string label = absl::StrCat("kind=\"", name, "\"");
    const auto now = sample.fail_slow_held.find(name);
    const auto total = sample.fail_slow_reported.find(name);
    held.emplace_back(label, now != sample.fail_slow_held.end() ? now->second : 0);
    reported.emplace_back(label, total != sample.fail_slow_reported.end() ? total->second : 0);
  }
  AppendFamily(text, "ncclguard_fail_slow", "gauge",
               "Fail-slow verdicts held now, by kind (on the process that judges the job's pace).", common,
               held);
  AppendFamily(text, "ncclguard_fail_slow_reported_total", "counter",
               "Fail-slow verdicts reported, by kind (on the process that judges the job's pace).", common,
               reported);
  AppendFamily(text, "ncclguard_async_errors_total", "counter", "Asynchronous NCCL errors reported.", common,
               {{"", counts.async_errors}});
  AppendFamily(
      text, "ncclguard_dumps_total", "counter", "State dumps, written or not (the file system failed).",
      common,
      {{"outcome=\"written\"", counts.dumps_written}, {"outcome=\"not_written\"", counts.dumps_not_written}});
  AppendFamily(text, "ncclguard_recoveries_total", "counter",
               "In-process recoveries (NCCLGUARD_RECOVER=inprocess), by outcome.", common,
               {{"outcome=\"recovered\"", counts.recoveries_recovered},
                {"outcome=\"fell_back\"", counts.recoveries_fell_back},
                {"outcome=\"failed\"", counts.recoveries_failed}});
  AppendFamily(text, "ncclguard_actions_total", "counter",
               "What NCCLGUARD_ACTION did: communicators aborted, exits for a restart.", common,
               {{"action=\"abort\"", counts.aborts}, {"action=\"exit\"", counts.exits}});
  AppendFamily(text, "ncclguard_operations_total", "counter", "NCCL operations watched.", common,
               {{"", sample.operations}});
  AppendFamily(text, "ncclguard_communicators", "gauge", "Communicators open.", common,
               {{"", static_cast<std::uint64_t>(sample.communicators)}});
  AppendFamily(text, "ncclguard_watchdog_rounds_total", "counter", "Rounds of the watchdog.", common,
               {{"", sample.rounds}});
  AppendFamily(text, "ncclguard_watchdog_late_rounds_total", "counter",
               "Rounds that came far too late: the process was stopped or starved.", common,
               {{"", counts.late_rounds}});
  return text;
}

std::string MetricsFileName(const MetricsLabels& labels) {
  return absl::StrCat("ncclguard_", SafeFileName(labels.job), "_", SafeFileName(labels.host), "_", labels.pid,
                      ".prom");
}

namespace {

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(errno)));
}

absl::Status WriteAndRename(const std::string& directory, const std::string& name, const std::string& text,
                            const std::string& temporary) {
  const int directory_fd = open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (directory_fd < 0) return ErrnoError("open the metrics directory", directory);
  const int fd =
      openat(directory_fd, temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    const absl::Status status = ErrnoError("create", absl::StrCat(directory, "/", temporary));
    close(directory_fd);
    return status;
  }
  // Readable by the node exporter, whatever the process's umask.
  bool written = fchmod(fd, 0644) == 0;
  for (std::size_t done = 0; written && done < text.size();) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    written = n > 0;
    if (written) done += static_cast<std::size_t>(n);
  }
  written = close(fd) == 0 && written;
  // rename() replaces whatever is at `name`, a symbolic link included, and follows none.
  if (written && renameat(directory_fd, temporary.c_str(), directory_fd, name.c_str()) == 0) {
    close(directory_fd);
    return absl::OkStatus();
  }
  const absl::Status status = ErrnoError("write", absl::StrCat(directory, "/", name));
  unlinkat(directory_fd, temporary.c_str(), 0);
  close(directory_fd);
  return status;
}

}  // namespace

absl::Status WriteMetricsFile(const std::string& directory, const std::string& name, const std::string& text,
                              std::chrono::milliseconds deadline) {
  static std::atomic<std::uint64_t> temporaries{0};
  const std::string temporary = TemporaryName(name, SafeFileName(log::HostName()), getpid(),
                                              temporaries.fetch_add(1, std::memory_order_relaxed));
  const absl::StatusOr<bool> done = RunWithDeadline<bool>(
      [directory, name, text, temporary]() -> absl::StatusOr<bool> {
        absl::Status status = WriteAndRename(directory, name, text, temporary);
        if (!status.ok()) return status;
        return true;
      },
      deadline);
  return done.status();
}

}  // namespace ncclguard
