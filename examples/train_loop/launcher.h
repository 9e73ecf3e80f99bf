#pragma once

#include "options.h"

// Runs `options.launch_ranks` copies of this executable as ranks 0..N-1 (RANK, WORLD_SIZE,
// LOCAL_RANK set; rank 0 creates the unique id and shares it through a rendezvous file in a
// private directory) and waits for them. Returns 0 when every rank exited 0.
int run_launcher(const Options& options, int argc, char** argv);
