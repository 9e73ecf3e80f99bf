#include "watchdog/report/job_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "watchdog/common/bounded_threads.h"
#include "watchdog/common/clock.h"
#include "watchdog/common/config.h"
#include "watchdog/common/files.h"
#include "watchdog/common/fnv1a.h"
#include "watchdog/common/log.h"
#include "watchdog/report/dump.h"
#include "watchdog/report/dump_reader.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/fields_json.h"
#include "watchdog/report/job_files.h"
#include "watchdog/report/op_signature.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/report/snapshot_fields.h"
#include "watchdog/report/snapshot_json.h"
#include "watchdog/report/status_reader.h"

namespace ncclguard {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kGenerationFile[] = "generation";
constexpr size_t kMaxReadBytes = 1 << 20;    // a status file is a few KiB; anything bigger is not ours
constexpr size_t kMaxGenerationBytes = 256;  // one request's name

std::atomic<std::uint64_t> g_request_counter{0};

std::string HostName() {
  const std::string host = log::HostName();
  return host.empty() ? "unknown" : host;
}

class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// The facts a status holds, or that its facts record (FormatStatusFacts) holds.
void AddFactsJson(const ProcessFacts& facts, Json& document) {
  document["environment"] = VariablesJson(facts.environment);
  document["system"] = SystemFactsJson(facts, /*with_memory=*/false);
}

Json StatusJson(const ProcessSnapshot& snapshot, const ProcessFacts& facts, std::string_view facts_digest) {
  Json communicators = Json::array();
  for (const CommSnapshot& comm : snapshot.comms) {
    Json entry = CommJson(comm, SnapshotDocument::kStatus);
    if (communicators.size() >= kMaxSignedCommunicators) entry["signatures"] = nullptr;
    communicators.push_back(std::move(entry));
  }
  const std::int64_t time_ns = snapshot.time_ns != 0 ? snapshot.time_ns : WallNowNs();
  Json document{
      {"format", kStatusFormat},
      {"format_version", kStatusFormatVersion},
      {"host", facts.host},
      {"pid", facts.pid},
      {"rank", snapshot.rank >= 0 ? snapshot.rank : LauncherRank(facts)},
      {"time", IsoTime(time_ns)},
      {"time_ns", time_ns},
      {"in_nccl_call", snapshot.in_nccl_call},
      {"stall", snapshot.stall ? StallJson(*snapshot.stall, SnapshotDocument::kStatus) : Json(nullptr)},
      {"communicators", std::move(communicators)},
      {"pending_inits", snapshot.pending_inits},
      {"exiting", snapshot.exiting}};
  if (!snapshot.fail_slow.empty())
    document["fail_slow"] = WrittenArray(snapshot.fail_slow, kFailSlowFields, kInStatus);
  if (facts_digest.empty()) {
    AddFactsJson(facts, document);
  } else {
    document["facts"] = facts_digest;
  }
  return document;
}

// A status file is rewritten in place (InPlaceFile): a reader may find a rewrite half done, or cut
// off by a crash. Its first member says that its last is a checksum of every byte before it, which
// tells: a mix of two versions may have lost the checksum altogether (a longer version written
// over a shorter one's), but never the first member, which both have.
constexpr char kChecksummedStart[] = "{\"checksummed\":true,";
constexpr char kChecksumMember[] = ",\"checksum\":\"";

std::uint64_t Fnv1a(absl::string_view bytes) { return ncclguard::Fnv1a(bytes.data(), bytes.size()); }

std::string Digest(absl::string_view bytes) {
  return absl::StrCat(absl::Hex(Fnv1a(bytes), absl::kZeroPad16));
}

// `document` (a JSON object of several members, as dumped) marked as checksummed, with the
// checksum as its last member.
std::string WithChecksum(const std::string& object) {
  if (object.size() < 2 || object.front() != '{' || object.back() != '}') return object;
  std::string document = absl::StrCat(kChecksummedStart, absl::string_view(object).substr(1));
  document.pop_back();
  const std::uint64_t checksum = Fnv1a(document);
  absl::StrAppend(&document, kChecksumMember, absl::Hex(checksum, absl::kZeroPad16), "\"}");
  return document;
}

// Whether `content`'s checksum matches what precedes it; true for a file of an earlier build,
// which has none (it was renamed into place, never rewritten in place).
bool ChecksumMatches(absl::string_view content) {
  if (!absl::StartsWith(content, kChecksummedStart)) return true;
  content = absl::StripTrailingAsciiWhitespace(content);
  const std::size_t member = content.rfind(kChecksumMember);
  if (member == absl::string_view::npos) return false;
  const absl::string_view hex = content.substr(member + std::strlen(kChecksumMember));
  std::uint64_t checksum = 0;
  return hex.size() == 16 + 2 && hex.substr(16) == "\"}" &&
         absl::SimpleHexAtoi(hex.substr(0, 16), &checksum) && checksum == Fnv1a(content.substr(0, member));
}

// Throws on a document of the wrong shape (status_reader.h).
PeerStatus ParseStatus(const std::string& file, const std::string& content) {
  if (!ChecksumMatches(content)) {
    throw std::runtime_error("being rewritten, or cut off by a crash (its checksum does not match)");
  }
  return ReadStatusDocument(file, content);
}

// One status file. A rewrite seen half done is read again: it takes microseconds, and a live rank
// must not look unreadable. A few times at most: a file cut off by a crash stays as it is.
absl::StatusOr<PeerStatus> ReadStatusFile(int directory_fd, const std::string& name) {
  constexpr int kReads = 5;
  for (int read = 1;; ++read) {
    absl::StatusOr<std::string> content = ReadFileAt(directory_fd, name, kMaxReadBytes);
    if (!content.ok()) return content.status();
    if (!ChecksumMatches(*content) && read < kReads) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    try {
      return ParseStatus(name, *content);
    } catch (const std::exception& error) {
      return absl::InvalidArgumentError(error.what());
    }
  }
}

absl::StatusOr<StatusScan> ReadStatusesNow(const std::string& job_dir) {
  absl::StatusOr<int> directory_fd = OpenPrivateDirectory(job_dir, /*create=*/false);
  if (!directory_fd.ok()) return directory_fd.status();
  const ScopedFd directory(*directory_fd);
  return ReadStatusesAt(directory.get(), std::chrono::steady_clock::now() + kReadDeadline);
}

}  // namespace

