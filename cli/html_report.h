// analyze --html: the verdicts as one self-contained page (no network, no external file) that an
// on-call engineer opens in a browser and shares. The verdict first, in one sentence; a picture of
// every rank's state at the stuck operation, legible from 8 to 100,000 ranks (a canvas drawn from
// one letter per rank, and the same states as rank lists for a page read without scripts); the
// late ranks' stacks; each verdict's evidence (the stopped link among it); the ranks' last
// operations.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/job_read.h"

namespace ncclguard {

std::string HtmlReport(const JobView& job, const std::vector<Verdict>& verdicts);

absl::Status WriteHtmlReport(const std::string& path, const JobView& job,
                             const std::vector<Verdict>& verdicts);

}  // namespace ncclguard
