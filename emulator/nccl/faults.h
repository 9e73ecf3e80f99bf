// NCCLEMU_FAULTS: faults injected into the transport, deterministically, by rank and by the
// per-communicator sequence number of an operation.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ncclemu {

enum class FaultKind { Hang, P2pStall, Slow, AsyncError, InitHang, Crash };

struct Fault {
  FaultKind kind;
  int rank = -1;       // -1: every rank
  int peer = -1;       // hang: the link from `rank` to `peer` stops instead of the whole rank; -1: none
  uint64_t seq = 0;    // 1-based operation number on the communicator
  uint64_t after = 0;  // p2p_stall: operations that still complete
  int delay_ms = 0;    // slow
  ncclResult_t code = ncclSuccess;  // async_error
  int comm_index = 0;               // 0: every communicator; else the K-th one this process joined
};

struct FaultPlan {
  std::vector<Fault> faults;
  std::string error;  // non-empty: the spec is malformed and this says which part
};

FaultPlan parseFaultSpec(const std::string& spec);

// NCCLEMU_FAULTS, parsed once per loaded library.
const FaultPlan& activeFaultPlan();

}  // namespace ncclemu
