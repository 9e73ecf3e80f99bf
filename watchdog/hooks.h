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
#include "watchdog/operations.h"
#include "watchdog/watchdog.h"

namespace ncclguard::hooks {

// True when NCCLGUARD_DISABLE asks for pure pass-through. Parses the configuration on first use
// and starts nothing.
bool Disabled() noexcept;

// Starts ncclguard on the first call (configuration, log) and says whether calls are to be
// reported. False when disabled, or when ncclguard could not start: it then said so once and
// every call is forwarded unchanged.
bool Active() noexcept;

// A call made by NCCL itself while serving `outer` on this thread: forwarded, not reported as a
// call of its own (ncclBcast calling ncclBroadcast is one operation). Visible at trace level.
inline void NestedCall(Api api, Api outer) noexcept {
  log::Write(spdlog::level::trace, "{} nested in {}: passed through", Describe(api).name,
             Describe(outer).name);
}

// Logs, once per function, that the library in slot `library` lacks it.
void ReportMissingFunction(Api api, int library) noexcept;

// How many threads of the process are inside an NCCL call now, and the last one entered; for
// status files ("is this rank blocked in NCCL?").
void EnterNccl(Api api) noexcept;
void LeaveNccl() noexcept;
std::string CurrentNcclCall();  // "" when no thread is inside NCCL

namespace detail {

// How a communicator creation call names the communicator it makes.
template <Api A, typename... Args>
CreationArguments CreationArgumentsOf(const Args&... args) {
  const auto arguments = std::forward_as_tuple(args...);
  CreationArguments creation;
  if constexpr (A == Api::ncclCommInitRank || A == Api::ncclCommInitRankConfig) {
    // (comm*, nranks, commId, rank[, config])
    creation.unique_id = &std::get<2>(arguments);
    creation.nranks = std::get<1>(arguments);
    creation.rank = std::get<3>(arguments);
  } else if constexpr (A == Api::ncclCommInitAll) {  // (comm*, ndev, devlist)
    creation.nranks = std::get<1>(arguments);
  } else if constexpr (A == Api::ncclCommSplit) {  // (comm, color, key, newcomm*, config)
    creation.parent = std::get<0>(arguments);
    creation.color = std::get<1>(arguments);
  } else if constexpr (A == Api::ncclCommShrink) {  // (comm, excludeRanks, count, newcomm*, ...)
    creation.parent = std::get<0>(arguments);
  } else {  // ncclCommInitRankScalable: (newcomm*, nranks, myrank, nId, commIds, config)
    creation.unique_id = std::get<4>(arguments);
    creation.nranks = std::get<1>(arguments);
    creation.rank = std::get<2>(arguments);
  }
  return creation;
}

template <Api A, typename... Args>
void FinishCreation(const Ticket& ticket, int library, ncclResult_t result, const Args&... args) {
  if constexpr (A == Api::ncclCommInitAll) {
    const auto [comms, ndev, devlist] = std::forward_as_tuple(args...);
    AfterCreation(ticket, A, library, result, comms, ndev);
  } else {
    const ncclComm_t* created = nullptr;
    auto take = [&created](const auto& value) {
      if constexpr (std::is_same_v<std::decay_t<decltype(value)>, ncclComm_t*>) created = value;
    };
    (take(args), ...);
    AfterCreation(ticket, A, library, result, created, 1);
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

// Before the real call of `A` (returning `Result`) served by the library in slot `library`:
// records what the call means. The ticket may say not to call NCCL at all (only for functions
// that return an ncclResult_t to say so with).
template <Api A, typename Result, typename... Args>
Ticket BeforeCall(int library, const Args&... args) noexcept {
  constexpr ApiKind kind = Describe(A).kind;
  WaitIfExiting();
  Ticket ticket;
  if constexpr (kind == ApiKind::Collective || kind == ApiKind::PointToPoint) {
    ticket = BeforeOperation(A, library, SortOperationArguments(args...));
  } else if constexpr (kind == ApiKind::CommCreate) {
    ticket = BeforeCreation(A, detail::CreationArgumentsOf<A>(args...));
  } else if constexpr (kind == ApiKind::Group) {
    ticket = BeforeGroupCall(A);
  } else if constexpr (std::is_same_v<Result, ncclResult_t>) {
    ticket = BeforeCommCall(A, FirstCommunicator(args...));
  }
  if (ticket.forward) EnterNccl(A);
  return ticket;
}

// After the real call: `result` is what it returned.
template <Api A, typename Result, typename... Args>
void AfterCall(const Ticket& ticket, int library, const Result& result, const Args&... args) noexcept {
  LeaveNccl();
  try {
    if constexpr (std::is_same_v<Result, ncclResult_t>) {
      constexpr ApiKind kind = Describe(A).kind;
      if constexpr (kind == ApiKind::Collective || kind == ApiKind::PointToPoint) {
        AfterOperation(ticket, result);
      } else if constexpr (kind == ApiKind::CommCreate) {
        detail::FinishCreation<A>(ticket, library, result, args...);
      } else if constexpr (kind == ApiKind::Group) {
        AfterGroupCall(A, result);
      } else if constexpr (A == Api::ncclCommGetAsyncError) {  // (comm, asyncError*)
        const auto [comm, async_error] = std::forward_as_tuple(args...);
        AfterAsyncErrorQuery(comm, async_error, result);
      } else {
        AfterCommCall(A, FirstCommunicator(args...), result);
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
void AfterVoidCall(const Ticket&, int, const Args&... args) noexcept {
  LeaveNccl();
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
