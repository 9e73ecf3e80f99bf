// What the recovery tests share: a train_loop (or other) job run on the emulator with a job
// directory of its own, nothing leaking in from outside, and the checksums of a healthy run.
// Needs EMULATOR_LIBRARY_DIR and TRAIN_LOOP from the build.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/process.h"
#include "tests/support/train_loop_output.h"

namespace ncclguard::testing {

using Environment = std::map<std::string, std::optional<std::string>>;

struct Job {
  ProcessResult result;
  std::string job_dir;
  std::string transcript;  // for the test's messages
};

// Runs `command` on the emulator with job id `job_id` and its job directory in `dump_dir`, the
// variables of `layers` set in order (a later layer wins), for `timeout_seconds` at most.
inline Job RunEmulatorJob(const TemporaryDirectory& dump_dir, const std::string& job_id,
                          const std::vector<std::string>& command, const std::vector<Environment>& layers,
                          double timeout_seconds) {
  ProcessOptions options;
  options.timeout_seconds = timeout_seconds;
  options.environment = EmulatorJobEnvironment(EMULATOR_LIBRARY_DIR, dump_dir.path(), job_id);
  for (const Environment& layer : layers) {
    for (const auto& [name, value] : layer) options.environment[name] = value;
  }
  Job job;
  job.result = RunProcess(command, options);
  job.job_dir = dump_dir.path() + "/" + job_id;
  job.transcript = "exit code " + std::to_string(job.result.exit_code) + (job.result.timed_out ? ", timed out" : "") +
                   "\nstdout:\n" + job.result.out + "\nstderr:\n" + job.result.err;
  return job;
}

inline std::vector<std::string> TrainLoop(std::vector<std::string> arguments) {
  arguments.insert(arguments.begin(), TRAIN_LOOP);
  return arguments;
}

struct HealthyRun {
  ProcessResult result;
  std::map<int, std::string> checksums;  // rank -> checksum, as train_loop prints them
  double wall_seconds = 0;
};

// `command` (a job that prints train_loop's checksum lines) run on the emulator without faults
// and without ncclguard; it must succeed.
inline HealthyRun RunHealthy(const std::vector<std::string>& command) {
  ProcessOptions options;
  options.timeout_seconds = 30;
  options.environment = {{"LD_LIBRARY_PATH", EMULATOR_LIBRARY_DIR}, {"NCCLEMU_FAULTS", std::nullopt}};
  HealthyRun healthy;
  const auto start = std::chrono::steady_clock::now();
  healthy.result = RunProcess(command, options);
  healthy.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(healthy.result.out << healthy.result.err);
  REQUIRE(healthy.result.exit_code == 0);
  healthy.checksums = Checksums(healthy.result.out);
  return healthy;
}

// The checksums of the same train_loop job run without faults and without ncclguard.
inline std::map<int, std::string> HealthyChecksums(const std::vector<std::string>& arguments) {
  return RunHealthy(TrainLoop(arguments)).checksums;
}

inline bool Contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

}  // namespace ncclguard::testing
