// Reading files of a job directory, and files the user named: never blocking, never through a
// symbolic link nobody expected, never more than asked for. See files.h.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "watchdog/common/files.h"
#include "watchdog/common/files_internal.h"

namespace ncclguard {
namespace {

using files_internal::Backoff;
using files_internal::CheckOwnRegularFile;
using files_internal::ErrnoError;
using files_internal::Forget;

// Sixteen times the files of a 16,384-rank job: more is not a job directory.
constexpr std::size_t kMaxListedNames = 1 << 18;

// Never blocks in open(): a FIFO without a writer or a device would hold the reader for ever.
constexpr int kReadFlags = O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;

absl::Status CheckReadable(const struct stat& entry, std::size_t max_bytes) {
  if (S_ISLNK(entry.st_mode)) return absl::PermissionDeniedError("a symbolic link; not followed");
  if (!S_ISREG(entry.st_mode)) {
    return absl::PermissionDeniedError("not a regular file (a FIFO, a device or a directory)");
  }
  if (entry.st_size < 0 || static_cast<std::uint64_t>(entry.st_size) > max_bytes) {
    return absl::OutOfRangeError(absl::StrCat("larger than ", max_bytes, " bytes"));
  }
  return absl::OkStatus();
}

// Reads the open `fd` (and closes it), whose fstat() gave `opened` (or failed: `opened_status`): a
// regular file, the one examined as `examined` when given, at most `max_bytes` even if it grows
// while being read.
absl::StatusOr<std::string> ReadOpenFile(int fd, const struct stat& opened, absl::Status opened_status,
                                         const struct stat* examined, std::size_t max_bytes) {
  absl::Status status = opened_status.ok() ? CheckReadable(opened, max_bytes) : std::move(opened_status);
  if (status.ok() && examined != nullptr &&
      (opened.st_dev != examined->st_dev || opened.st_ino != examined->st_ino)) {
    status = absl::UnavailableError("replaced while being opened");
  }
  std::string content;
  if (status.ok()) content.resize(static_cast<std::size_t>(opened.st_size) + 1);
  std::size_t filled = 0;
  while (status.ok()) {
    const std::size_t wanted = content.size() - filled;
    const ssize_t n = read(fd, content.data() + filled, wanted);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) status = ErrnoError("read", errno);
    if (n <= 0) break;
    filled += static_cast<std::size_t>(n);
    // A regular file reads short only at its end: no read() more to be told so (a job's worth of
    // files is read at once, and each system call counts).
    if (static_cast<std::size_t>(n) < wanted) break;
    if (content.size() > max_bytes) {
      status = absl::OutOfRangeError(absl::StrCat("larger than ", max_bytes, " bytes"));
    } else {
      content.resize(std::min(max_bytes + 1, content.size() * 2));  // it grows while we read
    }
  }
  close(fd);
  if (!status.ok()) return status;
  content.resize(filled);
  return content;
}

}  // namespace

struct PolledFile::State {
  std::mutex mutex;
  std::string directory;
  std::string name;
  std::size_t max_bytes = 0;
  int levels_below_job_directory = 0;
  Backoff backoff;
  int directory_fd = -1;  // kept too: opening the file again is then one openat()
  int fd = -1;
  int pid = 0;
  int reads_since_open = 0;
};

namespace {

// Opens the polled file again: through the directory kept open, else (the directory is gone or
// was never opened) from its path, creating both when missing.
absl::Status ReopenPolled(PolledFile::State& state) {
  Forget(state.fd);
  if (state.directory_fd >= 0) {
    const int fd = openat(state.directory_fd, state.name.c_str(),
                          O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd >= 0 && CheckOwnRegularFile(fd, absl::StrCat(state.directory, "/", state.name)).ok()) {
      state.fd = fd;
      return absl::OkStatus();
    }
    if (fd >= 0) close(fd);
    Forget(state.directory_fd);
  }
  absl::StatusOr<int> directory_fd =
      OpenPrivateDirectory(state.directory, /*create=*/true, state.levels_below_job_directory);
  if (!directory_fd.ok()) return directory_fd.status();
  state.directory_fd = *directory_fd;
  const int fd = openat(state.directory_fd, state.name.c_str(),
                        O_RDONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError(absl::StrCat("cannot open ", state.directory, "/", state.name), errno);
  if (absl::Status own = CheckOwnRegularFile(fd, absl::StrCat(state.directory, "/", state.name)); !own.ok()) {
    close(fd);
    return own;
  }
  state.fd = fd;
  return absl::OkStatus();
}

}  // namespace

PolledFile::PolledFile(std::string directory, std::string name, std::size_t max_bytes,
                       int levels_below_job_directory)
    : state_(std::make_shared<State>()) {
  state_->directory = std::move(directory);
  state_->name = std::move(name);
  state_->max_bytes = max_bytes;
  state_->levels_below_job_directory = levels_below_job_directory;
}

absl::StatusOr<std::string> PolledFile::ReadNow() noexcept {
  try {
    State& state = *state_;
    std::unique_lock<std::mutex> lock(state.mutex, std::try_to_lock);
    if (!lock.owns_lock()) return absl::UnavailableError("an earlier read still hangs");
    if (state.pid != static_cast<int>(getpid())) {
      state.fd = -1;  // the parent's, inherited
      state.directory_fd = -1;
      state.pid = static_cast<int>(getpid());
    }
    if (state.fd < 0 || ++state.reads_since_open >= kInPlaceChecks) {
      if (state.fd < 0 && state.backoff.Skip())
        return absl::UnavailableError("not opened for now: it failed");
      if (absl::Status opened = ReopenPolled(state); !opened.ok()) {
        state.backoff.Failed();
        return opened;
      }
      state.backoff.Succeeded();
      state.reads_since_open = 0;
    }
    std::string content(state.max_bytes + 1, '\0');
    std::size_t filled = 0;
    while (filled < content.size()) {
      const ssize_t n =
          pread(state.fd, content.data() + filled, content.size() - filled, static_cast<off_t>(filled));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int error = errno;
        Forget(state.fd);
        return ErrnoError("pread", error);
      }
      if (n == 0) break;
      filled += static_cast<std::size_t>(n);
    }
    if (filled > state.max_bytes)
      return absl::OutOfRangeError(absl::StrCat("larger than ", state.max_bytes, " bytes"));
    content.resize(filled);
    return content;
  } catch (...) {
    return absl::ResourceExhaustedError("cannot read a polled file");
  }
}

