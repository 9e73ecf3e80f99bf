// Reads a job directory: every dump and status file in it, merged per process (a status newer
// than the dump brings its progress forward), within a deadline.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "watchdog/common/config.h"
#include "watchdog/common/files.h"
#include "watchdog/common/log.h"
#include "watchdog/diagnose/job_view.h"
#include "watchdog/diagnose/op_states.h"
#include "watchdog/report/dump.h"
#include "watchdog/report/dump_reader.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/state/records.h"

namespace ncclguard {
namespace {

std::string ProcessKey(const std::string& host, int pid) { return absl::StrCat(host, "/", pid); }

// The status file is newer than the dump: its progress counters and oldest unfinished operation
// update the dump's communicators (the ring stays the dump's, with states brought forward).
void MergeNewerStatus(ProcessSnapshot& snapshot, const ProcessSnapshot& status) {
  snapshot.time_ns = status.time_ns;
  snapshot.in_nccl_call = status.in_nccl_call;
  snapshot.stall = status.stall;
  snapshot.pending_inits = status.pending_inits;
  snapshot.exiting = snapshot.exiting || status.exiting;
  if (snapshot.rank < 0) snapshot.rank = status.rank;
  for (const CommSnapshot& fresh : status.comms) {
    auto comm = std::find_if(snapshot.comms.begin(), snapshot.comms.end(),
                             [&](const CommSnapshot& known) { return known.id == fresh.id; });
    if (comm == snapshot.comms.end()) {
      snapshot.comms.push_back(fresh);
      continue;
    }
    comm->state = fresh.state;
    comm->last_enqueued = fresh.last_enqueued;
    comm->last_started = fresh.last_started;
    comm->last_completed = fresh.last_completed;
    comm->async_error = fresh.async_error;
    comm->signatures_first_seq = fresh.signatures_first_seq;
    comm->signatures = fresh.signatures;
    for (OpSnapshot& op : comm->ring) {
      if (Unfinished(op) && op.seq <= fresh.last_completed) SetState(op, OpState::kCompleted);
      if (StateOf(op) == OpState::kEnqueued && op.seq <= fresh.last_started) SetState(op, OpState::kStarted);
    }
    for (const OpSnapshot& oldest : fresh.ring) {
      auto known = std::find_if(comm->ring.begin(), comm->ring.end(),
                                [&](const OpSnapshot& op) { return op.seq == oldest.seq; });
      if (known != comm->ring.end()) {
        known->state = oldest.state;
        known->start_ns = oldest.start_ns;
      } else if (comm->ring.empty() || comm->ring.back().seq < oldest.seq) {
        comm->ring.push_back(oldest);
      }
    }
  }
}

// A zombie has ended: only its parent has not collected its exit status yet. kill() still finds
// it, and finds it for long where the parent was killed with it and the pid namespace's init
// does not reap (some containers' first process).
bool IsZombie(int pid) {
  std::ifstream file(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  if (!std::getline(file, stat)) return false;
  // "pid (comm) S ...": the command may hold spaces and parentheses, the state follows the last ')'.
  const std::size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() &&
         (stat[close + 2] == 'Z' || stat[close + 2] == 'X');
}

// The initialisations that a dump taken for a failed call shows pending, that are not pending
// in the process's newest record and made no communicator of it: the call that failed was theirs.
void SeparateFailedInits(ProcessView& view, const ProcessSnapshot& dump) {
  if (view.dump_reason != "error_return") return;
  std::vector<PendingInitSnapshot>& pending = view.snapshot.pending_inits;
  const bool status_newer = view.snapshot.time_ns > dump.time_ns;
  for (const PendingInitSnapshot& init : dump.pending_inits) {
    const bool made = std::any_of(view.snapshot.comms.begin(), view.snapshot.comms.end(),
                                  [&](const CommSnapshot& comm) { return comm.id == init.comm_id; });
    const auto still = std::find_if(pending.begin(), pending.end(), [&](const PendingInitSnapshot& other) {
      return other.comm_id == init.comm_id && other.rank == init.rank && other.start_ns == init.start_ns;
    });
    if (made) continue;
    // Pending in a newer status too: still waiting, whatever failed.
    if (still != pending.end() && status_newer) continue;
    view.failed_inits.push_back(init);
    if (still != pending.end()) pending.erase(still);
  }
}

ProcessView::Liveness CheckLiveness(const std::string& host, int pid, const std::string& own_host) {
  if (own_host.empty() || host != own_host || pid <= 0) return ProcessView::Liveness::kUnknown;
  if (kill(pid, 0) == 0 || errno == EPERM) {
    return IsZombie(pid) ? ProcessView::Liveness::kGone : ProcessView::Liveness::kAlive;
  }
  return errno == ESRCH ? ProcessView::Liveness::kGone : ProcessView::Liveness::kUnknown;
}

// The user names the directory to analyse: a relative path or a symbolic link is theirs to
// give, and its owner may be another user (root analysing a user's job). The process's own job
// directory must be what it writes into: a real directory of this user.
absl::StatusOr<int> OpenJobDirectory(const std::string& directory, JobDirectoryOrigin origin) {
  if (origin == JobDirectoryOrigin::kOwn) return OpenPrivateDirectory(directory, /*create=*/false);
  const int fd = open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open ", directory, ": ", std::strerror(errno)));
  return fd;
}

// The classifier walks every rank of every communicator, and its evidence names each rank that
// left nothing (a few hundred bytes each): the communicators' claimed sizes, each within
// kMaxRanks, must also stay within kMaxRankSlots together (a 16,384-rank job with 16
// communicators spanning it).
class RankSlots {
 public:
  static constexpr std::int64_t kMaxRankSlots = 1 << 18;

  absl::Status Admit(const ProcessSnapshot& snapshot) {
    std::int64_t added = 0;
    std::vector<std::pair<const std::string*, int>> grown;
    auto claim = [&](const std::string& id, int nranks) {
      const auto known = nranks_.find(id);
      const int before = known == nranks_.end() ? 0 : known->second;
      if (nranks > before) {
        added += nranks - before;
        grown.emplace_back(&id, nranks);
      }
    };
    for (const CommSnapshot& comm : snapshot.comms) claim(comm.id, comm.nranks);
    for (const PendingInitSnapshot& init : snapshot.pending_inits) claim(init.comm_id, init.nranks);
    if (total_ + added > kMaxRankSlots) {
      return absl::OutOfRangeError(absl::StrCat("its communicators would take the job past ", kMaxRankSlots,
                                                " ranks in all; not read"));
    }
    total_ += added;
    for (const auto& [id, nranks] : grown) nranks_[*id] = std::max(nranks_[*id], nranks);
    return absl::OkStatus();
  }

 private:
  std::unordered_map<std::string, int> nranks_;
  std::int64_t total_ = 0;
};

// Every dump and status file of the directory open as `directory_fd` that can be read before
// `stop_reading`; the others become problems.
JobView ReadOpenJobDirectory(int directory_fd, const std::string& directory,
                             std::chrono::steady_clock::time_point stop_reading) {
  JobView job;
  job.directory = directory;
  std::unordered_map<std::string, size_t> by_process;
  auto view_of = [&](const std::string& host, int pid) -> ProcessView& {
    auto [found, inserted] = by_process.try_emplace(ProcessKey(host, pid), job.processes.size());
    if (inserted) {
      job.processes.emplace_back();
      job.processes.back().host = host;
      job.processes.back().pid = pid;
    }
    return job.processes[found->second];
  };
  absl::StatusOr<std::vector<std::string>> dump_names = ListNamesAt(directory_fd, "dump-", ".json");
  if (!dump_names.ok()) job.problems.push_back(absl::StrCat("dumps: ", dump_names.status().message()));
  // Dumps written with the default ring are read in full whatever this process's ring.
  const std::size_t max_dump_bytes =
      MaxDumpBytes(std::max(GetConfig().ring_size.value, Config{}.ring_size.value));
  RankSlots slots;
  // The pending initialisations of each process's newest dump, before a newer status replaces them.
  std::unordered_map<std::string, ProcessSnapshot> dump_pending_inits;
  // A process keeps its dump with the latest time.
  for (const std::string& name : dump_names.ok() ? *dump_names : std::vector<std::string>()) {
    if (std::chrono::steady_clock::now() > stop_reading) {
      job.problems.push_back(absl::StrCat(name, " and later dumps: not read, the deadline passed"));
      break;
    }
    absl::StatusOr<std::string> content = ReadFileAt(directory_fd, name, max_dump_bytes);
    absl::StatusOr<ParsedDump> dump =
        content.ok() ? ParseDump(*content) : absl::StatusOr<ParsedDump>(content.status());
    if (absl::Status admitted = dump.ok() ? slots.Admit(dump->snapshot) : absl::OkStatus(); !admitted.ok()) {
      dump = admitted;
    }
    if (!dump.ok()) {
      job.problems.push_back(absl::StrCat(name, ": ", dump.status().message()));
      continue;
    }
    ProcessView& view = view_of(dump->facts.host, dump->facts.pid);
    if (!view.dump_file.empty() && view.snapshot.time_ns >= dump->snapshot.time_ns) continue;
    view.dump_file = absl::StrCat(directory, "/", name);
    view.dump_reason = dump->snapshot.reason;
    ProcessSnapshot& pending = dump_pending_inits[ProcessKey(dump->facts.host, dump->facts.pid)];
    pending.time_ns = dump->snapshot.time_ns;
    pending.pending_inits = dump->snapshot.pending_inits;
    view.snapshot = std::move(dump->snapshot);
    view.facts = std::move(dump->facts);
  }

  StatusScan statuses = ReadStatusesAt(directory_fd, stop_reading);
  job.problems.insert(job.problems.end(), statuses.problems.begin(), statuses.problems.end());
  for (PeerStatus& status : statuses.statuses) {
    if (absl::Status admitted = slots.Admit(status.snapshot); !admitted.ok()) {
      job.problems.push_back(absl::StrCat(status.file, ": ", admitted.message()));
      continue;
    }
    ProcessView& view = view_of(status.host, status.pid);
    view.status_file = absl::StrCat(directory, "/", status.file);
    if (view.dump_file.empty()) {
      view.snapshot = std::move(status.snapshot);
      // A dump's facts are the fuller ones; without a dump, the status file's are what there is.
      view.facts = std::move(status.facts);
    } else if (status.snapshot.time_ns > view.snapshot.time_ns) {
      MergeNewerStatus(view.snapshot, status.snapshot);
    }
  }

  const std::string own_host = log::HostName();
  for (ProcessView& view : job.processes) {
    SeparateFailedInits(view, dump_pending_inits[ProcessKey(view.host, view.pid)]);
    view.last_seen_ns = view.snapshot.time_ns;
    view.liveness = CheckLiveness(view.host, view.pid, own_host);
    view.exited = view.snapshot.exiting || view.dump_reason == "exit";
  }
  std::sort(job.processes.begin(), job.processes.end(), [](const ProcessView& a, const ProcessView& b) {
    return std::tie(a.snapshot.rank, a.host, a.pid) < std::tie(b.snapshot.rank, b.host, b.pid);
  });
  return job;
}

}  // namespace

absl::StatusOr<JobView> ReadJobDirectory(const std::string& directory, std::int64_t now_ns,
                                         double status_interval_seconds, JobDirectoryOrigin origin,
                                         std::chrono::milliseconds deadline) noexcept {
  try {
    // The reading thread stops a little before the caller gives up on it, so that what was read
    // in time is still used.
    const auto stop_reading = std::chrono::steady_clock::now() + deadline * 4 / 5;
    absl::StatusOr<JobView> job = RunWithDeadline<JobView>(
        [=]() -> absl::StatusOr<JobView> {
          absl::StatusOr<int> directory_fd = OpenJobDirectory(directory, origin);
          if (!directory_fd.ok()) return directory_fd.status();
          JobView job = ReadOpenJobDirectory(*directory_fd, directory, stop_reading);
          close(*directory_fd);
          job.now_ns = now_ns;
          job.status_interval_seconds = status_interval_seconds;
          return job;
        },
        deadline);
    if (absl::IsDeadlineExceeded(job.status())) {
      return absl::DeadlineExceededError(
          absl::StrCat("reading ", directory, " took longer than ", deadline.count(), " ms; given up"));
    }
    return job;
  } catch (...) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot read ", directory));
  }
}

}  // namespace ncclguard
