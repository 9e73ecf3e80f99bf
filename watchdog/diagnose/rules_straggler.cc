// straggler: one rank consistently last into the collectives, by a large margin.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "watchdog/diagnose/rules.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard::classifier {
// One rank consistently last into the collectives that every rank's ring holds. Enqueue times
// only: GPU start times are seen at the watchdog's poll interval, too coarse for this.
void ClassifyStraggler(const Communicator& communicator, Buckets& buckets) {
  constexpr size_t kMinCommonOps = 10;
  constexpr double kLatestShare = 0.8;
  constexpr double kMinLatenessMs = 50;
  constexpr double kMinRatio = 5;
  const size_t nranks = communicator.members.size();
  if (nranks < 2 || static_cast<int>(nranks) != communicator.nranks) return;
  // Pipeline stages (their numbers differ) enter a collective later the later their stage, each
  // after the receives before it: lateness says nothing of time spent outside NCCL there.
  if (communicator.numbers_differ) return;
  struct Arrival {
    std::uint64_t seq;
    size_t member;
    std::int64_t enqueue_ns;
  };
  std::vector<Arrival> arrivals;
  for (size_t i = 0; i < nranks; ++i) {
    for (const OpSnapshot& op : communicator.members[i].comm->ring) {
      if (op.enqueue_ns > 0 && !IsPointToPoint(op)) arrivals.push_back(Arrival{op.seq, i, op.enqueue_ns});
    }
  }
  std::sort(arrivals.begin(), arrivals.end(), [](const Arrival& a, const Arrival& b) {
    return a.seq != b.seq ? a.seq < b.seq : a.member < b.member;
  });
  std::vector<std::pair<size_t, size_t>> common;  // [begin, end) of each seq every rank holds
  std::vector<size_t> latest_count(nranks, 0);
  for (size_t begin = 0; begin < arrivals.size();) {
    size_t end = begin;
    while (end < arrivals.size() && arrivals[end].seq == arrivals[begin].seq) ++end;
    if (end - begin == nranks) {
      common.emplace_back(begin, end);
      const auto latest =
          std::max_element(arrivals.begin() + begin, arrivals.begin() + end,
                           [](const Arrival& a, const Arrival& b) { return a.enqueue_ns < b.enqueue_ns; });
      ++latest_count[latest->member];
    }
    begin = end;
  }
  if (common.size() < kMinCommonOps) return;
  const size_t candidate =
      static_cast<size_t>(std::max_element(latest_count.begin(), latest_count.end()) - latest_count.begin());
  if (latest_count[candidate] < kLatestShare * static_cast<double>(common.size())) return;
  std::vector<double> candidate_lateness_ms;
  std::vector<double> others_median_ms;
  for (const auto& [begin, end] : common) {
    std::int64_t earliest = std::numeric_limits<std::int64_t>::max();
    for (size_t i = begin; i < end; ++i) earliest = std::min(earliest, arrivals[i].enqueue_ns);
    std::vector<double> others;
    for (size_t i = begin; i < end; ++i) {
      const double lateness_ms = static_cast<double>(arrivals[i].enqueue_ns - earliest) / 1e6;
      if (arrivals[i].member == candidate) {
        candidate_lateness_ms.push_back(lateness_ms);
      } else {
        others.push_back(lateness_ms);
      }
    }
    others_median_ms.push_back(Median(std::move(others)));
  }
  const double median_ms = Median(candidate_lateness_ms);
  const double others_ms = Median(others_median_ms);
  if (median_ms < kMinLatenessMs || median_ms < kMinRatio * others_ms) return;
  const int rank = communicator.members[candidate].rank;
  Add(buckets, kStraggler, communicator.id, 0, {rank},
      fmt::format(
          "rank {} enters collectives a median {:.0f} ms after the others (latest in {} of {}): it is "
          "slow outside NCCL (data loading, compute)",
          rank, median_ms, latest_count[candidate], common.size()),
      Json{{"median_lateness_ms", median_ms},
           {"others_median_lateness_ms", others_ms},
           {"latest_in", latest_count[candidate]},
           {"common_ops", common.size()}});
}

}  // namespace ncclguard::classifier
