// Command line of train_loop. Steps are numbered from 1; a fault "after step S" happens once
// step S's AllReduce has completed on that rank.
#pragma once

#include "nccl_api.h"

#include <cstddef>
#include <optional>
#include <string>

struct RankStep {
  int rank;
  long step;
};

struct SleepAfterStep {
  int rank;
  long step;
  double seconds;
};

// A rank whose compute is slower by `milliseconds` in steps first..last (last 0: to the end).
struct SlowRank {
  int rank;
  double milliseconds;
  long first = 1;
  long last = 0;
  bool covers(long step) const { return step >= first && (last == 0 || step <= last); }
};

struct Options {
  int launch_ranks = 0;  // --ranks: launch this many rank processes; 0 runs one rank here
  double launch_timeout_s = 0;  // --timeout: 0 waits for ever
  long steps = 100;
  size_t count = 1024;
  size_t model_count = 0;  // 0: same as count
  NcclLoader loader = NcclLoader::linked;
  int workers = 0;
  std::string rendezvous_file;
  double rendezvous_timeout_s = 120;
  bool verbose = false;
  std::optional<RankStep> stop_early;
  std::optional<SleepAfterStep> sleep;
  std::optional<RankStep> exit_after;
  std::optional<RankStep> desync;
  std::optional<SlowRank> slow;
};

// Elements --desync adds to one AllReduce: 4 MiB more than the other ranks send, more than any
// single chunk a library moves at once, so the ranks disagree on how many transfers the
// collective takes (a few elements more may go unnoticed, on NCCL as on the emulator).
inline constexpr size_t kDesyncExtraElements = size_t{1} << 20;
// Exit code of a rank that --exit kills.
inline constexpr int kInjectedExitCode = 3;
// Exit code for a bad command line.
inline constexpr int kUsageExitCode = 2;

// Prints the problem and exits with kUsageExitCode on a bad command line; prints the usage and
// exits 0 on --help.
Options parse_options(int argc, char** argv);

// Whether argv[index] is the launcher-only flag that the launcher drops from its ranks' command
// line; sets `takes_value` when its value is the next argument.
bool is_launcher_flag(const std::string& argument, bool& takes_value);

// Exits with kUsageExitCode when a fault names a rank outside 0..world_size-1: such a fault
// would never fire and the run would prove nothing.
void check_fault_ranks(const Options& options, int world_size);
