// Reads a job: every status (from its board) and dump in its directory, read by a pool of threads
// and merged per process (a status newer than the dump brings its progress forward), within a
// deadline, the dumps sampled on a board that holds every status. See job_read.h.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <tuple>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "watchdog/common/bounded_threads.h"
#include "watchdog/common/config.h"
#include "watchdog/common/exit_gate.h"
#include "watchdog/common/files.h"
#include "watchdog/report/dump.h"
#include "watchdog/report/dump_reader.h"
#include "watchdog/report/fetched_statuses.h"
#include "watchdog/report/job_board.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/report/job_files.h"
#include "watchdog/report/job_merger.h"
#include "watchdog/report/job_read.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {
namespace {

using job_reading::FactsRecords;
using job_reading::JobFile;
using job_reading::Merger;
using job_reading::Outcome;
using job_reading::StatusPreParser;
using job_reading::WriterOf;

// The user names the directory to analyse: a relative path or a symbolic link is theirs to
// give, and its owner may be another user (root analysing a user's job). The process's own job
// directory must be what it writes into: a real directory of this user.
absl::StatusOr<int> OpenJobDirectory(const std::string& directory, JobDirectoryOrigin origin) {
  if (origin == JobDirectoryOrigin::kOwn) return OpenPrivateDirectory(directory, /*create=*/false);
  const int fd = open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open ", directory, ": ", std::strerror(errno)));
  return fd;
}

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
          names_ = ListNamesAt(directory_fd, kDumpPrefix, kJsonSuffix);
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
                             std::optional<absl::StatusOr<std::vector<std::string>>> dump_names,
                             const ViewBuilding& building) {
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
       {std::pair{kStatusPrefix, JobFile::Kind::kStatus}, std::pair{kDumpPrefix, JobFile::Kind::kDump}}) {
    if (directory_fd < 0 || (kind == JobFile::Kind::kStatus && fetched_statuses != nullptr)) continue;
    std::optional<absl::StatusOr<std::vector<std::string>>> listed =
        kind == JobFile::Kind::kDump ? std::exchange(dump_names, std::nullopt) : std::nullopt;
    absl::StatusOr<std::vector<std::string>> names =
        listed ? *std::move(listed) : ListNamesAt(directory_fd, prefix, kJsonSuffix);
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
  Merger merger(job, directory, census.processes, std::move(census.several_dumps), building);
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

}  // namespace

absl::StatusOr<JobView> ReadJobFiles(const std::string& where, const std::string& directory,
                                     const std::shared_ptr<JobBoard>& board, std::int64_t now_ns,
                                     double status_interval_seconds, JobDirectoryOrigin origin,
                                     const JobReadLimits& limits, const ViewBuilding& building) {
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
                                 parsed, listing ? listing->Take() : std::nullopt, building);
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

}  // namespace ncclguard
