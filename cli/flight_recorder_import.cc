#include "cli/flight_recorder_import.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "cli/pickle_reader.h"
#include "watchdog/common/bounded_threads.h"
#include "watchdog/common/files.h"
#include "watchdog/common/ranks.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/job_read.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {
namespace {

// PyTorch's default TORCH_NCCL_DEBUG_INFO_TEMP_FILE.
constexpr char kDefaultPrefix[] = "/tmp/nccl_trace_rank_";
// A dump of PyTorch's default 2,000 entries with stacks is a few megabytes.
constexpr std::size_t kMaxDumpBytes = 64 << 20;

std::string Text(const PickleValue* value) {
  return value != nullptr && value->IsString() ? value->text : "";
}
std::int64_t Integer(const PickleValue* value) {
  return value != nullptr && value->IsInt() ? value->integer : -1;
}

// "[0, 1, 2]", as pg_config writes a group's members.
std::vector<int> RankList(const std::string& text) {
  std::vector<int> ranks;
  for (absl::string_view part : absl::StrSplit(absl::StripPrefix(absl::StripSuffix(text, "]"), "["), ',')) {
    int rank = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &rank)) ranks.push_back(rank);
  }
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

// The innermost frame outside PyTorch itself: the user's line that called the collective.
std::string CallSite(const PickleValue* frames) {
  if (frames == nullptr || !frames->IsSequence()) return "";
  std::string first;
  for (const PickleValue& frame : frames->items) {
    const std::string file = Text(frame.Find("filename"));
    const std::string site = absl::StrCat(std::filesystem::path(file).filename().string(), ":",
                                          Integer(frame.Find("line")), " in ", Text(frame.Find("name")));
    if (first.empty()) first = site;
    if (!file.empty() && file.find("/torch/") == std::string::npos && file[0] != '<') return site;
  }
  return first;
}

FlightRecorderEntry EntryOf(const PickleValue& entry) {
  FlightRecorderEntry parsed;
  parsed.record_id = Integer(entry.Find("record_id"));
  if (const PickleValue* group = entry.Find("process_group");
      group != nullptr && group->IsSequence() && !group->items.empty()) {
    parsed.pg_name = Text(&group->items[0]);
  }
  parsed.collective_seq_id = Integer(entry.Find("collective_seq_id"));
  parsed.p2p_seq_id = Integer(entry.Find("p2p_seq_id"));
  parsed.profiling_name = Text(entry.Find("profiling_name"));
  parsed.state = Text(entry.Find("state"));
  parsed.call_site = CallSite(entry.Find("frames"));
  return parsed;
}

}  // namespace

absl::StatusOr<FlightRecorderDump> ParseFlightRecorderDump(std::string_view bytes) {
  absl::StatusOr<PickleValue> document = ReadPickle(bytes);
  if (!document.ok()) return document.status();
  if (document->kind != PickleValue::Kind::kDict || document->Find("entries") == nullptr) {
    return absl::InvalidArgumentError("not a Flight Recorder dump (no entries)");
  }
  FlightRecorderDump dump;
  dump.version = Text(document->Find("version"));
  if (const PickleValue* groups = document->Find("pg_config"); groups != nullptr) {
    for (std::size_t i = 0; i < groups->keys.size(); ++i) {
      const PickleValue& group = groups->values[i];
      dump.groups[groups->keys[i].text] =
          FlightRecorderGroup{.desc = Text(group.Find("desc")), .ranks = RankList(Text(group.Find("ranks")))};
    }
  }
  if (const PickleValue* entries = document->Find("entries"); entries->IsSequence()) {
    for (const PickleValue& entry : entries->items) dump.entries.push_back(EntryOf(entry));
  }
  std::stable_sort(
      dump.entries.begin(), dump.entries.end(),
      [](const FlightRecorderEntry& a, const FlightRecorderEntry& b) { return a.record_id < b.record_id; });
  return dump;
}

std::string FlightRecorderPrefix(const JobView& job, const std::string& named) {
  if (!named.empty()) {
    std::error_code error;
    return std::filesystem::is_directory(named, error) ? absl::StrCat(named, "/nccl_trace_rank_") : named;
  }
  bool dumps_on = false;
  for (const ProcessView& process : job.processes) {
    for (const auto& [name, value] : process.facts.environment) {
      if (name == "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" && !value.empty()) return value;
      if (name == "TORCH_NCCL_DUMP_ON_TIMEOUT" && value != "0") dumps_on = true;
    }
  }
  return dumps_on ? kDefaultPrefix : "";
}

