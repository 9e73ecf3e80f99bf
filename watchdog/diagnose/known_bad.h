// Known-bad configurations: machines where NCCL's P2P transport is known to hang or fail (a driver
// release, GPUs without working P2P, an old kernel), from one data file shipped with ncclguard
// (data/known-bad.json, format in docs/known-bad.md). Matching reads only ProcessFacts, so the
// same entries judge this process before its first communicator and, in the classifier, the
// facts that other processes left in their dumps.
#pragma once

#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "watchdog/common/config.h"
#include "watchdog/report/facts.h"

namespace ncclguard {

inline constexpr char kKnownBadFileName[] = "known-bad.json";
inline constexpr int kKnownBadFormatVersion = 1;

// Every criterion given must hold for an entry to match; a fact that is unknown holds none.
struct KnownBadCriteria {
  std::vector<std::string> driver_versions;  // NVML driver versions, exactly; empty: not a criterion
  std::optional<std::string> gpu_name;       // an ECMAScript regular expression found in a GPU's name
  std::optional<std::regex> gpu_name_pattern;
  std::optional<std::vector<int>> kernel_older_than;  // release numbers, e.g. {5, 5}
  std::optional<int> min_gpus;                        // at least this many visible GPUs
  std::optional<bool> p2p_enabled;  // NCCL_P2P_DISABLE / NCCL_P2P_LEVEL leave P2P on (true) or not
  std::optional<bool> peer_access;  // some two visible GPUs can access each other (true) or none can
};

enum class KnownBadAction {
  kWarn,     // report at the first init; evidence for a p2p_suspect verdict
  kDisable,  // also turn P2P off before the first init (NCCLGUARD_P2P=auto)
};

struct KnownBadEntry {
  std::string id;
  KnownBadCriteria match;
  KnownBadAction action = KnownBadAction::kWarn;
  std::string summary;  // what goes wrong, one sentence
  std::string remedy;   // what to do about it
  std::string source;   // where the knowledge comes from (the public report's URL)
};

// One fact that made a criterion hold.
struct MatchedFact {
  std::string criterion;    // the criterion's name in the data file, e.g. "gpu_name"
  std::string value;        // the fact, e.g. "NVIDIA GeForce RTX 4090"
  std::string description;  // for people, e.g. "GPU NVIDIA GeForce RTX 4090"
};

struct KnownBadMatch {
  const KnownBadEntry* entry = nullptr;  // points into the entries matched against
  std::vector<MatchedFact> facts;        // one per criterion of the entry
};

// Parses a known-bad document. `file` names it in errors, which say which entry and what is
// wrong; an unknown field or criterion is an error, never ignored.
absl::StatusOr<std::vector<KnownBadEntry>> ParseKnownBad(const std::string& content, const std::string& file);

absl::StatusOr<std::vector<KnownBadEntry>> LoadKnownBad(const std::string& path);

// The shipped file: share/ncclguard/known-bad.json found from the directory of the object that
// holds this code (libncclguard.so, or the ncclguard command), by the installed layout's relative
// paths. "" when that object cannot be found.
std::string DefaultKnownBadPath();

// NCCLGUARD_KNOWN_BAD_FILE, else DefaultKnownBadPath().
std::string KnownBadPath(const Config& config);

struct KnownBadList {
  std::string path;
  absl::Status status;  // why there are no entries, when the file could not be used
  std::vector<KnownBadEntry> entries;
};

// This process's entries (KnownBadPath of its configuration), loaded at the first call and kept.
// A file that cannot be read or parsed means no entries; the first call logs why (WARN).
const KnownBadList& ProcessKnownBad() noexcept;

// The entries whose every criterion holds for `facts`, in the entries' order.
std::vector<KnownBadMatch> MatchKnownBad(const std::vector<KnownBadEntry>& entries,
                                         const ProcessFacts& facts);

// "[id] fact, fact: summary" — one match for a log line.
std::string DescribeMatch(const KnownBadMatch& match);

std::string_view KnownBadActionName(KnownBadAction action);

// {"id", "action", "summary", "remedy", "source"}: an entry as reports show it.
nlohmann::json KnownBadEntryJson(const KnownBadEntry& entry);

}  // namespace ncclguard