DumpRequest ParseDumpRequest(const std::string& name, const absl::StatusOr<std::string>& content) {
  DumpRequest request;
  request.name = name;
  request.requester = "unknown";
  if (!content.ok()) return request;
  // A request that cannot be read is still a request: the fields only describe it.
  try {
    const nlohmann::json document = ParseBoundedJson(*content);
    if (!document.is_object()) return request;
    request.requester = document.value("requester", "unknown");
    request.host = document.value("host", "");
    request.pid = document.value("pid", -1);
    request.time_ns = document.value("time_ns", std::int64_t{0});
    if (const auto comms = document.find("comms"); comms != document.end() && comms->is_array()) {
      for (const nlohmann::json& comm : *comms) {
        if (comm.is_string()) request.comms.push_back(comm.get<std::string>());
      }
    }
  } catch (const std::exception&) {
  }
  return request;
}

namespace {

// The requests of the job directory not in `already_handled`; none when nobody ever asked.
absl::StatusOr<std::vector<DumpRequest>> ListRequestsNow(const std::string& job_dir,
                                                         const std::set<std::string>& already_handled) {
  const std::string requests_directory = absl::StrCat(job_dir, "/", kDumpRequestsDirectory);
  absl::StatusOr<int> directory_fd =
      OpenPrivateDirectory(requests_directory, /*create=*/false, /*levels_below_job_directory=*/1);
  if (!directory_fd.ok()) {
    struct stat unused {};
    if (lstat(requests_directory.c_str(), &unused) != 0 && errno == ENOENT) {
      return std::vector<DumpRequest>();
    }
    return directory_fd.status();
  }
  const ScopedFd directory(*directory_fd);
  absl::StatusOr<std::vector<std::string>> names = ListNamesAt(directory.get(), kRequestPrefix, "");
  if (!names.ok()) return names.status();
  std::vector<DumpRequest> requests;
  for (const std::string& name : *names) {
    if (already_handled.contains(name)) continue;
    requests.push_back(ParseDumpRequest(name, ReadFileAt(directory.get(), name, kMaxReadBytes)));
  }
  return requests;
}

// The name of the latest request, "" when nobody has asked yet (the file is empty).
absl::StatusOr<std::string> ReadGeneration(PolledFile& generation) {
  absl::StatusOr<std::string> content = generation.ReadNow();
  if (!content.ok())
    return absl::UnavailableError(absl::StrCat("cannot read the generation: ", content.status().message()));
  return std::string(absl::StripAsciiWhitespace(*content));
}

// The status files this process rewrites in place, by path; never destroyed (a write still
// hanging may outlive static destructors). A forked child starts a table of its own: the
// parent's mutex may have been held by a thread the child does not have.
constexpr std::size_t kMaxStatusFiles = 16;
struct StatusFiles {
  std::mutex mutex;
  // Shared: a writer keeps its file while another thread's new file drops the table's entries.
  std::map<std::string, std::shared_ptr<InPlaceFile>> by_path;
  pid_t pid = getpid();
};

StatusFiles& GetStatusFiles() {
  static std::atomic<StatusFiles*> files{nullptr};
  StatusFiles* current = files.load(std::memory_order_acquire);
  if (current == nullptr || current->pid != getpid()) {
    auto* fresh = new StatusFiles;  // an inherited table is left as it is
    if (files.compare_exchange_strong(current, fresh, std::memory_order_acq_rel)) return *fresh;
    delete fresh;  // another thread of this process made one first
  }
  return *current;
}

// When the request `name` (a generation) was made; an error when it cannot be told.
absl::StatusOr<std::int64_t> RequestTime(const std::string& job_dir, const std::string& name) {
  if (!absl::StartsWith(name, kRequestPrefix) || absl::StrContains(name, "/"))
    return absl::InvalidArgumentError("the generation names no request");
  absl::StatusOr<int> directory_fd = OpenPrivateDirectory(absl::StrCat(job_dir, "/", kDumpRequestsDirectory),
                                                          /*create=*/false, /*levels_below_job_directory=*/1);
  if (!directory_fd.ok()) return directory_fd.status();
  const ScopedFd directory(*directory_fd);
  const absl::StatusOr<std::string> content = ReadFileAt(directory.get(), name, kMaxReadBytes);
  if (!content.ok()) return content.status();
  const DumpRequest request = ParseDumpRequest(name, content);
  if (request.time_ns <= 0) return absl::InvalidArgumentError("the request says not when it was made");
  return request.time_ns;
}

struct PollOutcome {
  std::string generation;
  bool listed = false;
  std::vector<DumpRequest> fresh;                    // when listed: every request not handled before
  std::optional<std::int64_t> unlisted_baseline_ns;  // the first look, made without a listing
};

// The first look of a watcher whose sieve is `sieve`: whether it can do without a listing.
std::optional<std::int64_t> UnlistedBaseline(const std::string& job_dir, const RequestSieve& sieve,
                                             const std::string& generation) {
  if (sieve.baseline_taken()) return std::nullopt;
  if (generation.empty()) return std::numeric_limits<std::int64_t>::min();  // nobody has asked
  const absl::StatusOr<std::int64_t> made = RequestTime(job_dir, generation);
  if (!made.ok() || *made >= sieve.fresh_since_ns()) return std::nullopt;
  return *made;
}

}  // namespace

