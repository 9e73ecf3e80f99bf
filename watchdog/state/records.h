// What ncclguard keeps about communicators and their operations. Written on the application's
// threads without locks or allocation (records go into a preallocated ring), read by the watchdog.
#pragma once

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "watchdog/common/nccl_api.h"
#include "watchdog/state/gpu_events.h"
#include "watchdog/state/pace.h"

namespace ncclguard {

enum class OpState : std::uint8_t {
  kFree,       // slot never used
  kEnqueued,   // handed to NCCL; the GPU has not reached it yet
  kStarted,    // the GPU reached its start event
  kCompleted,  // the GPU reached its end event
  kFailed,     // NCCL returned an error for it
  kAborted,    // its communicator was aborted (or revoked) before it completed
  kCaptured,   // issued while its stream was captured into a CUDA graph: never timed
  kUntimed,    // no CUDA driver to time it with
};

constexpr bool IsFinished(OpState state) { return state != OpState::kEnqueued && state != OpState::kStarted; }
std::string_view OpStateName(OpState state);

// What tells a communicator's operations started and completed on the GPU: NCCL's profiler (its
// kernel channels' events, from the proxy thread, with the GPU's own timestamps; capture from its
// API events), where ncclguard serves it and NCCL profiles the communicator's calls, else a pair
// of CUDA events per operation, recorded on its stream (docs/architecture.md, "Timing").
enum class TimingSource : std::uint8_t { kCudaEvents, kProfiler };
std::string_view TimingSourceName(TimingSource source);  // "cuda_events", "profiler"

// One operation in a communicator's ring. Every field is atomic: the application's thread writes
// the description, the watchdog the progress, and a dump may read everything at any time.
// Relaxed accesses are published by `state` (release/acquire).
struct OpRecord {
  std::atomic<std::uint64_t> seq{0};
  // The communicator's collectives issued up to this operation, itself included: a collective's
  // number among collectives, which every rank gives it even where their sends and receives differ
  // (pipeline stages); for a Send or Recv, the collectives issued before it.
  std::atomic<std::uint64_t> coll_seq{0};
  std::atomic<OpState> state{OpState::kFree};
  std::atomic<Api> api{};
  std::atomic<int> datatype{0};
  std::atomic<int> reduction{-1};
  std::atomic<int> root_or_peer{-1};
  std::atomic<int> result{0};
  std::atomic<std::uint64_t> count{0};
  std::atomic<std::uint64_t> stream{0};
  std::atomic<std::uint64_t> group{0};
  std::atomic<std::int64_t> host_thread{0};
  // Steady-clock nanoseconds: when NCCL was called, and when the watchdog saw the GPU reach the
  // start and end events (so they are late by up to one poll interval; gpu_ms is exact).
  std::atomic<std::int64_t> enqueue_ns{0};
  std::atomic<std::int64_t> start_ns{0};
  std::atomic<std::int64_t> end_ns{0};
  std::atomic<float> gpu_ms{-1};
  // Whether the events have been recorded on the stream yet (grouped operations get theirs at the
  // outermost ncclGroupEnd; the end event goes in once NCCL has taken the launch).
  std::atomic<bool> start_recorded{false};
  std::atomic<bool> end_recorded{false};
  // NCCL answered ncclInProgress (a non-blocking communicator): the launch completes later, and
  // the watchdog records the end event once the communicator is no longer in progress.
  std::atomic<bool> launch_pending{false};
  // The slot's own pair of events, created on first use in the caller's context and reused with
  // the slot: a slot is reused only when its previous operation is finished, so the watchdog is
  // done with them. Written before `state` is published.
  GpuEvent start_event = nullptr;
  GpuEvent end_event = nullptr;

