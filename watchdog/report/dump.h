// Per-process dumps: one versioned JSON document each, format in docs/dump-format.md. Written
// with the private-file layer of common/files.h.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "watchdog/common/files.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {

// Bump on removing or renaming a field or changing its meaning; adding a field does not bump,
// except a section that verdicts rest on: version 2 added "threads" (where each thread is), which
// a reader of version 1 would silently ignore and then blame a late rank without saying where it
// is. Readers accept every version from 1 on.
inline constexpr int kDumpFormatVersion = 2;

// The dump's budget for the frames of its threads' stacks.
inline constexpr std::size_t kThreadFramesBudget = std::size_t{2} << 20;

// The path written, or why nothing was.
using DumpResult = absl::StatusOr<std::string>;

std::string FormatDump(const ProcessSnapshot& snapshot, const ProcessFacts& facts);

// The dump's sections of facts, shared with status files: variables as an object, and the
// "system" section (kernel, drivers, GPUs and, in dumps only, memory: it changes while the
// process runs, and a status file is not rewritten for it).
nlohmann::ordered_json VariablesJson(const EnvironmentVariables& variables);
nlohmann::ordered_json SystemFactsJson(const ProcessFacts& facts, bool with_memory);

// Writes FormatDump's document as job_dir/dump-<host>-<pid>-<rank>-<n>.json. Never throws and
// never blocks for longer than kWriteDeadline; failures are returned (and logged once per process).
DumpResult WriteDump(const std::string& job_dir, const ProcessSnapshot& snapshot,
                     const ProcessFacts& facts) noexcept;

// The largest dump ncclguard reads: a whole flight recorder of `ring_size` entries for each of
// kMaxDumpedRings communicators, plus the facts. Real dumps are well under a MiB at the default
// ring; anything larger was not written by ncclguard.
inline constexpr std::size_t kMaxDumpedRings = 8;
std::size_t MaxDumpBytes(long ring_size);

}  // namespace ncclguard