std::string JobDirectory(const Config& config, const std::string& job_id) {
  std::string base = config.dump_dir;
  if (base.empty()) {
    const char* temporary = std::getenv("TMPDIR");
    // Per user: the directory is created 0700, so a shared name would lock out every other user.
    base = absl::StrCat(temporary != nullptr && temporary[0] == '/' ? temporary : "/tmp", "/ncclguard-",
                        getuid());
  }
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  return absl::StrCat(base, "/", SafeFileName(job_id));
}

double StatusIntervalSeconds(double configured_seconds, int job_processes, double writes_per_second) {
  return std::max(configured_seconds, job_processes / writes_per_second);
}

std::string StatusName(const ProcessFacts& facts) {
  return absl::StrCat(kStatusPrefix, SafeFileName(facts.host), "-", facts.pid, kJsonSuffix);
}

absl::StatusOr<std::string> FormatStatus(const ProcessSnapshot& snapshot, const ProcessFacts& facts,
                                         std::string_view facts_digest) noexcept {
  try {
    return WithChecksum(StatusJson(snapshot, facts, facts_digest)
                            .dump(-1, ' ', false, Json::error_handler_t::replace)) +
           "\n";
  } catch (...) {
    return absl::ResourceExhaustedError("cannot format the status file");
  }
}

