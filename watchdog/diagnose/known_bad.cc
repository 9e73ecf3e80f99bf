#include "watchdog/diagnose/known_bad.h"

#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "watchdog/common/config.h"
#include "watchdog/common/files.h"
#include "watchdog/common/log.h"
#include "watchdog/common/version.h"
#include "watchdog/report/dump_reader.h"
#include "watchdog/report/facts.h"

namespace ncclguard {
namespace {

using Json = nlohmann::json;

// The shipped list is a few KiB; a file a thousand times larger is not a list of entries.
constexpr std::size_t kMaxKnownBadBytes = 4 << 20;

constexpr const char* kActionNames[] = {"warn", "disable"};

// What is wrong with one part of the document; ParseKnownBad adds the file and the entry.
struct FormatError {
  std::string what;
};

const Json& Field(const Json& object, const char* name) {
  const auto found = object.find(name);
  if (found == object.end()) throw FormatError{fmt::format("lacks \"{}\"", name)};
  return *found;
}

std::string Text(const Json& object, const char* name) {
  const Json& value = Field(object, name);
  if (!value.is_string() || value.get<std::string>().empty()) {
    throw FormatError{fmt::format("\"{}\" must be a non-empty string", name)};
  }
  return value.get<std::string>();
}

// "5.5" or "5.4.0-150-generic" → {5, 5} or {5, 4, 0}: the leading dot-separated numbers.
std::optional<std::vector<int>> ReleaseNumbers(const std::string& release) {
  std::vector<int> numbers;
  const std::vector<std::string> parts =
      absl::StrSplit(release.substr(0, release.find_first_not_of("0123456789.")), '.');
  for (const std::string& part : parts) {
    int number = 0;
    if (!absl::SimpleAtoi(part, &number) || number < 0) break;
    numbers.push_back(number);
  }
  if (numbers.empty()) return std::nullopt;
  return numbers;
}

// Compares release numbers as versions: missing trailing numbers count as 0.
bool OlderThan(std::vector<int> release, std::vector<int> threshold) {
  const size_t length = std::max(release.size(), threshold.size());
  release.resize(length, 0);
  threshold.resize(length, 0);
  return release < threshold;
}

KnownBadCriteria ParseCriteria(const Json& match) {
  if (!match.is_object() || match.empty())
    throw FormatError{"\"match\" must be an object with at least one criterion"};
  KnownBadCriteria criteria;
  for (const auto& [name, value] : match.items()) {
    if (name == "driver_versions") {
      if (!value.is_array() || value.empty())
        throw FormatError{"\"driver_versions\" must be a non-empty array of strings"};
      for (const Json& version : value) {
        if (!version.is_string() || version.get<std::string>().empty()) {
          throw FormatError{"\"driver_versions\" must be a non-empty array of strings"};
        }
        criteria.driver_versions.push_back(version.get<std::string>());
      }
    } else if (name == "gpu_name") {
      if (!value.is_string() || value.get<std::string>().empty())
        throw FormatError{"\"gpu_name\" must be a non-empty string"};
      criteria.gpu_name = value.get<std::string>();
      try {
        criteria.gpu_name_pattern.emplace(*criteria.gpu_name, std::regex::ECMAScript | std::regex::optimize);
      } catch (const std::regex_error& error) {
        throw FormatError{fmt::format("\"gpu_name\" is not a regular expression: {}", error.what())};
      }
    } else if (name == "kernel_older_than") {
      const std::optional<std::vector<int>> numbers =
          value.is_string() ? ReleaseNumbers(value.get<std::string>()) : std::nullopt;
      if (!numbers || value.get<std::string>().find_first_not_of("0123456789.") != std::string::npos) {
        throw FormatError{"\"kernel_older_than\" must be a release such as \"5.5\""};
      }
      criteria.kernel_older_than = numbers;
    } else if (name == "min_gpus") {
      if (!value.is_number_integer() || value.get<int>() < 1)
        throw FormatError{"\"min_gpus\" must be an integer of at least 1"};
      criteria.min_gpus = value.get<int>();
    } else if (name == "p2p_enabled" || name == "peer_access") {
      if (!value.is_boolean()) throw FormatError{fmt::format("\"{}\" must be true or false", name)};
      (name == "p2p_enabled" ? criteria.p2p_enabled : criteria.peer_access) = value.get<bool>();
    } else {
      throw FormatError{
          fmt::format("unknown criterion \"{}\" (known: driver_versions, gpu_name, kernel_older_than, "
                      "min_gpus, p2p_enabled, peer_access)",
                      name)};
    }
  }
  return criteria;
}

KnownBadEntry ParseEntry(const Json& entry) {
  if (!entry.is_object()) throw FormatError{"is not an object"};
  static const std::set<std::string> kFields = {"id", "match", "action", "summary", "remedy", "source"};
  for (const auto& [name, value] : entry.items()) {
    if (!kFields.contains(name)) throw FormatError{fmt::format("unknown field \"{}\"", name)};
  }
  KnownBadEntry parsed;
  parsed.id = Text(entry, "id");
  parsed.match = ParseCriteria(Field(entry, "match"));
  const std::string action = Text(entry, "action");
  if (action == "warn") {
    parsed.action = KnownBadAction::kWarn;
  } else if (action == "disable") {
    parsed.action = KnownBadAction::kDisable;
  } else {
    throw FormatError{fmt::format("\"action\" is \"{}\", not warn or disable", action)};
  }
  parsed.summary = Text(entry, "summary");
  parsed.remedy = Text(entry, "remedy");
  parsed.source = Text(entry, "source");
  return parsed;
}

// The first pair of different devices with `access` between them, as "i and j".
std::optional<std::string> SomePeerPair(const std::vector<std::vector<int>>& access) {
  for (size_t from = 0; from < access.size(); ++from) {
    for (size_t to = 0; to < access[from].size(); ++to) {
      if (from != to && access[from][to] != 0) return fmt::format("{} and {}", from, to);
    }
  }
  return std::nullopt;
}

// The facts that make `criteria` hold; `all_hold` says whether every criterion did.
std::vector<MatchedFact> MatchCriteria(const KnownBadCriteria& criteria, const ProcessFacts& facts,
                                       bool* all_hold) {
  std::vector<MatchedFact> matched;
  *all_hold = true;
  auto require = [&](bool holds, const char* criterion, std::string value, std::string description) {
    if (holds) {
      matched.push_back(MatchedFact{criterion, std::move(value), std::move(description)});
    } else {
      *all_hold = false;
    }
  };
  if (!criteria.driver_versions.empty()) {
    const auto& versions = criteria.driver_versions;
    require(std::find(versions.begin(), versions.end(), facts.driver_version) != versions.end(),
            "driver_versions", facts.driver_version, "driver " + facts.driver_version);
  }
  if (criteria.gpu_name_pattern) {
    // The process's GPUs, else the host's (before the process initialised CUDA).
    std::vector<std::string> names;
    names.reserve(facts.cuda.gpus.size());
    for (const GpuFacts& gpu : facts.cuda.gpus) names.push_back(gpu.name);
    if (names.empty()) names = facts.host_gpu_names;
    const auto name = std::find_if(names.begin(), names.end(), [&](const std::string& candidate) {
      return std::regex_search(candidate, *criteria.gpu_name_pattern);
    });
    const bool found = name != names.end();
    require(found, "gpu_name", found ? *name : "", found ? "GPU " + *name : "");
  }
  if (criteria.kernel_older_than) {
    const std::optional<std::vector<int>> release = ReleaseNumbers(facts.kernel_release);
    require(release && OlderThan(*release, *criteria.kernel_older_than), "kernel_older_than",
            facts.kernel_release,
            fmt::format("kernel {} (older than {})", facts.kernel_release,
                        absl::StrJoin(*criteria.kernel_older_than, ".")));
  }
  if (criteria.min_gpus) {
    // The GPUs visible to the process, else the host's (before the process initialised CUDA).
    const bool visible = facts.cuda.device_count >= 0;
    const int count = visible                        ? facts.cuda.device_count
                      : facts.host_gpu_names.empty() ? -1
                                                     : static_cast<int>(facts.host_gpu_names.size());
    require(count >= *criteria.min_gpus, "min_gpus", std::to_string(count),
            fmt::format("{} GPUs {}", count, visible ? "visible" : "on the host"));
  }
  if (criteria.p2p_enabled) {
    const bool enabled = !P2pDisabledBy(facts.environment);
    require(enabled == *criteria.p2p_enabled, "p2p_enabled", enabled ? "true" : "false",
            enabled ? "P2P not disabled" : "P2P disabled");
  }
  if (criteria.peer_access) {
    // Peer access needs two GPUs: with fewer, or an unknown matrix, neither value holds.
    const std::optional<std::string> pair = SomePeerPair(facts.cuda.peer_access);
    require(facts.cuda.peer_access.size() >= 2 && pair.has_value() == *criteria.peer_access, "peer_access",
            pair ? "true" : "false",
            pair ? "GPUs " + *pair + " have peer access" : "no GPU has peer access to another");
  }
  return matched;
}

}  // namespace

std::string_view KnownBadActionName(KnownBadAction action) { return kActionNames[static_cast<int>(action)]; }

Json KnownBadEntryJson(const KnownBadEntry& entry) {
  return Json{{"id", entry.id},
              {"action", KnownBadActionName(entry.action)},
              {"summary", entry.summary},
              {"remedy", entry.remedy},
              {"source", entry.source}};
}

absl::StatusOr<std::vector<KnownBadEntry>> ParseKnownBad(const std::string& content,
                                                         const std::string& file) {
  Json document;
  try {
    document = ParseBoundedJson(content);
  } catch (const std::exception& error) {
    return absl::InvalidArgumentError(fmt::format("{}: not JSON: {}", file, error.what()));
  }
  std::string where = file;
  try {
    if (!document.is_object()) throw FormatError{"is not a JSON object"};
    if (const Json& format = Field(document, "format"); format != "ncclguard-known-bad") {
      throw FormatError{fmt::format("\"format\" is {}, not \"ncclguard-known-bad\"", format.dump())};
    }
    if (const Json& version = Field(document, "format_version"); version != kKnownBadFormatVersion) {
      throw FormatError{
          fmt::format("\"format_version\" is {}, not {}", version.dump(), kKnownBadFormatVersion)};
    }
    const Json& entries = Field(document, "entries");
    if (!entries.is_array()) throw FormatError{"\"entries\" is not an array"};
    std::vector<KnownBadEntry> parsed;
    std::set<std::string> ids;
    for (size_t index = 0; index < entries.size(); ++index) {
      const Json& entry = entries[index];
      where = fmt::format("{}: entry {}", file, index + 1);
      if (entry.is_object() && entry.contains("id") && entry["id"].is_string()) {
        where += fmt::format(" (\"{}\")", entry["id"].get<std::string>());
      }
      parsed.push_back(ParseEntry(entry));
      if (!ids.insert(parsed.back().id).second) throw FormatError{"repeats an id used by an earlier entry"};
    }
    return parsed;
  } catch (const FormatError& error) {
    return absl::InvalidArgumentError(fmt::format("{}: {}", where, error.what));
  } catch (const Json::exception& error) {
    return absl::InvalidArgumentError(fmt::format("{}: {}", where, error.what()));
  }
}

absl::StatusOr<std::vector<KnownBadEntry>> LoadKnownBad(const std::string& path) {
  const absl::StatusOr<std::string> content = ReadRegularFile(path, kMaxKnownBadBytes);
  if (!content.ok())
    return absl::Status(content.status().code(),
                        fmt::format("cannot read {}", std::string(content.status().message())));
  return ParseKnownBad(*content, path);
}

std::string DefaultKnownBadPath() {
  Dl_info info{};
  link_map* object = nullptr;
  if (dladdr1(reinterpret_cast<const void*>(&DefaultKnownBadPath), &info, reinterpret_cast<void**>(&object),
              RTLD_DL_LINKMAP) == 0 ||
      object == nullptr) {
    return "";
  }
  // The main program's link map has an empty name: this code is then in the ncclguard command.
  const bool in_program = object->l_name == nullptr || object->l_name[0] == '\0';
  const std::unique_ptr<char, decltype(&free)> resolved(
      realpath(in_program ? "/proc/self/exe" : object->l_name, nullptr), &free);
  if (resolved == nullptr) return "";
  const std::filesystem::path object_directory = std::filesystem::path(resolved.get()).parent_path();
  return (object_directory / (in_program ? kDataDirFromBinDir : kDataDirFromLibDir) / kKnownBadFileName)
      .lexically_normal()
      .string();
}

std::string KnownBadPath(const Config& config) {
  return config.known_bad_file.empty() ? DefaultKnownBadPath() : config.known_bad_file;
}

const KnownBadList& ProcessKnownBad() noexcept {
  // Never destroyed: made at the first stall, it would be destroyed at exit before ncclguard's exit
  // hooks have stopped its threads. In static storage, so that making it allocates nothing that
  // could fail in this noexcept function.
  alignas(KnownBadList) static unsigned char storage[sizeof(KnownBadList)];
  static const KnownBadList* list = new (storage) KnownBadList([] {
    KnownBadList loaded;
    try {
      loaded.path = KnownBadPath(GetConfig());
      if (loaded.path.empty()) {
        loaded.status = absl::NotFoundError("cannot find ncclguard's data directory");
      } else if (absl::StatusOr<std::vector<KnownBadEntry>> entries = LoadKnownBad(loaded.path);
                 entries.ok()) {
        loaded.entries = std::move(*entries);
      } else {
        loaded.status = entries.status();
      }
    } catch (...) {
      loaded.entries.clear();
      loaded.status = absl::ResourceExhaustedError("out of memory loading the known-bad configurations");
    }
    if (!loaded.status.ok()) {
      log::Warn("known-bad configurations not checked: {} (set NCCLGUARD_KNOWN_BAD_FILE)",
                std::string(loaded.status.message()));
    }
    return loaded;
  }());
  return *list;
}

std::vector<KnownBadMatch> MatchKnownBad(const std::vector<KnownBadEntry>& entries,
                                         const ProcessFacts& facts) {
  std::vector<KnownBadMatch> matches;
  for (const KnownBadEntry& entry : entries) {
    bool all_hold = false;
    std::vector<MatchedFact> matched = MatchCriteria(entry.match, facts, &all_hold);
    if (all_hold) matches.push_back(KnownBadMatch{.entry = &entry, .facts = std::move(matched)});
  }
  return matches;
}

std::string DescribeMatch(const KnownBadMatch& match) {
  std::vector<std::string> facts;
  facts.reserve(match.facts.size());
  for (const MatchedFact& fact : match.facts) facts.push_back(fact.description);
  return fmt::format("[{}] {}: {}", match.entry->id, absl::StrJoin(facts, ", "), match.entry->summary);
}

}  // namespace ncclguard
