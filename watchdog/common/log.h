// ncclguard's log: lines prefixed like NCCL's own debug lines,
//   host:pid:tid [rank] ncclguard LEVEL message
// on stderr or in NCCLGUARD_LOG_FILE. Started with ncclguard (first NCCL call), never before.
#pragma once

#include <atomic>
#include <string>
#include <utility>

#include <spdlog/logger.h>

#include "watchdog/common/config.h"
#include "watchdog/common/exit_gate.h"

namespace ncclguard::log {

// Creates the process's logger from the configuration. Throws on failure (only called by the
// runtime's start, inside its catch-all); an unusable log file falls back to stderr with a warning.
void Start(const Config& config);

// Forgets the logger without touching it: after fork() a sink's mutex may be held by a thread
// that does not exist in the child. The old logger is deliberately leaked.
void ForgetAfterFork() noexcept;

// The rank shown in every line once known (-1: not shown).
void SetRank(int rank) noexcept;

spdlog::logger* Get() noexcept;

inline bool Enabled(spdlog::level::level_enum level) noexcept {
  spdlog::logger* logger = Get();
  return logger != nullptr && logger->should_log(level);
}

// Formatting happens only when the level is enabled; nothing escapes as an exception.
template <typename... Args>
void Write(spdlog::level::level_enum level, fmt::format_string<Args...> format, Args&&... args) noexcept {
  spdlog::logger* logger = Get();
  if (logger == nullptr || !logger->should_log(level)) return;
  // spdlog and fmt may be torn down once the application's exit has begun.
  const ExitPass pass;
  if (!pass.open()) return;
  try {
    logger->log(level, format, std::forward<Args>(args)...);
  } catch (...) {
  }
}

template <typename... Args>
void Info(fmt::format_string<Args...> format, Args&&... args) noexcept {
  Write(spdlog::level::info, format, std::forward<Args>(args)...);
}
template <typename... Args>
void Warn(fmt::format_string<Args...> format, Args&&... args) noexcept {
  Write(spdlog::level::warn, format, std::forward<Args>(args)...);
}
template <typename... Args>
void Error(fmt::format_string<Args...> format, Args&&... args) noexcept {
  Write(spdlog::level::err, format, std::forward<Args>(args)...);
}
template <typename... Args>
void Debug(fmt::format_string<Args...> format, Args&&... args) noexcept {
  Write(spdlog::level::debug, format, std::forward<Args>(args)...);
}

// This machine's host name; "" when the system will not say (callers choose their fallback).
std::string HostName();

// Expands %h (host name) and %p (process id) as NCCL_DEBUG_FILE does.
std::string ExpandPathPattern(const std::string& pattern);

}  // namespace ncclguard::log
