#include "watchdog/report/dump_reader.h"

#include <cstdlib>
#include <exception>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "watchdog/report/dump.h"

namespace ncclguard {
namespace {

using Json = nlohmann::json;

// Handles and streams are written as "0x…" strings: JSON numbers lose precision past 2^53.
std::uint64_t ParseHex(const Json& value) {
  const std::string text = value.get<std::string>();
  return std::strtoull(text.c_str(), nullptr, 16);
}

// "2.28.9" → 22809, the code ncclGetVersion returns; 0 for "unknown".
int ParseNcclVersion(const Json& value) {
  const std::vector<std::string> parts = absl::StrSplit(value.get<std::string>(), '.');
  int major = 0;
  int minor = 0;
  int patch = 0;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &major) || !absl::SimpleAtoi(parts[1], &minor) ||
      !absl::SimpleAtoi(parts[2], &patch)) {
    return 0;
  }
  // Before 2.9 the code was major*1000 + minor*100 + patch.
  return major > 2 || (major == 2 && minor >= 9) ? major * 10000 + minor * 100 + patch
                                                 : major * 1000 + minor * 100 + patch;
}

OpSnapshot ParseOp(const Json& entry) {
  OpSnapshot op;
  op.seq = entry.at("seq").get<std::uint64_t>();
  op.op = entry.at("op").get<std::string>();
  op.dtype = entry.at("dtype").get<std::string>();
  op.count = entry.at("count").get<std::uint64_t>();
  op.bytes = entry.at("bytes").get<std::uint64_t>();
  op.root = entry.at("root").get<int>();
  op.peer = entry.at("peer").get<int>();
  op.reduction = entry.at("reduction").get<std::string>();
  op.stream = ParseHex(entry.at("stream"));
  op.group = entry.at("group").get<std::uint64_t>();
  op.host_thread = entry.at("host_thread").get<std::int64_t>();
  op.enqueue_ns = entry.at("enqueue_ns").get<std::int64_t>();
  op.start_ns = entry.at("start_ns").get<std::int64_t>();
  op.end_ns = entry.at("end_ns").get<std::int64_t>();
  op.gpu_ms = entry.at("gpu_ms").get<double>();
  op.result = entry.at("result").get<int>();
  op.state = entry.at("state").get<std::string>();
  return op;
}

CommSnapshot ParseComm(const Json& entry) {
  CommSnapshot comm;
  comm.id = entry.at("id").get<std::string>();
  comm.handle = ParseHex(entry.at("handle"));
  comm.rank = entry.at("rank").get<int>();
  comm.nranks = entry.at("nranks").get<int>();
  CheckRanks(comm.rank, comm.nranks);
  comm.device = entry.at("device").get<int>();
  comm.created_by = entry.at("created_by").get<std::string>();
  comm.parent_id = entry.at("parent_id").get<std::string>();
  comm.library_path = entry.at("library_path").get<std::string>();
  comm.nccl_version = ParseNcclVersion(entry.at("nccl_version"));
  comm.state = entry.at("state").get<std::string>();
  comm.init_start_ns = entry.at("init_start_ns").get<std::int64_t>();
  comm.init_end_ns = entry.at("init_end_ns").get<std::int64_t>();
  comm.async_error = entry.at("async_error").get<std::string>();
  comm.dropped = entry.at("dropped").get<std::uint64_t>();
  for (const Json& op : entry.at("ops")) comm.ring.push_back(ParseOp(op));
  return comm;
}

