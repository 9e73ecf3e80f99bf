// The hidden temporary files a write leaves beside the file it writes (WriteFileAtomically,
// InPlaceFile, PublishFileOnce in files.h): named after the file, the writer's host and process,
// so that a file's temporaries whose writer was killed can be told from those of a write in
// progress. Nobody reads them (every reader skips hidden files). A process of a job never lists
// the job directory to find them: a job of N processes would read N² directory entries from a
// shared file system as it starts. The tools that read a whole job directory anyway (`ncclguard
// analyze`, and `ncclguard run` after each attempt) remove them.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ncclguard {

// .tmp-<name>~<host>~<pid>~<n>: `host` as SafeFileName writes it (never a '~'), `n` this process's
// count of its temporaries. The writer's host and pid come last, so that any `name` parses.
std::string TemporaryName(const std::string& name, absl::string_view host, int pid, std::uint64_t n);

struct TemporaryWriter {
  std::string host;
  int pid = 0;
};
// The writer a temporary's name gives; nullopt for a name that is not a temporary of this format
// (an earlier build's .tmp-<name>.<pid>.<n> names no host).
std::optional<TemporaryWriter> ParseTemporaryName(absl::string_view name);

// A temporary is abandoned when its writer, named on this host, is gone, or when it has not been
// written for kAbandonedTemporaryAge (a write takes milliseconds; one that hangs longer than
// that has failed long since, and a rename after its temporary was removed fails cleanly).
inline constexpr std::chrono::minutes kAbandonedTemporaryAge{15};

struct TemporaryCleanup {
  int removed = 0;
  int kept = 0;  // temporaries of writers that may still be writing
};

// Removes the abandoned temporaries of the job directory `job_dir` and of its subdirectories,
// two levels down (the dump requests, the recovery's meetings). Only regular files of this user
// named .tmp-*; a symbolic link or a directory that is not this user's is neither followed nor
// touched. Bounded in entries and by `deadline`.
absl::StatusOr<TemporaryCleanup> RemoveAbandonedTemporaries(const std::string& job_dir,
                                                            std::chrono::milliseconds deadline) noexcept;

}  // namespace ncclguard
