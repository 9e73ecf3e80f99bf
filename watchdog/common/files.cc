// The private-file layer: see files.h.
#include "watchdog/common/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
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
#include "absl/strings/string_view.h"
#include "watchdog/common/exit_gate.h"
#include "watchdog/common/log.h"
#include "watchdog/common/temporaries.h"

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

// A regular file of this user, open as `fd` (`path` for messages).
absl::Status CheckOwnRegularFile(int fd, const std::string& path) {
  struct stat opened {};
  if (fstat(fd, &opened) != 0) return ErrnoError(absl::StrCat("cannot examine ", path), errno);
  if (!S_ISREG(opened.st_mode))
    return absl::PermissionDeniedError(absl::StrCat(path, " is not a regular file"));
  if (opened.st_uid != geteuid()) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, " belongs to uid ", opened.st_uid, ", not to this process's uid ", geteuid()));
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
  // A thread that has handed over its result is counted until it has ended, a moment later: on a
  // busy machine calls in quick succession would find the count full of those. A refusal
  // therefore waits up to 20 ms for them; threads that hang keep it full, and the call fails.
  constexpr int kWaits = 20;
  for (int wait = 0; g_unfinished_threads.fetch_add(1) >= kMaxUnfinishedThreads; ++wait) {
    g_unfinished_threads.fetch_sub(1);
    if (wait == kWaits) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
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
      MarkOwnThread();
      {
        // Parks here, or at a pass inside the work, once the application's exit has begun.
        const ExitPass pass;
        body();
      }
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

namespace {

// After a failure to create or open a file the process keeps open (a full disk, the directory
// unwritable or gone), the next tries are spaced out: 1, 2, 4, ... 64 calls are skipped, so that a
// broken file system is not asked again every interval by every process.
class Backoff {
 public:
  bool Skip() {
    if (skip_ == 0) return false;
    --skip_;
    return true;
  }
  void Failed() { skip_ = 1 << std::min(failures_++, 6); }
  void Succeeded() { failures_ = 0; }

 private:
  int failures_ = 0;
  int skip_ = 0;
};

}  // namespace

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

void Forget(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
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
