#include "watchdog/detect/fail_slow.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "watchdog/common/log.h"
#include "watchdog/common/mutex.h"
#include "watchdog/detect/watchdog.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/state/records.h"
#include "watchdog/state/registry.h"

namespace ncclguard {
namespace {

// The figure a verdict's size is told by: how much slower the link, how long the peers wait.
double FigureOf(const Verdict& verdict) {
  for (const char* key : {"ratio_to_median", "waited_ms_per_block"}) {
    if (const auto found = verdict.evidence.find(key); found != verdict.evidence.end() && found->is_number())
      return found->get<double>();
  }
  return 0;
}

// Changes smaller than this share of the figure are the same verdict: not said again.
constexpr double kChangeWorthSaying = 0.25;

}  // namespace

bool JudgesPace(Registry& registry) {
  int largest = 0;
  bool rank_zero_of_largest = false;
  for (const CommState* comm : registry.All()) {
    if (comm->lifecycle.load(std::memory_order_acquire) != CommLifecycle::kReady) continue;
    const int nranks = comm->nranks.load(std::memory_order_relaxed);
    const bool rank_zero = comm->rank.load(std::memory_order_relaxed) == 0;
    if (nranks > largest) {
      largest = nranks;
      rank_zero_of_largest = rank_zero;
    } else if (nranks == largest) {
      rank_zero_of_largest = rank_zero_of_largest || rank_zero;
    }
  }
  return largest >= 2 && rank_zero_of_largest;
}

std::string FailSlowReport::KeyOf(const Verdict& verdict) {
  std::string key = fmt::format("{}/{}", VerdictKindName(verdict.kind), verdict.comm);
  for (const int rank : verdict.ranks) key += fmt::format("/{}", rank);
  if (const auto channels = verdict.evidence.find("channels"); channels != verdict.evidence.end())
    key += fmt::format("/c{}", channels->dump());
  return key;
}

std::vector<FailSlowReport::Line> FailSlowReport::Update(const std::vector<Verdict>& verdicts) {
  std::vector<Line> lines;
  std::map<std::string, Held> now;
  std::map<std::string, int> pending;
  for (const Verdict& verdict : verdicts) {
    if (verdict.kind != VerdictKind::kSlowLink && verdict.kind != VerdictKind::kSlowRank) continue;
    const std::string key = KeyOf(verdict);
    const auto before = held_.find(key);
    if (before == held_.end()) {
      const int looks = pending_.contains(key) ? pending_.at(key) + 1 : 1;
      if (looks < kLooks) {
        pending.emplace(key, looks);
        continue;
      }
      ++reported_[std::string(VerdictKindName(verdict.kind))];
    }
    const double said = before != held_.end() ? FigureOf(before->second.verdict) : 0;
    if (before == held_.end() || std::fabs(FigureOf(verdict) - said) > kChangeWorthSaying * said) {
      lines.push_back(Line{.ended = false,
                           .text = fmt::format("{}: {}", VerdictKindName(verdict.kind), verdict.message)});
      now.emplace(key, Held{.verdict = verdict});
    } else {
      now.emplace(key, Held{.verdict = before->second.verdict});  // what was said stays what is held
    }
  }
  for (const auto& [key, held] : held_) {
    if (now.contains(key)) continue;
    if (held.missed + 1 < kLooks) {
      now.emplace(key, Held{.verdict = held.verdict, .missed = held.missed + 1});
      continue;
    }
    lines.push_back(Line{
        .ended = true,
        .text = fmt::format("{} ended: no longer so in the latest operations of communicator {} "
                            "(it was: {})",
                            VerdictKindName(held.verdict.kind), held.verdict.comm, held.verdict.message)});
  }
  held_ = std::move(now);
  pending_ = std::move(pending);
  return lines;
}

std::vector<FailSlowSnapshot> FailSlowReport::Current() const {
  std::vector<FailSlowSnapshot> current;
  for (const auto& [key, held] : held_) {
    const Verdict& verdict = held.verdict;
    current.push_back(FailSlowSnapshot{.kind = std::string(VerdictKindName(verdict.kind)),
                                       .comm_id = verdict.comm,
                                       .ranks = verdict.ranks,
                                       .message = verdict.message});
  }
  return current;
}

std::map<std::string, std::uint64_t> FailSlowReport::HeldByKind() const {
  std::map<std::string, std::uint64_t> counts;
  for (const auto& [key, held] : held_) ++counts[std::string(VerdictKindName(held.verdict.kind))];
  return counts;
}

void Watchdog::JudgePace(std::int64_t now_ns) {
  const auto interval_ns = static_cast<std::int64_t>(config_.slow_interval.value * 1e9);
  if (interval_ns <= 0 || !effects_.JobDirectoryKnown() || now_ns < next_pace_ns_) return;
  if (next_pace_ns_ == 0) {  // the first look after one interval: before it no block is complete
    next_pace_ns_ = now_ns + interval_ns;
    return;
  }
  // Never more often than the statuses it reads change.
  next_pace_ns_ = now_ns + std::max(interval_ns, status_interval_ns_);
  if (!JudgesPace(registry_)) return;
  std::vector<Verdict> verdicts;
  {
    Activity activity(*this, "judging the job's pace");
    verdicts = effects_.ClassifyFailSlow();
  }
  std::vector<FailSlowReport::Line> lines;
  {
    MutexLock lock(status_mutex_);
    lines = fail_slow_.Update(verdicts);
  }
  for (const FailSlowReport::Line& line : lines) log::Warn("{}", line.text);
  if (lines.empty()) return;
  RequestStatus();  // the board and the metrics say it at the next round, not an interval later
  PublishMetrics(true);
}

}  // namespace ncclguard
