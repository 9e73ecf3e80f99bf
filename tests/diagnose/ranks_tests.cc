// The one rank-list formatter: ranges in reports, short runs kept explicit in verdict messages.
#include <catch2/catch.hpp>

#include "watchdog/common/ranks.h"

namespace ncclguard {
namespace {

TEST_CASE("rank lists are sorted, each rank once, runs as ranges", "[ranks]") {
  CHECK(FormatRanks({}).empty());
  CHECK(FormatRanks({3}) == "3");
  CHECK(FormatRanks({5, 0, 2, 1, 7, 8, 2}) == "0-2, 5, 7-8");
  CHECK(FormatRanks({0, 1, 2, 3, 5, 6, 7, 8, 9}) == "0-3, 5-9");
}

TEST_CASE("verdict messages keep runs shorter than four explicit", "[ranks]") {
  CHECK(FormatRanks({2, 0, 1}, kRanksInMessages) == "0,1,2");
  CHECK(FormatRanks({0, 1, 2, 3, 5, 6}, kRanksInMessages) == "0-3,5,6");
  std::vector<int> job(1024);
  for (int rank = 0; rank < 1024; ++rank) job[rank] = rank;
  CHECK(FormatRanks(job, kRanksInMessages) == "0-1023");
}

TEST_CASE("a long list ends with how many ranks it holds", "[ranks]") {
  std::vector<int> every_other;
  for (int rank = 0; rank < 40; rank += 2) every_other.push_back(rank);
  CHECK(FormatRanks(every_other, {.max_parts = 3}) == "0, 2, 4, ... (20 ranks)");
  CHECK(FormatRanks({0, 2, 4}, {.max_parts = 3}) == "0, 2, 4");
}

}  // namespace
}  // namespace ncclguard
