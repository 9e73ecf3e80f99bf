#include "faults.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <map>
#include <set>
#include <string_view>

namespace ncclemu {
namespace {

struct KindSyntax {
  FaultKind kind;
  std::set<std::string_view> required;
  std::set<std::string_view> optional;
};

const std::map<std::string_view, KindSyntax>& kindTable() {
  static const auto* table = new std::map<std::string_view, KindSyntax>{
      {"hang", {FaultKind::Hang, {"rank", "seq"}, {"comm", "peer"}}},
      {"p2p_stall", {FaultKind::P2pStall, {"after"}, {"comm"}}},
      {"slow", {FaultKind::Slow, {"ms"}, {"rank", "comm"}}},
      {"slow_link", {FaultKind::SlowLink, {"rank", "peer", "factor"}, {"channel", "from", "until", "comm"}}},
      {"async_error", {FaultKind::AsyncError, {"rank", "seq", "code"}, {"comm"}}},
      {"init_hang", {FaultKind::InitHang, {"rank"}, {"comm"}}},
      {"crash", {FaultKind::Crash, {"rank", "seq"}, {"comm"}}},
  };
  return *table;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

bool parseUnsigned(std::string_view text, uint64_t* value) {
  if (text.empty()) return false;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *value);
  return error == std::errc() && end == text.data() + text.size();
}

// A decimal such as 0, 3 or 2.5 (no sign, no exponent, no inf or nan).
bool parseDecimal(std::string_view text, double* value) {
  if (text.empty() || text.find_first_not_of("0123456789.") != std::string_view::npos) return false;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *value);
  return error == std::errc() && end == text.data() + text.size();
}

bool parseFactor(std::string_view text, double* value) { return parseDecimal(text, value) && *value > 0; }

// Splits "key=value" into its trimmed halves; false without '='.
bool splitPair(std::string_view pair, std::string_view* key, std::string_view* value) {
  const size_t equals = pair.find('=');
  if (equals == std::string_view::npos) return false;
  *key = trim(pair.substr(0, equals));
  *value = trim(pair.substr(equals + 1));
  return true;
}

bool parseResultCode(std::string_view text, ncclResult_t* code) {
  static const std::map<std::string_view, ncclResult_t> names = {
      {"ncclUnhandledCudaError", ncclUnhandledCudaError},
      {"ncclSystemError", ncclSystemError},
      {"ncclInternalError", ncclInternalError},
      {"ncclInvalidArgument", ncclInvalidArgument},
      {"ncclInvalidUsage", ncclInvalidUsage},
      {"ncclRemoteError", ncclRemoteError},
  };
  if (auto it = names.find(text); it != names.end()) {
    *code = it->second;
    return true;
  }
  uint64_t number = 0;
  if (!parseUnsigned(text, &number) || number < ncclUnhandledCudaError || number > ncclRemoteError)
    return false;
  *code = static_cast<ncclResult_t>(number);
  return true;
}

// Stores the value of `key` in fault, or returns what is wrong with it.
std::string parseValue(std::string_view key, std::string_view value, const std::string& quoted,
                       Fault* fault) {
  if (key == "code") {
    if (parseResultCode(value, &fault->code)) return "";
    return "bad code '" + std::string(value) + "' in " + quoted + " (1-6 or a name such as ncclRemoteError)";
  }
  if (key == "factor") {
    if (parseFactor(value, &fault->factor)) return "";
    return "bad value '" + std::string(value) + "' for factor in " + quoted + " (expected a decimal > 0)";
  }
  uint64_t number = 0;
  if (!parseUnsigned(value, &number) || number > INT32_MAX) {
    return "bad value '" + std::string(value) + "' for " + std::string(key) + " in " + quoted +
           " (expected a non-negative integer)";
  }
  if ((key == "seq" || key == "comm" || key == "from" || key == "until") && number == 0) {
    return std::string(key) + " counts from 1, got 0 in " + quoted;
  }
  if (key == "rank")
    fault->rank = static_cast<int>(number);
  else if (key == "peer")
    fault->peer = static_cast<int>(number);
  else if (key == "seq")
    fault->seq = number;
  else if (key == "after")
    fault->after = number;
  else if (key == "ms")
    fault->delay_ms = static_cast<int>(number);
  else if (key == "comm")
    fault->comm_index = static_cast<int>(number);
  else if (key == "channel")
    fault->channel = static_cast<int>(number);
  else if (key == "from")
    fault->from_seq = number;
  else if (key == "until")
    fault->until_seq = number;
  return "";
}

// Parses "kind:key=value,..." into fault, or returns what is wrong with it.
std::string parseEntry(std::string_view entry, Fault* fault) {
  const std::string quoted = "'" + std::string(entry) + "'";
  const size_t colon = entry.find(':');
  const std::string_view kind_name = trim(entry.substr(0, colon));
  auto kind = kindTable().find(kind_name);
  if (kind == kindTable().end()) {
    return "unknown fault kind '" + std::string(kind_name) + "' in " + quoted +
           " (kinds: hang, p2p_stall, slow, slow_link, async_error, init_hang, crash)";
  }
  fault->kind = kind->second.kind;
  std::set<std::string_view> seen;
  std::string_view rest = colon == std::string_view::npos ? std::string_view() : entry.substr(colon + 1);
  while (!trim(rest).empty()) {
    const size_t comma = rest.find(',');
    const std::string_view pair = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    std::string_view key, value;
    if (!splitPair(pair, &key, &value))
      return "expected key=value, got '" + std::string(pair) + "' in " + quoted;
    if (!kind->second.required.count(key) && !kind->second.optional.count(key)) {
      return "unknown key '" + std::string(key) + "' for " + std::string(kind_name) + " in " + quoted;
    }
    if (!seen.insert(key).second) return "key '" + std::string(key) + "' given twice in " + quoted;
    if (std::string error = parseValue(key, value, quoted, fault); !error.empty()) return error;
  }
  for (std::string_view key : kind->second.required) {
    if (!seen.count(key)) return "missing key '" + std::string(key) + "' in " + quoted;
  }
  // A link joins two ranks: a rank's link to itself does not exist.
  if (fault->peer >= 0 && fault->peer == fault->rank) return "peer must differ from rank in " + quoted;
  if (fault->until_seq != 0 && fault->until_seq < fault->from_seq) return "until is before from in " + quoted;
  return "";
}

// Stores the value of an NCCLEMU_LINKS key in model, or returns what is wrong with it.
std::string parseLinkValue(std::string_view key, std::string_view value, const std::string& quoted,
                           LinkModel* model) {
  const std::string bad = "bad value '" + std::string(value) + "' for " + std::string(key) + " in " + quoted;
  if (key == "seed") {
    if (!parseUnsigned(value, &model->seed)) return bad + " (expected a non-negative integer)";
  } else if (key == "gbps") {
    if (!parseFactor(value, &model->gbps)) return bad + " (expected a decimal > 0)";
  } else if (key == "latency_us") {
    if (!parseDecimal(value, &model->latency_us)) return bad + " (expected a decimal >= 0)";
  } else if (key == "jitter") {
    if (!parseDecimal(value, &model->jitter) || model->jitter > 0.9)
      return bad + " (expected a decimal from 0 to 0.9)";
  } else {
    return "unknown key '" + std::string(key) + "' in " + quoted + " (keys: gbps, latency_us, jitter, seed)";
  }
  return "";
}

// A uniform draw from [0, 1) that depends on every bit of the key.
double uniformDraw(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  const uint64_t bits = mixBits(seed ^ mixBits(a ^ mixBits(b ^ mixBits(c))));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

}  // namespace

FaultPlan parseFaultSpec(const std::string& spec) {
  FaultPlan plan;
  std::string_view rest(spec);
  while (!rest.empty()) {
    const size_t semicolon = rest.find(';');
    const std::string_view entry = trim(rest.substr(0, semicolon));
    rest = semicolon == std::string_view::npos ? std::string_view() : rest.substr(semicolon + 1);
    if (entry.empty()) continue;
    Fault fault{};
    fault.rank = -1;
    fault.peer = -1;
    if (std::string error = parseEntry(entry, &fault); !error.empty()) {
      plan.error = error;
      plan.faults.clear();
      return plan;
    }
    plan.faults.push_back(fault);
  }
  return plan;
}

const FaultPlan& activeFaultPlan() {
  static const FaultPlan* plan = [] {
    const char* spec = getenv("NCCLEMU_FAULTS");
    return new FaultPlan(parseFaultSpec(spec ? spec : ""));
  }();
  return *plan;
}

LinkModel parseLinkSpec(const std::string& spec) {
  LinkModel model;
  const std::string_view whole = trim(spec);
  if (whole.empty()) return model;
  model.enabled = true;
  if (whole == "on") return model;
  const std::string quoted = "'" + std::string(whole) + "'";
  std::set<std::string_view> seen;
  for (std::string_view rest = whole; !trim(rest).empty();) {
    const size_t comma = rest.find(',');
    const std::string_view pair = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    std::string_view key, value;
    std::string error;
    if (!splitPair(pair, &key, &value)) {
      error = "expected key=value, got '" + std::string(pair) + "' in " + quoted;
    } else if (!seen.insert(key).second) {
      error = "key '" + std::string(key) + "' given twice in " + quoted;
    } else {
      error = parseLinkValue(key, value, quoted, &model);
    }
    if (!error.empty()) {
      LinkModel malformed;  // off: nothing of it applies
      malformed.error = error;
      return malformed;
    }
  }
  return model;
}

const LinkModel& activeLinkModel() {
  static const LinkModel* model = [] {
    const char* spec = getenv("NCCLEMU_LINKS");
    auto* parsed = new LinkModel(parseLinkSpec(spec ? spec : ""));
    const std::vector<Fault>& faults = activeFaultPlan().faults;
    if (parsed->error.empty() && std::any_of(faults.begin(), faults.end(), [](const Fault& fault) {
          return fault.kind == FaultKind::SlowLink;
        })) {
      parsed->enabled = true;
    }
    return parsed;
  }();
  return *model;
}

std::string transportSpecError() {
  if (!activeFaultPlan().error.empty()) return "NCCLEMU_FAULTS: " + activeFaultPlan().error;
  if (!activeLinkModel().error.empty()) return "NCCLEMU_LINKS: " + activeLinkModel().error;
  return "";
}

std::chrono::nanoseconds linkTime(const LinkModel& model, const std::vector<Fault>& faults,
                                  const LinkUse& use) {
  double seconds = model.latency_us * 1e-6 + static_cast<double>(use.bytes) * 8 / (model.gbps * 1e9);
  for (const Fault& fault : faults) {
    if (fault.kind == FaultKind::SlowLink && fault.rank == use.from && fault.peer == use.to &&
        (fault.channel < 0 || fault.channel == use.channel) && use.seq >= fault.from_seq &&
        (fault.until_seq == 0 || use.seq <= fault.until_seq) &&
        (fault.comm_index == 0 || fault.comm_index == use.comm_index)) {
      seconds *= fault.factor;
    }
  }
  if (model.jitter > 0) {
    const uint64_t link = static_cast<uint64_t>(use.from) << 32 | static_cast<uint32_t>(use.to);
    const double draw = uniformDraw(model.seed, use.seq, static_cast<uint64_t>(use.channel), link);
    seconds *= 1 - model.jitter + 2 * model.jitter * draw;
  }
  return std::chrono::nanoseconds(static_cast<int64_t>(seconds * 1e9));
}

uint64_t mixBits(uint64_t value) {
  value += 0x9e3779b97f4a7c15ULL;
  value = (value ^ (value >> 30)) * 0xbf58476d1ce4e5b9ULL;
  value = (value ^ (value >> 27)) * 0x94d049bb133111ebULL;
  return value ^ (value >> 31);
}

}  // namespace ncclemu