absl::StatusOr<StatusFactsRecord> FormatStatusFacts(const ProcessFacts& facts) noexcept {
  try {
    Json document{{"format", kStatusFactsFormat}, {"format_version", kStatusFormatVersion}};
    AddFactsJson(facts, document);
    StatusFactsRecord record;
    record.content = document.dump(-1, ' ', false, Json::error_handler_t::replace);
    record.digest = Digest(record.content);
    return record;
  } catch (...) {
    return absl::ResourceExhaustedError("cannot format the status's facts");
  }
}

absl::Status ParseStatusFacts(std::string_view digest, const std::string& content,
                              ProcessFacts& facts) noexcept {
  try {
    if (content.size() > kMaxReadBytes) return absl::OutOfRangeError("larger than a facts record can be");
    if (Digest(content) != digest) return absl::DataLossError("its digest does not match its name");
    ReadStatusFactsDocument(content, facts);
    return absl::OkStatus();
  } catch (const std::exception& error) {
    return absl::InvalidArgumentError(error.what());
  } catch (...) {
    return absl::ResourceExhaustedError("cannot read the status's facts (out of memory)");
  }
}

absl::StatusOr<PeerStatus> ParseStatusRecord(const std::string& name, const std::string& content) noexcept {
  try {
    return ReadStatusDocument(name, content);
  } catch (const std::exception& error) {
    return absl::InvalidArgumentError(error.what());
  } catch (...) {
    return absl::ResourceExhaustedError("cannot read the status (out of memory)");
  }
}

absl::StatusOr<std::string> WriteStatus(const std::string& job_dir, const ProcessSnapshot& snapshot,
                                        const ProcessFacts& facts) noexcept {
  absl::StatusOr<std::string> content = FormatStatus(snapshot, facts);
  if (!content.ok()) return content.status();
  try {
    const std::string name = StatusName(facts);
    std::shared_ptr<InPlaceFile> file;
    {
      StatusFiles& files = GetStatusFiles();
      std::lock_guard<std::mutex> lock(files.mutex);
      auto [entry, created] = files.by_path.try_emplace(absl::StrCat(job_dir, "/", name));
      if (created) {
        // A few at most (a process writes one; tests write several): the oldest go.
        if (files.by_path.size() > kMaxStatusFiles) files.by_path.clear();
        entry = files.by_path.try_emplace(absl::StrCat(job_dir, "/", name)).first;
        entry->second = std::make_shared<InPlaceFile>(job_dir, name);
      }
      file = entry->second;
    }
    // Not fsync()ed (but on NFS, where other hosts would not see it otherwise): a status file is
    // rewritten every few seconds; flushing every rewrite would cost every rank a disk round trip.
    return file->Write(*content);
  } catch (...) {
    return absl::ResourceExhaustedError("cannot write the status file");
  }
}

