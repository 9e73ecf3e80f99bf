// For the end-to-end tests: the environment of a train_loop job on the emulator, and reading what
// examples/train_loop and ncclguard print.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ncclguard::testing {

// The environment of a job on the emulator, apart from whoever runs the tests: the emulator's
// libraries in `emulator_library_dir`, no injected fault, GPU name, driver version or P2P matrix,
// no NCCL variable or config file that changes the rendezvous or the transports (HOME is
// `dump_dir`, so no ~/.nccl.conf), and the job directory `dump_dir`/`job_id`. For
// ProcessOptions::environment.
std::map<std::string, std::optional<std::string>> EmulatorJobEnvironment(const std::string& emulator_library_dir,
                                                                         const std::string& dump_dir,
                                                                         const std::string& job_id);

// Rank -> pid, from train_loop's start-up lines ("rank R/N: device D (...), ..., pid P").
std::map<int, int> RankPids(const std::string& out);

// Rank -> checksum, from train_loop's last lines ("rank R checksum 0x...").
std::map<int, std::string> Checksums(const std::string& out);

// The ncclguard log lines of process `pid` that contain `needle` (the log prefix is
// "host:pid:tid [rank] ncclguard LEVEL").
std::vector<std::string> LogLinesOf(const std::string& err, int pid, const std::string& needle);

}  // namespace ncclguard::testing
