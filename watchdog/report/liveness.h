// Whether a process of the job still exists, as this host can tell.
#pragma once

#include <string>

#include "watchdog/report/job_read.h"

namespace ncclguard {

// kill(pid, 0) and /proc/<pid>/stat for a process of this host (`own_host`); kUnknown for one of
// another host, whose status file's age then decides.
ProcessView::Liveness CheckLiveness(const std::string& host, int pid, const std::string& own_host);

}  // namespace ncclguard
