// Reads a dump document (docs/dump-format.md) back into the snapshot and facts it was written
// from, for the classifier and `ncclguard analyze`.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {

struct ParsedDump {
  ProcessSnapshot snapshot;
  ProcessFacts facts;
};

// Fields a dump may lack (added later, or by an earlier format version) are left at their
// defaults; a document of another format, a newer format version or the wrong shape is an error.
absl::StatusOr<ParsedDump> ParseDump(const std::string& content) noexcept;

// Parses a document read from a file ncclguard did not necessarily write: refuses nesting deeper
// than kMaxJsonDepth, and a document that would take more than kMaxMemoryPerByte times its
// (capped) size in memory, twice what a real one takes. Throws nlohmann::json's exceptions or
// std::runtime_error.
inline constexpr int kMaxJsonDepth = 32;
inline constexpr std::size_t kMaxMemoryPerByte = 12;
nlohmann::json ParseBoundedJson(const std::string& content);

// The largest communicator ncclguard believes in; a larger claimed `nranks` is not a real one.
inline constexpr int kMaxRanks = 1 << 17;
// Throws std::runtime_error unless 0 <= nranks <= kMaxRanks and -1 <= rank < nranks (0 and -1:
// not known yet), so that nothing a reader sizes by them exceeds kMaxRanks.
void CheckRanks(int rank, int nranks);

// The dump's sections of facts, shared with status files (dump.h writes them). They throw
// nlohmann::json's exceptions on a document of the wrong shape.
EnvironmentVariables ParseVariables(const nlohmann::json& object);
void ParseSystemFacts(const nlohmann::json& system, ProcessFacts& facts);

}  // namespace ncclguard
