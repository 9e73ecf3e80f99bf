// For the verdicts' end-to-end tests: `ncclguard analyze --json` on a job directory (or its board),
// and its verdicts. The including program defines NCCLGUARD_CLI, the path of the command.
#pragma once

#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/support/process.h"
#include "tests/support/redis_server.h"

namespace ncclguard::testing {

struct Analysis {
  ProcessResult result;
  nlohmann::json document;
};

// Fails the test unless analyze answers within 30 s with a verdict (exit status 0 or 1).
inline Analysis Analyze(const std::string& job_dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {NCCLGUARD_CLI, "analyze"};
  for (const std::string& argument : AnalyzeTarget(job_dir)) argv.push_back(argument);
  argv.emplace_back("--json");
  argv.insert(argv.end(), extra.begin(), extra.end());
  ProcessOptions options;
  options.timeout_seconds = 30;
  Analysis analysis;
  analysis.result = RunProcess(argv, options);
  INFO("ncclguard analyze: exit code " << analysis.result.exit_code << "\nstdout:\n"
                                       << analysis.result.out << "\nstderr:\n"
                                       << analysis.result.err);
  REQUIRE_FALSE(analysis.result.timed_out);
  REQUIRE(analysis.result.exit_code != 2);
  analysis.document = nlohmann::json::parse(analysis.result.out);
  return analysis;
}

// The first verdict of `kind`, or null.
inline nlohmann::json FindVerdict(const nlohmann::json& document, const std::string& kind) {
  for (const nlohmann::json& verdict : document.at("verdicts")) {
    if (verdict.at("kind") == kind) return verdict;
  }
  return nullptr;
}

}  // namespace ncclguard::testing
