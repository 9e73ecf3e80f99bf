// train_loop: a small data-parallel training job on the CUDA driver API and NCCL, for testing
// tools that watch NCCL jobs. See examples/README.md.
#include "launcher.h"
#include "options.h"
#include "rank.h"
#include "self_path.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

// train_loop and train_loop_linked are the same program; only how libnccl enters the process
// differs. A loader that needs the other executable replaces this process with it.
void run_in_executable_for(NcclLoader loader, char** argv) {
  const bool needs_linked = loader == NcclLoader::linked;
  if (needs_linked == executable_links_nccl()) return;
  const std::string sibling = executable_directory() + (needs_linked ? "/train_loop_linked" : "/train_loop");
  std::fflush(nullptr);
  execv(sibling.c_str(), argv);
  std::perror(("train_loop: cannot run " + sibling).c_str());
  std::exit(EXIT_FAILURE);
}

}  // namespace

int main(int argc, char** argv) {
  // Line by line even into a pipe: a rank that is killed must not lose what it printed.
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const Options options = parse_options(argc, argv);
  run_in_executable_for(options.loader, argv);
  if (options.launch_ranks > 0) {
    check_fault_ranks(options, options.launch_ranks);
    return run_launcher(options, argc, argv);
  }
  return run_rank(options);
}