ParsedDump ParseDocument(const Json& document) {
  if (document.at("format").get<std::string>() != "ncclguard-dump") {
    throw std::runtime_error("not an ncclguard dump");
  }
  if (const int version = document.at("format_version").get<int>(); version != kDumpFormatVersion) {
    throw std::runtime_error(absl::StrCat("dump format version ", version, " is not ", kDumpFormatVersion));
  }
  ParsedDump parsed;
  ProcessFacts& facts = parsed.facts;
  facts.host = document.at("host").get<std::string>();
  facts.pid = document.at("pid").get<int>();
  facts.nccl_version = ParseNcclVersion(document.at("nccl_version"));
  const Json& process = document.at("process");
  facts.ppid = process.at("ppid").get<int>();
  facts.program = process.at("program").get<std::string>();
  facts.command_line = process.at("command_line").get<std::vector<std::string>>();
  facts.launcher = ParseVariables(process.at("launcher"));
  facts.environment = ParseVariables(process.at("environment"));
  facts.rss_bytes = process.at("rss_bytes").get<std::int64_t>();
  facts.peak_rss_bytes = process.at("peak_rss_bytes").get<std::int64_t>();
  ParseSystemFacts(document.at("system"), facts);

  ProcessSnapshot& snapshot = parsed.snapshot;
  snapshot.reason = document.at("reason").get<std::string>();
  snapshot.time_ns = document.at("time_ns").get<std::int64_t>();
  snapshot.rank = document.at("rank").get<int>();
  for (const Json& comm : document.at("communicators")) snapshot.comms.push_back(ParseComm(comm));
  if (const Json& stall = document.at("stall"); !stall.is_null()) {
    StallSnapshot& read = snapshot.stall.emplace();
    read.kind = stall.at("kind").get<std::string>();
    read.comm_id = stall.at("comm_id").get<std::string>();
    read.seq = stall.at("seq").get<std::uint64_t>();
    read.seconds = stall.at("seconds").get<double>();
    read.message = stall.at("message").get<std::string>();
    read.verdict = stall.value("verdict", "");
    read.verdict_message = stall.value("verdict_message", "");
  }
  const Json& watchdog = document.at("watchdog");
  snapshot.in_nccl_call = watchdog.at("in_nccl_call").get<std::string>();
  // The progress counters live apart from the communicators, in the watchdog's section.
  for (const Json& progress : watchdog.at("progress")) {
    const std::string id = progress.at("comm_id").get<std::string>();
    const int rank = progress.at("rank").get<int>();
    for (CommSnapshot& comm : snapshot.comms) {
      if (comm.id != id || comm.rank != rank) continue;
      comm.last_enqueued = progress.at("last_enqueued").get<std::uint64_t>();
      comm.last_started = progress.at("last_started").get<std::uint64_t>();
      comm.last_completed = progress.at("last_completed").get<std::uint64_t>();
    }
  }
  snapshot.last_nccl_warning = document.at("last_nccl_warning").get<std::string>();
  // Added to format version 1 later: earlier dumps lack them.
  if (const auto inits = document.find("pending_inits"); inits != document.end()) {
    for (const Json& init : *inits) {
      CheckRanks(init.at("rank").get<int>(), init.at("nranks").get<int>());
      snapshot.pending_inits.push_back(PendingInitSnapshot{.comm_id = init.at("comm_id").get<std::string>(),
                                                           .api = init.at("api").get<std::string>(),
                                                           .rank = init.at("rank").get<int>(),
                                                           .nranks = init.at("nranks").get<int>(),
                                                           .start_ns = init.at("start_ns").get<std::int64_t>()});
    }
  }
  snapshot.exiting = document.value("exiting", false);
  return parsed;
}

// A SAX handler that measures a document without building it: its depth, and roughly what it
// would take in memory as a nlohmann::json (a real dump takes about five times its size, an
// operation's 350 bytes becoming an object of 17 keyed values; a hostile [{},{},...] thirty).
class JsonBounds final : public nlohmann::json_sax<Json> {
 public:
  explicit JsonBounds(std::size_t max_bytes) : max_bytes_(max_bytes) {}

  bool null() override { return Add(kValueBytes); }
  bool boolean(bool) override { return Add(kValueBytes); }
  bool number_integer(number_integer_t) override { return Add(kValueBytes); }
  bool number_unsigned(number_unsigned_t) override { return Add(kValueBytes); }
  bool number_float(number_float_t, const string_t&) override { return Add(kValueBytes); }
  bool string(string_t& value) override { return Add(kValueBytes + value.size()); }
  bool binary(binary_t& value) override { return Add(kValueBytes + value.size()); }
  bool key(string_t& value) override { return Add(kMemberBytes + value.size()); }
  bool start_object(std::size_t) override { return Open(kObjectBytes); }
  bool start_array(std::size_t) override { return Open(kArrayBytes); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& error) override {
    refusal_ = error.what();
    return false;
  }

