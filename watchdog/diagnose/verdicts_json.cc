// The verdicts at the edge: their kinds' names, and what `ncclguard analyze --json` prints
// (docs/verdicts.md).
#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "watchdog/common/clock.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/job_read.h"

namespace ncclguard {
namespace {

using Json = nlohmann::json;

constexpr std::array<std::string_view, static_cast<size_t>(VerdictKind::kUnknown) + 1> kKindNames{
    "async_error",     "p2p_suspect",  "stuck_in_init",     "rank_dead",   "mismatch",
    "rank_not_joined", "link_stalled", "stuck_inside_nccl", "failed_call", "unexplained",
    "straggler",       "slow_link",    "slow_rank",         "healthy",     "unknown"};

const char* LivenessName(ProcessView::Liveness liveness) {
  switch (liveness) {
    case ProcessView::Liveness::kAlive:
      return "alive";
    case ProcessView::Liveness::kGone:
      return "gone";
    case ProcessView::Liveness::kStopped:
      return "stopped";
    case ProcessView::Liveness::kUnknown:
      return "unknown";
  }
  return "unknown";
}

}  // namespace

std::string_view VerdictKindName(VerdictKind kind) { return kKindNames[static_cast<size_t>(kind)]; }

std::optional<VerdictKind> ParseVerdictKind(std::string_view name) {
  const auto found = std::find(kKindNames.begin(), kKindNames.end(), name);
  if (found == kKindNames.end()) return std::nullopt;
  return static_cast<VerdictKind>(found - kKindNames.begin());
}

nlohmann::json VerdictsToJson(const JobView& job, const std::vector<Verdict>& verdicts) {
  const NotRead& not_read = job.not_read;
  // Every verdict rests on what was read: the whole job (null), or part of it.
  Json partial_read = nullptr;
  if (not_read.files > 0 || not_read.listing_cut_short) {
    partial_read = Json{{"processes_read", job.processes.size()},
                        {"processes_not_read", not_read.processes},
                        {"files_not_read", not_read.files},
                        {"listing_cut_short", not_read.listing_cut_short}};
  }
  Json list = Json::array();
  for (const Verdict& verdict : verdicts) {
    list.push_back(Json{{"kind", VerdictKindName(verdict.kind)},
                        {"comm", verdict.comm},
                        {"seq", verdict.seq},
                        {"ranks", verdict.ranks},
                        {"message", verdict.message},
                        {"evidence", verdict.evidence},
                        {"partial_read", partial_read}});
  }
  Json processes = Json::array();
  for (const ProcessView& process : job.processes) {
    processes.push_back(Json{{"host", process.host},
                             {"pid", process.pid},
                             {"rank", process.snapshot.rank},
                             {"liveness", LivenessName(process.liveness)},
                             {"exited", process.exited},
                             {"closed_nccl", process.closed_nccl},
                             {"last_seen_ns", process.last_seen_ns},
                             {"in_nccl_call", process.snapshot.in_nccl_call},
                             {"status_file", process.status_file},
                             {"dump_file", process.dump_file},
                             {"dump_reason", process.dump_reason}});
  }
  Json job_end = nullptr;
  if (const std::optional<JobEnd> end = EndedTogether(job)) {
    job_end = Json{{"processes", end->processes},
                   {"within_seconds", end->within_seconds},
                   {"ended_ns", end->ended_ns},
                   {"time", IsoTime(end->ended_ns)},
                   {"killed_from_outside", end->killed_from_outside},
                   {"message", end->message}};
  }
  return Json{{"verdicts", std::move(list)},
              {"job_end", std::move(job_end)},
              {"healthy", verdicts.size() == 1 && verdicts.front().kind == VerdictKind::kHealthy},
              {"directory", job.directory},
              {"time", IsoTime(job.now_ns)},
              {"time_ns", job.now_ns},
              {"status_interval_seconds", job.status_interval_seconds},
              {"processes", std::move(processes)},
              {"problems", job.problems},
              {"not_read", Json{{"files", not_read.files},
                                {"processes", not_read.processes},
                                {"listing_cut_short", not_read.listing_cut_short},
                                {"first_files", not_read.first_files},
                                {"why", not_read.why}}}};
}

}  // namespace ncclguard