absl::StatusOr<std::string> ReadFileAt(int directory_fd, const std::string& name, std::size_t max_bytes) {
  // Every writer replaces a file by renaming a new one over it: one replaced between the look and
  // the open is looked at again. A few times at most: a file replaced that often is not the job's.
  constexpr int kLooks = 5;
  for (int look = 1;; ++look) {
    // Examined before it is opened: opening a device can have effects of its own.
    struct stat entry {};
    if (fstatat(directory_fd, name.c_str(), &entry, AT_SYMLINK_NOFOLLOW) != 0) {
      return absl::NotFoundError(std::strerror(errno));
    }
    if (absl::Status type = CheckReadable(entry, max_bytes); !type.ok()) return type;
    // The directory's owner matters only for a file that is neither this user's nor root's.
    if (entry.st_uid != geteuid() && entry.st_uid != 0) {
      struct stat directory {};
      if (fstat(directory_fd, &directory) != 0) return ErrnoError("cannot examine the directory", errno);
      if (entry.st_uid != directory.st_uid) {
        return absl::PermissionDeniedError(
            absl::StrCat("belongs to uid ", entry.st_uid, ", neither this user (", geteuid(),
                         "), root nor the directory's owner (", directory.st_uid, ")"));
      }
    }
    const int fd = openat(directory_fd, name.c_str(), kReadFlags | O_NOFOLLOW);
    if (fd < 0) return absl::NotFoundError(std::strerror(errno));
    struct stat opened {};
    absl::Status opened_status = fstat(fd, &opened) == 0 ? absl::OkStatus() : ErrnoError("fstat", errno);
    if (look < kLooks && opened_status.ok() &&
        (opened.st_dev != entry.st_dev || opened.st_ino != entry.st_ino)) {
      close(fd);
      continue;
    }
    return ReadOpenFile(fd, opened, std::move(opened_status), &entry, max_bytes);
  }
}

absl::StatusOr<std::string> ReadOwnFile(const std::string& path, std::size_t max_bytes) {
  const int fd = open(path.c_str(), kReadFlags | O_NOFOLLOW);
  if (fd < 0 && errno == ELOOP) {
    return absl::PermissionDeniedError(absl::StrCat(path, ": a symbolic link; not followed"));
  }
  if (fd < 0) {
    const std::string message = absl::StrCat(path, ": ", std::strerror(errno));
    return errno == ENOENT ? absl::NotFoundError(message) : absl::UnavailableError(message);
  }
  struct stat opened {};
  if (fstat(fd, &opened) != 0 || (opened.st_uid != geteuid() && opened.st_uid != 0)) {
    close(fd);
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": belongs to uid ", opened.st_uid, ", not to this user"));
  }
  absl::StatusOr<std::string> content = ReadOpenFile(fd, opened, absl::OkStatus(), nullptr, max_bytes);
  if (!content.ok())
    return absl::Status(content.status().code(), absl::StrCat(path, ": ", content.status().message()));
  return content;
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, std::size_t max_bytes) {
  const int fd = open(path.c_str(), kReadFlags);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
  struct stat opened {};
  absl::Status opened_status = fstat(fd, &opened) == 0 ? absl::OkStatus() : ErrnoError("fstat", errno);
  absl::StatusOr<std::string> content =
      ReadOpenFile(fd, opened, std::move(opened_status), nullptr, max_bytes);
  if (!content.ok())
    return absl::Status(content.status().code(), absl::StrCat(path, ": ", content.status().message()));
  return content;
}

absl::StatusOr<std::vector<std::string>> ListNamesAt(int directory_fd, const std::string& prefix,
                                                     const std::string& suffix) {
  const int listing_fd = dup(directory_fd);
  DIR* directory = listing_fd >= 0 ? fdopendir(listing_fd) : nullptr;
  if (directory == nullptr) {
    const int error = errno;
    if (listing_fd >= 0) close(listing_fd);
    return absl::UnavailableError(absl::StrCat("cannot list the directory: ", std::strerror(error)));
  }
  // The duplicate shares the position of `directory_fd`, which an earlier listing left at the end.
  rewinddir(directory);
  std::vector<std::string> names;
  while (const dirent* entry = readdir(directory)) {
    const absl::string_view name = entry->d_name;
    if (!absl::StartsWith(name, prefix) || !absl::EndsWith(name, suffix)) continue;
    if (names.size() == kMaxListedNames) {
      closedir(directory);
      return absl::OutOfRangeError(
          absl::StrCat("more than ", kMaxListedNames, " files named ", prefix, "*", suffix));
    }
    names.emplace_back(name);
  }
  closedir(directory);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace ncclguard
