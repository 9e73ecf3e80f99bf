// The time the links take (NCCLEMU_LINKS, slow_link): what an operation waits on the stream's
// worker once its data has moved, and what NCCL's proxy reports of that time meanwhile.
#pragma once

#include <chrono>

#include "faults.h"

namespace ncclemu {

struct CommCore;
struct Operation;
class KernelTrace;

// Whether operations take the links' time; off, data moves as fast as memory does.
inline bool linksModelled() { return activeLinkModel().enabled; }

// A pipelined ring on one channel of a ring collective, once the channel's data has moved on
// every rank. Every rank computes every ring link's time alike, so all agree on the channel's
// time T, the slowest link's. A rank's own send steps spend only its own link's time on the
// network (SendWait), one after the other, at the end of T; before, they wait for data from
// upstream (SendGPUWait), and its receive steps complete as the upstream link delivers them.
// Returns false when the communicator is interrupted first.
bool waitRingChannel(CommCore& core, const Operation& op, KernelTrace& trace, int channel);

// AlltoAll, Gather and Scatter: their slowest link's time, after their exchange.
bool waitExchangeLinks(CommCore& core, const Operation& op);

// How long the link from this rank to a Send's peer takes to carry it (zero to itself).
std::chrono::nanoseconds sendLinkTime(const CommCore& core, const Operation& send);

}  // namespace ncclemu
