#pragma once

#include "options.h"

// Runs one rank of the job: rank, world size and local rank come from RANK, WORLD_SIZE and
// LOCAL_RANK (rank 0 of 1 when they are unset). Returns the process exit code.
int run_rank(const Options& options);
