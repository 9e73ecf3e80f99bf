#include "watchdog/common/launcher.h"

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "absl/strings/numbers.h"

namespace ncclguard {

int LauncherRankFrom(VariableLookup lookup) {
  for (const std::string_view variable : kLauncherRankVariables) {
    const std::optional<std::string> value = lookup(variable);
    int rank = -1;
    if (value && absl::SimpleAtoi(*value, &rank) && rank >= 0) return rank;
  }
  return -1;
}

int LauncherRankFromEnvironment() {
  return LauncherRankFrom([](std::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  });
}

}  // namespace ncclguard
