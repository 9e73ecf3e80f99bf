// What a wrapper tells the core about its call, sorted by the call's kind and its arguments' types
// at compile time. Only the sorting is here; every decision is behind the core's door,
// watchdog/record/hooks.h.
#pragma once

#include <tuple>
#include <type_traits>

#include "watchdog/common/describe.h"
#include "watchdog/common/nccl_api.h"
#include "watchdog/record/hooks.h"

namespace ncclguard::shim {

// An operation's arguments, found by type: every collective and point-to-point call has exactly
// one count, datatype and communicator, at most one reduction, at most one int (root or peer), at
// most one input (`const void*`) and at most one output (`void*`) buffer.
template <typename... Args>
OperationArguments SortOperationArguments(const Args&... args) {
  OperationArguments sorted;
  auto take = [&sorted](const auto& value) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<T, ncclComm_t>)
      sorted.comm = value;
    else if constexpr (std::is_same_v<T, cudaStream_t>)
      sorted.stream = value;
    else if constexpr (std::is_same_v<T, std::size_t>)
      sorted.count = value;
    else if constexpr (std::is_same_v<T, ncclDataType_t>)
      sorted.datatype = value;
    else if constexpr (std::is_same_v<T, ncclRedOp_t>)
      sorted.reduction = value;
    else if constexpr (std::is_same_v<T, int>)
      sorted.root_or_peer = value;
    else if constexpr (std::is_same_v<T, const void*>)
      sorted.send = value;
    else if constexpr (std::is_same_v<T, void*>)
      sorted.recv = value;
  };
  (take(args), ...);
  return sorted;
}

// The communicator a non-operation call is about (its first ncclComm_t argument), if any.
template <typename... Args>
ncclComm_t FirstCommunicator(const Args&... args) {
  ncclComm_t comm = nullptr;
  auto take = [&comm](const auto& value) {
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, ncclComm_t>) {
      if (comm == nullptr) comm = value;
    }
  };
  (take(args), ...);
  return comm;
}

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
    if constexpr (A == Api::ncclCommInitRankConfig) creation.config = std::get<4>(arguments);
  } else if constexpr (A == Api::ncclCommInitAll) {  // (comm*, ndev, devlist)
    creation.nranks = std::get<1>(arguments);
  } else if constexpr (A == Api::ncclCommSplit) {  // (comm, color, key, newcomm*, config)
    creation.parent = std::get<0>(arguments);
    creation.color = std::get<1>(arguments);
    creation.config = std::get<4>(arguments);
  } else if constexpr (A == Api::ncclCommShrink) {  // (comm, excludeRanks, count, newcomm*, config, flags)
    creation.parent = std::get<0>(arguments);
    creation.config = std::get<4>(arguments);
  } else {  // ncclCommInitRankScalable: (newcomm*, nranks, myrank, nId, commIds, config)
    creation.unique_id = std::get<4>(arguments);
    creation.nranks = std::get<1>(arguments);
    creation.rank = std::get<2>(arguments);
    creation.config = std::get<5>(arguments);
  }
  return creation;
}

template <Api A, typename... Args>
void FinishCreation(const Ticket& ticket, int library, ncclResult_t result, const Args&... args) {
  if constexpr (A == Api::ncclCommInitAll) {
    const auto [comms, ndev, devlist] = std::forward_as_tuple(args...);
    AfterCreation(ticket, A, library, result, comms, ndev);
  } else {
    ncclComm_t* created = nullptr;
    auto take = [&created](const auto& value) {
      if constexpr (std::is_same_v<std::decay_t<decltype(value)>, ncclComm_t*>) created = value;
    };
    (take(args), ...);
    AfterCreation(ticket, A, library, result, created, 1);
  }
}

// `returned` is nullptr for a function that returns nothing; `detail` what LoggedCallDetail says,
// not kNone.
template <Api A, typename Result, typename... Args>
void LogCall(hooks::CallDetail detail, const Result* returned, const Args&... args) {
  fmt::memory_buffer value;
  if (returned != nullptr) {
    AppendValue(value, *returned);
  } else {
    fmt::format_to(std::back_inserter(value), "void");
  }
  hooks::LogCall(
      detail,
      detail == hooks::CallDetail::kArguments ? DescribeCall(A, args...) : std::string(Describe(A).name),
      fmt::to_string(value));
}

}  // namespace detail

