#include "watchdog/report/dump.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "watchdog/common/clock.h"
#include "watchdog/common/files.h"
#include "watchdog/common/version.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/fields_json.h"
#include "watchdog/report/job_files.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/report/snapshot_fields.h"
#include "watchdog/report/snapshot_json.h"

namespace ncclguard {
namespace {

using Json = nlohmann::ordered_json;

std::atomic<std::uint64_t> g_dump_counter{0};

int BestRank(const ProcessSnapshot& snapshot, const ProcessFacts& facts) {
  return snapshot.rank >= 0 ? snapshot.rank : LauncherRank(facts);
}

int BestNcclVersion(const ProcessSnapshot& snapshot, const ProcessFacts& facts) {
  if (facts.nccl_version > 0) return facts.nccl_version;
  for (const CommSnapshot& comm : snapshot.comms) {
    if (comm.nccl_version > 0) return comm.nccl_version;
  }
  return 0;
}

}  // namespace

nlohmann::ordered_json VariablesJson(const EnvironmentVariables& variables) {
  Json object = Json::object();
  for (const auto& [name, value] : variables) object[name] = value;
  return object;
}

nlohmann::ordered_json SystemFactsJson(const ProcessFacts& facts, bool with_memory) {
  const FieldSet set = with_memory ? kInDump : kInStatus;
  Json system = Written(facts, kSystemFields, set);
  system["gpus"] = WrittenArray(facts.cuda.gpus, kGpuFields, set);
  return system;
}

std::string FormatDump(const ProcessSnapshot& snapshot, const ProcessFacts& facts) {
  Json communicators = Json::array();
  Json progress = Json::array();
  for (const CommSnapshot& comm : snapshot.comms) {
    communicators.push_back(CommJson(comm, SnapshotDocument::kDump));
    progress.push_back(ProgressJson(comm));
  }
  const Json document{
      {"format", kDumpFormat},
      {"format_version", kDumpFormatVersion},
      {"ncclguard_version", kVersion},
      {"nccl_version", NcclVersionText(BestNcclVersion(snapshot, facts))},
      {"host", facts.host},
      {"pid", facts.pid},
      {"rank", BestRank(snapshot, facts)},
      {"reason", snapshot.reason},
      {"time", IsoTime(snapshot.time_ns)},
      {"time_ns", snapshot.time_ns},
      {"process", Json{{"ppid", facts.ppid},
                       {"program", facts.program},
                       {"command_line", facts.command_line},
                       {"launcher", VariablesJson(facts.launcher)},
                       {"environment", VariablesJson(facts.environment)},
                       {"rss_bytes", facts.rss_bytes},
                       {"peak_rss_bytes", facts.peak_rss_bytes}}},
      {"system", SystemFactsJson(facts, /*with_memory=*/true)},
      {"communicators", std::move(communicators)},
      {"stall", snapshot.stall ? StallJson(*snapshot.stall, SnapshotDocument::kDump) : Json(nullptr)},
      {"watchdog", Json{{"in_nccl_call", snapshot.in_nccl_call}, {"progress", std::move(progress)}}},
      {"last_nccl_warning", snapshot.last_nccl_warning},
      {"pending_inits", snapshot.pending_inits},
      {"exiting", snapshot.exiting},
      {"fail_slow", WrittenArray(snapshot.fail_slow, kFailSlowFields, kInDump)},
      {"threads", snapshot.threads ? ThreadsJson(*snapshot.threads, kThreadFramesBudget) : Json(nullptr)}};
  // Text from NCCL or the environment may hold invalid UTF-8: replace it rather than fail.
  return document.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

DumpResult WriteDump(const std::string& job_dir, const ProcessSnapshot& snapshot,
                     const ProcessFacts& facts) noexcept {
  std::string name;
  std::string content;
  try {
    const int rank = BestRank(snapshot, facts);
    name = absl::StrCat(kDumpPrefix, SafeFileName(facts.host), "-", facts.pid, "-",
                        rank >= 0 ? absl::StrCat(rank) : std::string("unranked"), "-",
                        g_dump_counter.fetch_add(1) + 1, kJsonSuffix);
    content = FormatDump(snapshot, facts);
  } catch (...) {
    const std::string message = "cannot format the dump (out of memory)";
    LogFirstWriteFailure(message);
    return absl::ResourceExhaustedError(message);
  }
  return WriteFileAtomically(job_dir, name, content, /*durable=*/true);
}

std::size_t MaxDumpBytes(long ring_size) {
  // A dumped operation is about 350 bytes of JSON; the facts (environment, command line, GPUs)
  // a few KiB.
  constexpr std::size_t kBytesPerOperation = 512;
  constexpr std::size_t kFactsBytes = 256 << 10;
  constexpr std::size_t kLargestCap = 256 << 20;
  // Every thread listed (at most 1,024, about 300 bytes each without frames) and the frames' budget.
  constexpr std::size_t kThreadsBytes = std::size_t{1024} * 512 + kThreadFramesBudget;
  const std::size_t ring = static_cast<std::size_t>(std::clamp<long>(ring_size, 1, 1 << 20));
  return std::min(kLargestCap, kFactsBytes + kThreadsBytes + kMaxDumpedRings * ring * kBytesPerOperation);
}

}  // namespace ncclguard
