// Writing files into the job directory: atomically, in place, once of several writers, appending.
// See files.h.
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "watchdog/common/bounded_threads.h"
#include "watchdog/common/files.h"
#include "watchdog/common/files_internal.h"
#include "watchdog/common/log.h"
#include "watchdog/common/temporaries.h"

namespace ncclguard {
namespace {

using files_internal::Backoff;
using files_internal::CheckOwnRegularFile;
using files_internal::CreateDirectories;
using files_internal::ErrnoError;
using files_internal::Forget;

std::atomic<bool> g_write_failure_logged{false};
std::atomic<std::uint64_t> g_temporary_counter{0};

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

// Whether `fd` lies on NFS, whose client keeps written data until a close or a flush: another
// host reading the file would not see an in-place write before.
bool OnNfs(int fd) {
  constexpr decltype(statfs::f_type) kNfsMagic = 0x6969;
  struct statfs file_system {};
  return fstatfs(fd, &file_system) == 0 && file_system.f_type == kNfsMagic;
}

// Writes `content` into a new hidden file of the directory open as `directory_fd` (O_EXCL,
// O_NOFOLLOW, mode 0600), fsync()ed when `durable`, and returns its name; removed again on failure.
// With `kept_fd`, the file is left open there (flushed as a close would flush it) instead of closed.
absl::StatusOr<std::string> WriteTemporaryFile(int directory_fd, const std::string& directory,
                                               const std::string& name, const std::string& content,
                                               bool durable, int* kept_fd = nullptr) {
  // Named after its writer: `ncclguard analyze` tells a killed writer's from one being written.
  std::string temporary = TemporaryName(name, SafeFileName(log::HostName()), static_cast<int>(getpid()),
                                        g_temporary_counter.fetch_add(1));
  const int fd =
      openat(directory_fd, temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError(absl::StrCat("cannot create a file in ", directory), errno);
  absl::Status status = absl::OkStatus();
  // The umask may have taken bits away; 0600 is what a dump must have, exactly.
  if (fchmod(fd, 0600) != 0) status = ErrnoError("fchmod", errno);
  if (status.ok()) status = WriteAll(fd, content);
  const bool flush = durable || (kept_fd != nullptr && OnNfs(fd));
  if (status.ok() && flush && fsync(fd) != 0) status = ErrnoError("fsync", errno);
  if (kept_fd != nullptr && status.ok()) {
    *kept_fd = fd;
    return temporary;
  }
  // NFS reports a failed write as late as close().
  if (close(fd) != 0 && status.ok()) status = ErrnoError("close", errno);
  if (!status.ok()) {
    unlinkat(directory_fd, temporary.c_str(), 0);
    return status;
  }
  return temporary;
}

// pwrite() of all of `content` at offset 0.
absl::Status WriteAllAtStart(int fd, const std::string& content) {
  std::size_t written = 0;
  while (written < content.size()) {
    const ssize_t n =
        pwrite(fd, content.data() + written, content.size() - written, static_cast<off_t>(written));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("pwrite", errno);
    written += static_cast<std::size_t>(n);
  }
  return absl::OkStatus();
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

}  // namespace

void LogFirstWriteFailure(const std::string& message) {
  if (g_write_failure_logged.exchange(true)) return;
  log::Warn(
      "{} (ncclguard reports only the first failure to write into the job directory; "
      "NCCLGUARD_DUMP_DIR chooses another directory)",
      message);
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

struct InPlaceFile::State {
  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  // The last owner is the file or a write that outlived it.
  ~State() {
    if (fd >= 0) close(fd);
  }

  std::mutex mutex;  // held by the thread writing; a write still hanging holds it
  Backoff backoff;
  int fd = -1;
  int pid = 0;  // the process that opened `fd`: a forked child creates its own file
  std::size_t size = 0;
  bool flush = false;  // on NFS
  int writes_since_look = 0;
};

namespace {

// Whether the file open as `fd` is still in its directory (the job directory may be deleted under
// the job, or the file replaced by an older build's rename).
bool StillThere(int fd, const std::string& path) {
  struct stat opened {};
  struct stat named {};
  return fstat(fd, &opened) == 0 && opened.st_nlink > 0 && lstat(path.c_str(), &named) == 0 &&
         named.st_dev == opened.st_dev && named.st_ino == opened.st_ino;
}

absl::StatusOr<std::string> WriteInPlaceNow(InPlaceFile::State& state, const std::string& directory,
                                            const std::string& name, const std::string& content) {
  std::string path = absl::StrCat(directory, "/", name);
  if (state.pid != static_cast<int>(getpid())) {
    state.fd = -1;  // the parent's, inherited: not closed here (it is close-on-exec anyway)
    state.pid = static_cast<int>(getpid());
  }
  if (state.fd >= 0 && ++state.writes_since_look >= kInPlaceChecks) {
    state.writes_since_look = 0;
    if (!StillThere(state.fd, path)) Forget(state.fd);
  }
  if (state.fd >= 0 && content.size() <= state.size) {
    std::string padded = content;
    padded.resize(state.size, ' ');
    absl::Status written = WriteAllAtStart(state.fd, padded);
    if (written.ok() && state.flush && fdatasync(state.fd) != 0) written = ErrnoError("fdatasync", errno);
    if (written.ok()) return path;
    Forget(state.fd);  // created anew below
  }
  if (state.backoff.Skip())
    return absl::UnavailableError(absl::StrCat("not writing ", path, " for now: it failed"));
  // A quarter to spare, in whole pages: a file that grows a little is not created again each time.
  constexpr std::size_t kPage = 4096;
  const std::size_t size = (content.size() + content.size() / 4 + kPage) / kPage * kPage;
  std::string padded = content;
  padded.resize(size, ' ');
  absl::StatusOr<int> directory_fd = OpenPrivateDirectory(directory, /*create=*/true);
  if (!directory_fd.ok()) {
    state.backoff.Failed();
    return directory_fd.status();
  }
  int fd = -1;
  absl::StatusOr<std::string> temporary =
      WriteTemporaryFile(*directory_fd, directory, name, padded, false, &fd);
  absl::Status status = temporary.status();
  if (status.ok() && renameat(*directory_fd, temporary->c_str(), *directory_fd, name.c_str()) != 0) {
    status = ErrnoError("rename", errno);
    unlinkat(*directory_fd, temporary->c_str(), 0);
    Forget(fd);
  }
  close(*directory_fd);
  if (!status.ok()) {
    state.backoff.Failed();
    return absl::Status(status.code(), absl::StrCat("cannot write ", path, ": ", status.message()));
  }
  state.backoff.Succeeded();
  state.fd = fd;
  state.size = size;
  state.flush = OnNfs(fd);
  state.writes_since_look = 0;
  return path;
}

}  // namespace

InPlaceFile::InPlaceFile(std::string directory, std::string name)
    : directory_(std::move(directory)), name_(std::move(name)), state_(std::make_shared<State>()) {}

absl::StatusOr<std::string> InPlaceFile::Write(const std::string& content) noexcept {
  absl::StatusOr<std::string> result = absl::UnknownError("not written");
  try {
    result = RunWithDeadline<std::string>(
        [state = state_, directory = directory_, name = name_, content]() -> absl::StatusOr<std::string> {
          std::unique_lock<std::mutex> lock(state->mutex, std::try_to_lock);
          if (!lock.owns_lock())
            return absl::UnavailableError(
                absl::StrCat("an earlier write of ", directory, "/", name, " still hangs"));
          return WriteInPlaceNow(*state, directory, name, content);
        },
        kWriteDeadline);
    if (absl::IsDeadlineExceeded(result.status())) {
      result =
          absl::DeadlineExceededError(absl::StrCat("writing ", directory_, "/", name_, " took longer than ",
                                                   kWriteDeadline.count() / 1000, " s; given up"));
    }
  } catch (...) {
    result = absl::ResourceExhaustedError(absl::StrCat("cannot write ", directory_, "/", name_));
  }
  if (!result.ok()) LogFirstWriteFailure(std::string(result.status().message()));
  return result;
}

namespace {

// Opens (creating it 0600 when missing) `name` in `directory` for `flags`, a regular file of this
// user, never through a symbolic link and never blocking.
absl::StatusOr<int> OpenOwnFile(const std::string& directory, const std::string& name, int flags,
                                int levels_below_job_directory) {
  absl::StatusOr<int> directory_fd =
      OpenPrivateDirectory(directory, /*create=*/true, levels_below_job_directory);
  if (!directory_fd.ok()) return directory_fd.status();
  const std::string path = absl::StrCat(directory, "/", name);
  const int fd = openat(*directory_fd, name.c_str(),
                        flags | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0600);
  const int error = errno;
  close(*directory_fd);
  if (fd < 0)
    return ErrnoError(absl::StrCat("cannot open ", path, error == ELOOP ? " (a symbolic link)" : ""), error);
  if (absl::Status own = CheckOwnRegularFile(fd, path); !own.ok()) {
    close(fd);
    return own;
  }
  return fd;
}

}  // namespace

absl::Status OverwriteInPlace(const std::string& directory, const std::string& name,
                              const std::string& content, std::size_t size,
                              int levels_below_job_directory) noexcept {
  try {
    absl::StatusOr<bool> written = RunWithDeadline<bool>(
        [directory, name, content, size, levels_below_job_directory]() -> absl::StatusOr<bool> {
          absl::StatusOr<int> fd = OpenOwnFile(directory, name, O_WRONLY, levels_below_job_directory);
          if (!fd.ok()) return fd.status();
          std::string padded = content;
          if (padded.size() < size) padded.resize(size, ' ');
          absl::Status status = WriteAllAtStart(*fd, padded);
          // NFS reports a failed write as late as close(), which also publishes it to other hosts.
          if (close(*fd) != 0 && status.ok()) status = ErrnoError("close", errno);
          if (!status.ok()) return status;
          return true;
        },
        kWriteDeadline);
    return written.status();
  } catch (...) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot write ", directory, "/", name));
  }
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

}  // namespace ncclguard
