// The private-file layer: the private directories and the checks its parts share; writing is in
// file_writes.cc, reading in file_reads.cc. See files.h.
#include "watchdog/common/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "watchdog/common/files_internal.h"

namespace ncclguard {
namespace files_internal {

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

void Forget(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

}  // namespace files_internal

namespace {

using files_internal::CreateDirectories;
using files_internal::ErrnoError;

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

}  // namespace

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

}  // namespace ncclguard
