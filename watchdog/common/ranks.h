// Lists of ranks as people read them: "0-3, 5", so that the thousands of ranks of a large job
// stay one line. The one formatter for rank lists in messages, logs and reports.
#pragma once

#include <cstddef>
#include <limits>
#include <string>
#include <vector>

namespace ncclguard {

struct RankListStyle {
  const char* separator = ", ";
  // Runs of consecutive ranks at least this long are written "first-last"; shorter ones rank by rank.
  std::size_t min_range = 2;
  // After this many parts (a rank or a range), "... (N ranks)" ends the list.
  std::size_t max_parts = std::numeric_limits<std::size_t>::max();
};

// In verdict messages: "0,1,2" stays explicit, "0-1023" keeps a big job's message short.
inline constexpr RankListStyle kRanksInMessages{.separator = ",", .min_range = 4};

// The ranks sorted, each once: "0-2, 5, 7-16383" in the default style.
std::string FormatRanks(std::vector<int> ranks, const RankListStyle& style = {});

}  // namespace ncclguard
