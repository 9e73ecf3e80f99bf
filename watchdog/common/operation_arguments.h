// An intercepted operation's arguments, as the shim sorts them by type (shim/calls.h) and the core
// records them: here in common/ so that in-process recovery (common/in_process_recovery.h) takes
// them as record/ does.
#pragma once

#include <nccl.h>

#include <cstddef>

namespace ncclguard {

// Every collective and point-to-point call has exactly one count, datatype and communicator, at
// most one reduction and at most one int (root or peer).
struct OperationArguments {
  ncclComm_t comm = nullptr;
  void* stream = nullptr;
  std::size_t count = 0;
  int datatype = -1;
  int reduction = -1;
  int root_or_peer = -1;
  const void* send = nullptr;  // the input buffer (`const void*`): none for ncclRecv and ncclBcast
  void* recv = nullptr;        // the output buffer (`void*`): ncclBcast's only buffer
};

}  // namespace ncclguard
