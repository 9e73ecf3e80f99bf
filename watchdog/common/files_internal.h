// What the private-file layer's parts share (files.cc, file_writes.cc, file_reads.cc); not for use
// outside common/.
#pragma once

#include <algorithm>
#include <string>

#include "absl/status/status.h"

namespace ncclguard::files_internal {

absl::Status ErrnoError(const std::string& what, int error);

// Creates every missing directory of the absolute `directory`, 0700.
absl::Status CreateDirectories(const std::string& directory);

// A regular file of this user, open as `fd` (`path` for messages).
absl::Status CheckOwnRegularFile(int fd, const std::string& path);

// Closes `fd` when open and marks it closed.
void Forget(int& fd);

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

}  // namespace ncclguard::files_internal
