// The private-file layer: see files.h.
#include "watchdog/common/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "watchdog/common/log.h"

namespace ncclguard {
namespace {

// Threads of RunWithDeadline still running, abandoned ones included.
std::atomic<int> g_unfinished_threads{0};
constexpr int kMaxUnfinishedThreads = 4;
// Sixteen times the files of a 16,384-rank job: more is not a job directory.
constexpr std::size_t kMaxListedNames = 1 << 18;

std::atomic<bool> g_write_failure_logged{false};
std::atomic<std::uint64_t> g_temporary_counter{0};

absl::Status ErrnoError(const std::string& what, int error) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(error)));
}

absl::Status CreateDirectories(const std::string& directory) {
  for (size_t slash = directory.find('/', 1);; slash = directory.find('/', slash + 1)) {
    const std::string prefix = directory.substr(0, slash);
    if (!prefix.empty() && mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoError(absl::StrCat("cannot create the directory ", prefix), errno);
    }
    if (slash == std::string::npos) return absl::OkStatus();
  }
}

// How many trailing components of a directory ncclguard writes into are its own: those below the
// job directory, the job directory, and the default dump directory ncclguard-<uid> above it.
std::size_t OwnLevels(const std::vector<std::string>& components, int levels_below_job_directory) {
  const std::size_t job_and_below = static_cast<std::size_t>(std::max(levels_below_job_directory, 0)) + 1;
  if (components.size() <= job_and_below) return job_and_below;
  const bool default_base =
      components[components.size() - job_and_below - 1] == absl::StrCat("ncclguard-", getuid());
  return job_and_below + (default_base ? 1 : 0);
}

