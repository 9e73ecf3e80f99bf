// How the job reader (job_reader.cc) merges what its threads read: the files to read, what became
// of each, the processes found so far in their ranks' slots, and the cap on the ranks of the job.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "watchdog/common/log.h"
#include "watchdog/report/dump_reader.h"
#include "watchdog/report/job_board.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/report/job_files.h"
#include "watchdog/report/job_read.h"
#include "watchdog/report/liveness.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/state/records.h"

namespace ncclguard::job_reading {

inline std::string ProcessKey(const std::string& host, int pid) { return absl::StrCat(host, "/", pid); }

// ProcessView::closed_nccl: the states are CommLifecycleName's (state/records.h).
inline bool ClosedEveryCommunicator(const ProcessSnapshot& snapshot) {
  return !snapshot.comms.empty() &&
         std::all_of(snapshot.comms.begin(), snapshot.comms.end(), [](const CommSnapshot& comm) {
           return comm.state == CommLifecycleName(CommLifecycle::kDestroyed) ||
                  comm.state == CommLifecycleName(CommLifecycle::kFinalized);
         });
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

// A file of the job directory to read: status files first, so that a deadline leaves as few
// processes unread as it can (a status file is small and every live process has one), then dumps.
struct JobFile {
  enum class Kind { kStatus, kDump };
  std::string name;
  Kind kind;
  // A status the board fetched (Redis), parsed instead of a file read; null for a file.
  const StatusRecord* record = nullptr;
  std::size_t record_index = 0;  // its position among the fetched records
};

// What became of each file.
enum class Outcome : std::uint8_t {
  kNotRead,     // a bound stopped the reading before it (the deadline, the count of files)
  kSampledOut,  // a dump of a process like the rest, past JobReadLimits::sampled_dumps of them
  kRead,        // in the view (or an older dump of a process whose newer dump is)
  kCapped,      // refused by a cap on bytes or ranks: not read either, and said among the problems
  kUnreadable,  // not a readable file of ours: a problem
};

// The process that wrote a file, as its name says: "<host>-<pid>" of status-<host>-<pid>.json and
// of dump-<host>-<pid>-<rank>-<n>.json (the host as SafeFileName wrote it).
inline std::string_view WriterOf(const JobFile& file) {
  std::string_view name = file.name;
  const bool status = file.kind == JobFile::Kind::kStatus;
  name.remove_prefix(status ? std::strlen(kStatusPrefix) : std::strlen(kDumpPrefix));
  name.remove_suffix(std::strlen(kJsonSuffix));
  for (int part = 0; !status && part < 2; ++part)
    name = name.substr(0, std::min(name.rfind('-'), name.size()));
  return name;
}

// What the reading threads share: the processes found so far, filled under the mutex. Every
// status file is added before the first dump (ReadOpenJobDirectory reads them in two rounds), so
// that a process's status, merged into its dump as soon as the dump is in, is not held meanwhile:
// a job's worth of status snapshots would double the memory.
//
// A process whose status comes in is given the slot of its rank when no other took it (ranks are
// usually 0 to N-1, one per process), so that the views come out in rank order: sorting 100,000
// views of a kilobyte each by moving them took a tenth of a second. The slots no process took are
// dropped once the statuses are in (StatusesMerged); dumps then add processes at the end.
class Merger {
 public:
  // `several_dumps`: the writers (WriterOf) of more than one dump, whose status waits for all.
  // `dump_directory`: where the dumps are files (the job's directory, also when the statuses come
  // from another board).
  // `building`: the classifier's merge of a newer status and of a failed call's dump.
  Merger(JobView& job, std::string dump_directory, std::size_t expected_processes,
         absl::flat_hash_set<std::string_view> several_dumps, const ViewBuilding& building)
      : job_(job),
        dump_directory_(std::move(dump_directory)),
        several_dumps_(std::move(several_dumps)),
        building_(building) {
    job_.processes.resize(expected_processes);
    marks_.resize(expected_processes);
    by_process_.reserve(expected_processes);
  }

  // The statuses `statuses` (indices into `files`, and what was read of them), each file's outcome
  // in `outcomes`; the caller holds no lock.
  void AddStatuses(const std::vector<JobFile>& files,
                   std::vector<std::pair<std::size_t, PeerStatus>>& statuses,
                   std::vector<Outcome>& outcomes) {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [index, status] : statuses) outcomes[index] = AddStatusLocked(files[index], std::move(status));
  }

  // Returns the file's outcome; the caller holds no lock.
  Outcome AddDump(const JobFile& file, ParsedDump dump) {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (absl::Status admitted = slots_.Admit(dump.snapshot); !admitted.ok()) {
      job_.problems.push_back(absl::StrCat(file.name, ": ", admitted.message()));
      return Outcome::kCapped;
    }
    const std::size_t index = IndexOf(dump.facts.host, dump.facts.pid, std::nullopt);
    ProcessView& view = job_.processes[index];
    // A process keeps its dump with the latest time.
    if (!view.dump_file.empty() && view.snapshot.time_ns >= dump.snapshot.time_ns) return Outcome::kRead;
    std::optional<ProcessSnapshot> status;
    if (marks_[index].status_only) status = std::move(view.snapshot);
    marks_[index].status_only = false;
    view.dump_file = absl::StrCat(dump_directory_, "/", file.name);
    view.dump_reason = dump.snapshot.reason;
    // Only a dump taken for a failed call tells initialisations that failed (SeparateFailedInits).
    failed_call_dumps_.erase(index);
    if (view.dump_reason == "error_return") {
      ProcessSnapshot& pending = failed_call_dumps_[index];
      pending.time_ns = dump.snapshot.time_ns;
      pending.pending_inits = dump.snapshot.pending_inits;
    }
    // A dump's facts are the fuller ones.
    view.snapshot = std::move(dump.snapshot);
    view.facts = std::move(dump.facts);
    if (!status) return Outcome::kRead;
    // A newer dump of the same process may follow: then the status waits for it.
    if (several_dumps_.contains(WriterOf(file))) {
      waiting_statuses_.insert_or_assign(index, *std::move(status));
    } else if (status->time_ns > view.snapshot.time_ns) {
      building_.merge_newer_status(view.snapshot, *status);
    }
    return Outcome::kRead;
  }

  // Once every status is in (the reading threads are done): the slots no process took dropped.
  void StatusesMerged() {
    ranked_slots_ = false;
    if (std::all_of(marks_.begin(), marks_.end(), [](const Marks& marks) { return marks.taken; })) return;
    std::vector<std::size_t> moved_to(job_.processes.size());
    std::size_t kept = 0;
    for (std::size_t index = 0; index < job_.processes.size(); ++index) {
      if (!marks_[index].taken) continue;
      moved_to[index] = kept;
      if (kept != index) {
        job_.processes[kept] = std::move(job_.processes[index]);
        marks_[kept] = marks_[index];
      }
      ++kept;
    }
    job_.processes.resize(kept);
    marks_.resize(kept);
    for (auto& [process, index] : by_process_) index = moved_to[index];
  }

  void AddProblem(std::string problem) {
    const std::lock_guard<std::mutex> lock(mutex_);
    job_.problems.push_back(std::move(problem));
  }

  // Once every reading thread is done: the statuses that waited merged, failed initialisations
  // set apart, liveness looked at.
  void Finish() {
    const std::string own_host = log::HostName();
    for (std::size_t index = 0; index < job_.processes.size(); ++index) {
      ProcessView& view = job_.processes[index];
      if (const auto status = waiting_statuses_.find(index); status != waiting_statuses_.end()) {
        if (status->second.time_ns > view.snapshot.time_ns)
          building_.merge_newer_status(view.snapshot, status->second);
        waiting_statuses_.erase(status);
      }
      if (const auto dump = failed_call_dumps_.find(index); dump != failed_call_dumps_.end()) {
        building_.separate_failed_inits(view, dump->second);
      }
      view.last_seen_ns = view.snapshot.time_ns;
      view.liveness = CheckLiveness(view.host, view.pid, own_host);
      view.exited = view.snapshot.exiting || view.dump_reason == "exit";
      view.closed_nccl = ClosedEveryCommunicator(view.snapshot);
    }
  }

 private:
  // Returns the file's outcome; the caller holds mutex_.
  Outcome AddStatusLocked(const JobFile& file, PeerStatus status) {
    if (absl::Status admitted = slots_.Admit(status.snapshot); !admitted.ok()) {
      job_.problems.push_back(absl::StrCat(file.name, ": ", admitted.message()));
      return Outcome::kCapped;
    }
    const std::size_t index = IndexOf(status.host, status.pid, status.snapshot.rank);
    ProcessView& view = job_.processes[index];
    view.status_file = absl::StrCat(job_.directory, "/", file.name);
    if (view.dump_file.empty()) {
      // Until a dump comes, the status is all there is of the process, facts included.
      view.snapshot = std::move(status.snapshot);
      view.facts = std::move(status.facts);
      marks_[index].status_only = true;
    } else if (status.snapshot.time_ns > view.snapshot.time_ns) {
      building_.merge_newer_status(view.snapshot, status.snapshot);
    }
    return Outcome::kRead;
  }

  // The process's view, made when it is new: at the slot of `rank` while statuses come in and the
  // slot is free, else at the end.
  std::size_t IndexOf(const std::string& host, int pid, std::optional<int> rank) {
    std::string key = ProcessKey(host, pid);
    if (const auto found = by_process_.find(key); found != by_process_.end()) return found->second;
    const bool at_rank = ranked_slots_ && rank && *rank >= 0 &&
                         static_cast<std::size_t>(*rank) < marks_.size() &&
                         !marks_[static_cast<std::size_t>(*rank)].taken;
    const std::size_t views = job_.processes.size();
    const std::size_t index = at_rank ? static_cast<std::size_t>(*rank) : views;
    try {
      if (!at_rank) {
        job_.processes.emplace_back();
        marks_.emplace_back();
      }
      by_process_.emplace(std::move(key), index);
    } catch (...) {
      // No memory: the views and their marks stay as they were.
      job_.processes.resize(views);
      marks_.resize(views);
      throw;
    }
    marks_[index].taken = true;
    ProcessView& view = job_.processes[index];
    view.host = host;
    view.pid = pid;
    return index;
  }

  std::mutex mutex_;
  JobView& job_;
  const std::string dump_directory_;
  const absl::flat_hash_set<std::string_view> several_dumps_;
  const ViewBuilding building_;
  absl::flat_hash_map<std::string, std::size_t> by_process_;
  bool ranked_slots_ = true;  // statuses still come in: a new process takes its rank's slot
  struct Marks {
    bool taken = false;        // a process's view is in the slot
    bool status_only = false;  // its snapshot is its status file's, no dump yet
  };
  std::vector<Marks> marks_;  // by slot
  // The status snapshots of processes with several dumps, merged once the newest dump is known.
  std::unordered_map<std::size_t, ProcessSnapshot> waiting_statuses_;
  // The pending initialisations of each process's newest dump when it was taken for a failed call.
  std::unordered_map<std::size_t, ProcessSnapshot> failed_call_dumps_;
  RankSlots slots_;
};

}  // namespace ncclguard::job_reading