  const std::string& refusal() const { return refusal_; }

 private:
  static constexpr std::size_t kObjectBytes = 64;
  static constexpr std::size_t kArrayBytes = 32;
  static constexpr std::size_t kMemberBytes = 64;
  static constexpr std::size_t kValueBytes = 16;

  bool Add(std::size_t bytes) {
    bytes_ += bytes;
    if (bytes_ <= max_bytes_) return true;
    refusal_ = absl::StrCat("would take more than ", max_bytes_, " bytes of memory");
    return false;
  }
  bool Open(std::size_t bytes) {
    if (++depth_ > kMaxJsonDepth) {
      refusal_ = absl::StrCat("nested deeper than ", kMaxJsonDepth, " levels");
      return false;
    }
    return Add(bytes);
  }
  bool Close() {
    --depth_;
    return true;
  }

  std::size_t max_bytes_;
  std::size_t bytes_ = 0;
  int depth_ = 0;
  std::string refusal_;
};

}  // namespace

nlohmann::json ParseBoundedJson(const std::string& content) {
  JsonBounds bounds((64 << 10) + kMaxMemoryPerByte * content.size());
  // A first pass builds nothing: the document is built only once known to be within bounds.
  if (!Json::sax_parse(content, &bounds)) throw std::runtime_error(bounds.refusal());
  return Json::parse(content);
}

void CheckRanks(int rank, int nranks) {
  if (nranks < 0 || nranks > kMaxRanks) {
    throw std::runtime_error(absl::StrCat("nranks ", nranks, " is outside 0..", kMaxRanks));
  }
  const int rank_limit = nranks > 0 ? nranks : kMaxRanks;
  if (rank < -1 || rank >= rank_limit) {
    throw std::runtime_error(absl::StrCat("rank ", rank, " is outside -1..", rank_limit - 1));
  }
}

EnvironmentVariables ParseVariables(const nlohmann::json& object) {
  EnvironmentVariables variables;
  for (const auto& [name, value] : object.items()) variables.emplace_back(name, value.get<std::string>());
  return variables;
}

void ParseSystemFacts(const nlohmann::json& system, ProcessFacts& facts) {
  // Memory figures are in dumps only (dump.h).
  facts.kernel_release = system.at("kernel_release").get<std::string>();
  facts.driver_version = system.at("driver_version").get<std::string>();
  facts.cuda.driver_version = system.at("cuda_driver_version").get<int>();
  // Added after format version 1 was first written: absent in older dumps.
  facts.cuda.device_count = system.value("gpu_count", -1);
  facts.host_gpu_names = system.value("host_gpus", std::vector<std::string>());
  facts.cuda.peer_access = system.value("peer_access", std::vector<std::vector<int>>());
  facts.host_memory_total_bytes = system.value("host_memory_total_bytes", std::int64_t{-1});
  facts.host_memory_available_bytes = system.value("host_memory_available_bytes", std::int64_t{-1});
  for (const Json& gpu : system.at("gpus")) {
    facts.cuda.gpus.push_back(GpuFacts{.device = gpu.at("device").get<int>(),
                                       .name = gpu.at("name").get<std::string>(),
                                       .pci_bus_id = gpu.at("pci_bus_id").get<std::string>(),
                                       .memory_free_bytes = gpu.value("memory_free_bytes", std::int64_t{-1}),
                                       .memory_total_bytes = gpu.value("memory_total_bytes", std::int64_t{-1})});
  }
}

absl::StatusOr<ParsedDump> ParseDump(const std::string& content) noexcept {
  try {
    return ParseDocument(ParseBoundedJson(content));
  } catch (const std::exception& error) {
    return absl::InvalidArgumentError(error.what());
  }
}

}  // namespace ncclguard
