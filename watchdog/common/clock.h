// The clocks of ncclguard: steady time for every recorded time and interval (it never jumps), wall
// time for what a person or another host reads (dumps, status files, verdicts).
#pragma once

#include <cstdint>
#include <string>

namespace ncclguard {

// CLOCK_MONOTONIC in nanoseconds. Neither allocates nor locks: the recording path calls it.
std::int64_t SteadyNowNs() noexcept;

// CLOCK_REALTIME in nanoseconds since the Unix epoch.
std::int64_t WallNowNs() noexcept;

// An ISO 8601 UTC time with milliseconds: 2025-01-31T12:34:56.789Z.
std::string IsoTime(std::int64_t epoch_ns);

}  // namespace ncclguard
