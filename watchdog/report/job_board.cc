// The job board's directory backend, and the choice of backend (job_board.h).
#include "watchdog/report/job_board.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "watchdog/common/config.h"
#include "watchdog/common/escape.h"
#include "watchdog/common/files.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {
namespace {

constexpr char kRedisScheme[] = "redis://";
constexpr char kRedisTlsScheme[] = "rediss://";

// The job directory itself: every record a file, as job_dir.h and files.h write and read them.
class DirectoryBoard final : public JobBoard {
 public:
  DirectoryBoard(std::string job_dir, std::string job_id, BoardIdentity identity)
      : job_dir_(std::move(job_dir)), job_id_(std::move(job_id)), identity_(std::move(identity)) {}

  std::string Where() const override { return job_dir_; }
  const std::string& Directory() const override { return job_dir_; }
  const std::string& JobId() const override { return job_id_; }
  double StatusWritesPerSecond() const override { return kJobStatusWritesPerSecond; }

  absl::Status PublishStatus(const ProcessSnapshot& snapshot, const ProcessFacts& facts) noexcept override {
    return WriteStatus(job_dir_, snapshot, facts).status();
  }

  bool StatusesAreFiles() const override { return true; }
  absl::StatusOr<StatusRecords> FetchStatuses(std::chrono::steady_clock::time_point /*deadline*/,
                                              StatusBatchSink* /*batches*/) noexcept override {
    return absl::FailedPreconditionError("the statuses are files of the job directory");
  }

  absl::StatusOr<std::string> RequestDumps(const std::string& requester,
                                           const std::vector<std::string>& comms) noexcept override {
    return ::ncclguard::RequestDumps(job_dir_, requester, comms);
  }

  absl::StatusOr<std::vector<DumpRequest>> PollDumpRequests() noexcept override {
    if (!watcher_) {
      try {
        watcher_.emplace(job_dir_, identity_.host, identity_.pid, identity_.started_wall_ns);
      } catch (...) {
        return absl::ResourceExhaustedError("cannot watch the dump requests (out of memory)");
      }
    }
    return watcher_->Poll();
  }

  absl::Status Put(const std::string& folder, const std::string& name, const std::string& content,
                   bool durable) noexcept override {
    try {
      return WriteFileAtomically(PathOf(folder), name, content, durable, Levels(folder)).status();
    } catch (...) {
      return absl::ResourceExhaustedError("cannot write a record (out of memory)");
    }
  }

  absl::Status PutOnce(const std::string& folder, const std::string& name, const std::string& content,
                       std::chrono::milliseconds deadline) noexcept override {
    try {
      return PublishFileOnce(PathOf(folder), name, content, Levels(folder), deadline);
    } catch (...) {
      return absl::ResourceExhaustedError("cannot write a record (out of memory)");
    }
  }

  absl::StatusOr<std::string> Get(const std::string& folder, const std::string& name,
                                  std::size_t max_bytes) noexcept override {
    try {
      absl::StatusOr<int> directory_fd = OpenFolder(folder);
      if (!directory_fd.ok()) return directory_fd.status();
      struct stat entry {};
      const bool exists = fstatat(*directory_fd, name.c_str(), &entry, AT_SYMLINK_NOFOLLOW) == 0;
      absl::StatusOr<std::string> content =
          exists ? ReadFileAt(*directory_fd, name, max_bytes)
                 : absl::NotFoundError(absl::StrCat(PathOf(folder), "/", name, " does not exist"));
      close(*directory_fd);
      return content;
    } catch (...) {
      return absl::ResourceExhaustedError("cannot read a record (out of memory)");
    }
  }

  absl::StatusOr<std::vector<std::string>> ListNames(const std::string& folder, const std::string& prefix,
                                                     const std::string& suffix) noexcept override {
    try {
      absl::StatusOr<int> directory_fd = OpenFolder(folder);
      if (absl::IsNotFound(directory_fd.status())) return std::vector<std::string>();
      if (!directory_fd.ok()) return directory_fd.status();
      absl::StatusOr<std::vector<std::string>> names = ListNamesAt(*directory_fd, prefix, suffix);
      close(*directory_fd);
      return names;
    } catch (...) {
      return absl::ResourceExhaustedError("cannot list records (out of memory)");
    }
  }

 private:
  std::string PathOf(const std::string& folder) const {
    return folder.empty() ? job_dir_ : absl::StrCat(job_dir_, "/", folder);
  }
  static int Levels(const std::string& folder) {
    return folder.empty() ? 0 : static_cast<int>(std::count(folder.begin(), folder.end(), '/')) + 1;
  }
  // NotFound when the folder (or the job directory) does not exist; Unavailable when it cannot be
  // opened now; any other error when what is there is not ours.
  absl::StatusOr<int> OpenFolder(const std::string& folder) const {
    const std::string path = PathOf(folder);
    struct stat entry {};
    if (lstat(path.c_str(), &entry) != 0 && errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat(path, " does not exist"));
    }
    return OpenPrivateDirectory(path, /*create=*/false, Levels(folder));
  }

  const std::string job_dir_;
  const std::string job_id_;
  const BoardIdentity identity_;
  std::optional<DumpRequestWatcher> watcher_;  // PollDumpRequests is called by one thread
};

}  // namespace

