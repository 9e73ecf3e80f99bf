// A second, private instance of the NCCL library in use, whose first communicator is created with
// P2P turned off. NCCL reads NCCL_P2P_DISABLE and NCCL_P2P_LEVEL once per library instance, into a
// static (src/graph/paths.cc in NCCL), so a process whose communicators already exist can get P2P
// off only in an instance that has not initialised yet. glibc loads a second instance only of a
// different file (a hard or symbolic link is the same object to it), and dlmopen() would give that
// instance a libcuda of its own that does not see the application's memory: so the instance is a
// copy of the library file, made once per node and library build in a directory of the job,
// shared by the node's processes, and removed by the last of them.
#pragma once

#include <sys/types.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "watchdog/common/mutex.h"
#include "watchdog/common/nccl_api.h"

namespace ncclguard {

// The directory of the copies, below the job directory (OpenPrivateDirectory's levels).
inline constexpr char kPrivateInstancesDirectory[] = "nccl-instances";
// How long making (or finding) the copy may take when the caller names no deadline: a real
// libnccl is about 300 MB, and a shared file system that stops answering must not hold the
// recovery for ever. In-process recovery passes what is left of its meeting's deadline instead.
inline constexpr std::chrono::milliseconds kPrivateCopyDeadline{60'000};

class PrivateNcclInstance {
 public:
  // Copies `library_path` (the NCCL library in use, e.g. Real().Path(slot); symbolic links are
  // followed) into `copies_directory` as PrivateCopyName() unless a complete copy is there, and
  // loads the copy. `copies_directory` lies `levels_below_job_directory` levels below the job
  // directory (OpenPrivateDirectory; <job dir>/nccl-instances is 1) and is created 0700. Finding or
  // making the copy takes `deadline` at most. Each failure is a Status that says what and where;
  // nothing throws. Two loads of the same copy in one process share one loaded instance (glibc
  // loads a file once). The file work runs on one of the private-file layer's bounded threads
  // (RunWithDeadline).
  static absl::StatusOr<std::unique_ptr<PrivateNcclInstance>> Load(
      const std::string& library_path, const std::string& copies_directory,
      int levels_below_job_directory = 1, std::chrono::milliseconds deadline = kPrivateCopyDeadline) noexcept;

  // Releases the copy (see Release). Never unloads the instance: its threads and communicators
  // may outlive this object.
  ~PrivateNcclInstance();
  PrivateNcclInstance(const PrivateNcclInstance&) = delete;
  PrivateNcclInstance& operator=(const PrivateNcclInstance&) = delete;

  // The private instance's own function for `api` (glibc's lookup, never ncclguard's dlsym());
  // nullptr when the library lacks it (an older NCCL). Calls go straight to the instance: a
  // function the library calls through its own exported names (ncclBcast calls ncclBroadcast,
  // and real NCCL 2.28 calls ncclGetUniqueId, ncclCommGetAsyncError, ncclMemAlloc, ... that way)
  // binds to the first definition in the process's global scope, not to the copy.
  void* Function(Api api) const noexcept;
  // Function(api), or a Status naming the function and the copy when the library lacks it.
  absl::StatusOr<void*> RequiredFunction(Api api) const;

  const std::string& CopyPath() const noexcept { return copy_path_; }
  const std::string& LibraryPath() const noexcept { return library_path_; }
  int Version() const noexcept { return version_; }  // ncclGetVersion's answer
  void* Handle() const noexcept { return handle_; }  // dlopen()'s handle of the copy

  // Runs `create`, the instance's first communicator creation, with P2P turned off for it; see
  // RunWithP2pDisabled.
  static ncclResult_t WithP2pDisabled(absl::FunctionRef<ncclResult_t()> create) noexcept;

  // Gives up this process's use of the copy's file: the shared lock goes, and the copy is
  // removed when no other process holds it (then a later process makes it again). The loaded
  // instance stays usable: its mapping does not need the file. Idempotent; safe from an atexit
  // hook; bounded in time on a file system that stops answering. In a child forked after Load, it
  // only closes the child's descriptors: the lock belongs to the open file the parent shares.
  void Release() noexcept;

 private:
  PrivateNcclInstance() = default;
  // Loads the copy at copy_path_ and finds its functions.
  absl::Status Open();

  Mutex mutex_;
  int copy_fd_ ABSL_GUARDED_BY(mutex_) = -1;       // read-only, holding a shared flock
  int directory_fd_ ABSL_GUARDED_BY(mutex_) = -1;  // the copies' directory
  pid_t loaded_by_ ABSL_GUARDED_BY(mutex_) = -1;   // the process whose lock copy_fd_ holds
  // Written by Load before the object is handed out, read-only afterwards.
  std::string library_path_;
  std::string copy_path_;
  std::string copy_name_;
  void* handle_ = nullptr;
  int version_ = 0;
  std::array<void*, kApiCount> functions_{};
};

// Runs `create` with NCCL_P2P_DISABLE=1 and NCCL_P2P_LEVEL unset in the environment, then
// restores both exactly as they were (set to the same value, or unset). Calls are serialised. For
// the setting to reach NCCL, `create` must return only once the communicator is created: for a
// non-blocking one, after polling ncclCommGetAsyncError past ncclInProgress; for ranks created in
// a group, after the outermost ncclGroupEnd. Returns what `create` returns; ncclSystemError
// without calling it when the environment cannot be changed; ncclInternalError if it throws.
ncclResult_t RunWithP2pDisabled(absl::FunctionRef<ncclResult_t()> create) noexcept;

// "libnccl-<host>-<16 hex digits>.so.2": the copy of one library build (the file's device, inode,
// size and modification time) on one host, whose name is made safe for a file name.
std::string PrivateCopyName(const std::string& host, dev_t device, ino_t inode, std::int64_t size,
                            std::int64_t modified_ns);

namespace detail {
// Copies `size` bytes from `from_fd` to `to_fd` in chunks (a file of hundreds of MB is never held
// in memory). DeadlineExceeded when `deadline` passes with bytes still to copy.
absl::Status CopyFileContents(int from_fd, int to_fd, std::uint64_t size,
                              std::chrono::steady_clock::time_point deadline);
}  // namespace detail

}  // namespace ncclguard