FlightRecorderDumps ReadFlightRecorderDumps(const std::string& prefix, const std::vector<int>& ranks,
                                            std::chrono::milliseconds deadline) {
  FlightRecorderDumps dumps;
  dumps.prefix = prefix;
  const std::filesystem::path path(prefix);
  const std::string directory = path.has_parent_path() ? path.parent_path().string() : ".";
  const std::string base = path.filename().string();
  using Files = std::map<int, absl::StatusOr<std::string>>;
  const absl::StatusOr<Files> read = RunWithDeadline<Files>(
      [directory, base, ranks]() -> absl::StatusOr<Files> {
        const int directory_fd = open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (directory_fd < 0) return absl::NotFoundError(absl::StrCat("cannot open ", directory));
        Files files;
        for (const int rank : ranks)
          files.emplace(rank, ReadFileAt(directory_fd, base + std::to_string(rank), kMaxDumpBytes));
        close(directory_fd);
        return files;
      },
      deadline);
  if (!read.ok()) {
    dumps.problems.push_back(absl::StrCat("Flight Recorder dumps ", prefix, "*: ", read.status().message()));
    return dumps;
  }
  for (const auto& [rank, file] : *read) {
    if (absl::IsNotFound(file.status())) continue;  // that rank's PyTorch wrote none
    absl::StatusOr<FlightRecorderDump> dump =
        file.ok() ? ParseFlightRecorderDump(*file) : absl::StatusOr<FlightRecorderDump>(file.status());
    if (dump.ok()) {
      dumps.by_rank.emplace(rank, *std::move(dump));
    } else {
      dumps.problems.push_back(absl::StrCat(prefix, rank, ": ", dump.status().message()));
    }
  }
  return dumps;
}

namespace {

int GlobalRank(const ProcessView& process) {
  const int launcher = LauncherRank(process.facts);
  return launcher >= 0 ? launcher : process.snapshot.rank;
}

const CommSnapshot* CommOf(const ProcessView& process, const std::string& id) {
  for (const CommSnapshot& comm : process.snapshot.comms) {
    if (comm.id == id) return &comm;
  }
  return nullptr;
}

// The process group of `dump` that is `comm` on this rank: as many members, this rank at the
// communicator's rank among them; of several, the one with an operation not completed.
const std::pair<const std::string, FlightRecorderGroup>* GroupOf(const FlightRecorderDump& dump,
                                                                 const CommSnapshot& comm, int global_rank) {
  const std::pair<const std::string, FlightRecorderGroup>* found = nullptr;
  for (const auto& group : dump.groups) {
    const std::vector<int>& ranks = group.second.ranks;
    if (static_cast<int>(ranks.size()) != comm.nranks || comm.rank < 0 || comm.rank >= comm.nranks ||
        ranks[static_cast<std::size_t>(comm.rank)] != global_rank) {
      continue;
    }
    const bool waiting =
        std::any_of(dump.entries.begin(), dump.entries.end(), [&group](const FlightRecorderEntry& e) {
          return e.pg_name == group.first && e.state != "completed";
        });
    if (found == nullptr || waiting) found = &group;
  }
  return found;
}

}  // namespace

std::vector<int> RanksToRead(const JobView& job, const std::vector<Verdict>& verdicts, std::size_t max) {
  std::set<int> ranks;
  for (const Verdict& verdict : verdicts) {
    if (verdict.seq == 0) continue;
    for (const ProcessView& process : job.processes) {
      const CommSnapshot* comm = CommOf(process, verdict.comm);
      if (comm == nullptr) continue;
      const bool named =
          std::find(verdict.ranks.begin(), verdict.ranks.end(), comm->rank) != verdict.ranks.end();
      if (named || ranks.size() < max / 2) ranks.insert(GlobalRank(process));
      if (ranks.size() >= max) break;
    }
  }
  return {ranks.begin(), ranks.end()};
}

void AddFlightRecorderContext(const JobView& job, const FlightRecorderDumps& dumps,
                              std::vector<Verdict>& verdicts) {
  for (Verdict& verdict : verdicts) {
    if (verdict.seq == 0) continue;
    // (group, operation, call site) → the ranks where PyTorch's oldest unfinished operation is that.
    std::map<std::tuple<std::string, std::string, std::int64_t, std::string>, std::vector<int>> sites;
    std::string desc;
    for (const ProcessView& process : job.processes) {
      const CommSnapshot* comm = CommOf(process, verdict.comm);
      const auto dump = dumps.by_rank.find(GlobalRank(process));
      if (comm == nullptr || dump == dumps.by_rank.end()) continue;
      const auto* group = GroupOf(dump->second, *comm, GlobalRank(process));
      if (group == nullptr) continue;
      desc = group->second.desc;
      const auto& entries = dump->second.entries;
      const auto stuck = std::find_if(entries.begin(), entries.end(), [group](const FlightRecorderEntry& e) {
        return e.pg_name == group->first && e.state != "completed";
      });
      if (stuck == entries.end()) continue;
      sites[{group->first, stuck->profiling_name, stuck->collective_seq_id, stuck->call_site}].push_back(
          comm->rank);
    }
    if (sites.empty()) continue;
    nlohmann::json found = nlohmann::json::array();
    std::vector<std::string> clauses;
    for (const auto& [site, ranks] : sites) {
      const auto& [pg, operation, seq, call_site] = site;
      found.push_back({{"pg_name", pg},
                       {"pg_desc", desc},
                       {"profiling_name", operation},
                       {"collective_seq_id", seq},
                       {"call_site", call_site},
                       {"ranks", ranks}});
      clauses.push_back(absl::StrCat(operation, " #", seq, " of pg ", pg,
                                     desc.empty() ? "" : absl::StrCat(" (", desc, ")"),
                                     call_site.empty() ? "" : absl::StrCat(" called at ", call_site),
                                     " on ranks ", FormatRanks(ranks, kRanksInMessages)));
    }
    verdict.evidence["flight_recorder"] = found;
    verdict.message += absl::StrCat("; PyTorch's Flight Recorder: ", absl::StrJoin(clauses, "; "));
  }
}

}  // namespace ncclguard
