#include "watchdog/common/temporaries.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "watchdog/common/files.h"
#include "watchdog/common/log.h"

namespace ncclguard {
namespace {

constexpr char kTemporaryPrefix[] = ".tmp-";
constexpr char kSeparator = '~';
// Of a longer host name, the start: a temporary's name must stay within NAME_MAX (255).
constexpr std::size_t kMaxHostChars = 64;
// The job directory and two levels below it (recovery/<meeting>/).
constexpr int kLevelsBelow = 2;
// Entries looked at in all: a job directory of 131,072 ranks holds about twice as many.
constexpr std::size_t kMaxEntries = std::size_t{1} << 21;

struct Sweep {
  std::string own_host;
  std::time_t now = 0;
  std::size_t entries = 0;
  TemporaryCleanup cleanup;
};

bool WriterGone(const TemporaryWriter& writer, const std::string& own_host) {
  return writer.host == own_host && writer.pid > 0 && kill(writer.pid, 0) != 0 && errno == ESRCH;
}

// The temporary `name` of the directory open as `directory_fd`, removed when abandoned.
void ConsiderTemporary(int directory_fd, const char* name, Sweep& sweep) {
  struct stat file {};
  if (fstatat(directory_fd, name, &file, AT_SYMLINK_NOFOLLOW) != 0) return;
  if (!S_ISREG(file.st_mode) || file.st_uid != geteuid()) return;  // not ours to judge
  const std::optional<TemporaryWriter> writer = ParseTemporaryName(name);
  const bool old = sweep.now - file.st_mtim.tv_sec >=
                   std::chrono::duration_cast<std::chrono::seconds>(kAbandonedTemporaryAge).count();
  if (old || (writer && WriterGone(*writer, sweep.own_host))) {
    if (unlinkat(directory_fd, name, 0) == 0) ++sweep.cleanup.removed;
  } else {
    ++sweep.cleanup.kept;
  }
}

// Opens the subdirectory `name` of `directory_fd` when it is a real directory of this user.
int OpenOwnSubdirectory(int directory_fd, const char* name) {
  const int fd = openat(directory_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat directory {};
  if (fstat(fd, &directory) != 0 || directory.st_uid != geteuid()) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sweeps the directory open as `directory_fd` (closed here), and its subdirectories down to
// `levels_below` more levels.
void SweepDirectory(int directory_fd, int levels_below, Sweep& sweep) {
  DIR* listing = fdopendir(directory_fd);
  if (listing == nullptr) {
    close(directory_fd);
    return;
  }
  std::vector<std::string> subdirectories;
  while (const dirent* entry = readdir(listing)) {
    if (++sweep.entries > kMaxEntries) break;
    const absl::string_view name = entry->d_name;
    if (absl::StartsWith(name, kTemporaryPrefix)) {
      ConsiderTemporary(dirfd(listing), entry->d_name, sweep);
    } else if (levels_below > 0 && !absl::StartsWith(name, ".") &&
               (entry->d_type == DT_DIR || entry->d_type == DT_UNKNOWN)) {
      subdirectories.emplace_back(name);
    }
  }
  for (const std::string& name : subdirectories) {
    const int fd = OpenOwnSubdirectory(dirfd(listing), name.c_str());
    if (fd >= 0) SweepDirectory(fd, levels_below - 1, sweep);
  }
  closedir(listing);
}

}  // namespace

std::string TemporaryName(const std::string& name, absl::string_view host, int pid, std::uint64_t n) {
  return absl::StrCat(kTemporaryPrefix, name, std::string(1, kSeparator), host.substr(0, kMaxHostChars),
                      std::string(1, kSeparator), pid, std::string(1, kSeparator), n);
}

std::optional<TemporaryWriter> ParseTemporaryName(absl::string_view name) {
  if (!absl::StartsWith(name, kTemporaryPrefix)) return std::nullopt;
  name.remove_prefix(std::strlen(kTemporaryPrefix));
  // From the right: <n>, <pid>, <host>; whatever precedes is the file's name.
  absl::string_view fields[3];
  for (absl::string_view& field : fields) {
    const std::size_t separator = name.rfind(kSeparator);
    if (separator == absl::string_view::npos) return std::nullopt;
    field = name.substr(separator + 1);
    name = name.substr(0, separator);
  }
  std::uint64_t n = 0;
  TemporaryWriter writer;
  if (!absl::SimpleAtoi(fields[0], &n) || !absl::SimpleAtoi(fields[1], &writer.pid) || writer.pid <= 0 ||
      fields[2].empty()) {
    return std::nullopt;
  }
  writer.host = std::string(fields[2]);
  return writer;
}

absl::StatusOr<TemporaryCleanup> RemoveAbandonedTemporaries(const std::string& job_dir,
                                                            std::chrono::milliseconds deadline) noexcept {
  try {
    const std::string own_host = SafeFileName(log::HostName()).substr(0, kMaxHostChars);
    return RunWithDeadline<TemporaryCleanup>(
        [job_dir, own_host]() -> absl::StatusOr<TemporaryCleanup> {
          absl::StatusOr<int> directory_fd = OpenPrivateDirectory(job_dir, /*create=*/false);
          if (!directory_fd.ok()) return directory_fd.status();
          Sweep sweep;
          sweep.own_host = own_host;
          sweep.now = std::time(nullptr);
          SweepDirectory(*directory_fd, kLevelsBelow, sweep);
          return sweep.cleanup;
        },
        deadline);
  } catch (...) {
    return absl::ResourceExhaustedError("cannot look for abandoned temporary files (out of memory)");
  }
}

}  // namespace ncclguard
