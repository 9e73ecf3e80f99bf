// Liveness of a job's processes: see liveness.h.
#include "watchdog/report/liveness.h"

#include <signal.h>

#include <cerrno>
#include <cstddef>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "watchdog/report/job_read.h"

namespace ncclguard {
namespace {

// The state letter of /proc/<pid>/stat ('?': unreadable). A zombie (Z, X) has ended, though kill()
// finds it until its parent reaps it (for long where the pid namespace's init does not reap, as in
// some containers). A stopped process (T, or t under a debugger) exists but does not run.
char ProcessStateLetter(int pid) {
  std::ifstream file(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  if (!std::getline(file, stat)) return '?';
  // "pid (comm) S ...": the command may hold spaces and parentheses, the state follows the last ')'.
  const std::size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
}

}  // namespace

ProcessView::Liveness CheckLiveness(const std::string& host, int pid, const std::string& own_host) {
  if (own_host.empty() || host != own_host || pid <= 0) return ProcessView::Liveness::kUnknown;
  if (kill(pid, 0) == 0 || errno == EPERM) {
    const char state = ProcessStateLetter(pid);
    if (state == 'Z' || state == 'X') return ProcessView::Liveness::kGone;
    return state == 'T' || state == 't' ? ProcessView::Liveness::kStopped : ProcessView::Liveness::kAlive;
  }
  return errno == ESRCH ? ProcessView::Liveness::kGone : ProcessView::Liveness::kUnknown;
}

}  // namespace ncclguard
