#include "watchdog/common/config.h"

#include <signal.h>
#include <string.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "watchdog/common/config_table.h"
#include "watchdog/common/escape.h"

namespace ncclguard {
namespace {

// Debian's Abseil has its own string_view type: hand it std::string and char arrays only.
constexpr const char* kLogLevelNames[] = {"trace", "debug", "info", "warn", "error", "off"};
constexpr const char* kActionNames[] = {"warn", "abort", "exit", "reinit"};
constexpr const char* kP2pModeNames[] = {"auto", "on", "off"};
constexpr const char* kRecoverModeNames[] = {"off", "inprocess"};

// A value that must be one of `names`, case-insensitive; the enum's values are in the same order.
template <typename Enum, size_t N>
absl::StatusOr<Enum> ParseNamed(std::string_view text, const char* const (&names)[N]) {
  const std::string value = absl::AsciiStrToLower(std::string(text));
  for (size_t i = 0; i < N; ++i) {
    if (value == names[i]) return static_cast<Enum>(i);
  }
  return absl::InvalidArgumentError(absl::StrCat("is not one of ", absl::StrJoin(names, "|")));
}

absl::StatusOr<bool> ParseValue(std::string_view text, bool*) {
  const std::string value = absl::AsciiStrToLower(std::string(text));
  if (value == "1" || value == "true" || value == "yes" || value == "on") return true;
  if (value == "0" || value == "false" || value == "no" || value == "off" || value.empty()) return false;
  return absl::InvalidArgumentError("is not a boolean (1/0, true/false, yes/no, on/off)");
}

absl::StatusOr<LogLevel> ParseValue(std::string_view text, LogLevel*) {
  if (absl::AsciiStrToLower(std::string(text)) == "warning") return LogLevel::kWarn;
  return ParseNamed<LogLevel>(text, kLogLevelNames);
}

absl::StatusOr<Action> ParseValue(std::string_view text, Action*) {
  return ParseNamed<Action>(text, kActionNames);
}

absl::StatusOr<P2pMode> ParseValue(std::string_view text, P2pMode*) {
  return ParseNamed<P2pMode>(text, kP2pModeNames);
}

absl::StatusOr<RecoverMode> ParseValue(std::string_view text, RecoverMode*) {
  return ParseNamed<RecoverMode>(text, kRecoverModeNames);
}

absl::StatusOr<Seconds> ParseValue(std::string_view text, Seconds*) {
  double value = 0;
  // 0 is a number of seconds; a setting that cannot be 0 says so by its range (config_table.h).
  if (!absl::SimpleAtod(std::string(text), &value) || !(value >= 0) || !std::isfinite(value)) {
    return absl::InvalidArgumentError("is not a number of seconds");
  }
  return Seconds{value};
}

absl::StatusOr<Count> ParseValue(std::string_view text, Count*) {
  long value = 0;
  if (!absl::SimpleAtoi(std::string(text), &value) || value <= 0) {
    return absl::InvalidArgumentError("is not a positive whole number");
  }
  return Count{value};
}

// A dump signal must not change what the signal otherwise does to the process: its handler
// replaces the default action, so only signals whose default is to be ignored, or that exist for
// the user, qualify. SIGTERM would be swallowed, a SIGSEGV handler would return to the fault.
bool CanBeDumpSignal(int number) {
  switch (number) {
    case SIGUSR1:
    case SIGUSR2:
    case SIGWINCH:
    case SIGURG:
    case SIGCHLD:
      return true;
    default:
      return number >= SIGRTMIN && number <= SIGRTMAX;
  }
}

// "SIGUSR2", "usr2", "RTMIN+3", "SIGRTMAX-1" or a number; -1 when it names no signal.
int SignalNumber(std::string name) {
  int number = 0;
  if (absl::SimpleAtoi(name, &number)) return number;
  name = std::string(absl::StripPrefix(name, "SIG"));
  for (const auto& [base, sign, value] :
       {std::tuple{"RTMIN", 1, SIGRTMIN}, std::tuple{"RTMAX", -1, SIGRTMAX}}) {
    const std::string prefix = base;
    if (!absl::StartsWith(name, prefix) || name.size() == prefix.size()) continue;
    const char expected_sign = sign > 0 ? '+' : '-';
    int offset = 0;
    if (name[prefix.size()] != expected_sign || !absl::SimpleAtoi(name.substr(prefix.size() + 1), &offset))
      return -1;
    return value + sign * offset;
  }
  for (int candidate = 1; candidate < NSIG; ++candidate) {
    const char* abbreviation = sigabbrev_np(candidate);
    if (abbreviation != nullptr && name == abbreviation) return candidate;
  }
  return -1;
}

absl::StatusOr<Signal> ParseValue(std::string_view text, Signal*) {
  const int number = SignalNumber(absl::AsciiStrToUpper(std::string(text)));
  if (number == 0 || CanBeDumpSignal(number)) return Signal{number};
  return absl::InvalidArgumentError(
      "is not SIGUSR1, SIGUSR2, a real-time signal or a signal ignored by default (SIGWINCH, SIGURG, "
      "SIGCHLD); 0 turns the dump signal off");
}

absl::StatusOr<std::string> ParseValue(std::string_view text, std::string*) { return std::string(text); }

const char* TypeName(const bool*) { return "boolean"; }
const char* TypeName(const LogLevel*) { return "level"; }
const char* TypeName(const std::string*) { return "text"; }
const char* TypeName(const Action*) { return "action"; }
const char* TypeName(const P2pMode*) { return "auto|on|off"; }
const char* TypeName(const RecoverMode*) { return "off|inprocess"; }
const char* TypeName(const Seconds*) { return "seconds"; }
const char* TypeName(const Count*) { return "count"; }
const char* TypeName(const Signal*) { return "signal"; }

// A bound as a user writes it: a whole number in full (a byte count of 2^40 is not 1.09951e+12).
std::string RangeBound(double bound) {
  if (bound == std::floor(bound) && std::fabs(bound) < 1e15)
    return absl::StrCat(static_cast<std::int64_t>(bound));
  return absl::StrCat(bound);
}

// The type column of docs/settings.md: the type, and the range of a numeric setting.
template <typename T>
std::string TypeText(std::string_view variable, const T* field) {
  const std::optional<SettingRange> range = RangeOf(variable);
  if (!range) return TypeName(field);
  return absl::StrCat(TypeName(field), ", ", RangeBound(range->least), " to ", RangeBound(range->greatest));
}

std::string FormatValue(bool value) { return value ? "1" : "0"; }
std::string FormatValue(LogLevel value) { return std::string(LogLevelName(value)); }
std::string FormatValue(const std::string& value) {
  return value.empty() ? "unset" : RemoveUrlCredentials(value);
}
std::string FormatValue(Action value) { return std::string(ActionName(value)); }
std::string FormatValue(P2pMode value) { return std::string(P2pModeName(value)); }
std::string FormatValue(RecoverMode value) { return std::string(RecoverModeName(value)); }
std::string FormatValue(Seconds value) { return absl::StrCat(value.value); }
std::string FormatValue(Count value) { return absl::StrCat(value.value); }
std::string FormatValue(Signal value) {
  if (value.number == 0) return "0";
  // Real-time signals as one writes them: their numbers depend on the C library.
  if (value.number >= SIGRTMIN && value.number <= SIGRTMAX) {
    const int from_min = value.number - SIGRTMIN;
    const int from_max = SIGRTMAX - value.number;
    if (from_max == 0) return "SIGRTMAX";
    if (from_min == 0) return "SIGRTMIN";
    return from_max < from_min ? absl::StrCat("SIGRTMAX-", from_max) : absl::StrCat("SIGRTMIN+", from_min);
  }
  const char* abbreviation = sigabbrev_np(value.number);
  return abbreviation != nullptr ? absl::StrCat("SIG", abbreviation) : absl::StrCat(value.number);
}

double NumericValue(Seconds value) { return value.value; }
double NumericValue(Count value) { return static_cast<double>(value.value); }

// A parsed number outside its setting's range becomes a problem like any bad value.
template <typename T>
absl::StatusOr<T> InRange(std::string_view variable, absl::StatusOr<T> parsed) {
  if constexpr (std::is_same_v<T, Seconds> || std::is_same_v<T, Count>) {
    const std::optional<SettingRange> range = RangeOf(variable);
    if (parsed.ok() && range &&
        !(NumericValue(*parsed) >= range->least && NumericValue(*parsed) <= range->greatest)) {
      return absl::InvalidArgumentError(
          absl::StrCat("is not between ", RangeBound(range->least), " and ", RangeBound(range->greatest)));
    }
  }
  return parsed;
}

template <typename T>
void ParseOption(const EnvironmentReader& read_environment, const char* name, T* field, Config* config) {
  std::string text;
  if (!read_environment(name, &text)) return;
  absl::StatusOr<T> parsed = InRange(name, ParseValue(text, field));
  if (parsed.ok()) {
    *field = *std::move(parsed);
    config->effective_values.push_back(absl::StrCat(name, "=", FormatValue(*field)));
  } else {
    config->problems.push_back(absl::StrCat(name, "='", RemoveUrlCredentials(text), "' ",
                                            std::string(parsed.status().message()), "; using the default '",
                                            FormatValue(*field), "'"));
  }
}

}  // namespace

bool ReadProcessEnvironment(const char* name, std::string* value) {
  const char* text = std::getenv(name);
  if (text == nullptr) return false;
  *value = text;
  return true;
}

std::string_view LogLevelName(LogLevel level) { return kLogLevelNames[static_cast<int>(level)]; }
std::string_view ActionName(Action action) { return kActionNames[static_cast<int>(action)]; }
std::string_view P2pModeName(P2pMode mode) { return kP2pModeNames[static_cast<int>(mode)]; }
std::string_view RecoverModeName(RecoverMode mode) { return kRecoverModeNames[static_cast<int>(mode)]; }

std::optional<SettingRange> RangeOf(std::string_view variable) {
#define NCCLGUARD_RANGE_OF(name, least, greatest) \
  if (variable == "NCCLGUARD_" #name) return SettingRange{least, greatest};
  NCCLGUARD_FOR_EACH_RANGE(NCCLGUARD_RANGE_OF)
#undef NCCLGUARD_RANGE_OF
  return std::nullopt;
}

Config ParseConfig(const EnvironmentReader& read_environment) {
  Config config;
#define NCCLGUARD_PARSE_OPTION(name, field, type, default_value, doc) \
  ParseOption(read_environment, "NCCLGUARD_" #name, &config.field, &config);
  NCCLGUARD_FOR_EACH_OPTION(NCCLGUARD_PARSE_OPTION)
#undef NCCLGUARD_PARSE_OPTION
  return config;
}

const Config& GetConfig() noexcept {
  // Published through an atomic pointer rather than call_once: no lock that a fork() could leave
  // held. Two threads racing on the first call both parse; one copy is kept, the other freed.
  static std::atomic<const Config*> parsed{nullptr};
  const Config* config = parsed.load(std::memory_order_acquire);
  if (config != nullptr) return *config;
  static const Config kDefaults;
  const Config* fresh = nullptr;
  try {
    fresh = new Config(ParseConfig(ReadProcessEnvironment));
  } catch (...) {
    return kDefaults;  // out of memory at start-up: run with the defaults
  }
  if (parsed.compare_exchange_strong(config, fresh, std::memory_order_acq_rel)) return *fresh;
  delete fresh;
  return *config;
}

std::string OptionsMarkdownTable() {
  std::string table = "| Variable | Type | Default | Meaning |\n|---|---|---|---|\n";
  const Config defaults;
#define NCCLGUARD_OPTION_ROW(name, field, type, default_value, doc)                                    \
  absl::StrAppend(&table, "| `NCCLGUARD_" #name "` | ", TypeText("NCCLGUARD_" #name, &defaults.field), \
                  " | `", FormatValue(defaults.field), "` | ", doc, " |\n");
  NCCLGUARD_FOR_EACH_OPTION(NCCLGUARD_OPTION_ROW)
#undef NCCLGUARD_OPTION_ROW
  return table;
}

}  // namespace ncclguard
