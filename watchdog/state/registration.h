// What NCCL says of a registered communicator, written into its state by whichever thread heard
// it: its rank, size and device once NCCL has made it, and its asynchronous error. Here, below
// both, because the application's threads (record/) and the watchdog (detect/) both hear it: a
// blocking initialisation completes on the application's thread, a non-blocking one at the
// watchdog's round; ncclCommGetAsyncError is asked by the application and by the watchdog.
#pragma once

#include <nccl.h>

#include <cstdint>

#include "watchdog/state/records.h"

namespace ncclguard {

// Fills in a new communicator's rank, size and device from NCCL and logs its creation. Only
// once NCCL has completed its initialisation. True for the call that did it (once per
// communicator). `steady_now_ns` ends the initialisation unless its end is known already.
bool CompleteRegistration(CommState& comm, std::int64_t steady_now_ns) noexcept;

// What ncclCommGetAsyncError said of the communicator, whoever asked. An error is kept once known
// (the application may abort the communicator right after its own call saw it, and the watchdog
// asks no more then) and reported once by the watchdog, at its next round or at exit. True when
// this call recorded the communicator's first error.
bool RecordAsyncError(CommState& comm, ncclResult_t error) noexcept;

}  // namespace ncclguard
