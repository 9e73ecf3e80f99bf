// How the recovery tests' own programs launch their ranks, as a launcher would: one process per
// rank, forked after the parent made the unique ids, with RANK, LOCAL_RANK and WORLD_SIZE set as
// torchrun sets them.
#pragma once

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace ncclguard::testing {

// Runs `run_rank(rank)` (its result is the rank's exit code) in a process of its own for every
// rank, waits for them all, and says, as `program`, how each one that did not exit 0 ended.
// Returns how many did not.
template <typename RunRank>
int ForkRanks(const char* program, int ranks, RunRank run_rank) {
  std::fflush(nullptr);
  std::vector<pid_t> children;
  for (int rank = 0; rank < ranks; ++rank) {
    const pid_t child = fork();
    if (child == 0) {
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(ranks).c_str(), 1);
      _exit(run_rank(rank));
    }
    if (child < 0) {
      std::printf("%s: fork failed\n", program);
      std::exit(1);
    }
    children.push_back(child);
  }
  int failed = 0;
  for (int rank = 0; rank < ranks; ++rank) {
    int status = 0;
    waitpid(children[rank], &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    ++failed;
    if (WIFEXITED(status)) {
      std::printf("%s: rank %d (pid %d) exited with code %d\n", program, rank, static_cast<int>(children[rank]),
                  WEXITSTATUS(status));
    } else {
      std::printf("%s: rank %d (pid %d) ended by signal %d\n", program, rank, static_cast<int>(children[rank]),
                  WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    }
  }
  return failed;
}

}  // namespace ncclguard::testing
