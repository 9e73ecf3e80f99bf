// Fail-slow, while the job runs: one process of the job judges the pace of every communicator from
// the ranks' statuses (their pace blocks) at an interval (NCCLGUARD_SLOW_INTERVAL), and says each
// slow_link and slow_rank verdict once when it appears, again when it changes, and when it ends. A
// report only: nothing is ever done to the job for it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/state/registry.h"

namespace ncclguard {

// Whether this process judges the job's pace: it holds rank 0 of the largest communicator it is in.
// One process per job where every rank shares a world communicator, a few where the largest ones
// are several (each judges the whole job: what it reads grows with the job, not with the judges).
bool JudgesPace(Registry& registry);

// What was said, and what is to be said next.
class FailSlowReport {
 public:
  struct Line {
    bool ended = false;  // the verdict no longer holds
    std::string text;
  };
  // The judgement of a new look at the job; the lines to log, each verdict that appeared (found by
  // kLooks looks in a row: one look may compare ranks caught at different moments, as a slowness
  // begins or ends) or changed (its figure by more than a quarter), and each that ended (missing
  // from kLooks looks in a row: one look may miss it for want of one rank's latest figures).
  std::vector<Line> Update(const std::vector<Verdict>& verdicts);
  // The verdicts held now, as statuses carry them.
  std::vector<FailSlowSnapshot> Current() const;
  // How many of each kind are held now, and how many were reported since the process started.
  std::map<std::string, std::uint64_t> HeldByKind() const;
  const std::map<std::string, std::uint64_t>& ReportedByKind() const { return reported_; }

 private:
  // A verdict's identity across looks: its kind, communicator, ranks and (for a link) channel.
  static std::string KeyOf(const Verdict& verdict);
  static constexpr int kLooks = 2;
  struct Held {
    Verdict verdict;
    int missed = 0;  // looks in a row that did not find it
  };
  std::map<std::string, Held> held_;
  std::map<std::string, int> pending_;  // found, not yet by kLooks looks in a row: how many
  std::map<std::string, std::uint64_t> reported_;
};

}  // namespace ncclguard
