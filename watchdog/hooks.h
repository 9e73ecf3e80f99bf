// What every intercepted call reports, and the runtime that starts on the first NCCL call.
//
// The shim calls these and decides nothing: whether ncclguard is on, what is logged and what a
// call means are settled here.
#pragma once

#include <tuple>
#include <type_traits>

#include <spdlog/common.h>

#include "shim/nccl_api.h"
#include "watchdog/describe.h"
#include "watchdog/log.h"

namespace ncclguard::hooks {

// True when NCCLGUARD_DISABLE asks for pure pass-through. Parses the configuration on first use
// and starts nothing.
bool Disabled() noexcept;

// Starts ncclguard on the first call (configuration, log) and says whether calls are to be
// reported. False when disabled, or when ncclguard could not start: it then said so once and
// every call is forwarded unchanged.
bool Active() noexcept;

// A communicator created by `api` through the NCCL library in slot `library`.
void RecordCommunicator(Api api, int library, ncclComm_t comm) noexcept;

// A call made by NCCL itself while serving `outer` on this thread: forwarded, not reported as a
// call of its own (ncclBcast calling ncclBroadcast is one operation). Visible at trace level.
inline void NestedCall(Api api, Api outer) noexcept {
  log::Write(spdlog::level::trace, "{} nested in {}: passed through", Describe(api).name,
             Describe(outer).name);
}

// Logs, once per function, that the library in slot `library` lacks it.
void ReportMissingFunction(Api api, int library) noexcept;

namespace detail {

// The communicators an API hands back through its ncclComm_t* parameter.
template <Api A, typename... Args>
void RecordCreatedCommunicators(int library, const Args&... args) {
  if constexpr (A == Api::ncclCommInitAll) {
    const auto [comms, ndev, devlist] = std::forward_as_tuple(args...);
    for (int i = 0; comms != nullptr && i < ndev; ++i) RecordCommunicator(A, library, comms[i]);
  } else {
    auto record_output = [library](const auto& value) {
      if constexpr (std::is_same_v<std::decay_t<decltype(value)>, ncclComm_t*>) {
        if (value != nullptr && *value != nullptr) RecordCommunicator(A, library, *value);
      }
    };
    (record_output(args), ...);
  }
}

template <Api A, typename... Args>
void LogCall(const fmt::memory_buffer& returned, const Args&... args) {
  if (log::Enabled(spdlog::level::trace)) {
    log::Write(spdlog::level::trace, "{} -> {}", DescribeCall(A, args...), fmt::to_string(returned));
  } else {
    log::Debug("{} -> {}", Describe(A).name, fmt::to_string(returned));
  }
}

}  // namespace detail

// Reports a finished call of `A` served by the library in slot `library`; `result` is what the
// real function returned.
template <Api A, typename Result, typename... Args>
void AfterCall(int library, const Result& result, const Args&... args) noexcept {
  try {
    if constexpr (Describe(A).kind == ApiKind::CommCreate) {
      if (result == ncclSuccess || result == ncclInProgress) {
        detail::RecordCreatedCommunicators<A>(library, args...);
      }
    }
    if (log::Enabled(spdlog::level::debug)) {
      fmt::memory_buffer returned;
      AppendValue(returned, result);
      detail::LogCall<A>(returned, args...);
    }
  } catch (...) {
  }
}

// The same for the functions that return nothing.
template <Api A, typename... Args>
void AfterVoidCall(int library, const Args&... args) noexcept {
  (void)library;
  try {
    if (log::Enabled(spdlog::level::debug)) {
      fmt::memory_buffer returned;
      fmt::format_to(std::back_inserter(returned), "void");
      detail::LogCall<A>(returned, args...);
    }
  } catch (...) {
  }
}

}  // namespace ncclguard::hooks