std::string RedisAddress::ToString() const {
  // An IPv6 literal is bracketed again, so that the text parses back to this address.
  const bool literal = host.find(':') != std::string::npos;
  return absl::StrCat(tls ? kRedisTlsScheme : kRedisScheme, literal ? "[" : "", host, literal ? "]" : "", ":",
                      port, "/", database);
}

bool IsRedisName(const std::string& text) {
  return absl::StartsWith(text, kRedisScheme) || absl::StartsWith(text, kRedisTlsScheme);
}

bool RedisTlsAvailable() { return NCCLGUARD_HAVE_HIREDIS_SSL != 0; }

const std::string& DefaultStoreAuthFile() noexcept { return GetConfig().store_auth_file; }

absl::StatusOr<RedisAddress> ParseRedisAddress(const std::string& text) {
  auto invalid = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", RemoveUrlCredentials(text), "' is not a Redis address (redis://host[:port][/database]): ", why));
  };
  if (!IsRedisName(text)) return invalid("it does not begin with redis:// or rediss://");
  RedisAddress address;
  address.tls = absl::StartsWith(text, kRedisTlsScheme);
  absl::string_view rest = absl::string_view(text).substr(
      std::char_traits<char>::length(address.tls ? kRedisTlsScheme : kRedisScheme));
  // No host name holds '@': whatever precedes one is a user or a password, and none of it is shown.
  if (rest.find('@') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        "NCCLGUARD_STORE carries a user or password (redis://user:password@host): refused, since "
        "the URL is logged, stored in dumps and visible to every user of the node; write them to a "
        "file of mode 0600 (the password, or the ACL user then its password, one per line) and name "
        "it in NCCLGUARD_STORE_AUTH_FILE");
  }
  const std::size_t slash = rest.find('/');
  if (slash != absl::string_view::npos) {
    const absl::string_view database = rest.substr(slash + 1);
    if (!database.empty() && (!absl::SimpleAtoi(database, &address.database) || address.database < 0 ||
                              address.database > 65535)) {
      return invalid("the database is not a number");
    }
    rest = rest.substr(0, slash);
  }
  std::optional<absl::string_view> port;  // when the address names one
  if (absl::StartsWith(rest, "[")) {
    const std::size_t close = rest.find(']');
    if (close == absl::string_view::npos) return invalid("an IPv6 address lacks its closing ']'");
    const absl::string_view after = rest.substr(close + 1);
    if (!after.empty() && !absl::StartsWith(after, ":")) return invalid("text follows the IPv6 address");
    if (!after.empty()) port = after.substr(1);
    rest = rest.substr(1, close - 1);
  } else {
    const std::size_t colon = rest.rfind(':');
    if (colon != absl::string_view::npos) {
      if (rest.find(':') != colon)
        return invalid("an IPv6 address is written in brackets: redis://[::1]:6379/0");
      port = rest.substr(colon + 1);
      rest = rest.substr(0, colon);
    }
  }
  if (port && (!absl::SimpleAtoi(*port, &address.port) || address.port < 1 || address.port > 65535)) {
    return invalid("the port is not a number from 1 to 65535");
  }
  if (rest.empty()) return invalid("no host");
  address.host = std::string(rest);
  if (address.tls && !RedisTlsAvailable()) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", address.ToString(),
                     "': TLS (rediss://) is unavailable in this build of ncclguard, which was built "
                     "without hiredis_ssl (hiredis 1.0 or later with its SSL library); use redis:// on "
                     "the cluster's private network, or a build of ncclguard with hiredis_ssl"));
  }
  return address;
}

absl::StatusOr<RedisJob> ParseRedisJob(const std::string& text) {
  const std::size_t slash = text.rfind('/');
  const std::size_t host_start = std::char_traits<char>::length(kRedisScheme);
  if (!IsRedisName(text) || slash == std::string::npos || slash < host_start || slash + 1 == text.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", RemoveUrlCredentials(text),
                     "' is not a job on a Redis board (redis://host[:port][/database]/<job id>)"));
  }
  absl::StatusOr<RedisAddress> address = ParseRedisAddress(text.substr(0, slash));
  if (!address.ok()) return address.status();
  return RedisJob{.address = *std::move(address), .job_id = text.substr(slash + 1)};
}

absl::StatusOr<std::shared_ptr<JobBoard>> OpenJobBoard(const std::string& store, const std::string& job_dir,
                                                       const std::string& job_id, BoardIdentity identity,
                                                       const std::string& auth_file) {
  if (store.empty() || store == "dir") {
    return std::shared_ptr<JobBoard>(std::make_shared<DirectoryBoard>(job_dir, job_id, std::move(identity)));
  }
  if (!IsRedisName(store)) {
    return absl::InvalidArgumentError(absl::StrCat("NCCLGUARD_STORE '", RemoveUrlCredentials(store),
                                                   "' is neither 'dir' nor redis://host[:port][/database]"));
  }
  absl::StatusOr<RedisAddress> address = ParseRedisAddress(store);
  if (!address.ok()) return address.status();
  address->auth_file = auth_file;
  return MakeRedisBoard(*address, job_dir, job_id, identity);
}

}  // namespace ncclguard
