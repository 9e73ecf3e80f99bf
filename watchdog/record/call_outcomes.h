// What operations.cc and comm_calls.cc share: whether NCCL took a call, and what a call that NCCL
// refused leaves behind.
#pragma once

#include <nccl.h>

#include "watchdog/common/nccl_api.h"

namespace ncclguard {

struct CommState;

namespace record {

// NCCL took the call: it succeeded, or continues in the background (a non-blocking communicator).
inline bool Launched(ncclResult_t result) { return result == ncclSuccess || result == ncclInProgress; }

// A call that returned an error: logged (a few times per process) and dumped once per
// communicator (`comm` may be null), before the call returns to the application.
void NoteFailedCall(Api api, CommState* comm, ncclResult_t result) noexcept;

}  // namespace record
}  // namespace ncclguard