StatusScan ReadStatusesAt(int directory_fd, std::chrono::steady_clock::time_point deadline) {
  StatusScan scan;
  absl::StatusOr<std::vector<std::string>> names = ListNamesAt(directory_fd, kStatusPrefix, kJsonSuffix);
  if (!names.ok()) {
    scan.problems.push_back(absl::StrCat("status files: ", names.status().message()));
    return scan;
  }
  for (const std::string& name : *names) {
    if (std::chrono::steady_clock::now() > deadline) {
      scan.problems.push_back(absl::StrCat(name, " and later status files: not read, the deadline passed"));
      break;
    }
    absl::StatusOr<PeerStatus> status = ReadStatusFile(directory_fd, name);
    if (status.ok()) {
      scan.statuses.push_back(*std::move(status));
    } else {
      scan.problems.push_back(absl::StrCat(name, ": ", status.status().message()));
    }
  }
  return scan;
}

absl::StatusOr<PeerStatus> ReadStatusFileAt(int directory_fd, const std::string& name) noexcept {
  try {
    return ReadStatusFile(directory_fd, name);
  } catch (...) {
    return absl::ResourceExhaustedError("cannot read the status file (out of memory)");
  }
}

absl::StatusOr<StatusScan> ReadStatuses(const std::string& job_dir) noexcept {
  try {
    return RunWithDeadline<StatusScan>([job_dir] { return ReadStatusesNow(job_dir); }, kReadDeadline);
  } catch (...) {
    return absl::ResourceExhaustedError("cannot read the status files");
  }
}

absl::StatusOr<FormattedDumpRequest> FormatDumpRequest(const std::string& requester,
                                                       const std::vector<std::string>& comms) noexcept {
  try {
    const std::string host = HostName();
    const int pid = static_cast<int>(getpid());
    const std::int64_t now = WallNowNs();
    FormattedDumpRequest request;
    request.name =
        absl::StrCat(kRequestPrefix, SafeFileName(host), "-", pid, "-", g_request_counter.fetch_add(1) + 1);
    request.content = Json{
        {"format", kRequestFormat},
        {"format_version", 1},
        {"requester", requester},
        {"host", host},
        {"pid", pid},
        {"time", IsoTime(now)},
        {"time_ns", now},
        {"comms", comms}}.dump(-1, ' ', false, Json::error_handler_t::replace);
    return request;
  } catch (...) {
    return absl::ResourceExhaustedError("cannot format the dump request");
  }
}

absl::StatusOr<std::string> RequestDumps(const std::string& job_dir, const std::string& requester,
                                         const std::vector<std::string>& comms) noexcept {
  absl::StatusOr<FormattedDumpRequest> request = FormatDumpRequest(requester, comms);
  if (!request.ok()) return request.status();
  const std::string& name = request->name;
  const std::string& content = request->content;
  const std::string directory = absl::StrCat(job_dir, "/", kDumpRequestsDirectory);
  // The request first, then the generation naming it: a process that sees the new generation is
  // sure to find the request in its listing.
  absl::StatusOr<std::string> written = WriteFileAtomically(directory, name, content + "\n", /*durable=*/true,
                                                            /*levels_below_job_directory=*/1);
  if (!written.ok()) return written.status();
  // In place, not renamed over: every process keeps the generation file open and polls it.
  absl::Status generation = OverwriteInPlace(directory, kGenerationFile, name + "\n", kMaxGenerationBytes,
                                             /*levels_below_job_directory=*/1);
  if (!generation.ok()) {
    LogFirstWriteFailure(std::string(generation.message()));
    return generation;
  }
  return name;
}

