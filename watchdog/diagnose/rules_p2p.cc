// p2p_suspect: a fault on a communicator whose ranks share a host, with evidence against P2P in
// their facts (known-bad entries) or in NCCL's warnings.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "watchdog/diagnose/job_view.h"
#include "watchdog/diagnose/known_bad.h"
#include "watchdog/diagnose/rules.h"
#include "watchdog/report/facts.h"

namespace ncclguard::classifier {
namespace {

bool MentionsP2pTrouble(const std::string& warning) {
  std::string lower = warning;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* needle : {"failed to peer", "peer access", "cudaipc", "p2p"}) {
    if (absl::StrContains(lower, needle)) return true;
  }
  return false;
}

// Evidence that P2P transfers are behind a fault on this communicator; null when there is none.
// Only facts (from dumps and status files) and NCCL's warnings can tell: the known-bad entries
// (known_bad.h) that match a member's facts, and NCCL warnings about P2P.
Json P2pEvidence(const Communicator& communicator, const std::vector<KnownBadEntry>& entries) {
  std::set<std::string> hosts;
  bool shares_a_host = false;
  std::set<std::string> gpus;      // GPU names that a known-bad entry matched
  std::set<std::string> drivers;   // driver versions that a known-bad entry matched
  Json known_bad = Json::array();  // per matching entry, in the data file's order of first match
  std::vector<std::string> warnings;
  for (const Member& member : communicator.members) {
    const ProcessView& process = *member.process;
    // P2P connects GPUs of one node only.
    shares_a_host = shares_a_host || !hosts.insert(process.host).second;
    if (P2pDisabledBy(process.facts.environment)) return nullptr;
    for (const KnownBadMatch& match : MatchKnownBad(entries, process.facts)) {
      for (const MatchedFact& fact : match.facts) {
        if (fact.criterion == "gpu_name") gpus.insert(fact.value);
        if (fact.criterion == "driver_versions") drivers.insert(fact.value);
      }
      auto entry = std::find_if(known_bad.begin(), known_bad.end(),
                                [&](const Json& known) { return known["id"] == match.entry->id; });
      if (entry == known_bad.end()) {
        known_bad.push_back(KnownBadEntryJson(*match.entry));
        known_bad.back()["ranks"] = Json::array();
        entry = known_bad.end() - 1;
      }
      (*entry)["ranks"].push_back(member.rank);
    }
    const std::string& warning = process.snapshot.last_nccl_warning;
    if (MentionsP2pTrouble(warning) &&
        std::find(warnings.begin(), warnings.end(), warning) == warnings.end()) {
      warnings.push_back(warning);
    }
  }
  if (!shares_a_host || (known_bad.empty() && warnings.empty())) return nullptr;
  return Json{
      {"consumer_gpus", gpus}, {"drivers", drivers}, {"known_bad", known_bad}, {"warnings", warnings}};
}

std::string P2pMessage(const std::string& what, const Json& evidence,
                       const std::vector<KnownBadEntry>& entries) {
  std::string message = what + " with P2P in use";
  if (!evidence["consumer_gpus"].empty()) {
    message += fmt::format(" on {} GPUs",
                           absl::StrJoin(evidence["consumer_gpus"].get<std::vector<std::string>>(), ", "));
  }
  if (!evidence["drivers"].empty()) {
    message += fmt::format(" with driver {}",
                           absl::StrJoin(evidence["drivers"].get<std::vector<std::string>>(), ", "));
  }
  // Entries that name no GPU or driver (a kernel release, the number of GPUs) are named by their id.
  std::vector<std::string> other_entries;
  for (const Json& matched : evidence["known_bad"]) {
    for (const KnownBadEntry& entry : entries) {
      if (matched["id"] == Json(entry.id) && !entry.match.gpu_name && entry.match.driver_versions.empty()) {
        other_entries.push_back(entry.id);
      }
    }
  }
  if (!other_entries.empty())
    message += fmt::format(" on a known-bad configuration ({})", absl::StrJoin(other_entries, ", "));
  if (!evidence["warnings"].empty()) {
    message += fmt::format(" (NCCL warned: \"{}\")", evidence["warnings"][0].get<std::string>());
  }
  message += ": P2P transfers are the likely cause; NCCL_P2P_DISABLE=1 avoids them";
  return message;
}

}  // namespace

void AddP2pSuspectIfAny(Buckets& buckets, const Communicator& communicator,
                        const std::vector<KnownBadEntry>& known_bad, std::uint64_t seq,
                        const std::vector<int>& ranks, const std::string& what) {
  Json evidence = P2pEvidence(communicator, known_bad);
  if (evidence.is_null()) return;
  std::string message = P2pMessage(what, evidence, known_bad);
  Add(buckets, kP2pSuspect, communicator.id, seq, ranks, std::move(message), std::move(evidence));
}

}  // namespace ncclguard::classifier
