#include "watchdog/report/snapshot_builder.h"

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "watchdog/common/describe.h"
#include "watchdog/common/libraries.h"
#include "watchdog/common/nccl_api.h"
#include "watchdog/common/profile_events.h"
#include "watchdog/report/op_signature.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/state/profiles.h"
#include "watchdog/state/records.h"
#include "watchdog/state/registry.h"

namespace ncclguard {
namespace {

OpSnapshot CopyOperation(const OpRecord& op, std::uint64_t seq, std::int64_t to_wall) {
  auto wall = [to_wall](std::int64_t steady) { return steady == 0 ? 0 : steady + to_wall; };
  OpSnapshot copy;
  copy.seq = seq;
  copy.coll_seq = op.coll_seq.load(std::memory_order_relaxed);
  const Api api = op.api.load(std::memory_order_relaxed);
  copy.op = std::string(OperationName(api));
  const int datatype = op.datatype.load(std::memory_order_relaxed);
  copy.dtype = std::string(DatatypeName(datatype));
  copy.count = op.count.load(std::memory_order_relaxed);
  copy.bytes = copy.count * DatatypeSize(datatype);
  const int root_or_peer = op.root_or_peer.load(std::memory_order_relaxed);
  (Describe(api).kind == ApiKind::kPointToPoint ? copy.peer : copy.root) = root_or_peer;
  copy.reduction = ReductionName(op.reduction.load(std::memory_order_relaxed));
  copy.stream = op.stream.load(std::memory_order_relaxed);
  copy.group = op.group.load(std::memory_order_relaxed);
  copy.host_thread = op.host_thread.load(std::memory_order_relaxed);
  copy.enqueue_ns = wall(op.enqueue_ns.load(std::memory_order_relaxed));
  copy.start_ns = wall(op.start_ns.load(std::memory_order_relaxed));
  copy.end_ns = wall(op.end_ns.load(std::memory_order_relaxed));
  copy.gpu_ms = op.gpu_ms.load(std::memory_order_relaxed);
  copy.result = op.result.load(std::memory_order_relaxed);
  copy.state = std::string(OpStateName(op.state.load(std::memory_order_acquire)));
  return copy;
}

// What a status file carries instead of the ring: the signatures of the latest operations, so
// that a peer can find the first #N at which the ranks' calls differ.
void SignLatestOperations(const CommState& comm, std::int64_t to_wall, CommSnapshot& copy) {
  const std::uint64_t last = copy.last_enqueued;
  if (last == 0) return;
  const std::uint64_t window = std::min<std::uint64_t>(kSignedOperations, comm.ring_size);
  copy.signatures_first_seq = last >= window ? last - window + 1 : 1;
  for (std::uint64_t seq = copy.signatures_first_seq; seq <= last; ++seq) {
    const OpRecord& op = comm.ring[seq % comm.ring_size];
    copy.signatures.push_back(op.seq.load(std::memory_order_relaxed) == seq
                                  ? OperationSignature(CopyOperation(op, seq, to_wall))
                                  : kNoSignature);
  }
}

// The operations' part of a communicator's copy (the ring, or its status form, and the signatures),
// from `copy.last_enqueued` and `copy.last_completed`.
void CopyOperations(const CommState& comm, bool with_rings, bool sign, std::int64_t to_wall,
                    CommSnapshot& copy) {
  if (comm.ring == nullptr) {  // closed and freed: its operations as the ring held them then
    if (comm.closed_status != nullptr) {
      if (sign) {
        copy.signatures_first_seq = comm.closed_status->signatures_first_seq;
        copy.signatures = comm.closed_status->signatures;
      }
      for (const OpSnapshot& op : comm.closed_status->ring) {
        if (with_rings || op.seq == copy.last_completed) copy.ring.push_back(op);
      }
    }
    return;
  }
  if (sign) SignLatestOperations(comm, to_wall, copy);
  // The whole ring, or (for status files) only the last completed and the oldest unfinished
  // operations: peers name a late rank's last operation from it.
  const std::uint64_t last = copy.last_enqueued;
  for (std::uint64_t seq = last >= comm.ring_size ? last - comm.ring_size + 1 : 1; seq <= last; ++seq) {
    const OpRecord& op = comm.ring[seq % comm.ring_size];
    if (op.seq.load(std::memory_order_relaxed) != seq) continue;
    if (with_rings || seq == copy.last_completed) {
      copy.ring.push_back(CopyOperation(op, seq, to_wall));
    } else if (!IsFinished(op.state.load(std::memory_order_acquire))) {
      copy.ring.push_back(CopyOperation(op, seq, to_wall));
      break;
    }
  }
}

// One communicator, less its library (path and version), which BuildSnapshot adds.
CommSnapshot SnapshotOfCommunicator(const CommState& comm, bool with_rings, bool sign, std::int64_t to_wall) {
  CommSnapshot copy;
  copy.id = comm.id;
  copy.handle = reinterpret_cast<std::uint64_t>(comm.handle.load());
  copy.rank = comm.rank.load(std::memory_order_relaxed);
  copy.nranks = comm.nranks.load(std::memory_order_relaxed);
  copy.device = comm.device.load(std::memory_order_relaxed);
  copy.created_by = std::string(Describe(comm.created_by).name);
  copy.parent_id = comm.parent_id;
  copy.state = std::string(CommLifecycleName(comm.lifecycle.load(std::memory_order_acquire)));
  copy.timing = std::string(TimingSourceName(comm.timing.load(std::memory_order_acquire)));
  copy.init_start_ns = comm.init_start_ns + to_wall;
  const std::int64_t init_end = comm.init_end_ns.load(std::memory_order_acquire);
  copy.init_end_ns = init_end == 0 ? 0 : init_end + to_wall;
  copy.last_enqueued = comm.last_enqueued.load(std::memory_order_acquire);
  copy.collectives = comm.collectives.load(std::memory_order_relaxed);
  copy.last_started = comm.last_started.load(std::memory_order_acquire);
  copy.last_completed = comm.last_completed.load(std::memory_order_acquire);
  const int async_error = comm.async_error.load(std::memory_order_relaxed);
  if (IsNcclError(static_cast<ncclResult_t>(async_error))) {
    copy.async_error = std::string(ResultName(static_cast<ncclResult_t>(async_error)));
  }
  copy.dropped = comm.dropped.load(std::memory_order_relaxed);
  CopyOperations(comm, with_rings, sign, to_wall, copy);
  copy.pace = comm.pace.Blocks();
  // A dump has every operation NCCL's profiler told of; a status, which every peer reads at a
  // stall, those still running.
  if (std::optional<CommProfileSnapshot> profile = GetProfileTable().Find(copy.id, copy.rank)) {
    for (OpProfileSnapshot& op : profile->ops) {
      if (with_rings || StillRunning(op)) copy.profile.push_back(std::move(op));
    }
  }
  return copy;
}

}  // namespace

CommSnapshot ClosedStatusOf(const CommState& comm, std::int64_t to_wall) {
  CommSnapshot copy;
  copy.last_enqueued = comm.last_enqueued.load(std::memory_order_acquire);
  copy.last_completed = comm.last_completed.load(std::memory_order_acquire);
  // The whole ring: a dump (at exit, say) still has the operations of a communicator the
  // application closed an instant before, for as long as its state is kept (a status interval).
  CopyOperations(comm, true, true, to_wall, copy);
  return copy;
}

ProcessSnapshot BuildSnapshot(Registry& registry, const std::string& reason, bool with_rings,
                              std::int64_t steady_now_ns, std::int64_t wall_now_ns) {
  const std::int64_t to_wall = wall_now_ns - steady_now_ns;
  ProcessSnapshot snapshot;
  snapshot.reason = reason;
  snapshot.time_ns = wall_now_ns;
  snapshot.in_nccl_call = CurrentNcclCall();
  // Asked once per library, not per communicator: finding the library may walk the loaded objects.
  std::map<int, std::pair<std::string, int>> libraries;
  for (CommState* comm : registry.All()) {
    // Status files sign only the first communicators (job_dir.h): no need to sign the others.
    const bool sign = !with_rings && snapshot.comms.size() < kMaxSignedCommunicators;
    CommSnapshot& copy =
        snapshot.comms.emplace_back(SnapshotOfCommunicator(*comm, with_rings, sign, to_wall));
    auto [library, added] = libraries.try_emplace(comm->library.load());
    if (added) library->second = {Real().Path(comm->library.load()), Real().Version(comm->library.load())};
    copy.library_path = library->second.first;
    copy.nccl_version = library->second.second;
    if (snapshot.rank < 0) snapshot.rank = copy.rank;
  }
  for (const PendingInit& init : registry.PendingInits()) {
    PendingInitSnapshot copy;
    copy.comm_id = init.comm_id;
    copy.api = std::string(Describe(init.api).name);
    copy.rank = init.rank;
    copy.nranks = init.nranks;
    copy.start_ns = init.start_ns + to_wall;
    if (init.result != ncclSuccess)
      copy.result = std::string(ResultName(static_cast<ncclResult_t>(init.result)));
    if (snapshot.rank < 0) snapshot.rank = copy.rank;
    snapshot.pending_inits.push_back(std::move(copy));
  }
  return snapshot;
}

}  // namespace ncclguard
