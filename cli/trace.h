// The job's timeline as a Chrome trace event document (the JSON format that ui.perfetto.dev and
// chrome://tracing load): a process track per rank, a thread per communicator, a slice per
// recorded operation, with stuck and failed operations marked.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "watchdog/diagnose/verdicts.h"

namespace ncclguard {

nlohmann::json ChromeTrace(const JobView& job, const std::vector<Verdict>& verdicts);

absl::Status WriteChromeTrace(const std::string& path, const JobView& job,
                              const std::vector<Verdict>& verdicts);

}  // namespace ncclguard