  // Timed by NCCL's profiler (its communicator's source, and a call NCCL profiles): no event is
  // recorded for it. Its API event ties it to the record (`profile_linked`, the calling thread);
  // its Coll or P2p events add the kernel channels they launch; the proxy thread counts the
  // channels started and stopped and keeps the earliest start and latest stop (the GPU's global
  // timer, ns). Started: a channel started; completed: every channel launched stopped.
  std::atomic<bool> profiled{false};
  std::atomic<bool> profile_linked{false};
  std::atomic<std::uint32_t> channels_expected{0};
  std::atomic<std::uint32_t> channels_started{0};
  std::atomic<std::uint32_t> channels_stopped{0};
  std::atomic<std::int64_t> gpu_start_ns{0};
  std::atomic<std::int64_t> gpu_stop_ns{0};
};

// A profiled operation's progress, as its kernel channels told it.
inline bool ProfiledStarted(const OpRecord& op) {
  return op.channels_started.load(std::memory_order_acquire) > 0;
}
inline bool ProfiledCompleted(const OpRecord& op) {
  const std::uint32_t expected = op.channels_expected.load(std::memory_order_acquire);
  return expected > 0 && op.channels_stopped.load(std::memory_order_acquire) >= expected;
}
// GPU milliseconds from the first channel's start to the last one's stop; negative when unknown.
inline float ProfiledGpuMs(const OpRecord& op) {
  const std::int64_t start = op.gpu_start_ns.load(std::memory_order_relaxed);
  const std::int64_t stop = op.gpu_stop_ns.load(std::memory_order_relaxed);
  return start > 0 && stop >= start ? static_cast<float>(static_cast<double>(stop - start) / 1e6) : -1.0F;
}

enum class CommLifecycle : std::uint8_t {
  kInitializing,
  kReady,
  kFailed,
  kAborted,
  kRevoked,
  kFinalized,
  kDestroyed
};
std::string_view CommLifecycleName(CommLifecycle lifecycle);

// A ring is mapped on its own rather than taken from the heap: freed, its memory goes back to the
// system at once instead of staying in the application's heap (a ring is hundreds of KiB).
struct RingUnmapper {
  std::size_t size;
  void operator()(OpRecord* ring) const noexcept;
};
using RingPointer = std::unique_ptr<OpRecord[], RingUnmapper>;
RingPointer MapRing(std::size_t size);  // throws std::bad_alloc when there is no memory

// Probation (NCCLGUARD_RECOVER=inprocess): one of a communicator's first operations, or one queued
// behind them, with what a replay needs. The application's stream waits on the GPU after it, at a
// gate word, until the operation is seen complete (then the word is set) or replayed on a new
// communicator.
enum class ProbationState : std::uint8_t {
  kNone,        // not on probation
  kHeld,        // queued behind an earlier one: not handed to NCCL yet (ncclguard issues it)
  kPending,     // in NCCL's hands and gated; outcome not known yet
  kReleased,    // it completed: the gate is open
  kRecovering,  // the watchdog took it over: only a replay opens the gate
};

struct ProbationOp {
  // Published by `state` (release): the application's thread writes the rest first, once.
  std::atomic<ProbationState> state{ProbationState::kNone};
  std::uint64_t seq = 0;
  Api api{};
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;
  int datatype = 0;
  int reduction = 0;
  int root_or_peer = -1;
  void* stream = nullptr;   // the application's: it waits at the gate
  std::uint64_t group = 0;  // the ncclGroupStart/End it was issued in (0: none): replayed as one
  // A held operation: the application's stream at the call (the issuing stream waits for it), and
  // whether its group has ended, so that the group is issued whole.
  GpuEvent ready_event = nullptr;
  std::atomic<bool> issuable{false};
  // A copy of an in-place operation's input, taken on the stream before the operation (0: none).
  std::uint64_t saved_input = 0;
  std::size_t saved_bytes = 0;
  // Page-locked host word the stream waits on (>= 1), and its device address.
  std::atomic<std::uint32_t>* gate = nullptr;
  std::uint64_t gate_device = 0;
  // Why a replay would not give the application what the operation would have (nullptr: it
  // would): set by the application's thread, also after `state` is published.
  std::atomic<const char*> unsafe{nullptr};
};
inline constexpr int kMaxProbationOps = 16;  // NCCLGUARD_PROBATION_OPS's upper bound
// Slots for the first operations and those queued behind them; past that the application's next
// operation waits until the queue has drained.
inline constexpr int kProbationSlots = 64;

// What the application asked of a communicator at its creation, kept for a re-creation: its
// ncclConfig_t (its strings copied), or, without one, NCCL's defaults.
struct KeptConfig {
  bool present = false;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  std::string net_name;
  std::string comm_name;
};

struct CommSnapshot;
class CommProfile;

struct CommState {
  CommState(ncclComm_t handle, int library, std::size_t ring_size)
      : handle(handle), library(library), ring_size(ring_size), ring(MapRing(ring_size)) {}

  // NCCL's communicator and the slot of the library serving it: changed only by in-process
  // recovery (Registry::Rekey), while the application's calls are held.
  std::atomic<ncclComm_t> handle;
  std::atomic<int> library;
  char id[17] = {};  // the same on every rank: from the unique id, or the parent's id + lineage
  char parent_id[17] = {};
  Api created_by = Api::ncclCommInitRank;
  GpuContext context = nullptr;  // where its events live
  std::int64_t init_start_ns = 0;
  std::atomic<std::int64_t> init_end_ns{0};
  std::atomic<int> rank{-1};
  std::atomic<int> nranks{0};
  std::atomic<int> device{-1};
  std::atomic<CommLifecycle> lifecycle{CommLifecycle::kInitializing};
  // Set when ncclguard itself aborted it: the real communicator is gone, so the application's
  // later calls on it must not reach NCCL.
  std::atomic<bool> aborted_by_ncclguard{false};
  // The latest result NCCL gave for it, from the watchdog's ncclCommGetAsyncError or the
  // application's own: an error either way is reported once (`reported_async_error`).
  std::atomic<int> async_error{ncclSuccess};
  // Created inside a group that has not ended yet: NCCL creates it only at the outermost
  // ncclGroupEnd, and any call on it before then warns and changes ncclGetLastError.
  std::atomic<bool> awaiting_group_end{false};
  std::atomic<std::uint32_t> children{0};   // splits and shrinks made from it, for their ids
  std::atomic<bool> failure_dumped{false};  // a failed call on it was dumped already

