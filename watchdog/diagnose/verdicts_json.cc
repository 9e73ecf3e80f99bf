// The verdicts at the JSON edge: what `ncclguard analyze --json` prints (docs/verdicts.md).
#include "watchdog/common/files.h"
#include "watchdog/diagnose/verdicts.h"

namespace ncclguard {
namespace {

using Json = nlohmann::json;

const char* LivenessName(ProcessView::Liveness liveness) {
  switch (liveness) {
    case ProcessView::Liveness::kAlive: return "alive";
    case ProcessView::Liveness::kGone: return "gone";
    case ProcessView::Liveness::kUnknown: return "unknown";
  }
  return "unknown";
}

}  // namespace

nlohmann::json VerdictsToJson(const JobView& job, const std::vector<Verdict>& verdicts) {
  Json list = Json::array();
  for (const Verdict& verdict : verdicts) {
    list.push_back(Json{{"kind", verdict.kind},
                        {"comm", verdict.comm},
                        {"seq", verdict.seq},
                        {"ranks", verdict.ranks},
                        {"message", verdict.message},
                        {"evidence", verdict.evidence}});
  }
  Json processes = Json::array();
  for (const ProcessView& process : job.processes) {
    processes.push_back(Json{{"host", process.host},
                             {"pid", process.pid},
                             {"rank", process.snapshot.rank},
                             {"liveness", LivenessName(process.liveness)},
                             {"exited", process.exited},
                             {"last_seen_ns", process.last_seen_ns},
                             {"in_nccl_call", process.snapshot.in_nccl_call},
                             {"status_file", process.status_file},
                             {"dump_file", process.dump_file},
                             {"dump_reason", process.dump_reason}});
  }
  return Json{{"verdicts", std::move(list)},
              {"healthy", verdicts.size() == 1 && verdicts.front().kind == "healthy"},
              {"directory", job.directory},
              {"time", IsoTime(job.now_ns)},
              {"time_ns", job.now_ns},
              {"status_interval_seconds", job.status_interval_seconds},
              {"processes", std::move(processes)},
              {"problems", job.problems}};
}

}  // namespace ncclguard
