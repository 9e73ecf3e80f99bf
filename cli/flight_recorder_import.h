// What `ncclguard analyze` takes from the Flight Recorder dumps PyTorch wrote beside the job
// (`<TORCH_NCCL_DEBUG_INFO_TEMP_FILE><rank>`, pickles of format "2.x", docs/formats.md): for the
// operation a verdict is about, the process group PyTorch knew it by (name and description) and the
// Python line that called it on each rank. The files are read as every other input: regular files
// only, size-capped, within a deadline, and a file that cannot be read is a problem, not a verdict.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/job_read.h"

namespace ncclguard {

struct FlightRecorderEntry {
  std::int64_t record_id = -1;
  std::string pg_name;  // the process group, as pg_config names it
  std::int64_t collective_seq_id = -1;
  std::int64_t p2p_seq_id = -1;
  std::string profiling_name;  // "nccl:all_reduce", "nccl:send 0->1", ...
  std::string state;           // "scheduled", "started", "completed"
  std::string call_site;       // "train.py:88 in train_step": the innermost frame outside torch; "" when none
};

struct FlightRecorderGroup {
  std::string desc;
  std::vector<int> ranks;  // global ranks, sorted
};

struct FlightRecorderDump {
  std::string version;
  std::map<std::string, FlightRecorderGroup> groups;  // by name
  std::vector<FlightRecorderEntry> entries;           // by record_id
};

// One file's content; what is missing or of another type in an entry is left at its default.
absl::StatusOr<FlightRecorderDump> ParseFlightRecorderDump(std::string_view bytes);

struct FlightRecorderDumps {
  std::string prefix;                         // what the files' names start with, rank after it
  std::map<int, FlightRecorderDump> by_rank;  // by global rank
  std::vector<std::string> problems;
};

// The prefix of the job's Flight Recorder files: `named` (a directory holds them under PyTorch's
// default name) when given, else TORCH_NCCL_DEBUG_INFO_TEMP_FILE as a process recorded it, else
// PyTorch's default when a process ran with its dumps on (TORCH_NCCL_DUMP_ON_TIMEOUT); "" when the
// job wrote none.
std::string FlightRecorderPrefix(const JobView& job, const std::string& named);

// Reads the files of `ranks` (the ranks the verdicts are about, a bounded number) within `deadline`.
FlightRecorderDumps ReadFlightRecorderDumps(const std::string& prefix, const std::vector<int>& ranks,
                                            std::chrono::milliseconds deadline);

// The global ranks whose Flight Recorder files the verdicts need: those each verdict is about and
// the first others of its operation, `max` at most.
std::vector<int> RanksToRead(const JobView& job, const std::vector<Verdict>& verdicts, std::size_t max);

// Adds to each verdict about an operation what the dumps say of it: the evidence's
// `flight_recorder` and a clause of the message naming the process group and the call sites.
void AddFlightRecorderContext(const JobView& job, const FlightRecorderDumps& dumps,
                              std::vector<Verdict>& verdicts);

}  // namespace ncclguard
