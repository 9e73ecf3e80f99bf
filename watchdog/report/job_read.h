// Reading a job: what every process of a job left on its board and in its job directory (status
// files or records, dumps), read by a pool of threads within a deadline and merged per process:
// the classifier's input, in the watchdog at a stall and in `ncclguard analyze`. What the merge
// makes of the states (a newer status brought into a dump, initialisations that failed) is the
// classifier's, handed in as ViewBuilding (diagnose/job_view.h).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "watchdog/common/files.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/job_board.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {

// Everything known about one process of the job: its newest dump (with the flight recorder) and
// its status file, merged; `snapshot.comms[i].ring` holds the whole ring when a dump was found,
// else only the oldest unfinished operation (status files carry just that).
struct ProcessView {
  std::string host;
  int pid = -1;
  std::string status_file;        // "" when none
  std::string dump_file;          // the newest dump, "" when none
  std::string dump_reason;        // its reason
  std::int64_t last_seen_ns = 0;  // the newest time of its status or dump (epoch ns)
  // Whether the process exists now: checked with kill(pid, 0) when it ran on this host; unknown
  // on other hosts (then the status file's age decides). Stopped: it exists but does not run
  // (state T or t in /proc: SIGSTOP, a debugger, a cgroup freezer), so its status is as old as the
  // stop and it is busy with nothing.
  enum class Liveness { kAlive, kGone, kUnknown, kStopped };
  Liveness liveness = Liveness::kUnknown;
  bool exited = false;  // it wrote a final status or dump on its way out (a normal exit)
  // Every communicator its last status lists (one at least) was closed by the application, destroyed
  // or finalized: its NCCL work was over, whatever then ended the process (an exit without exit
  // handlers, such as os._exit in a forked worker, writes no final status).
  bool closed_nccl = false;
  // Communicator initialisations that returned an error: a failure is dumped (reason
  // error_return) before the call returns, so the dump shows the initialisation pending; one that
  // is neither pending since nor a communicator of the process failed. Not in pending_inits.
  std::vector<PendingInitSnapshot> failed_inits;
  ProcessSnapshot snapshot;
  ProcessFacts facts;  // from the dump, else the status file (no memory figures)
};

// The files of a job directory that were not read because a bound stopped the reading: the
// deadline passed, or a cap on how many files, bytes or ranks are read was reached. Unlike a file
// that is missing or unreadable (a problem), such a file may well hold a live rank's record: the
// processes that wrote only such files are neither present nor absent, so the classifier names
// none of the ranks it cannot find as missing while any is not read.
struct NotRead {
  std::size_t files = 0;
  // Processes (told apart by the host and pid in the files' names) none of whose files was read.
  std::size_t processes = 0;
  // More files were there than could be listed: how many, and whose, is not known.
  bool listing_cut_short = false;
  std::vector<std::string> first_files;  // the first few names, for messages
  std::string why;                       // "the deadline passed", "larger than 1048576 bytes", ...

  // Whether some process may be missing from the view only because its files were not read.
  bool SomeProcessMissing() const { return processes > 0 || listing_cut_short; }
};

// A status that has not been rewritten for this many intervals belongs to a process that ended
// or hangs outside the watchdog's reach.
inline constexpr double kStaleIntervals = 3;

struct JobView {
  std::string directory;
  std::int64_t now_ns = 0;             // when it was read (epoch ns)
  double status_interval_seconds = 2;  // a status older than kStaleIntervals intervals is stale
  std::vector<ProcessView> processes;
  std::vector<std::string> problems;  // files that could not be read, and why
  NotRead not_read;                   // files left unread by the deadline or a cap (also in problems)
  // Set by Classify when every process ended together (EndedTogether): when the job ended. The
  // rules then judge the job as it was then, every process alive and a status's age counted to
  // then; `now_ns` and each process's `liveness` still say what was found when it was read.
  std::optional<std::int64_t> ended_together_ns;
};

// Whose job directory is read. kNamedByUser (`ncclguard analyze`): a relative path or a symbolic
// link is followed and the directory may belong to another user. kOwn (the watchdog): it must be
// a real directory of this user, as for writing. Either way, its files are read with ReadFileAt's
// rules (files.h).
enum class JobDirectoryOrigin { kNamedByUser, kOwn };

// What bounds the reading of a job directory. The defaults are what the watchdog and `ncclguard
// analyze` use; tests make them small to see what a bound leaves unread.
struct JobReadLimits {
  // The whole read, listing included; the reading stops at four fifths of it so that what was
  // read in time is still used, and past all of it the caller gives up on a file system that hangs.
  std::chrono::milliseconds deadline = kReadDeadline;
  // Status files and dumps read at most, status files first; the rest is not read.
  std::size_t max_files = std::size_t{1} << 19;
  // On a board that holds every status, the dumps of processes whose status is like most of the
  // job's are read up to this many (they show the same); those of the others are all read.
  std::size_t sampled_dumps = 1024;
  // Threads reading files side by side; 0: eight.
  int threads = 0;
  // The clock the reading stops by (a test's clock moves on with each look).
  std::function<std::chrono::steady_clock::time_point()> now = std::chrono::steady_clock::now;
};
// How the classifier turns what was read into its view: how a status newer than a process's dump
// brings the dump forward, and which initialisations a dump taken for a failed call shows failed.
struct ViewBuilding {
  void (*merge_newer_status)(ProcessSnapshot& snapshot, const ProcessSnapshot& status);
  void (*separate_failed_inits)(ProcessView& view, const ProcessSnapshot& dump);
};

// Reads the job on a thread of its own within `limits`: the dumps (and, without `board`, the
// status files) from `directory`, the statuses from `board` when it keeps them elsewhere; `where`
// names the job in the view and in messages. A directory that cannot be opened fails the read only
// when its status files were to be read there. May throw std::bad_alloc (the callers catch it).
absl::StatusOr<JobView> ReadJobFiles(const std::string& where, const std::string& directory,
                                     const std::shared_ptr<JobBoard>& board, std::int64_t now_ns,
                                     double status_interval_seconds, JobDirectoryOrigin origin,
                                     const JobReadLimits& limits, const ViewBuilding& building);

}  // namespace ncclguard
