#include "watchdog/report/dump_reader.h"

#include <cstddef>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "watchdog/common/exit_gate.h"
#include "watchdog/report/dump.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/fields_json.h"
#include "watchdog/report/job_files.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/report/snapshot_fields.h"
#include "watchdog/report/snapshot_json.h"

namespace ncclguard {
namespace {

using Json = nlohmann::json;

void CheckFormat(const Json& document) {
  if (document.at("format").get<std::string>() != kDumpFormat) {
    throw std::runtime_error("not an ncclguard dump");
  }
  if (const int version = document.at("format_version").get<int>();
      version < 1 || version > kDumpFormatVersion) {
    throw std::runtime_error(absl::StrCat("dump format version ", version, " is not between 1 and ",
                                          kDumpFormatVersion, " (a newer ncclguard wrote it)"));
  }
}

ProcessFacts ReadFacts(const Json& document) {
  ProcessFacts facts;
  document.at("host").get_to(facts.host);
  document.at("pid").get_to(facts.pid);
  facts.nccl_version = NcclVersionCode(document.at("nccl_version").get<std::string>());
  const Json& process = document.at("process");
  process.at("ppid").get_to(facts.ppid);
  process.at("program").get_to(facts.program);
  process.at("command_line").get_to(facts.command_line);
  facts.launcher = ParseVariables(process.at("launcher"));
  facts.environment = ParseVariables(process.at("environment"));
  process.at("rss_bytes").get_to(facts.rss_bytes);
  process.at("peak_rss_bytes").get_to(facts.peak_rss_bytes);
  ParseSystemFacts(document.at("system"), facts);
  return facts;
}

ProcessSnapshot ReadSnapshot(const Json& document) {
  ProcessSnapshot snapshot;
  document.at("reason").get_to(snapshot.reason);
  document.at("time_ns").get_to(snapshot.time_ns);
  document.at("rank").get_to(snapshot.rank);
  snapshot.comms = ReadArray(document.at("communicators"), [](const Json& comm) { return ReadComm(comm); });
  if (const Json& stall = document.at("stall"); !stall.is_null()) {
    snapshot.stall = ReadStall(stall);
  }
  const Json& watchdog = document.at("watchdog");
  watchdog.at("in_nccl_call").get_to(snapshot.in_nccl_call);
  // The progress counters live apart from the communicators, in the watchdog's section.
  for (const Json& progress : CheckedArray(watchdog.at("progress"))) ReadProgress(progress, snapshot.comms);
  document.at("last_nccl_warning").get_to(snapshot.last_nccl_warning);
  // Added to format version 1 later: earlier dumps lack them.
  if (const auto inits = document.find("pending_inits"); inits != document.end()) {
    snapshot.pending_inits =
        ReadArray(*inits, [](const Json& init) { return init.get<PendingInitSnapshot>(); });
  }
  snapshot.exiting = document.value("exiting", false);
  // Added to format version 2 later.
  if (const auto fail_slow = document.find("fail_slow"); fail_slow != document.end()) {
    snapshot.fail_slow = ReadArray(*fail_slow, [](const Json& verdict) {
      return ReadRecord<FailSlowSnapshot>(verdict, kFailSlowFields, kInDump);
    });
  }
  // Format version 2 on.
  if (const auto threads = document.find("threads"); threads != document.end() && !threads->is_null()) {
    snapshot.threads = ReadThreads(*threads);
  }
  return snapshot;
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

// Builds the document while JsonBounds measures it, in one pass over the text: each value is
// measured before it is added, so the part built when the bounds refuse the rest is within them.
// The building is nlohmann's own (the DOM builder its parse() uses), told not to throw: a parse
// error is the bounds' refusal like any other.
class BoundedDocumentBuilder {
 public:
  BoundedDocumentBuilder(Json& document, std::size_t max_bytes)
      : bounds_(max_bytes), builder_(document, /*allow_exceptions_=*/false) {}

  bool null() { return bounds_.null() && builder_.null(); }
  bool boolean(bool value) { return bounds_.boolean(value) && builder_.boolean(value); }
  bool number_integer(Json::number_integer_t value) {
    return bounds_.number_integer(value) && builder_.number_integer(value);
  }
  bool number_unsigned(Json::number_unsigned_t value) {
    return bounds_.number_unsigned(value) && builder_.number_unsigned(value);
  }
  bool number_float(Json::number_float_t value, const Json::string_t& text) {
    return bounds_.number_float(value, text) && builder_.number_float(value, text);
  }
  bool string(Json::string_t& value) { return bounds_.string(value) && builder_.string(value); }
  bool binary(Json::binary_t& value) { return bounds_.binary(value) && builder_.binary(value); }
  bool key(Json::string_t& value) { return bounds_.key(value) && builder_.key(value); }
  bool start_object(std::size_t elements) {
    return bounds_.start_object(elements) && builder_.start_object(elements);
  }
  bool start_array(std::size_t elements) {
    return bounds_.start_array(elements) && builder_.start_array(elements);
  }
  bool end_object() { return bounds_.end_object() && builder_.end_object(); }
  bool end_array() { return bounds_.end_array() && builder_.end_array(); }
  bool parse_error(std::size_t position, const std::string& token, const nlohmann::detail::exception& error) {
    return bounds_.parse_error(position, token, error);
  }

  const std::string& refusal() const { return bounds_.refusal(); }

 private:
  JsonBounds bounds_;
  nlohmann::detail::json_sax_dom_parser<Json> builder_;
};

}  // namespace

nlohmann::json ParseBoundedJson(const std::string& content) {
  Json document;
  BoundedDocumentBuilder builder(document, (64 << 10) + kMaxMemoryPerByte * content.size());
  // Files rewritten in place are padded with spaces; the lexer would go through them one by one.
  std::size_t end = content.size();
  while (end > 0 && absl::ascii_isspace(static_cast<unsigned char>(content[end - 1]))) --end;
  if (!Json::sax_parse(content.data(), content.data() + end, &builder))
    throw std::runtime_error(builder.refusal());
  return document;
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
  if (!object.is_object())
    throw std::runtime_error(absl::StrCat("variables are an object, not ", object.type_name()));
  EnvironmentVariables variables;
  for (const auto& [name, value] : object.items()) variables.emplace_back(name, value.get<std::string>());
  return variables;
}

void ParseSystemFacts(const nlohmann::json& system, ProcessFacts& facts) {
  ReadFields(system, facts, kSystemFields, kInDump);
  facts.cuda.gpus = ReadArray(system.at("gpus"),
                              [](const Json& gpu) { return ReadRecord<GpuFacts>(gpu, kGpuFields, kInDump); });
}

absl::StatusOr<ParsedDump> ParseDump(const std::string& content) noexcept {
  const ExitPass pass;  // nlohmann's globals may be gone once the application's exit has begun
  if (!pass.open()) return absl::CancelledError("the process is exiting");
  try {
    const Json document = ParseBoundedJson(content);
    CheckFormat(document);
    return ParsedDump{.snapshot = ReadSnapshot(document), .facts = ReadFacts(document)};
  } catch (const std::exception& error) {
    return absl::InvalidArgumentError(error.what());
  }
}

}  // namespace ncclguard
