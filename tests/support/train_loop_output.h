// Reading what examples/train_loop and ncclguard print, for the end-to-end tests.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace ncclguard::testing {

// Rank -> pid, from train_loop's start-up lines ("rank R/N: device D (...), ..., pid P").
std::map<int, int> RankPids(const std::string& out);

// Rank -> checksum, from train_loop's last lines ("rank R checksum 0x...").
std::map<int, std::string> Checksums(const std::string& out);

// The ncclguard log lines of process `pid` that contain `needle` (the log prefix is
// "host:pid:tid [rank] ncclguard LEVEL").
std::vector<std::string> LogLinesOf(const std::string& err, int pid, const std::string& needle);

}  // namespace ncclguard::testing
