// Rank lists for people (ranks.h).
#include "watchdog/common/ranks.h"

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ncclguard {

std::string FormatRanks(std::vector<int> ranks, const RankListStyle& style) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::vector<std::string> parts;
  for (std::size_t first = 0; first < ranks.size();) {
    std::size_t last = first;
    while (last + 1 < ranks.size() && ranks[last + 1] == ranks[last] + 1) ++last;
    if (last - first + 1 >= style.min_range) {
      parts.push_back(absl::StrCat(ranks[first], "-", ranks[last]));
    } else {
      for (std::size_t rank = first; rank <= last; ++rank) parts.push_back(absl::StrCat(ranks[rank]));
    }
    first = last + 1;
  }
  if (parts.size() > style.max_parts) {
    parts.resize(style.max_parts);
    parts.push_back(absl::StrCat("... (", ranks.size(), " ranks)"));
  }
  return absl::StrJoin(parts, style.separator);
}

}  // namespace ncclguard
