#include "faults.h"

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

// Parses "kind:key=value,..." into fault, or returns what is wrong with it.
std::string parseEntry(std::string_view entry, Fault* fault) {
  const std::string quoted = "'" + std::string(entry) + "'";
  const size_t colon = entry.find(':');
  const std::string_view kind_name = trim(entry.substr(0, colon));
  auto kind = kindTable().find(kind_name);
  if (kind == kindTable().end()) {
    return "unknown fault kind '" + std::string(kind_name) + "' in " + quoted +
           " (kinds: hang, p2p_stall, slow, async_error, init_hang, crash)";
  }
  fault->kind = kind->second.kind;
  std::set<std::string_view> seen;
  std::string_view rest = colon == std::string_view::npos ? std::string_view() : entry.substr(colon + 1);
  while (!trim(rest).empty()) {
    const size_t comma = rest.find(',');
    const std::string_view pair = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const size_t equals = pair.find('=');
    if (equals == std::string_view::npos)
      return "expected key=value, got '" + std::string(pair) + "' in " + quoted;
    const std::string_view key = trim(pair.substr(0, equals));
    const std::string_view value = trim(pair.substr(equals + 1));
    if (!kind->second.required.count(key) && !kind->second.optional.count(key)) {
      return "unknown key '" + std::string(key) + "' for " + std::string(kind_name) + " in " + quoted;
    }
    if (!seen.insert(key).second) return "key '" + std::string(key) + "' given twice in " + quoted;
    uint64_t number = 0;
    if (key == "code") {
      if (!parseResultCode(value, &fault->code)) {
        return "bad code '" + std::string(value) + "' in " + quoted +
               " (1-6 or a name such as ncclRemoteError)";
      }
      continue;
    }
    if (!parseUnsigned(value, &number) || number > INT32_MAX) {
      return "bad value '" + std::string(value) + "' for " + std::string(key) + " in " + quoted +
             " (expected a non-negative integer)";
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
    if ((key == "seq" || key == "comm") && number == 0) {
      return std::string(key) + " counts from 1, got 0 in " + quoted;
    }
  }
  for (std::string_view key : kind->second.required) {
    if (!seen.count(key)) return "missing key '" + std::string(key) + "' in " + quoted;
  }
  // A link joins two ranks: a rank's link to itself does not exist.
  if (fault->peer >= 0 && fault->peer == fault->rank) return "peer must differ from rank in " + quoted;
  return "";
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

}  // namespace ncclemu
