#include "watchdog/report/dump.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "watchdog/common/log.h"
#include "watchdog/common/version.h"

namespace ncclguard {
namespace {

using Json = nlohmann::ordered_json;

std::atomic<std::uint64_t> g_dump_counter{0};

std::string Hex(std::uint64_t value) { return fmt::format("0x{:x}", value); }

Json OpJson(const OpSnapshot& op) {
  return Json{{"seq", op.seq},
              {"op", op.op},
              {"dtype", op.dtype},
              {"count", op.count},
              {"bytes", op.bytes},
              {"root", op.root},
              {"peer", op.peer},
              {"reduction", op.reduction},
              {"stream", Hex(op.stream)},
              {"group", op.group},
              {"host_thread", op.host_thread},
              {"enqueue_ns", op.enqueue_ns},
              {"start_ns", op.start_ns},
              {"end_ns", op.end_ns},
              {"gpu_ms", op.gpu_ms},
              {"result", op.result},
              {"state", op.state}};
}

Json CommJson(const CommSnapshot& comm) {
  Json ops = Json::array();
  for (const OpSnapshot& op : comm.ring) ops.push_back(OpJson(op));
  return Json{{"id", comm.id},
              {"handle", Hex(comm.handle)},
              {"rank", comm.rank},
              {"nranks", comm.nranks},
              {"device", comm.device},
              {"created_by", comm.created_by},
              {"parent_id", comm.parent_id},
              {"library_path", comm.library_path},
              {"nccl_version", NcclVersionText(comm.nccl_version)},
              {"state", comm.state},
              {"init_start_ns", comm.init_start_ns},
              {"init_end_ns", comm.init_end_ns},
              {"async_error", comm.async_error},
              {"dropped", comm.dropped},
              {"ops", std::move(ops)}};
}

Json StallJson(const std::optional<StallSnapshot>& stall) {
  if (!stall) return nullptr;
  return Json{{"kind", stall->kind},
              {"comm_id", stall->comm_id},
              {"seq", stall->seq},
              {"seconds", stall->seconds},
              {"message", stall->message},
              {"verdict", stall->verdict},
              {"verdict_message", stall->verdict_message}};
}

Json PendingInitsJson(const std::vector<PendingInitSnapshot>& pending_inits) {
  Json inits = Json::array();
  for (const PendingInitSnapshot& init : pending_inits) {
    inits.push_back(Json{{"comm_id", init.comm_id},
                         {"api", init.api},
                         {"rank", init.rank},
                         {"nranks", init.nranks},
                         {"start_ns", init.start_ns}});
  }
  return inits;
}

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
  Json gpus = Json::array();
  for (const GpuFacts& gpu : facts.cuda.gpus) {
    Json entry{{"device", gpu.device}, {"name", gpu.name}, {"pci_bus_id", gpu.pci_bus_id}};
    if (with_memory) {
      entry["memory_free_bytes"] = gpu.memory_free_bytes;
      entry["memory_total_bytes"] = gpu.memory_total_bytes;
    }
    gpus.push_back(std::move(entry));
  }
  Json system{{"kernel_release", facts.kernel_release},
              {"driver_version", facts.driver_version},
              {"cuda_driver_version", facts.cuda.driver_version},
              {"gpu_count", facts.cuda.device_count},
              {"host_gpus", facts.host_gpu_names},
              {"peer_access", facts.cuda.peer_access}};
  if (with_memory) {
    system["host_memory_total_bytes"] = facts.host_memory_total_bytes;
    system["host_memory_available_bytes"] = facts.host_memory_available_bytes;
  }
  system["gpus"] = std::move(gpus);
  return system;
}

std::string FormatDump(const ProcessSnapshot& snapshot, const ProcessFacts& facts) {
  Json communicators = Json::array();
  Json progress = Json::array();
  for (const CommSnapshot& comm : snapshot.comms) {
    communicators.push_back(CommJson(comm));
    progress.push_back(Json{{"comm_id", comm.id},
                            {"rank", comm.rank},
                            {"last_enqueued", comm.last_enqueued},
                            {"last_started", comm.last_started},
                            {"last_completed", comm.last_completed}});
  }
  const Json document{
      {"format", "ncclguard-dump"},
      {"format_version", kDumpFormatVersion},
      {"ncclguard_version", kVersion},
      {"nccl_version", NcclVersionText(BestNcclVersion(snapshot, facts))},
      {"host", facts.host},
      {"pid", facts.pid},
      {"rank", BestRank(snapshot, facts)},
      {"reason", snapshot.reason},
      {"time", IsoTime(snapshot.time_ns)},
      {"time_ns", snapshot.time_ns},
      {"process",
       Json{{"ppid", facts.ppid},
            {"program", facts.program},
            {"command_line", facts.command_line},
            {"launcher", VariablesJson(facts.launcher)},
            {"environment", VariablesJson(facts.environment)},
            {"rss_bytes", facts.rss_bytes},
            {"peak_rss_bytes", facts.peak_rss_bytes}}},
      {"system", SystemFactsJson(facts, /*with_memory=*/true)},
      {"communicators", std::move(communicators)},
      {"stall", StallJson(snapshot.stall)},
      {"watchdog", Json{{"in_nccl_call", snapshot.in_nccl_call}, {"progress", std::move(progress)}}},
      {"last_nccl_warning", snapshot.last_nccl_warning},
      {"pending_inits", PendingInitsJson(snapshot.pending_inits)},
      {"exiting", snapshot.exiting}};
  // Text from NCCL or the environment may hold invalid UTF-8: replace it rather than fail.
  return document.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

DumpResult WriteDump(const std::string& job_dir, const ProcessSnapshot& snapshot,
                     const ProcessFacts& facts) noexcept {
  std::string name;
  std::string content;
  try {
    const int rank = BestRank(snapshot, facts);
    name = absl::StrCat("dump-", SafeFileName(facts.host), "-", facts.pid, "-",
                        rank >= 0 ? absl::StrCat(rank) : std::string("unranked"), "-",
                        g_dump_counter.fetch_add(1) + 1, ".json");
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
  const std::size_t ring = static_cast<std::size_t>(std::clamp<long>(ring_size, 1, 1 << 20));
  return std::min(kLargestCap, kFactsBytes + kMaxDumpedRings * ring * kBytesPerOperation);
}

}  // namespace ncclguard