absl::StatusOr<std::vector<DumpRequest>> PendingDumpRequests(
    const std::string& job_dir, const std::set<std::string>& already_handled) noexcept {
  try {
    return RunWithDeadline<std::vector<DumpRequest>>(
        [job_dir, already_handled] { return ListRequestsNow(job_dir, already_handled); }, kReadDeadline);
  } catch (...) {
    return absl::ResourceExhaustedError("cannot list the dump requests");
  }
}

std::vector<DumpRequest> RequestSieve::Sift(std::vector<DumpRequest> listed, const std::string& generation) {
  std::vector<DumpRequest> reported;
  for (DumpRequest& request : listed) {
    if (!handled_.insert(request.name).second) continue;
    const bool own = request.host == own_host_ && request.pid == own_pid_;
    const bool old = baseline_taken_ ? request.time_ns < old_before_ns_ : request.time_ns < fresh_since_ns_;
    if (!own && !old) reported.push_back(std::move(request));
  }
  baseline_taken_ = true;
  // A listing that does not show the request the generation names is older than the generation
  // (a shared file system's cached directory): list again next time.
  if (generation.empty() || handled_.contains(generation)) seen_generation_ = generation;
  return reported;
}

void RequestSieve::TakeUnlistedBaseline(const std::string& generation, std::int64_t made_ns) {
  baseline_taken_ = true;
  seen_generation_ = generation;
  if (!generation.empty()) handled_.insert(generation);
  old_before_ns_ = std::min(made_ns, fresh_since_ns_);
}

DumpRequestWatcher::DumpRequestWatcher(std::string job_dir, const std::string& own_host, int own_pid,
                                       std::int64_t fresh_since_ns)
    : job_dir_(std::move(job_dir)),
      sieve_(own_host, own_pid, fresh_since_ns),
      generation_(std::make_shared<PolledFile>(absl::StrCat(job_dir_, "/", kDumpRequestsDirectory),
                                               kGenerationFile, kMaxGenerationBytes,
                                               /*levels_below_job_directory=*/1)) {}

absl::StatusOr<std::vector<DumpRequest>> DumpRequestWatcher::Poll() noexcept {
  try {
    // The sieve is copied: a look that outlives its deadline must not touch this watcher.
    absl::StatusOr<PollOutcome> outcome = RunWithDeadline<PollOutcome>(
        [job_dir = job_dir_, generation_file = generation_, sieve = sieve_]() -> absl::StatusOr<PollOutcome> {
          PollOutcome outcome;
          absl::StatusOr<std::string> generation = ReadGeneration(*generation_file);
          if (!generation.ok()) return generation.status();
          outcome.generation = *generation;
          if (!sieve.MustList(outcome.generation)) return outcome;
          outcome.unlisted_baseline_ns = UnlistedBaseline(job_dir, sieve, outcome.generation);
          if (outcome.unlisted_baseline_ns) return outcome;
          absl::StatusOr<std::vector<DumpRequest>> fresh = ListRequestsNow(job_dir, sieve.handled());
          if (!fresh.ok()) return fresh.status();
          outcome.listed = true;
          outcome.fresh = *std::move(fresh);
          return outcome;
        },
        kReadDeadline);
    if (!outcome.ok()) return outcome.status();
    if (const std::optional<std::int64_t> made_ns = outcome->unlisted_baseline_ns; made_ns.has_value()) {
      sieve_.TakeUnlistedBaseline(outcome->generation, *made_ns);
      return std::vector<DumpRequest>();
    }
    if (!outcome->listed) return std::vector<DumpRequest>();
    return sieve_.Sift(std::move(outcome->fresh), outcome->generation);
  } catch (...) {
    return absl::ResourceExhaustedError("cannot look for dump requests");
  }
}

}  // namespace ncclguard
