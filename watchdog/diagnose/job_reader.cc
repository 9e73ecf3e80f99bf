// Reads a job directory: every dump and status file in it, merged per process (a status newer
// than the dump brings its progress forward), within a deadline.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "watchdog/common/config.h"
#include "watchdog/common/exit_gate.h"
#include "watchdog/common/files.h"
#include "watchdog/common/log.h"
#include "watchdog/common/mutex.h"
#include "watchdog/diagnose/job_view.h"
#include "watchdog/diagnose/op_states.h"
#include "watchdog/report/dump.h"
#include "watchdog/report/dump_reader.h"
#include "watchdog/report/job_board.h"
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

// The state letter of /proc/<pid>/stat ('?': unreadable). A zombie (Z, X) has ended, though kill()
// finds it until its parent reaps it (for long where the pid namespace's init does not reap, as in
// some containers). A stopped process (T, or t under a debugger) exists but does not run.
char ProcessStateLetter(int pid) {
  std::ifstream file(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  if (!std::getline(file, stat)) return '?';
  // "pid (comm) S ...": the command may hold spaces and parentheses, the state follows the last ')'.
  const std::size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
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
    const char state = ProcessStateLetter(pid);
    if (state == 'Z' || state == 'X') return ProcessView::Liveness::kGone;
    return state == 'T' || state == 't' ? ProcessView::Liveness::kStopped : ProcessView::Liveness::kAlive;
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

// Parses the statuses a board fetches while the next batch is being fetched: one thread takes each
// batch as the fetch hands it over. The reading threads later take what it parsed and parse what
// it has not reached themselves; a record is parsed once, by whoever claims it first.
class StatusPreParser final : public StatusBatchSink {
 public:
  StatusPreParser() = default;
  StatusPreParser(const StatusPreParser&) = delete;
  StatusPreParser& operator=(const StatusPreParser&) = delete;
  ~StatusPreParser() override { Finish(); }

  void Fetched(StatusRecord* records, std::size_t first, std::size_t count,
               std::size_t expected) noexcept override {
    try {
      MutexLock lock(mutex_);
      if (claims_ == nullptr) {
        claims_ = std::make_unique<std::atomic<std::uint8_t>[]>(expected);
        results_.resize(expected);
        expected_ = expected;
        records_ = records;
        thread_ = std::thread([this] { Run(); });
      }
      batches_.push_back({first, std::min(first + count, expected_)});
      ready_.notify_one();
    } catch (...) {
      // No memory or no thread: the reading threads parse everything themselves.
    }
  }

  // The parsed status of fetched record `index`, `record`: parsed here unless already claimed.
  // Called once the fetch has returned: claims_ and expected_, set at its first batch, stay.
  absl::StatusOr<PeerStatus> Take(std::size_t index, const StatusRecord& record) {
    if (claims_ == nullptr || index >= expected_) return ParseStatusRecord(record.name, record.content);
    std::uint8_t unclaimed = kUnclaimed;
    if (claims_[index].compare_exchange_strong(unclaimed, kClaimed)) return Parse(index);
    // The thread is parsing it: one status, a few microseconds.
    while (claims_[index].load(std::memory_order_acquire) != kParsed) std::this_thread::yield();
    const std::unique_ptr<absl::StatusOr<PeerStatus>> result = std::move(results_[index]);
    if (result == nullptr) return absl::ResourceExhaustedError("cannot be parsed (out of memory)");
    return std::move(*result);
  }

  // No more batches: the thread ends once it has gone through what it was given.
  void Finish() noexcept {
    {
      MutexLock lock(mutex_);
      finished_ = true;
    }
    ready_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  static constexpr std::uint8_t kUnclaimed = 0;
  static constexpr std::uint8_t kClaimed = 1;
  static constexpr std::uint8_t kParsed = 2;
  struct Batch {
    std::size_t first;
    std::size_t end;
  };

  // The next batch; nothing once finished and every batch taken.
  std::optional<Batch> NextBatch() {
    MutexLock lock(mutex_);
    // wait_for: the plain wait of std::condition_variable is a symbol of GCC 12's libstdc++
    // (GLIBCXX_3.4.30), newer than the library needs elsewhere (scripts/glibc-requirement.sh).
    while (!ready_.wait_for(mutex_, std::chrono::seconds(1), [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
      return finished_ || !batches_.empty();
    })) {
    }
    if (batches_.empty()) return std::nullopt;
    const Batch batch = batches_.front();
    batches_.pop_front();
    return batch;
  }

  void Run() noexcept {
    MarkOwnThread();  // its parses park once the application's exit has begun
    try {
      while (const std::optional<Batch> batch = NextBatch()) {
        for (std::size_t index = batch->first; index < batch->end; ++index) {
          std::uint8_t unclaimed = kUnclaimed;
          if (!claims_[index].compare_exchange_strong(unclaimed, kClaimed)) continue;
          try {
            results_[index] = std::make_unique<absl::StatusOr<PeerStatus>>(Parse(index));
          } catch (...) {
            // No result: Take says it could not be parsed.
          }
          claims_[index].store(kParsed, std::memory_order_release);
        }
      }
    } catch (...) {
      // No memory to wait with: the reading threads parse what is left.
    }
  }

  // Record `index`, claimed by the caller; its content is given back once parsed, so that the
  // statuses parsed next take that memory rather than new pages.
  absl::StatusOr<PeerStatus> Parse(std::size_t index) {
    StatusRecord& record = records_[index];
    absl::StatusOr<PeerStatus> status = ParseStatusRecord(record.name, record.content);
    std::string().swap(record.content);
    return status;
  }

  Mutex mutex_;
  std::condition_variable_any ready_;  // waits on mutex_ itself
  std::deque<Batch> batches_ ABSL_GUARDED_BY(mutex_);
  bool finished_ ABSL_GUARDED_BY(mutex_) = false;
  // Set once, at the first batch, and read without the mutex after the fetch: its thread, which
  // set them, started the thread that reads them, and returned before the reading threads began.
  std::size_t expected_ = 0;
  StatusRecord* records_ = nullptr;  // the fetch's, which stay where they are
  // Per record: who parses it, and the result the thread left.
  std::unique_ptr<std::atomic<std::uint8_t>[]> claims_;
  std::vector<std::unique_ptr<absl::StatusOr<PeerStatus>>> results_;
  std::thread thread_;
};

// The facts records a board fetched (StatusRecords::facts), each parsed once, by the first status
// that names it; the statuses that name one get a copy.
class FactsRecords {
 public:
  explicit FactsRecords(const StatusRecords* fetched) {
    if (fetched == nullptr) return;
    why_not_fetched_ = fetched->why_facts_not_fetched;
    records_.reserve(fetched->facts.size());
    for (const auto& [digest, content] : fetched->facts) records_.try_emplace(digest, &content);
  }
  FactsRecords(const FactsRecords&) = delete;
  FactsRecords& operator=(const FactsRecords&) = delete;

  // `status`'s facts from the record it names, when it names one; a status whose record is not
  // there, or cannot be read, keeps its facts unknown, and is counted.
  void Fill(PeerStatus& status) {
    if (status.facts_digest.empty()) return;
    const auto record = records_.find(status.facts_digest);
    if (record == records_.end()) {
      Missed(why_not_fetched_.empty() ? "not on the board" : why_not_fetched_);
      return;
    }
    Record& facts = record->second;
    std::call_once(facts.parsed,
                   [&] { facts.read = ParseStatusFacts(record->first, *facts.content, facts.facts); });
    if (!facts.read.ok()) {
      Missed(std::string(facts.read.message()));
      return;
    }
    status.facts = facts.facts;
    status.facts.host = status.host;
    status.facts.pid = status.pid;
  }

  // One line for every status whose facts stayed unknown; none when there is none.
  std::optional<std::string> Problem() const {
    const MutexLock lock(mutex_);
    if (missed_ == 0) return std::nullopt;
    return absl::StrCat(missed_,
                        " statuses name facts records that could not be read (the first: ", first_why_,
                        "): their processes' environment and system are not known");
  }

 private:
  struct Record {
    explicit Record(const std::string* document) : content(document) {}
    const std::string* content;  // the fetch's
    std::once_flag parsed;       // std's: ThreadSanitizer sees pthread_once, not Abseil's own waiting
    absl::Status read;
    ProcessFacts facts;
  };

  void Missed(std::string why) {
    const MutexLock lock(mutex_);
    if (missed_++ == 0) first_why_ = std::move(why);
  }

  absl::node_hash_map<std::string, Record> records_;  // by digest; a Record does not move
  std::string why_not_fetched_;
  mutable Mutex mutex_;
  std::size_t missed_ ABSL_GUARDED_BY(mutex_) = 0;
  std::string first_why_ ABSL_GUARDED_BY(mutex_);
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
std::string_view WriterOf(const JobFile& file) {
  std::string_view name = file.name;
  const bool status = file.kind == JobFile::Kind::kStatus;
  name.remove_prefix(status ? std::strlen("status-") : std::strlen("dump-"));
  name.remove_suffix(std::strlen(".json"));
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
  Merger(JobView& job, std::string dump_directory, std::size_t expected_processes,
         absl::flat_hash_set<std::string_view> several_dumps)
      : job_(job), dump_directory_(std::move(dump_directory)), several_dumps_(std::move(several_dumps)) {
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
      MergeNewerStatus(view.snapshot, *status);
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
        if (status->second.time_ns > view.snapshot.time_ns) MergeNewerStatus(view.snapshot, status->second);
        waiting_statuses_.erase(status);
      }
      if (const auto dump = failed_call_dumps_.find(index); dump != failed_call_dumps_.end()) {
        SeparateFailedInits(view, dump->second);
      }
      view.last_seen_ns = view.snapshot.time_ns;
      view.liveness = CheckLiveness(view.host, view.pid, own_host);
      view.exited = view.snapshot.exiting || view.dump_reason == "exit";
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
      MergeNewerStatus(view.snapshot, status.snapshot);
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

int ReadingThreads(const JobReadLimits& limits, std::size_t files) {
  // More than a small machine's cores: a reading thread mostly waits for the file system (a page
  // not cached, a shared file system's round trip), and the others parse meanwhile.
  constexpr int kDefaultReadingThreads = 8;
  const int threads = limits.threads > 0 ? limits.threads : kDefaultReadingThreads;
  return static_cast<int>(std::clamp<std::size_t>(files, 1, static_cast<std::size_t>(threads)));
}

// Reads the files whose indices `order` lists, in that order, with `threads` threads side by side,
// each file once, until they run out or `stop_reading` passes; `outcomes` says what became of each.
// A fetched status is taken from `parsed`; a status's facts record from `facts`.
void ReadFiles(int directory_fd, const std::vector<JobFile>& files, const std::vector<std::size_t>& order,
               std::vector<Outcome>& outcomes, Merger& merger, int threads, const JobReadLimits& limits,
               std::chrono::steady_clock::time_point stop_reading, StatusPreParser& parsed,
               FactsRecords& facts) {
  // Dumps written with the default ring are read in full whatever this process's ring.
  const std::size_t max_dump_bytes =
      MaxDumpBytes(std::max(GetConfig().ring_size.value, Config{}.ring_size.value));
  std::atomic<std::size_t> next{0};
  // Statuses parsed, waiting to be merged a few dozen at a time: merged one by one, 131,072 of them
  // keep the reading threads waiting on each other's lock.
  constexpr std::size_t kMergedTogether = 64;
  using PendingStatuses = std::vector<std::pair<std::size_t, PeerStatus>>;  // file index, status
  auto merge = [&](PendingStatuses& pending) noexcept {
    try {
      merger.AddStatuses(files, pending, outcomes);
    } catch (...) {
      for (const auto& [index, status] : pending) outcomes[index] = Outcome::kUnreadable;
      try {
        merger.AddProblem(absl::StrCat(pending.size(), " statuses: cannot be read (out of memory)"));
      } catch (...) {
      }
    }
    pending.clear();
  };
  // What became of the file `index`; nothing yet for a status added to `pending`.
  auto read_one = [&](std::size_t index, PendingStatuses& pending) -> std::optional<Outcome> {
    const JobFile& file = files[index];
    auto refusal = [&](const absl::Status& status) {
      merger.AddProblem(absl::StrCat(file.name, ": ", status.message()));
      return absl::IsOutOfRange(status) ? Outcome::kCapped : Outcome::kUnreadable;
    };
    if (file.kind == JobFile::Kind::kStatus) {
      absl::StatusOr<PeerStatus> status = file.record == nullptr
                                              ? ReadStatusFileAt(directory_fd, file.name)
                                              : parsed.Take(file.record_index, *file.record);
      if (status.ok() && file.record != nullptr) {
        status->snapshot.time_ns = std::max(status->snapshot.time_ns, file.record->heartbeat_ns);
      }
      if (!status.ok()) return refusal(status.status());
      facts.Fill(*status);
      pending.emplace_back(index, *std::move(status));
      if (pending.size() == kMergedTogether) merge(pending);
      return std::nullopt;
    }
    absl::StatusOr<ParsedDump> dump = [&]() -> absl::StatusOr<ParsedDump> {
      const absl::StatusOr<std::string> content = ReadFileAt(directory_fd, file.name, max_dump_bytes);
      if (!content.ok()) return content.status();
      return ParseDump(*content);
    }();
    return dump.ok() ? merger.AddDump(file, *std::move(dump)) : refusal(dump.status());
  };
  // Each thread takes the next file nobody took; one that finds the time up leaves it unread.
  const bool owned = IsOwnThread();
  auto work = [&]() noexcept {
    // The helpers are ncclguard's own threads wherever the reading thread is.
    if (owned) MarkOwnThread();
    PendingStatuses pending;
    for (std::size_t position = next++; position < order.size(); position = next++) {
      const std::size_t index = order[position];
      if (limits.now() > stop_reading) break;
      try {
        if (const std::optional<Outcome> outcome = read_one(index, pending)) outcomes[index] = *outcome;
      } catch (...) {
        outcomes[index] = Outcome::kUnreadable;
        try {
          merger.AddProblem(absl::StrCat(files[index].name, ": cannot be read (out of memory)"));
        } catch (...) {
        }
      }
    }
    merge(pending);
  };
  // Started from the reading thread, they inherit its mask with every signal blocked.
  std::vector<std::thread> helpers;
  for (int helper = 1; helper < threads; ++helper) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // no more threads to be had: fewer read
    }
  }
  work();
  for (std::thread& helper : helpers) helper.join();
}

// Counts what the bounds left unread, and says so among the problems: one line per kind of file
// and bound (a file refused by a cap on bytes or ranks has a line of its own already).
void NoteUnread(const std::vector<JobFile>& files, const std::vector<Outcome>& outcomes,
                const JobReadLimits& limits, JobView& job) {
  constexpr std::size_t kNamedUnreadFiles = 5;
  struct Unread {
    std::size_t files = 0;
    const std::string* first = nullptr;
  };
  // By kind of file, then stopped by the deadline, by the count of files or by the sample.
  std::array<std::array<Unread, 3>, 2> unread{};
  bool capped = false;
  absl::flat_hash_set<std::string_view> read_writers;
  absl::flat_hash_set<std::string_view> unread_writers;
  for (std::size_t index = 0; index < files.size(); ++index) {
    const Outcome outcome = outcomes[index];
    if (outcome == Outcome::kUnreadable) continue;
    if (outcome == Outcome::kRead) {
      read_writers.insert(WriterOf(files[index]));
      continue;
    }
    unread_writers.insert(WriterOf(files[index]));
    ++job.not_read.files;
    if (job.not_read.first_files.size() < kNamedUnreadFiles)
      job.not_read.first_files.push_back(files[index].name);
    if (outcome == Outcome::kCapped) {
      capped = true;
      continue;
    }
    const std::size_t bound = outcome == Outcome::kSampledOut ? 2 : index >= limits.max_files ? 1 : 0;
    Unread& stopped = unread[static_cast<std::size_t>(files[index].kind)][bound];
    if (stopped.files++ == 0) stopped.first = &files[index].name;
  }
  for (const std::string_view writer : unread_writers)
    job.not_read.processes += read_writers.contains(writer) ? 0 : 1;

  std::vector<std::string> reasons;
  const std::array<std::string, 3> bounds = {
      "the deadline passed", absl::StrCat("more than ", limits.max_files, " files"),
      absl::StrCat("their processes' statuses are like most of the job's, and ", limits.sampled_dumps,
                   " of their dumps were read")};
  for (std::size_t bound = 0; bound < bounds.size(); ++bound) {
    const std::string& why = bounds[bound];
    for (const JobFile::Kind kind : {JobFile::Kind::kStatus, JobFile::Kind::kDump}) {
      const Unread& stopped = unread[static_cast<std::size_t>(kind)][bound];
      if (stopped.files == 0) continue;
      job.problems.push_back(absl::StrCat(stopped.files,
                                          kind == JobFile::Kind::kStatus ? " status files" : " dumps",
                                          ": not read, ", why, " (the first: ", *stopped.first, ")"));
      if (std::find(reasons.begin(), reasons.end(), why) == reasons.end()) reasons.push_back(why);
    }
  }
  if (capped) reasons.emplace_back("a cap on a file's bytes or the job's ranks refused some");
  if (job.not_read.listing_cut_short) reasons.push_back(job.not_read.why);
  job.not_read.why = absl::StrJoin(reasons, "; ");
}

// Reorders `dumps` (indices into `files`) so that the dumps of the processes whose status differs
// from most of the job's come first: in or out of an NCCL call, stalled or not, exiting or not
// (`job` holds the statuses read so far). Returns how many they are.
std::size_t PutOddProcessesFirst(const std::vector<JobFile>& files, const JobView& job,
                                 std::vector<std::size_t>& dumps) {
  auto kind = [](const ProcessSnapshot& status) {
    return (status.in_nccl_call.empty() ? 1 : 0) | (status.stall ? 2 : 0) | (status.exiting ? 4 : 0);
  };
  std::array<std::size_t, 8> processes_of_kind{};
  for (const ProcessView& process : job.processes)
    ++processes_of_kind[static_cast<std::size_t>(kind(process.snapshot))];
  const auto most = static_cast<int>(std::max_element(processes_of_kind.begin(), processes_of_kind.end()) -
                                     processes_of_kind.begin());
  std::unordered_set<std::string> odd;
  for (const ProcessView& process : job.processes) {
    if (kind(process.snapshot) != most)
      odd.insert(absl::StrCat(SafeFileName(process.host), "-", process.pid));
  }
  if (odd.empty()) return 0;
  const auto others = std::stable_partition(dumps.begin(), dumps.end(), [&](std::size_t index) {
    return odd.contains(std::string(WriterOf(files[index])));
  });
  return static_cast<std::size_t>(others - dumps.begin());
}

// On a board that holds every status, every process is known before the first dump: dumps only add
// evidence. Puts the dumps of the processes unlike most of the job first (the one rank not waiting
// where the others wait), then a sample of the others', which show the same; the rest are
// kSampledOut. Returns when to stop reading them: after a fifth of the deadline, so that a job of
// 100,000 ranks is judged in seconds.
std::chrono::steady_clock::time_point SampleDumps(const std::vector<JobFile>& files, const JobView& job,
                                                  const JobReadLimits& limits,
                                                  std::vector<std::size_t>& order,
                                                  std::vector<Outcome>& outcomes,
                                                  std::chrono::steady_clock::time_point stop_reading) {
  const std::size_t sampled = PutOddProcessesFirst(files, job, order) + limits.sampled_dumps;
  if (order.size() > sampled) {
    for (std::size_t position = sampled; position < order.size(); ++position)
      outcomes[order[position]] = Outcome::kSampledOut;
    order.resize(sampled);
  }
  return std::min(stop_reading, limits.now() + limits.deadline / 5);
}

// By rank, then host and pid. A view is kilobytes: the ranks are sorted apart from the views, then
// each view is moved once, in place (at 100,000 views, sorting the views takes a tenth of a second).
void SortByRank(std::vector<ProcessView>& processes) {
  std::vector<std::pair<int, std::size_t>> order;  // rank, index
  order.reserve(processes.size());
  for (std::size_t index = 0; index < processes.size(); ++index)
    order.emplace_back(processes[index].snapshot.rank, index);
  auto before = [&](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first < b.first;
    return std::tie(processes[a.second].host, processes[a.second].pid) <
           std::tie(processes[b.second].host, processes[b.second].pid);
  };
  // The views usually come in rank order (Merger).
  if (std::is_sorted(order.begin(), order.end(), before)) return;
  std::sort(order.begin(), order.end(), before);
  // In place, cycle by cycle: position i takes the view at order[i].second.
  std::vector<bool> placed(processes.size(), false);
  for (std::size_t start = 0; start < processes.size(); ++start) {
    if (placed[start] || order[start].second == start) continue;
    ProcessView first = std::move(processes[start]);
    std::size_t position = start;
    for (std::size_t from = order[position].second; from != start; from = order[position].second) {
      processes[position] = std::move(processes[from]);
      placed[position] = true;
      position = from;
    }
    processes[position] = std::move(first);
    placed[position] = true;
  }
}

// What the files to read are: how many statuses, about how many processes wrote them, and the
// writers (WriterOf) of more than one dump.
struct FileCensus {
  std::size_t statuses = 0;
  std::size_t processes = 0;
  absl::flat_hash_set<std::string_view> several_dumps;
};

FileCensus CountFiles(const std::vector<JobFile>& files) {
  FileCensus census;
  absl::flat_hash_set<std::string_view> dump_writers;
  for (const JobFile& file : files) {
    if (file.kind == JobFile::Kind::kStatus) {
      ++census.statuses;
    } else if (!dump_writers.insert(WriterOf(file)).second) {
      census.several_dumps.insert(WriterOf(file));
    }
  }
  // A process writes one status and usually no dump or one: the processes are about as many as the
  // statuses or the dumps' writers, whichever is more.
  census.processes = std::max(census.statuses, dump_writers.size());
  return census;
}

// The names of a job directory's dumps, listed on a thread of their own while the statuses are
// fetched from a board that keeps them elsewhere: 100,000 names take a tenth of a second to list
// and sort, which the fetch, waiting on the board's answers, leaves a core for.
class EarlyDumpListing {
 public:
  explicit EarlyDumpListing(int directory_fd) {
    try {
      thread_ = std::thread([this, directory_fd]() noexcept {
        MarkOwnThread();
        try {
          names_ = ListNamesAt(directory_fd, "dump-", ".json");
        } catch (...) {
          names_.reset();  // no memory: listed again when needed
        }
      });
    } catch (const std::system_error&) {
      // No thread to be had: listed when needed.
    }
  }
  EarlyDumpListing(const EarlyDumpListing&) = delete;
  EarlyDumpListing& operator=(const EarlyDumpListing&) = delete;
  ~EarlyDumpListing() {
    if (thread_.joinable()) thread_.join();
  }

  // The names, or nothing when they were not listed.
  std::optional<absl::StatusOr<std::vector<std::string>>> Take() {
    if (thread_.joinable()) thread_.join();
    return std::move(names_);
  }

 private:
  std::optional<absl::StatusOr<std::vector<std::string>>> names_;
  std::thread thread_;
};

// Every dump and status file of the directory `directory`, open as `directory_fd` (-1: none), that
// can be read before `stop_reading` within `limits`; the others are problems, and those a bound
// left unread are counted in job.not_read. With `fetched_statuses`, the statuses are those (from
// the board `where`), not the directory's files, taken from `parsed`, which the fetch fed.
// `dump_names`: the dumps' names when they were listed already.
JobView ReadOpenJobDirectory(int directory_fd, const std::string& where, const std::string& directory,
                             const JobReadLimits& limits, std::chrono::steady_clock::time_point stop_reading,
                             const StatusRecords* fetched_statuses, StatusPreParser& parsed,
                             std::optional<absl::StatusOr<std::vector<std::string>>> dump_names) {
  JobView job;
  job.directory = where;
  std::vector<JobFile> files;
  if (fetched_statuses != nullptr) {
    for (std::size_t index = 0; index < fetched_statuses->records.size(); ++index) {
      const StatusRecord& record = fetched_statuses->records[index];
      files.push_back(JobFile{
          .name = record.name, .kind = JobFile::Kind::kStatus, .record = &record, .record_index = index});
    }
    if (fetched_statuses->not_fetched > 0) {
      // Whose statuses they are is not known: no rank may be named as missing.
      job.not_read.listing_cut_short = true;
      job.not_read.why =
          absl::StrCat(fetched_statuses->not_fetched,
                       " statuses not fetched from the board: ", fetched_statuses->why_not_fetched);
      job.problems.push_back(job.not_read.why);
    }
  }
  for (const auto& [prefix, kind] :
       {std::pair{"status-", JobFile::Kind::kStatus}, std::pair{"dump-", JobFile::Kind::kDump}}) {
    if (directory_fd < 0 || (kind == JobFile::Kind::kStatus && fetched_statuses != nullptr)) continue;
    std::optional<absl::StatusOr<std::vector<std::string>>> listed =
        kind == JobFile::Kind::kDump ? std::exchange(dump_names, std::nullopt) : std::nullopt;
    absl::StatusOr<std::vector<std::string>> names =
        listed ? *std::move(listed) : ListNamesAt(directory_fd, prefix, ".json");
    if (!names.ok()) {
      job.problems.push_back(absl::StrCat(kind == JobFile::Kind::kStatus ? "status files: " : "dumps: ",
                                          names.status().message()));
      // Too many to list: who wrote them is not known, nor whether they hold the job's ranks.
      if (absl::IsOutOfRange(names.status())) {
        job.not_read.listing_cut_short = true;
        job.not_read.why = std::string(names.status().message());
      }
      continue;
    }
    for (std::string& name : *names) files.push_back(JobFile{.name = std::move(name), .kind = kind});
  }

  FileCensus census = CountFiles(files);
  const std::size_t statuses = census.statuses;
  Merger merger(job, directory, census.processes, std::move(census.several_dumps));
  // Files past the cap are never started on; they stay kNotRead. Every status file is in before
  // the first dump (Merger).
  std::vector<Outcome> outcomes(files.size(), Outcome::kNotRead);
  const std::size_t to_read = std::min(files.size(), limits.max_files);
  const int threads = ReadingThreads(limits, to_read);
  const std::size_t statuses_to_read = std::min(statuses, to_read);
  std::vector<std::size_t> order(statuses_to_read);
  std::iota(order.begin(), order.end(), 0);
  // Statuses fetched from a board are in memory: parsing them wants a thread per core, no more.
  const int status_threads =
      fetched_statuses != nullptr
          ? std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, threads)
          : threads;
  FactsRecords facts(fetched_statuses);
  ReadFiles(directory_fd, files, order, outcomes, merger, status_threads, limits, stop_reading, parsed,
            facts);
  parsed.Finish();
  if (std::optional<std::string> problem = facts.Problem()) job.problems.push_back(*std::move(problem));
  merger.StatusesMerged();
  order.resize(to_read - statuses_to_read);
  std::iota(order.begin(), order.end(), statuses_to_read);
  const std::chrono::steady_clock::time_point stop_dumps =
      fetched_statuses != nullptr && fetched_statuses->not_fetched == 0
          ? SampleDumps(files, job, limits, order, outcomes, stop_reading)
          : stop_reading;
  ReadFiles(directory_fd, files, order, outcomes, merger, threads, limits, stop_dumps, parsed, facts);
  NoteUnread(files, outcomes, limits, job);
  merger.Finish();
  // In the order of the files' names, whichever thread read them.
  std::sort(job.problems.begin(), job.problems.end());
  SortByRank(job.processes);
  return job;
}

// Reads the job on a thread of its own within `limits`: the dumps (and, without `board`, the
// status files) from `directory`, the statuses from `board` when it keeps them elsewhere. A
// directory that cannot be opened fails the read only when its status files were to be read there.
absl::StatusOr<JobView> ReadJobWithin(const std::string& where, const std::string& directory,
                                      const std::shared_ptr<JobBoard>& board, std::int64_t now_ns,
                                      double status_interval_seconds, JobDirectoryOrigin origin,
                                      const JobReadLimits& limits) {
  // The reading thread stops a little before the caller gives up on it, so that what was read in
  // time is still used.
  const auto stop_reading = limits.now() + limits.deadline * 4 / 5;
  absl::StatusOr<JobView> job = RunWithDeadline<JobView>(
      [=]() -> absl::StatusOr<JobView> {
        const absl::StatusOr<int> directory_fd = OpenJobDirectory(directory, origin);
        if (!directory_fd.ok() && !board) return directory_fd.status();
        const int fd = directory_fd.ok() ? *directory_fd : -1;
        const absl::Cleanup close_directory = [fd] {
          if (fd >= 0) close(fd);
        };
        std::optional<StatusRecords> fetched;
        StatusPreParser parsed;
        std::optional<EarlyDumpListing> listing;
        if (board) {
          if (fd >= 0) listing.emplace(fd);
          absl::StatusOr<StatusRecords> records = board->FetchStatuses(stop_reading, &parsed);
          if (!records.ok()) return records.status();
          fetched = *std::move(records);
        }
        JobView job =
            ReadOpenJobDirectory(fd, where, directory, limits, stop_reading, fetched ? &*fetched : nullptr,
                                 parsed, listing ? listing->Take() : std::nullopt);
        job.now_ns = now_ns;
        job.status_interval_seconds = status_interval_seconds;
        return job;
      },
      limits.deadline);
  if (absl::IsDeadlineExceeded(job.status())) {
    return absl::DeadlineExceededError(
        absl::StrCat("reading ", where, " took longer than ", limits.deadline.count(), " ms; given up"));
  }
  return job;
}

}  // namespace

absl::StatusOr<JobView> ReadJobDirectory(const std::string& directory, std::int64_t now_ns,
                                         double status_interval_seconds, JobDirectoryOrigin origin,
                                         const JobReadLimits& limits) noexcept {
  try {
    return ReadJobWithin(directory, directory, nullptr, now_ns, status_interval_seconds, origin, limits);
  } catch (...) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot read ", directory));
  }
}

absl::StatusOr<JobView> ReadJob(const std::shared_ptr<JobBoard>& board, std::int64_t now_ns,
                                double status_interval_seconds, JobDirectoryOrigin origin,
                                const JobReadLimits& limits) noexcept {
  try {
    const bool files = board->StatusesAreFiles();
    return ReadJobWithin(files ? board->Directory() : board->Where(), board->Directory(),
                         files ? nullptr : board, now_ns, status_interval_seconds, origin, limits);
  } catch (...) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot read ", board->Where()));
  }
}

absl::StatusOr<JobView> ReadJobDirectory(const std::string& directory, std::int64_t now_ns,
                                         double status_interval_seconds, JobDirectoryOrigin origin,
                                         std::chrono::milliseconds deadline) noexcept {
  JobReadLimits limits;
  limits.deadline = deadline;
  return ReadJobDirectory(directory, now_ns, status_interval_seconds, origin, limits);
}

}  // namespace ncclguard
