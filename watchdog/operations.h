// What a call means to the watchdog, decided before and after the real NCCL call. The templates
// only sort the arguments by type; the decisions are in operations.cc.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <type_traits>

#include "shim/nccl_api.h"
#include "watchdog/records.h"

namespace ncclguard {

// What the shim must do with a call, and what the After hook needs to know.
struct Ticket {
  bool forward = true;  // false: do not call NCCL, return `result` (the communicator is gone)
  Api api{};
  ncclResult_t result = ncclSuccess;
  CommState* comm = nullptr;
  std::uint64_t seq = 0;  // the operation recorded, 0 when none
  int init_token = -1;
  std::int64_t start_ns = 0;
  char comm_id[17] = {};  // of the communicator being created
};

// An operation's arguments, found by type: every collective and point-to-point call has exactly
// one count, datatype and communicator, at most one reduction and at most one int (root or peer).
struct OperationArguments {
  ncclComm_t comm = nullptr;
  void* stream = nullptr;
  std::size_t count = 0;
  int datatype = -1;
  int reduction = -1;
  int root_or_peer = -1;
};

template <typename... Args>
OperationArguments SortOperationArguments(const Args&... args) {
  OperationArguments sorted;
  auto take = [&sorted](const auto& value) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<T, ncclComm_t>) sorted.comm = value;
    else if constexpr (std::is_same_v<T, cudaStream_t>) sorted.stream = value;
    else if constexpr (std::is_same_v<T, std::size_t>) sorted.count = value;
    else if constexpr (std::is_same_v<T, ncclDataType_t>) sorted.datatype = value;
    else if constexpr (std::is_same_v<T, ncclRedOp_t>) sorted.reduction = value;
    else if constexpr (std::is_same_v<T, int>) sorted.root_or_peer = value;
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

// How a communicator creation call identifies the new communicator.
struct CreationArguments {
  const ncclUniqueId* unique_id = nullptr;  // InitRank, InitRankConfig, InitRankScalable
  ncclComm_t parent = nullptr;              // Split, Shrink
  int color = 0;                            // Split
  int rank = -1;
  int nranks = 0;
};

Ticket BeforeOperation(Api api, int library, const OperationArguments& arguments) noexcept;
void AfterOperation(const Ticket& ticket, ncclResult_t result) noexcept;

Ticket BeforeCreation(Api api, const CreationArguments& arguments) noexcept;
// `comms` are the communicators the call returned (several for ncclCommInitAll).
void AfterCreation(const Ticket& ticket, Api api, int library, ncclResult_t result,
                   const ncclComm_t* comms, int count) noexcept;

Ticket BeforeGroupCall(Api api) noexcept;
void AfterGroupCall(Api api, ncclResult_t result) noexcept;

// Any other call that names a communicator: refused when ncclguard aborted it.
Ticket BeforeCommCall(Api api, ncclComm_t comm) noexcept;
void AfterCommCall(Api api, ncclComm_t comm, ncclResult_t result) noexcept;
// The application's own ncclCommGetAsyncError: an error it returns is recorded as if the watchdog
// had found it.
void AfterAsyncErrorQuery(ncclComm_t comm, const ncclResult_t* async_error, ncclResult_t result) noexcept;

}  // namespace ncclguard
