// ncclguard's settings, read once from NCCLGUARD_* environment variables (see config_table.h).
#pragma once

#include <csignal>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "watchdog/common/config_table.h"

namespace ncclguard {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kOff };
enum class Action { kWarn, kAbort, kExit, kReinit };
// NCCLGUARD_P2P: whether ncclguard may turn NCCL's P2P transport off before the first init.
enum class P2pMode { kAuto, kOn, kOff };
enum class RecoverMode { kOff, kInProcess };

// Value types of settings that need more than a C++ type says.
struct Seconds {  // a number of seconds, at least 0 (each setting's range says more)
  double value;
  bool operator==(const Seconds&) const = default;
};
struct Count {  // a positive count
  long value;
  bool operator==(const Count&) const = default;
};
struct Signal {  // a signal number; 0 means none
  int number;
  bool operator==(const Signal&) const = default;
};

// The exit code of NCCLGUARD_ACTION=exit and =reinit: EX_TEMPFAIL, "try again", for launchers to restart on.
inline constexpr int kRestartExitCode = 75;

struct Config {
#define NCCLGUARD_CONFIG_FIELD(name, field, type, default_value, doc) type field = default_value;
  NCCLGUARD_FOR_EACH_OPTION(NCCLGUARD_CONFIG_FIELD)
#undef NCCLGUARD_CONFIG_FIELD

  // One line per variable that was set, with its effective value and where it came from.
  std::vector<std::string> effective_values;
  // One message per variable whose value could not be used; the default was used instead.
  std::vector<std::string> problems;
};

// Reads a variable's value; returns false when it is unset. A seam so tests need no setenv.
using EnvironmentReader = std::function<bool(const char* name, std::string* value)>;

Config ParseConfig(const EnvironmentReader& read_environment);

// The process's real environment, as an EnvironmentReader.
bool ReadProcessEnvironment(const char* name, std::string* value);

// The process's configuration, parsed from the real environment on first use and kept for the
// life of the process (a forked child keeps its parent's). Never fails: bad values become
// problems and defaults.
const Config& GetConfig() noexcept;

// The accepted range of a numeric setting, inclusive (NCCLGUARD_FOR_EACH_RANGE); std::nullopt for
// a setting that is not a number.
struct SettingRange {
  double least;
  double greatest;
};
std::optional<SettingRange> RangeOf(std::string_view variable);

// The table of variables in docs/settings.md, generated from config_table.h.
std::string OptionsMarkdownTable();

std::string_view LogLevelName(LogLevel level);
std::string_view ActionName(Action action);
std::string_view P2pModeName(P2pMode mode);
std::string_view RecoverModeName(RecoverMode mode);

}  // namespace ncclguard
