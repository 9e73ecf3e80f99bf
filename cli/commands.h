// The subcommands of the `ncclguard` command. Each adds itself to the application; when it is the
// one on the command line, it sets `run` to its body, which returns the exit status.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace ncclguard {

// The exit statuses shared by every subcommand.
inline constexpr int kExitHealthy = 0;       // nothing wrong
inline constexpr int kExitProblemFound = 1;  // something is wrong, and it was reported
inline constexpr int kExitUsage = 2;         // bad usage, or nothing could be read

void AddAnalyzeCommand(CLI::App& app, std::function<int()>& run);
void AddDoctorCommand(CLI::App& app, std::function<int()>& run);
void AddRunCommand(CLI::App& app, std::function<int()>& run);

}  // namespace ncclguard
