// The one way ncclguard reads and writes files: privately, atomically, never through a symbolic
// link it did not expect, never blocking on a FIFO or a device, never for longer than a deadline.
// Every file in a job directory may have been written by a stranger or cut off by a crash.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "watchdog/common/bounded_threads.h"

namespace ncclguard {

// How long a write into the job directory may take before the caller gives up on it (a shared
// file system whose server went away blocks I/O indefinitely).
inline constexpr std::chrono::milliseconds kWriteDeadline{10'000};

// Writes `content` as directory/name: a temporary file in the same directory (O_EXCL,
// O_NOFOLLOW, mode 0600), fsync()ed when `durable`, then renamed over `name`. `directory` is the
// job directory or lies `levels_below_job_directory` levels below it; see OpenPrivateDirectory
// for which levels must be real directories of this user. Bounded by kWriteDeadline. The first
// failure in the process is logged.
absl::StatusOr<std::string> WriteFileAtomically(const std::string& directory, const std::string& name,
                                                const std::string& content, bool durable,
                                                int levels_below_job_directory = 0) noexcept;

// How many in-place writes (InPlaceFile) or polled reads (PolledFile) go by between two looks at
// the file itself: the only metadata operations they cost a shared file system.
inline constexpr int kInPlaceChecks = 15;

// A file one process rewrites often (its status file). Created as WriteFileAtomically creates a
// file and kept open; then rewritten in place, one pwrite() at offset 0, which costs the file
// system no metadata operation (no create, no rename, no stat). The file only grows: `content`
// is padded with spaces to the file's size, so the caller's format must allow trailing spaces
// (JSON does), and a reader may see a rewrite half done, or cut off by a crash: the caller's format
// must let it tell (a checksum). Created anew when the content outgrows it, after a failed write,
// in a forked child, and when a look every kInPlaceChecks writes finds it gone from the directory.
// On NFS each rewrite is flushed (fdatasync), as a close would. Thread-safe; each write is bounded
// by kWriteDeadline, and one still hanging makes the next fail at once.
class InPlaceFile {
 public:
  InPlaceFile(std::string directory, std::string name);
  absl::StatusOr<std::string> Write(const std::string& content) noexcept;  // the file's path

  struct State;

 private:
  std::string directory_;
  std::string name_;
  std::shared_ptr<State> state_;
};

// Writes `content`, padded with spaces to `size` bytes (at least), into directory/name in place:
// created 0600 when missing, never through a symbolic link, only a regular file of this user. For
// a small file that other processes keep open and poll (PolledFile), which a rename would take
// away from them. Bounded by kWriteDeadline.
absl::Status OverwriteInPlace(const std::string& directory, const std::string& name,
                              const std::string& content, std::size_t size,
                              int levels_below_job_directory) noexcept;

// A small file a process reads every status interval (the dump requests' generation): kept open
// and read with pread(), which costs the file system no metadata operation. Opened again every
// kInPlaceChecks reads, and after a failure, so that a file replaced meanwhile, or a client cache
// that would not show a change, is not trusted for longer. Created empty (with its directory)
// when missing, so that it can be kept open. Not bounded: the caller runs it with a deadline.
// One thread at a time: a read while another still hangs fails at once.
class PolledFile {
 public:
  PolledFile(std::string directory, std::string name, std::size_t max_bytes, int levels_below_job_directory);
  absl::StatusOr<std::string> ReadNow() noexcept;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

// Writes `content` as directory/name unless that name exists already: of several writers, in this
// process or on other hosts of a shared file system, exactly one wins; the others get
// AlreadyExists and find the winner's file there (or whatever else took the name first). A
// temporary file written as WriteFileAtomically writes it is hard-linked to `name`, as link()
// never replaces a file, NFS included (which has no rename without replacing). Not fsync()ed: for
// files that matter only while the job runs. Bounded by `deadline`; failures are not logged.
absl::Status PublishFileOnce(const std::string& directory, const std::string& name,
                             const std::string& content, int levels_below_job_directory,
                             std::chrono::milliseconds deadline) noexcept;

// Opens `path` (NCCLGUARD_LOG_FILE) for appending the way ncclguard writes every file: missing
// parent directories are created 0700 and the file 0600, a symbolic link is not followed, the
// open never blocks (a FIFO), and only a regular file of this user is accepted. Returns the
// descriptor (the caller closes).
absl::StatusOr<int> OpenFileForAppending(const std::string& path);

// How long reading one file named by the user, or a whole job directory, may take (a shared
// file system whose server went away blocks I/O indefinitely).
inline constexpr std::chrono::milliseconds kReadDeadline{10'000};

// Reads `name` in the directory open as `directory_fd`, the one way ncclguard reads a job
// directory's files: never blocks on the open (a FIFO or a device is refused, not waited for),
// never follows a symbolic link, reads only a regular file owned by this user, by root or by the
// directory's owner, and refuses one larger than `max_bytes` before reading it.
absl::StatusOr<std::string> ReadFileAt(int directory_fd, const std::string& name, std::size_t max_bytes);

// Reads `path` in the process's own job directory with ReadFileAt's rules (a regular file of this
// user or root, no symbolic link, no blocking, `max_bytes` at most) in a single open(): for the
// file polled every status interval.
absl::StatusOr<std::string> ReadOwnFile(const std::string& path, std::size_t max_bytes);

// Reads a file the user named (NCCLGUARD_KNOWN_BAD_FILE): a symbolic link the user made is
// followed and any owner is accepted, but only a regular file of at most `max_bytes` is read,
// and the open never blocks.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, std::size_t max_bytes);

// Names in the directory open as `directory_fd` that start with `prefix` and end with `suffix`,
// sorted. Hidden temporary files never match.
absl::StatusOr<std::vector<std::string>> ListNamesAt(int directory_fd, const std::string& prefix,
                                                     const std::string& suffix);

// Opens `directory` (absolute), the job directory or a directory `levels_below_job_directory`
// levels below it, for *at() calls. ncclguard's own levels, that is the job directory, those
// below it and the default dump directory ncclguard-<uid> above it, are opened one by one
// without following a symbolic link and must belong to this user; the levels above are the
// user's and are followed as given. Missing directories are created 0700 when `create`. Returns
// the descriptor (the caller closes).
absl::StatusOr<int> OpenPrivateDirectory(const std::string& directory, bool create,
                                         int levels_below_job_directory = 0);

// `text` reduced to [A-Za-z0-9._-] (others become '_'), no leading '.', at most 100 characters;
// "unknown" when empty.
std::string SafeFileName(const std::string& text);

// Logs the first failure to write into the job directory in this process; later ones are not.
void LogFirstWriteFailure(const std::string& message);

}  // namespace ncclguard
