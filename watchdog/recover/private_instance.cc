// The private NCCL instance: making and sharing the copy of the library, loading it, P2P off for
// its first communicator, and removing the copy after its last user. See private_instance.h.
#include "watchdog/recover/private_instance.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "watchdog/common/files.h"
#include "watchdog/common/fnv1a.h"
#include "watchdog/common/libraries.h"
#include "watchdog/common/log.h"
#include "watchdog/common/mutex.h"
#include "watchdog/common/nccl_api.h"

namespace ncclguard {
namespace {

using Clock = std::chrono::steady_clock;

// copy_file_range() moves this much per call; read()/write() go through a buffer of this size.
constexpr std::size_t kCopyChunkBytes = 8 << 20;
constexpr std::size_t kBufferedChunkBytes = 1 << 20;
// A process that holds the exclusive lock of a copy is removing it, which takes a moment; one that
// holds the directory's is copying, which takes up to the deadline.
constexpr std::chrono::milliseconds kLockPollInterval{10};
// Another process may remove the copy between our look and our lock; we look again this often.
constexpr int kMaxCopyAttempts = 8;
// Release() at exit must not hold the process on a file system that stopped answering.
constexpr std::chrono::milliseconds kReleaseDeadline{5'000};
// How long past its deadline the copy's work is waited for before it is abandoned.
constexpr std::chrono::milliseconds kHungCallMargin{500};

std::atomic<std::uint64_t> g_temporary_counter{0};
// Serialises RunWithP2pDisabled: two overlapping windows would restore each other's values.
Mutex g_environment_mutex;

absl::Status ErrnoError(absl::StatusCode code, const std::string& what, int error) {
  return {code, absl::StrCat(what, ": ", std::strerror(error))};
}

absl::StatusCode CodeOfErrno(int error) {
  if (error == ENOENT) return absl::StatusCode::kNotFound;
  if (error == EACCES || error == EPERM || error == EROFS) return absl::StatusCode::kPermissionDenied;
  if (error == ENOSPC) return absl::StatusCode::kResourceExhausted;
  return absl::StatusCode::kUnavailable;
}

absl::Status FileError(const std::string& what, int error) {
  return ErrnoError(CodeOfErrno(error), what, error);
}

bool SameFile(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// Takes flock(`operation`) on `fd`, retrying a lock held by another process until `deadline`.
// False with errno set on failure (EWOULDBLOCK once the deadline has passed).
bool LockUntil(int fd, int operation, Clock::time_point deadline) {
  for (;;) {
    if (flock(fd, operation | LOCK_NB) == 0) return true;
    if ((errno != EWOULDBLOCK && errno != EINTR) || Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(kLockPollInterval);
  }
}

// The copy's file, held open read-only with a shared flock: what marks it as in use.
struct CopyLease {
  int copy_fd = -1;
  int directory_fd = -1;
  std::string path;

  CopyLease() = default;
  CopyLease(CopyLease&& other) noexcept
      : copy_fd(std::exchange(other.copy_fd, -1)),
        directory_fd(std::exchange(other.directory_fd, -1)),
        path(std::move(other.path)) {}
  CopyLease& operator=(CopyLease&& other) noexcept {
    std::swap(copy_fd, other.copy_fd);
    std::swap(directory_fd, other.directory_fd);
    std::swap(path, other.path);
    return *this;
  }
  CopyLease(const CopyLease&) = delete;
  CopyLease& operator=(const CopyLease&) = delete;
  // A lease never handed out (an abandoned search) is simply dropped: the lock goes with the file.
  ~CopyLease() {
    if (copy_fd >= 0) close(copy_fd);
    if (directory_fd >= 0) close(directory_fd);
  }
};

struct CopyRequest {
  std::string library_path;
  std::string directory;
  int levels_below_job_directory = 1;
  Clock::time_point deadline;
};

// Writes the copy as a temporary file and links it under `name`: the first process to link wins
// and the others use its copy, so racing processes agree on one file. A file system without hard
// links gets a rename (the last one wins; every copy is complete).
absl::Status CreateCopy(int library_fd, std::uint64_t size, int directory_fd, const std::string& name,
                        const CopyRequest& request) {
  const std::string temporary =
      absl::StrCat(".tmp-", name, ".", getpid(), ".", g_temporary_counter.fetch_add(1));
  const int fd =
      openat(directory_fd, temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return FileError(absl::StrCat("cannot create a file in ", request.directory), errno);
  absl::Status status = detail::CopyFileContents(library_fd, fd, size, request.deadline);
  // A crash of the node after the link must not leave a copy of the right size with holes in it.
  if (status.ok() && fdatasync(fd) != 0) status = FileError("fdatasync", errno);
  // Read and map only: nothing writes a copy once it is complete.
  if (status.ok() && fchmod(fd, 0500) != 0) status = FileError("fchmod", errno);
  if (close(fd) != 0 && status.ok()) status = FileError("close", errno);  // NFS reports late
  if (status.ok() && linkat(directory_fd, temporary.c_str(), directory_fd, name.c_str(), 0) != 0) {
    const int error = errno;
    if (error == EPERM || error == EOPNOTSUPP || error == EMLINK) {
      if (renameat(directory_fd, temporary.c_str(), directory_fd, name.c_str()) != 0) {
        status = FileError("rename", errno);
      }
    } else if (error != EEXIST) {  // EEXIST: another process linked its copy first
      status = FileError("link", error);
    }
  }
  unlinkat(directory_fd, temporary.c_str(), 0);
  if (!status.ok()) {
    return {status.code(), absl::StrCat("cannot copy ", request.library_path, " to ", request.directory, "/",
                                        name, ": ", status.message())};
  }
  return absl::OkStatus();
}

// The complete copy `name` open with a shared lock, once it is still the file of that name after
// the lock (a process that held the exclusive lock may have removed it). std::nullopt when it is
// missing, incomplete or was replaced: the caller makes or looks for it again.
absl::StatusOr<std::optional<int>> OpenLockedCopy(int directory_fd, const std::string& name,
                                                  std::uint64_t size, const CopyRequest& request) {
  const std::string path = absl::StrCat(request.directory, "/", name);
  const int fd =
      openat(directory_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) return std::nullopt;
  if (fd < 0) return FileError(absl::StrCat("cannot open ", path), errno);
  struct stat opened {};
  absl::Status refused = absl::OkStatus();
  if (fstat(fd, &opened) != 0) {
    refused = FileError(absl::StrCat("cannot examine ", path), errno);
  } else if (!S_ISREG(opened.st_mode) || opened.st_uid != geteuid()) {
    refused = absl::PermissionDeniedError(absl::StrCat(path, " is not a regular file of this user"));
  }
  if (!refused.ok()) {
    close(fd);
    return refused;
  }
  if (static_cast<std::uint64_t>(opened.st_size) != size) {
    // Cut short by a crash, or written by another program: made again.
    close(fd);
    unlinkat(directory_fd, name.c_str(), 0);
    return std::nullopt;
  }
  if (!LockUntil(fd, LOCK_SH, request.deadline)) {
    const int error = errno;
    close(fd);
    if (error == EWOULDBLOCK) return absl::DeadlineExceededError(absl::StrCat(path, " stayed locked"));
    return FileError(absl::StrCat("cannot lock ", path), error);
  }
  struct stat named {};
  if (fstatat(directory_fd, name.c_str(), &named, AT_SYMLINK_NOFOLLOW) != 0 || !SameFile(named, opened)) {
    close(fd);
    return std::nullopt;
  }
  return fd;
}

absl::Status CheckExecutable(int directory_fd, const std::string& directory) {
  struct statvfs file_system {};
  if (fstatvfs(directory_fd, &file_system) == 0 && (file_system.f_flag & ST_NOEXEC) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        directory, " is on a file system mounted noexec: a library copied there cannot be loaded"));
  }
  return absl::OkStatus();
}

// Finds or makes the copy of the library and takes a shared lock on it. Copies are made under an
// exclusive lock of the directory, so the node's processes copy a 300 MB library once, not once
// each; a file system without flock() on directories makes each copy its own (still correct).
absl::StatusOr<CopyLease> AcquireCopy(const CopyRequest& request) {
  const int library_fd = open(request.library_path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (library_fd < 0)
    return FileError(absl::StrCat("cannot open the NCCL library ", request.library_path), errno);
  const auto close_library = [&](absl::Status status) {
    close(library_fd);
    return status;
  };
  struct stat library {};
  if (fstat(library_fd, &library) != 0) {
    return close_library(FileError(absl::StrCat("cannot examine ", request.library_path), errno));
  }
  if (!S_ISREG(library.st_mode)) {
    return close_library(
        absl::InvalidArgumentError(absl::StrCat(request.library_path, " is not a regular file")));
  }
  const auto size = static_cast<std::uint64_t>(library.st_size);
  const std::string name = PrivateCopyName(
      log::HostName(), library.st_dev, library.st_ino, library.st_size,
      static_cast<std::int64_t>(library.st_mtim.tv_sec) * 1'000'000'000 + library.st_mtim.tv_nsec);
  CopyLease lease;
  absl::StatusOr<int> directory_fd =
      OpenPrivateDirectory(request.directory, /*create=*/true, request.levels_below_job_directory);
  if (!directory_fd.ok()) return close_library(directory_fd.status());
  lease.directory_fd = *directory_fd;
  if (absl::Status executable = CheckExecutable(lease.directory_fd, request.directory); !executable.ok()) {
    return close_library(executable);
  }
  const bool directory_locked = LockUntil(lease.directory_fd, LOCK_EX, request.deadline);
  if (!directory_locked && errno == EWOULDBLOCK) {
    return close_library(absl::DeadlineExceededError(
        absl::StrCat("another process kept ", request.directory, " locked while copying NCCL")));
  }
  absl::Status status = absl::OkStatus();
  for (int attempt = 0; status.ok() && lease.copy_fd < 0 && attempt < kMaxCopyAttempts; ++attempt) {
    absl::StatusOr<std::optional<int>> copy = OpenLockedCopy(lease.directory_fd, name, size, request);
    if (!copy.ok()) {
      status = copy.status();
      continue;
    }
    lease.copy_fd = copy->value_or(-1);
    if (lease.copy_fd < 0) status = CreateCopy(library_fd, size, lease.directory_fd, name, request);
  }
  if (directory_locked) flock(lease.directory_fd, LOCK_UN);
  close(library_fd);
  if (!status.ok()) return status;
  if (lease.copy_fd < 0) {
    return absl::UnavailableError(absl::StrCat("the copy ", request.directory, "/", name,
                                               " kept disappearing while other processes removed it"));
  }
  struct stat copy {};
  if (fstat(lease.copy_fd, &copy) == 0 && SameFile(copy, library)) {
    return absl::FailedPreconditionError(absl::StrCat(
        request.directory, "/", name, " is ", request.library_path, " itself (a hard link), not a copy"));
  }
  lease.path = absl::StrCat(request.directory, "/", name);
  return lease;
}

const link_map* LinkMapOf(const void* address) {
  Dl_info info;
  link_map* map = nullptr;
  if (address == nullptr || dladdr1(address, &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) == 0) {
    return nullptr;
  }
  return map;
}

// Gives up `lease`: the copy is removed when no other process holds its shared lock and it is
// still the file of its name.
void ReleaseLease(CopyLease& lease) {
  if (flock(lease.copy_fd, LOCK_EX | LOCK_NB) == 0) {
    struct stat held {};
    struct stat named {};
    const std::string name = lease.path.substr(lease.path.rfind('/') + 1);
    if (fstat(lease.copy_fd, &held) == 0 &&
        fstatat(lease.directory_fd, name.c_str(), &named, AT_SYMLINK_NOFOLLOW) == 0 &&
        SameFile(held, named)) {
      unlinkat(lease.directory_fd, name.c_str(), 0);
    }
  }
}

// Saves an environment variable's state and puts it back in the destructor.
class SavedVariable {
 public:
  explicit SavedVariable(const char* name) : name_(name) {
    if (const char* value = getenv(name)) value_ = value;
  }
  ~SavedVariable() {
    const char* now = getenv(name_);
    if (value_.has_value()) {
      if (now == nullptr || *value_ != now) setenv(name_, value_->c_str(), 1);
    } else if (now != nullptr) {
      unsetenv(name_);
    }
  }
  SavedVariable(const SavedVariable&) = delete;
  SavedVariable& operator=(const SavedVariable&) = delete;

 private:
  const char* name_;
  std::optional<std::string> value_;
};

}  // namespace

std::string PrivateCopyName(const std::string& host, dev_t device, ino_t inode, std::int64_t size,
                            std::int64_t modified_ns) {
  // Stable across processes and hosts, unlike std::hash. (An empty host becomes "unknown" below.)
  std::uint64_t hash = kFnv1aOffsetBasis;
  for (const std::uint64_t value :
       {static_cast<std::uint64_t>(device), static_cast<std::uint64_t>(inode),
        static_cast<std::uint64_t>(size), static_cast<std::uint64_t>(modified_ns)}) {
    hash = Fnv1a(&value, sizeof(value), hash);
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash));
  return absl::StrCat("libnccl-", SafeFileName(host), "-", hex, ".so.2");
}

namespace detail {

absl::Status CopyFileContents(int from_fd, int to_fd, std::uint64_t size, Clock::time_point deadline) {
  std::vector<char> buffer;  // only when the kernel cannot copy between these files
  std::uint64_t copied = 0;
  off_t from_offset = 0;
  while (copied < size) {
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("copying took too long (", copied, " of ", size, " bytes)"));
    }
    const std::size_t chunk =
        static_cast<std::size_t>(std::min<std::uint64_t>(size - copied, kCopyChunkBytes));
    ssize_t n = -1;
    if (buffer.empty()) {
      n = copy_file_range(from_fd, &from_offset, to_fd, nullptr, chunk, 0);
      if (n < 0 && (errno == EXDEV || errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP)) {
        buffer.resize(kBufferedChunkBytes);
        if (lseek(from_fd, from_offset, SEEK_SET) < 0) return FileError("lseek", errno);
        continue;
      }
    } else {
      n = read(from_fd, buffer.data(), std::min(chunk, buffer.size()));
      for (ssize_t written = 0; n > 0 && written < n;) {
        const ssize_t w = write(to_fd, buffer.data() + written, static_cast<std::size_t>(n - written));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return FileError("write", errno);
        written += w;
      }
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return FileError(buffer.empty() ? "copy_file_range" : "read", errno);
    if (n == 0)
      return absl::DataLossError(absl::StrCat("the library ended after ", copied, " of ", size, " bytes"));
    copied += static_cast<std::uint64_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace detail

ncclResult_t RunWithP2pDisabled(absl::FunctionRef<ncclResult_t()> create) noexcept {
  try {
    // The window in which the process's environment is not the user's. Another thread that
    // calls getenv() meanwhile (NCCL's own threads, the application's) may see NCCL_P2P_DISABLE=1,
    // and glibc's setenv()/unsetenv() are not safe against a concurrent getenv() (the array of
    // variables is rewritten in place or reallocated): so the window is one init long, and only
    // the two variables NCCL caches change. A thread that sets them itself meanwhile loses its
    // value to the restore.
    MutexLock lock(g_environment_mutex);
    const SavedVariable saved_disable("NCCL_P2P_DISABLE");
    const SavedVariable saved_level("NCCL_P2P_LEVEL");
    if (setenv("NCCL_P2P_DISABLE", "1", 1) != 0 || unsetenv("NCCL_P2P_LEVEL") != 0) {
      log::Warn("cannot turn P2P off for NCCL's private instance: setenv failed ({})", std::strerror(errno));
      return ncclSystemError;
    }
    try {
      return create();
    } catch (...) {
      return ncclInternalError;
    }
  } catch (...) {
    return ncclInternalError;
  }
}

ncclResult_t PrivateNcclInstance::WithP2pDisabled(absl::FunctionRef<ncclResult_t()> create) noexcept {
  return RunWithP2pDisabled(create);
}

absl::StatusOr<std::unique_ptr<PrivateNcclInstance>> PrivateNcclInstance::Load(
    const std::string& library_path, const std::string& copies_directory, int levels_below_job_directory,
    std::chrono::milliseconds deadline) noexcept {
  try {
    if (library_path.empty()) {
      return absl::FailedPreconditionError(
          "the path of the NCCL library in use is not known: nothing to copy");
    }
    CopyRequest request{library_path, copies_directory, levels_below_job_directory, Clock::now() + deadline};
    // The work keeps to the deadline between chunks and between looks at a lock; the margin covers
    // a call that hangs, and is small: the caller's deadline is the recovery meeting's.
    absl::StatusOr<CopyLease> lease =
        RunWithDeadline<CopyLease>([request] { return AcquireCopy(request); }, deadline + kHungCallMargin);
    if (!lease.ok()) {
      return absl::Status(lease.status().code(), absl::StrCat("no private copy of NCCL in ", copies_directory,
                                                              ": ", lease.status().message()));
    }
    std::unique_ptr<PrivateNcclInstance> instance(new PrivateNcclInstance);
    instance->library_path_ = library_path;
    instance->copy_path_ = lease->path;
    {
      MutexLock lock(instance->mutex_);
      instance->copy_fd_ = std::exchange(lease->copy_fd, -1);
      instance->directory_fd_ = std::exchange(lease->directory_fd, -1);
      instance->loaded_by_ = getpid();
    }
    if (absl::Status loaded = instance->Open(); !loaded.ok()) return loaded;  // ~instance releases
    return instance;
  } catch (const std::exception& error) {
    return absl::InternalError(absl::StrCat("no private copy of NCCL: ", error.what()));
  } catch (...) {
    return absl::InternalError("no private copy of NCCL: unknown error");
  }
}

absl::Status PrivateNcclInstance::Open() {
  // ncclguard does not interpose dlopen(): this is glibc's. RTLD_LOCAL keeps the copy's symbols out
  // of the process's global scope: no lookup by name from the application finds the private one.
  handle_ = dlopen(copy_path_.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(
        absl::StrCat("the private copy ", copy_path_, " of ", library_path_,
                     " cannot be loaded: ", why != nullptr ? why : "unknown error"));
  }
  const link_map* own = nullptr;
  if (dlinfo(handle_, RTLD_DI_LINKMAP, static_cast<void*>(&own)) != 0) own = nullptr;
  // Lookups through glibc's dlsym(): ncclguard's own would hand out its wrappers for an NCCL
  // library's handle. A function that resolves to another object (a dependency) is not the copy's.
  for (int i = 0; i < kApiCount; ++i) {
    const std::string name(kApis[i].name);
    void* function = Real().Symbol(handle_, name.c_str());
    functions_[i] = function != nullptr && LinkMapOf(function) == own ? function : nullptr;
  }
  using GetVersion = ncclResult_t (*)(int*);
  const auto get_version = reinterpret_cast<GetVersion>(Function(Api::ncclGetVersion));
  if (own == nullptr || get_version == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the private copy ", copy_path_, " of ", library_path_,
                     " is not an NCCL library: it does not define ncclGetVersion"));
  }
  if (get_version(&version_) != ncclSuccess) version_ = 0;
  return absl::OkStatus();
}

PrivateNcclInstance::~PrivateNcclInstance() { Release(); }

void* PrivateNcclInstance::Function(Api api) const noexcept { return functions_[static_cast<int>(api)]; }

absl::StatusOr<void*> PrivateNcclInstance::RequiredFunction(Api api) const {
  if (void* function = Function(api)) return function;
  return absl::UnimplementedError(absl::StrCat("the private copy ", copy_path_, " of ", library_path_,
                                               " (NCCL ", version_, ") does not define ",
                                               std::string(Describe(api).name)));
}

void PrivateNcclInstance::Release() noexcept {
  try {
    auto lease = std::make_shared<CopyLease>();
    {
      MutexLock lock(mutex_);
      if (copy_fd_ < 0) return;
      lease->copy_fd = std::exchange(copy_fd_, -1);
      lease->directory_fd = std::exchange(directory_fd_, -1);
      lease->path = copy_path_;
      // flock() locks belong to the open file, which a forked child shares with its parent: the
      // child's lock request would change the parent's lock.
      if (getpid() != loaded_by_) return;  // the lease closes the child's descriptors only
    }
    // The lease closes with the work, whenever a hung file system lets it finish.
    RunWithDeadline<bool>(
        [lease] {
          ReleaseLease(*lease);
          return absl::StatusOr<bool>(true);
        },
        kReleaseDeadline)
        .IgnoreError();
  } catch (...) {
  }
}

}  // namespace ncclguard