// Before the real call of `A` (returning `Result`) served by the library in slot `library`:
// records what the call means. The ticket may say not to call NCCL at all (only for functions
// that return an ncclResult_t to say so with).
template <Api A, typename Result, typename... Args>
Ticket BeforeCall(int library, const Args&... args) noexcept {
  constexpr ApiKind kKind = Describe(A).kind;
  // The hot ones cross the door once on each side (hooks::EnterOperation, EnterGroupCall).
  constexpr bool kResult = std::is_same_v<Result, ncclResult_t>;
  if constexpr (kResult && (kKind == ApiKind::kCollective || kKind == ApiKind::kPointToPoint)) {
    return hooks::EnterOperation(A, library, SortOperationArguments(args...));
  } else if constexpr (kResult && kKind == ApiKind::kGroup) {
    hooks::EnterGroupCall(A);
    return Ticket{};
  }
  hooks::WaitIfExiting();
  Ticket ticket;
  if constexpr (kKind == ApiKind::kCommCreate) {
    ticket = BeforeCreation(A, detail::CreationArgumentsOf<A>(args...));
  } else if constexpr (std::is_same_v<Result, ncclResult_t>) {
    ticket = BeforeCommCall(A, FirstCommunicator(args...));
  }
  if (ticket.forward) hooks::EnterNccl(A);
  return ticket;
}

namespace detail {

// Logs a call the log wants (`logged` is not kNone). Out of line: its frame and its handler would
// otherwise weigh on every operation's call.
template <Api A, typename Result, typename... Args>
[[gnu::noinline]] void LogCallOrNothing(hooks::CallDetail logged, const Result* returned,
                                        const Args&... args) noexcept {
  try {
    LogCall<A>(logged, returned, args...);
  } catch (...) {
  }
}

}  // namespace detail

// After the real call: `result` is what it returned; `logged` what the log wants of the call.
template <Api A, typename Result, typename... Args>
void AfterCall(const Ticket& ticket, int library, hooks::CallDetail logged, const Result& result,
               const Args&... args) noexcept {
  constexpr ApiKind kKind = Describe(A).kind;
  constexpr bool kOperation = kKind == ApiKind::kCollective || kKind == ApiKind::kPointToPoint;
  constexpr bool kHot = std::is_same_v<Result, ncclResult_t> && (kOperation || kKind == ApiKind::kGroup);
  if constexpr (kHot) {
    // The door functions are noexcept: nothing here throws.
    if constexpr (kOperation) {
      hooks::LeaveOperation(ticket, result);
    } else {
      hooks::LeaveGroupCall(A, result);
    }
    if (logged != hooks::CallDetail::kNone) [[unlikely]]
      detail::LogCallOrNothing<A>(logged, &result, args...);
    return;
  }
  hooks::LeaveNccl();
  try {
    if constexpr (std::is_same_v<Result, ncclResult_t>) {
      if constexpr (kKind == ApiKind::kCommCreate) {
        detail::FinishCreation<A>(ticket, library, result, args...);
      } else if constexpr (A == Api::ncclCommGetAsyncError) {  // (comm, asyncError*)
        const auto [comm, async_error] = std::forward_as_tuple(args...);
        AfterAsyncErrorQuery(comm, async_error, result);
      } else {
        AfterCommCall(A, FirstCommunicator(args...), result);
      }
    }
    if (logged != hooks::CallDetail::kNone) detail::LogCall<A>(logged, &result, args...);
  } catch (...) {
  }
}

// The same for the functions that return nothing.
template <Api A, typename... Args>
void AfterVoidCall(const Ticket&, int, hooks::CallDetail logged, const Args&... args) noexcept {
  hooks::LeaveNccl();
  try {
    if (logged != hooks::CallDetail::kNone) detail::LogCall<A, int>(logged, nullptr, args...);
  } catch (...) {
  }
}

}  // namespace ncclguard::shim
