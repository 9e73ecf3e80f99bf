// A rank as the classifier's tests start one: its process seen just now and alive, holding one
// ready communicator in which it is that rank. The test adds the communicator's operations.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "watchdog/report/job_read.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard::testing {

inline ProcessView AliveRank(std::string host, int pid, int rank, std::string comm_id, int nranks,
                             std::int64_t now_ns) {
  ProcessView process;
  process.host = std::move(host);
  process.pid = pid;
  process.liveness = ProcessView::Liveness::kAlive;
  process.last_seen_ns = now_ns;
  process.snapshot.time_ns = now_ns;
  process.snapshot.rank = rank;
  CommSnapshot& comm = process.snapshot.comms.emplace_back();
  comm.id = std::move(comm_id);
  comm.rank = rank;
  comm.nranks = nranks;
  comm.state = "ready";
  return process;
}

}  // namespace ncclguard::testing
