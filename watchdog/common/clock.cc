#include "watchdog/common/clock.h"

#include <time.h>

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace ncclguard {
namespace {

std::int64_t Nanoseconds(const timespec& time) {
  return static_cast<std::int64_t>(time.tv_sec) * 1'000'000'000 + time.tv_nsec;
}

}  // namespace

std::int64_t SteadyNowNs() noexcept {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return Nanoseconds(now);
}

std::int64_t WallNowNs() noexcept {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return Nanoseconds(now);
}

std::string IsoTime(std::int64_t epoch_ns) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixNanos(epoch_ns), absl::UTCTimeZone());
}

}  // namespace ncclguard