// Opens (creating it 0700 when asked) the directory `name` in `parent_fd`, one of ncclguard's own
// levels (`path`, for messages): a real directory owned by this user. Checked on the open
// descriptor: what is checked is what is written into.
absl::StatusOr<int> OpenOwnLevel(int parent_fd, const std::string& name, const std::string& path,
                                 bool create) {
  constexpr int kFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
  int fd = openat(parent_fd, name.c_str(), kFlags);
  if (fd < 0 && errno == ENOENT && create) {
    if (mkdirat(parent_fd, name.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoError(absl::StrCat("cannot create the directory ", path), errno);
    }
    fd = openat(parent_fd, name.c_str(), kFlags);
  }
  if (fd < 0) {
    const int error = errno;
    struct stat link {};
    if (fstatat(parent_fd, name.c_str(), &link, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(link.st_mode)) {
      return absl::PermissionDeniedError(
          absl::StrCat(path, " is a symbolic link; ncclguard writes only into real directories"));
    }
    return ErrnoError(absl::StrCat("cannot open the directory ", path), error);
  }
  struct stat status {};
  if (fstat(fd, &status) != 0) {
    const int error = errno;
    close(fd);
    return ErrnoError(absl::StrCat("cannot examine the directory ", path), error);
  }
  if (status.st_uid != geteuid()) {
    close(fd);
    return absl::PermissionDeniedError(
        absl::StrCat(path, " belongs to uid ", status.st_uid, ", not to this process's uid ", geteuid()));
  }
  return fd;
}

absl::Status WriteAll(int fd, const std::string& content) {
  size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = write(fd, content.data() + written, content.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("write", errno);
    written += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Writes `content` into a new hidden file of the directory open as `directory_fd` (O_EXCL,
// O_NOFOLLOW, mode 0600), fsync()ed when `durable`, and returns its name; removed again on failure.
absl::StatusOr<std::string> WriteTemporaryFile(int directory_fd, const std::string& directory,
                                               const std::string& name, const std::string& content,
                                               bool durable) {
  std::string temporary = absl::StrCat(".tmp-", name, ".", getpid(), ".", g_temporary_counter.fetch_add(1));
  const int fd =
      openat(directory_fd, temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError(absl::StrCat("cannot create a file in ", directory), errno);
  absl::Status status = absl::OkStatus();
  // The umask may have taken bits away; 0600 is what a dump must have, exactly.
  if (fchmod(fd, 0600) != 0) status = ErrnoError("fchmod", errno);
  if (status.ok()) status = WriteAll(fd, content);
  if (status.ok() && durable && fsync(fd) != 0) status = ErrnoError("fsync", errno);
  // NFS reports a failed write as late as close().
  if (close(fd) != 0 && status.ok()) status = ErrnoError("close", errno);
  if (!status.ok()) {
    unlinkat(directory_fd, temporary.c_str(), 0);
    return status;
  }
  return temporary;
}

absl::StatusOr<std::string> WriteFileNow(const std::string& directory, const std::string& name,
                                         const std::string& content, bool durable,
                                         int levels_below_job_directory) {
  absl::StatusOr<int> directory_fd =
      OpenPrivateDirectory(directory, /*create=*/true, levels_below_job_directory);
  if (!directory_fd.ok()) return directory_fd.status();
  absl::StatusOr<std::string> temporary =
      WriteTemporaryFile(*directory_fd, directory, name, content, durable);
  absl::Status status = temporary.status();
  if (status.ok() && renameat(*directory_fd, temporary->c_str(), *directory_fd, name.c_str()) != 0) {
    status = ErrnoError("rename", errno);
    unlinkat(*directory_fd, temporary->c_str(), 0);
  } else if (status.ok() && durable) {
    fsync(*directory_fd);  // makes the rename itself survive a crash of the node
  }
  close(*directory_fd);
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("cannot write ", directory, "/", name, ": ", status.message()));
  }
  return absl::StrCat(directory, "/", name);
}

absl::Status PublishFileNow(const std::string& directory, const std::string& name, const std::string& content,
                            int levels_below_job_directory) {
  absl::StatusOr<int> directory_fd =
      OpenPrivateDirectory(directory, /*create=*/true, levels_below_job_directory);
  if (!directory_fd.ok()) return directory_fd.status();
  absl::StatusOr<std::string> temporary = WriteTemporaryFile(*directory_fd, directory, name, content, false);
  absl::Status status = temporary.status();
  if (status.ok() && linkat(*directory_fd, temporary->c_str(), *directory_fd, name.c_str(), 0) != 0) {
    int error = errno;
    // A file system without hard links may still rename without replacing.
    if (error == EPERM || error == EOPNOTSUPP) {
      error = renameat2(*directory_fd, temporary->c_str(), *directory_fd, name.c_str(), RENAME_NOREPLACE) == 0
                  ? 0
                  : errno;
    }
    // Over NFS a retransmitted link() can fail with EEXIST although the first transmission made
    // the link: two links on the temporary file say that it did.
    struct stat linked {};
    const bool made_anyway =
        error == 0 ||
        (error == EEXIST && fstatat(*directory_fd, temporary->c_str(), &linked, AT_SYMLINK_NOFOLLOW) == 0 &&
         linked.st_nlink == 2);
    if (!made_anyway) {
      status = error == EEXIST ? absl::AlreadyExistsError(absl::StrCat(directory, "/", name, " exists"))
                               : ErrnoError(absl::StrCat("cannot write ", directory, "/", name), error);
    }
  }
  if (temporary.ok()) unlinkat(*directory_fd, temporary->c_str(), 0);
  close(*directory_fd);
  if (!status.ok() && !absl::IsAlreadyExists(status)) {
    return absl::Status(status.code(),
                        absl::StrCat("cannot write ", directory, "/", name, ": ", status.message()));
  }
  return status;
}

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

void LogFirstWriteFailure(const std::string& message) {
  if (g_write_failure_logged.exchange(true)) return;
  log::Warn(
      "{} (ncclguard reports only the first failure to write into the job directory; "
      "NCCLGUARD_DUMP_DIR chooses another directory)",
      message);
}

namespace detail {

bool StartBoundedThread(std::function<void()> body) {
  if (g_unfinished_threads.fetch_add(1) >= kMaxUnfinishedThreads) {
    g_unfinished_threads.fetch_sub(1);
    return false;
  }
  // The thread inherits the creator's signal mask: block everything around its creation so an
  // application's signal handler never runs on it.
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  bool started = true;
  try {
    std::thread([body = std::move(body)] {
      body();
      g_unfinished_threads.fetch_sub(1);
    }).detach();
  } catch (...) {
    g_unfinished_threads.fetch_sub(1);
    started = false;
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  return started;
}

int UnfinishedThreads() noexcept { return g_unfinished_threads.load(); }

}  // namespace detail

std::string SafeFileName(const std::string& text) {
  std::string name;
  for (const char c : text.substr(0, 100)) {
    const bool safe = absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    name += safe ? c : '_';
  }
  if (!name.empty() && name[0] == '.') name[0] = '_';  // neither hidden nor "." or ".."
  return name.empty() ? "unknown" : name;
}

absl::StatusOr<int> OpenPrivateDirectory(const std::string& path, bool create,
                                         int levels_below_job_directory) {
  // A trailing slash would make open() follow a symbolic link despite O_NOFOLLOW.
  std::string directory = path;
  while (directory.size() > 1 && directory.back() == '/') directory.pop_back();
  if (directory.empty() || directory[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat("'", directory, "' is not an absolute path"));
  }
  const std::vector<std::string> components = absl::StrSplit(directory, '/', absl::SkipEmpty());
  const std::size_t own = std::min(components.size(), OwnLevels(components, levels_below_job_directory));
  std::string base = "/";
  for (std::size_t i = 0; i + own < components.size(); ++i)
    absl::StrAppend(&base, i > 0 ? "/" : "", components[i]);
  // The part above ncclguard's own levels is the user's: followed as given, created when missing.
  int fd = open(base.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT && create) {
    if (absl::Status created = CreateDirectories(base); !created.ok()) return created;
    fd = open(base.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  }
  if (fd < 0) return ErrnoError(absl::StrCat("cannot open the directory ", directory, ": ", base), errno);
  std::string opened = base == "/" ? "" : base;
  for (std::size_t i = components.size() - own; i < components.size(); ++i) {
    absl::StrAppend(&opened, "/", components[i]);
    absl::StatusOr<int> next = OpenOwnLevel(fd, components[i], opened, create);
    close(fd);
    if (!next.ok()) return next.status();
    fd = *next;
  }
  return fd;
}

absl::StatusOr<int> OpenFileForAppending(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  const std::string directory = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat("'", path, "' names a directory"));
  int directory_fd = open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (directory_fd < 0 && errno == ENOENT) {
    if (absl::Status created = CreateDirectories(directory); !created.ok()) return created;
    directory_fd = open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  }
  if (directory_fd < 0) return ErrnoError(absl::StrCat("cannot open the directory ", directory), errno);
  // O_NONBLOCK: a FIFO without a reader fails at once instead of holding the first NCCL call.
  const int fd = openat(directory_fd, name.c_str(),
                        O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0600);
  const int error = errno;
  close(directory_fd);
  if (fd < 0) {
    const char* why = error == ELOOP ? " (a symbolic link; not followed)" : "";
    return ErrnoError(absl::StrCat("cannot open ", path, why), error);
  }
  struct stat status {};
  absl::Status refused = absl::OkStatus();
  if (fstat(fd, &status) != 0) {
    refused = ErrnoError(absl::StrCat("cannot examine ", path), errno);
  } else if (!S_ISREG(status.st_mode)) {
    refused = absl::PermissionDeniedError(absl::StrCat(path, " is not a regular file"));
  } else if (status.st_uid != geteuid()) {
    refused = absl::PermissionDeniedError(
        absl::StrCat(path, " belongs to uid ", status.st_uid, ", not to this process's uid ", geteuid()));
  }
  if (!refused.ok()) {
    close(fd);
    return refused;
  }
  return fd;
}

absl::StatusOr<std::string> WriteFileAtomically(const std::string& directory, const std::string& name,
                                                const std::string& content, bool durable,
                                                int levels_below_job_directory) noexcept {
  absl::StatusOr<std::string> result = absl::UnknownError("not written");
  try {
    result = RunWithDeadline<std::string>(
        [directory, name, content, durable, levels_below_job_directory] {
          return WriteFileNow(directory, name, content, durable, levels_below_job_directory);
        },
        kWriteDeadline);
    if (absl::IsDeadlineExceeded(result.status())) {
      result = absl::DeadlineExceededError(absl::StrCat("writing ", directory, "/", name,
                                                        " took longer than ", kWriteDeadline.count() / 1000,
                                                        " s; given up (the file may still appear)"));
    }
  } catch (...) {
    result = absl::ResourceExhaustedError(absl::StrCat("cannot write ", directory, "/", name));
  }
  if (!result.ok()) LogFirstWriteFailure(std::string(result.status().message()));
  return result;
}

absl::Status PublishFileOnce(const std::string& directory, const std::string& name,
                             const std::string& content, int levels_below_job_directory,
                             std::chrono::milliseconds deadline) noexcept {
  try {
    absl::StatusOr<bool> published = RunWithDeadline<bool>(
        [directory, name, content, levels_below_job_directory]() -> absl::StatusOr<bool> {
          absl::Status status = PublishFileNow(directory, name, content, levels_below_job_directory);
          if (!status.ok()) return status;
          return true;
        },
        deadline);
    if (absl::IsDeadlineExceeded(published.status())) {
      return absl::DeadlineExceededError(absl::StrCat("writing ", directory, "/", name, " took longer than ",
                                                      deadline.count(),
                                                      " ms; given up (the file may still appear)"));
    }
    return published.status();
  } catch (...) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot write ", directory, "/", name));
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
    const std::string name = entry->d_name;
    if (!absl::StartsWith(name, prefix) || !absl::EndsWith(name, suffix)) continue;
    if (names.size() == kMaxListedNames) {
      closedir(directory);
      return absl::OutOfRangeError(
          absl::StrCat("more than ", kMaxListedNames, " files named ", prefix, "*", suffix));
    }
    names.push_back(name);
  }
  closedir(directory);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace ncclguard
