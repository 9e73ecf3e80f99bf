// The job's coordination directory, NCCLGUARD_DUMP_DIR/<job id>/: every process keeps a small
// status file there, and a process that detects a stall leaves a dump request that every other
// process of the job notices. Files and atomic renames only: no locks, no inotify, no server, so
// it works in a local directory and on a shared file system alike. Layout and metadata load:
// docs/dump-format.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "watchdog/common/config.h"
#include "watchdog/common/files.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/job_id.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {

inline constexpr int kStatusFormatVersion = 1;  // same bump rule as dumps
inline constexpr char kDumpRequestsDirectory[] = "dump-requests";

// NCCLGUARD_DUMP_DIR (default $TMPDIR/ncclguard-<uid>, else /tmp/ncclguard-<uid>) / job_id.
std::string JobDirectory(const Config& config, const std::string& job_id);

// How often a process of a job of `job_processes` processes rewrites its status file and looks
// for dump requests: NCCLGUARD_STATUS_INTERVAL, stretched so that the whole job writes at most
// `writes_per_second` statuses per second on its board (kJobStatusWritesPerSecond into a shared
// directory; a Redis board takes more, JobBoard::StatusWritesPerSecond).
inline constexpr double kJobStatusWritesPerSecond = 1000;
double StatusIntervalSeconds(double configured_seconds, int job_processes,
                             double writes_per_second = kJobStatusWritesPerSecond);

// Writes status-<host>-<pid>.json: the process's identity, its stall if any, per communicator
// its progress, oldest outstanding operation (the first unfinished entry of the communicator's
// ring, when the caller put one there; the rest of the ring is not written) and the signatures of
// its latest operations (for the first kMaxSignedCommunicators communicators), and the facts that
// do not change while it runs (environment, kernel, drivers, GPUs: collected once by the caller,
// CollectMatchingFacts; memory figures are not written). Rewritten in place (InPlaceFile), ending
// with a checksum that tells a reader a rewrite it saw half done, or one a crash cut off. Never
// lists the job directory: the temporaries of killed writers are left to the tools that read the
// whole job (RemoveAbandonedTemporaries).
absl::StatusOr<std::string> WriteStatus(const std::string& job_dir, const ProcessSnapshot& snapshot,
                                        const ProcessFacts& facts) noexcept;

// The status document WriteStatus writes (with its checksum and a final newline), for a board that
// keeps it elsewhere; and its file name, status-<host>-<pid>.json. With `facts_digest`, the
// status names its facts record (FormatStatusFacts) by that digest instead of holding the facts:
// a board that keeps each process's unchanging facts once, not in every status.
absl::StatusOr<std::string> FormatStatus(const ProcessSnapshot& snapshot, const ProcessFacts& facts,
                                         std::string_view facts_digest = {}) noexcept;
std::string StatusName(const ProcessFacts& facts);

// The facts a status holds (environment and system facts), as a record of their own, and its
// digest (16 hex digits of FNV-1a), the name under which statuses refer to it. Processes with the
// same facts (a node's ranks on GPUs alike, most of a job) share one record.
struct StatusFactsRecord {
  std::string digest;
  std::string content;
};
absl::StatusOr<StatusFactsRecord> FormatStatusFacts(const ProcessFacts& facts) noexcept;
// The facts record `content` named `digest`, read back into `facts` (environment and system facts;
// the rest left as they are). Fails on a record whose digest is not `digest` or of the wrong shape.
absl::Status ParseStatusFacts(std::string_view digest, const std::string& content,
                              ProcessFacts& facts) noexcept;

struct PeerStatus {
  std::string file;
  std::string host;
  int pid = -1;
  // time_ns, rank, in_nccl_call, stall, pending_inits, exiting, and per communicator id, rank,
  // nranks, state, progress, async_error, operation signatures, and the last completed and oldest
  // outstanding operations (as its only ring entries).
  ProcessSnapshot snapshot;
  // host, pid, environment and the system facts (kernel, drivers, GPUs without memory); left at
  // their defaults when the file was written by an earlier build, or when the status names a
  // facts record instead (facts_digest).
  ProcessFacts facts;
  std::string facts_digest;  // the facts record that holds this status's facts; empty: inline
};

struct StatusScan {
  std::vector<PeerStatus> statuses;   // sorted by file name
  std::vector<std::string> problems;  // "file: why" for each status file that could not be read
};

// Every status file of the job directory, including those of processes that have ended (they are
// evidence, and nobody removes them). Lists the directory and reads every file: meant for the one
// process that analyses a stall, not for every process at every interval.
absl::StatusOr<StatusScan> ReadStatuses(const std::string& job_dir) noexcept;

// One status document as a board that does not keep statuses as files holds it (`name` says
// where, in messages). Such a board sets a status whole, in one command: its checksum, there for
// files rewritten in place, is not checked.
absl::StatusOr<PeerStatus> ParseStatusRecord(const std::string& name, const std::string& content) noexcept;