  // Closing (destroy, abort, finalize) and the watchdog's own NCCL calls on it exclude each other:
  // NCCL frees the communicator in ncclCommDestroy/ncclCommAbort.
  std::atomic<bool> closing{false};
  std::atomic<bool> watchdog_in_call{false};
  // The application aborts or revokes it: NCCL ends its kernels early, so an end event that fires
  // from then on says nothing of completion (the call's end marks what was unfinished aborted).
  std::atomic<bool> cut_short{false};

  // The watchdog thread's own bookkeeping: the oldest operation not known to be finished, and
  // the operation last reported as stalled.
  std::uint64_t watch_cursor = 1;
  std::uint64_t reported_stall_seq = 0;
  int reported_async_error = ncclSuccess;
  bool stall_acted_on = false;         // the action for that stall was taken
  std::int64_t stall_recheck_ns = 0;   // when to look at a stall not acted on again
  std::int64_t stall_reported_ns = 0;  // when that stall was found
  bool verdict_settling = false;       // the recheck awaits a settled verdict: not logged
  std::int64_t closed_seen_ns = 0;     // when it freed the ring of a closed communicator
  std::uint64_t pace_cursor = 1;       // the next operation FoldPace adds to `pace`
  PaceLog pace;

  const std::size_t ring_size;
  // Freed (null) by the watchdog thread once the application has closed the communicator and
  // every operation has its final state; the state itself stays one status interval longer.
  RingPointer ring;
  // Its operations once the ring is freed (the ring's copy, its last operations' signatures): status
  // files keep saying its last completed operation, so that a peer that exits right after
  // destroying its communicators still lets the others find a desync, and a dump (at exit) still
  // has every operation. Set by the watchdog thread under its status lock.
  std::shared_ptr<const CommSnapshot> closed_status;
  std::atomic<std::uint64_t> last_enqueued{0};
  std::atomic<std::uint64_t> collectives{0};  // issued so far: the last collective's coll_seq
  std::atomic<std::uint64_t> last_started{0};
  std::atomic<std::uint64_t> last_completed{0};
  std::atomic<std::uint64_t> dropped{0};
  // CUDA events: the application's thread asks the GPU about the operation in the slot it wants
  // only from this operation on, after the GPU last said it had not reached it (operations.cc).
  std::atomic<std::uint64_t> reclaim_query_from{0};

  // Probation: how many of its first operations go on probation (set when it is registered), how
  // many slots were taken (the first operations and those queued behind them), and theirs. Written
  // by the application's thread that issues operations (NCCL wants one at a time per
  // communicator).
  int probation_limit = 0;
  std::atomic<int> probation_taken{0};
  ProbationOp probation[kProbationSlots];
  // After a recovery nothing more goes on probation, but what is queued is still issued in order.
  std::atomic<bool> probation_closed{false};
  // Held operations: the stream ncclguard issues them on (created by the issuing thread), whether
  // that thread is inside NCCL on it (closing waits, as for `watchdog_in_call`), and whether the
  // communicator is on that thread's list.
  void* issue_stream = nullptr;
  std::atomic<bool> issuer_in_call{false};
  std::atomic<bool> issuer_listed{false};
  // Set by the watchdog while it recovers the communicator, and once it did; and when the replay
  // completed (steady clock): the operations queued behind the replayed ones waited for it, so
  // their wait to start counts from then.
  std::atomic<bool> recovered{false};
  std::atomic<std::int64_t> recovered_ns{0};
  // Made non-blocking (ncclConfig_t::blocking = 0, or NCCL_COMM_BLOCKING=0): calls may answer
  // ncclInProgress. Its configuration, for a re-creation. Set at registration.
  bool nonblocking = false;
  KeptConfig config;

  // Its timing source (set once its profile is linked, at the end of its creation) and NCCL's
  // profile of it (state/profiles.h), each pointing at the other.
  std::atomic<TimingSource> timing{TimingSource::kCudaEvents};
  std::atomic<CommProfile*> profile{nullptr};

  OpRecord& Slot(std::uint64_t seq) { return ring[seq % ring_size]; }
  // The probation slots taken so far (a slot's `state` publishes the rest of it).
  std::span<ProbationOp> TakenProbation() {
    const int taken = std::min(probation_taken.load(std::memory_order_acquire), kProbationSlots);
    return {probation, static_cast<std::size_t>(taken)};
  }
};

// Names used in logs and dumps.
std::string_view OperationName(Api api);  // "AllReduce"; ncclBcast is a "Broadcast"
std::string_view DatatypeName(int datatype);
std::size_t DatatypeSize(int datatype);
std::string ReductionName(int reduction);  // "" for none

}  // namespace ncclguard
