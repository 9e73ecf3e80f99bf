// Reads a dump document (docs/dump-format.md) back into the snapshot and facts it was written
// from, for the classifier and `ncclguard analyze`.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "watchdog/facts.h"
#include "watchdog/snapshot.h"

namespace ncclguard {

struct ParsedDump {
  ProcessSnapshot snapshot;
  ProcessFacts facts;
};

// Fields a dump of this format version may lack (added later) are left at their defaults; a
// document of another format, another format version or the wrong shape is an error.
absl::StatusOr<ParsedDump> ParseDump(const std::string& content) noexcept;

// The dump's sections of facts, shared with status files (dump.h writes them). They throw
// nlohmann::json's exceptions on a document of the wrong shape.
EnvironmentVariables ParseVariables(const nlohmann::json& object);
void ParseSystemFacts(const nlohmann::json& system, ProcessFacts& facts);

}  // namespace ncclguard