// The same in the directory open as `directory_fd`, with ReadFileAt's rules; the files not read
// by `deadline` are problems.
StatusScan ReadStatusesAt(int directory_fd, std::chrono::steady_clock::time_point deadline);

// One status file, `name` in the directory open as `directory_fd`, as ReadStatusesAt reads each:
// for a reader that reads a job's files side by side. Never throws.
absl::StatusOr<PeerStatus> ReadStatusFileAt(int directory_fd, const std::string& name) noexcept;

struct DumpRequest {
  std::string name;  // dump-request-<host>-<pid>-<n>
  std::string requester;
  std::string host;
  int pid = -1;
  std::int64_t time_ns = 0;
  // The requester's communicators: a process that has none of them is of another job (one that
  // shares the job id). Empty in a request that names none (or of an older ncclguard).
  std::vector<std::string> comms;
};

// A dump request's name and document, as RequestDumps writes them (for a board kept elsewhere).
struct FormattedDumpRequest {
  std::string name;
  std::string content;
};
absl::StatusOr<FormattedDumpRequest> FormatDumpRequest(const std::string& requester,
                                                       const std::vector<std::string>& comms = {}) noexcept;
// A request as read back; one whose document cannot be read is still a request.
DumpRequest ParseDumpRequest(const std::string& name, const absl::StatusOr<std::string>& content);

// What a watcher of dump requests reports of the requests it lists: each once, never the
// process's own, and at the first listing only those made since the process started (the others
// are an earlier launch's with the same job id).
class RequestSieve {
 public:
  RequestSieve(std::string own_host, int own_pid, std::int64_t fresh_since_ns)
      : own_host_(std::move(own_host)), own_pid_(own_pid), fresh_since_ns_(fresh_since_ns) {}
  // Whether the requests must be listed, the latest request being `generation` ("" when none).
  bool MustList(const std::string& generation) const {
    return !baseline_taken_ || generation != seen_generation_;
  }
  // The requests already reported or passed over: a listing may leave them out.
  const std::set<std::string>& handled() const { return handled_; }
  bool baseline_taken() const { return baseline_taken_; }
  std::int64_t fresh_since_ns() const { return fresh_since_ns_; }
  // The first look without a listing, so that a job's start lists nothing: nobody has asked yet
  // (`generation` ""), or the latest request, `generation`, was made at `made_ns`, before this
  // process started. Requests listed later that were made before it are an earlier launch's.
  void TakeUnlistedBaseline(const std::string& generation, std::int64_t made_ns);
  // Takes note of a listing made when the latest request was `generation`; returns what to report.
  std::vector<DumpRequest> Sift(std::vector<DumpRequest> listed, const std::string& generation);

 private:
  std::string own_host_;
  int own_pid_;
  std::int64_t fresh_since_ns_;
  bool baseline_taken_ = false;
  std::int64_t old_before_ns_ = std::numeric_limits<std::int64_t>::min();  // after the baseline
  std::string seen_generation_;
  std::set<std::string> handled_;
};

// Asks every process of the job to dump: writes dump-requests/dump-request-<host>-<pid>-<n>, then
// the generation file that the other processes watch (in place: they keep it open). Returns the
// request's name.
absl::StatusOr<std::string> RequestDumps(const std::string& job_dir, const std::string& requester,
                                         const std::vector<std::string>& comms = {}) noexcept;

// The requests in the directory whose names are not in `already_handled`, oldest name first.
// Lists the requests directory on every call.
absl::StatusOr<std::vector<DumpRequest>> PendingDumpRequests(
    const std::string& job_dir, const std::set<std::string>& already_handled) noexcept;

// What a process calls every status interval. Reads the one small generation file, which it
// keeps open (created empty when missing), and lists the requests directory only when it changed,
// so a quiet job costs the file system one pread() per process per interval and one open() every
// kInPlaceChecks intervals. The first call takes note of the requests already there (left by an earlier
// launch with the same job id) without reporting them, and without listing them: it reads the one
// request the generation names, and lists only when that one is newer than this process. This
// process's own requests are never reported.
class DumpRequestWatcher {
 public:
  // Requests already in the directory at the first call are taken as old (an earlier launch with
  // the same job id) unless they were made at or after `fresh_since_ns` (epoch ns): a request
  // made after this process started, before it first looked, must not be lost.
  DumpRequestWatcher(std::string job_dir, const std::string& own_host, int own_pid,
                     std::int64_t fresh_since_ns);

  // The requests that appeared since the previous call.
  absl::StatusOr<std::vector<DumpRequest>> Poll() noexcept;

 private:
  std::string job_dir_;
  RequestSieve sieve_;
  std::shared_ptr<PolledFile> generation_;  // kept open: a quiet job's poll is one pread()
};

}  // namespace ncclguard
