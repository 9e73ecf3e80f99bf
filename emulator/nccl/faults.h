// NCCLEMU_FAULTS: faults injected into the transport, deterministically, by rank and by the
// per-communicator sequence number of an operation. NCCLEMU_LINKS: how long the transport's
// links take.
#pragma once

#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ncclemu {

enum class FaultKind { Hang, P2pStall, Slow, SlowLink, AsyncError, InitHang, Crash };

struct Fault {
  FaultKind kind;
  int rank = -1;           // -1: every rank
  int peer = -1;           // hang: the link from `rank` to `peer` stops instead of the whole rank; -1: none
                           // slow_link: the link from `rank` to `peer` is slower
  uint64_t seq = 0;        // 1-based operation number on the communicator
  uint64_t from_seq = 0;   // slow_link: first operation slowed (0: from the first)
  uint64_t until_seq = 0;  // slow_link: last operation slowed (0: no end)
  int channel = -1;        // slow_link: the only channel slowed; -1: every channel
  double factor = 1;       // slow_link: how many times longer the link takes
  uint64_t after = 0;      // p2p_stall: operations that still complete
  int delay_ms = 0;        // slow
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

// A transfer over the link between two ranks takes latency + bytes / bandwidth, times the
// slow_link factors that apply, times a jitter factor drawn uniformly from [1 - jitter, 1 + jitter].
struct LinkModel {
  bool enabled = false;  // off: data moves as fast as memory does
  double gbps = 10;      // bandwidth, in gigabits per second
  double latency_us = 50;
  double jitter = 0;  // 0 to 0.9
  uint64_t seed = 0;
  std::string error;  // non-empty: the spec is malformed and this says which part
};

// "gbps=G,latency_us=L,jitter=J,seed=S", every key optional; "on" alone takes every default;
// empty: off.
LinkModel parseLinkSpec(const std::string& spec);

// NCCLEMU_LINKS, parsed once per loaded library; on with its defaults when unset but a slow_link
// fault is given.
const LinkModel& activeLinkModel();

// What is wrong with NCCLEMU_FAULTS or NCCLEMU_LINKS, prefixed with the variable's name; empty
// when both are well formed.
std::string transportSpecError();

// One use of the link from rank `from` to rank `to`: `bytes` on `channel`, in the operation
// numbered `seq` on its communicator (the K-th one this process joined: comm_index).
struct LinkUse {
  int from = 0;
  int to = 0;
  int channel = 0;
  uint64_t seq = 0;
  size_t bytes = 0;
  int comm_index = 0;
};

// How long `use` takes under `model` and the slow_link faults of `faults`. The jitter is drawn
// from the seed, the link, the channel and seq alone, so every rank computes the same time for
// every link.
std::chrono::nanoseconds linkTime(const LinkModel& model, const std::vector<Fault>& faults,
                                  const LinkUse& use);

// A 64-bit mixer (SplitMix64's finalizer): spreads every input bit over the result.
uint64_t mixBits(uint64_t value);

}  // namespace ncclemu
