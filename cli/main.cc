// ncclguard SUBCOMMAND ...: the command-line side of ncclguard (see cli/commands.h).
#include <exception>
#include <functional>
#include <iostream>

#include <CLI/CLI.hpp>

#include "cli/commands.h"

// No exception leaves main(): one that escapes everything else is a usage error, said once.
int main(int argc, char** argv) try {
  CLI::App app{"ncclguard: finds out why a distributed NCCL job hangs.", "ncclguard"};
  app.require_subcommand(1);
  std::function<int()> run;
  ncclguard::AddAnalyzeCommand(app, run);
  ncclguard::AddDoctorCommand(app, run);
  ncclguard::AddRunCommand(app, run);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? ncclguard::kExitHealthy : ncclguard::kExitUsage;
  }
  try {
    return run();
  } catch (const std::exception& error) {
    std::cerr << "ncclguard: " << error.what() << '\n';
    return ncclguard::kExitUsage;
  }
} catch (...) {
  std::cerr << "ncclguard: unexpected error\n";
  return ncclguard::kExitUsage;
}
