// What NCCL's profiler plugin API tells of each communicator's latest operations, inside the
// collective: which kernel channels started and which stopped, and, for transfers a proxy thread
// moves (the network), each proxy operation's peer, direction, steps done and where the step in
// flight waits, since when. NCCL calls ncclguard's plugin (shim/profiler.cc) on its own threads;
// this keeps the last kProfiledOps operations of each communicator, in fixed arrays.
//
// Events refer to what they belong to by a ProfileRef, which a newer operation reusing the slot
// makes stale: an event for a stale reference is dropped, never applied to the newer one.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "watchdog/common/mutex.h"
#include "watchdog/common/profile_events.h"
#include "watchdog/state/pace_links.h"

namespace ncclguard {

struct CommState;

class CommProfile {
 public:
  // `api_events`: NCCL sends Coll and P2p API events (profiler version 5 and later, NCCL 2.28+).
  CommProfile(std::string comm_id, int rank, bool api_events = true)
      : comm_id_(std::move(comm_id)), rank_(rank), api_events_(api_events) {}
  CommProfile(const CommProfile&) = delete;
  CommProfile& operator=(const CommProfile&) = delete;

  const std::string& comm_id() const { return comm_id_; }
  int rank() const { return rank_; }
  bool api_events() const { return api_events_; }
  // The communicator's state, once linked (ProfileTable::Link): set once, before NCCL's calls
  // for its operations, so the calling thread reads it without a lock.
  CommState* state() const { return state_.load(std::memory_order_acquire); }

  // A Coll or P2p API event, on the application's thread inside its call: ties the call's ring
  // record (the communicator's newest, which the call just claimed) to the events below it, or
  // marks it captured into a graph. Nothing when the communicator is not timed by the profiler.
  static ProfileRef StartApi(CommProfile* profile, bool graph_captured) noexcept;
  // `api`: the Coll or P2p event's parent, whose record it inherits.
  ProfileRef StartOp(const ProfiledOpStart& start, const ProfileRef& api) noexcept;
  static ProfileRef StartChannel(const ProfileRef& op, int channel, std::int64_t gpu_ns) noexcept;
  static void StopChannel(const ProfileRef& channel, std::int64_t gpu_ns) noexcept;
  // A send proxy operation of an operation tied to its record counts in the pace links
  // (PaceLinkTable) from its start to its stop, even when the profile does not keep it (the
  // reference is then not valid(), and carries only the record).
  static ProfileRef StartProxyOp(const ProfileRef& op, int channel, int peer, bool send, int steps) noexcept;
  static void StopProxyOp(const ProfileRef& proxy) noexcept;
  static ProfileRef StartStep(const ProfileRef& proxy, int step) noexcept;
  // A send step's time on the network (from SendWait to its next state or its stop) and its bytes
  // add to its proxy operation's network figures: what tells a slow link from the others.
  static void SetStepWait(const ProfileRef& step, StepWait wait, std::size_t bytes = 0) noexcept;
  static void StopStep(const ProfileRef& step) noexcept;

  CommProfileSnapshot Snapshot() const;
  // Every proxy operation's send figures by pace block, also those the profile no longer holds.
  PaceLinkTable& pace_links() { return pace_links_; }

 private:
  // Written by NCCL's threads with relaxed atomics and read by snapshots, without a lock: an
  // operation's slot is a sequence lock (its generation is odd while StartOp replaces it), and a
  // proxy operation belongs to the generation it names (`owner`).
  struct Step {
    std::atomic<int> step{-1};  // -1: the slot is free
    std::atomic<StepWait> wait{StepWait::kNone};
    std::atomic<std::int64_t> since_ns{0};
  };
  struct ProxyOp {
    std::atomic<std::uint32_t> owner{0};  // the operation's generation once written, else 0
    std::atomic<int> channel{0};
    std::atomic<int> peer{-1};
    std::atomic<bool> send{false};
    std::atomic<int> steps{0};
    std::atomic<int> steps_done{0};
    std::atomic<bool> stopped{false};
    std::atomic<std::int64_t> network_ns{0};
    std::atomic<std::uint64_t> network_bytes{0};
    std::atomic<int> network_steps{0};
    std::array<Step, kStepsInFlight> in_flight{};
  };
  struct Channel {
    std::atomic<bool> stopped{false};
    std::atomic<std::int64_t> gpu_start_ns{0};
    std::atomic<std::int64_t> gpu_stop_ns{0};
  };
  struct Op {
    std::atomic<std::uint32_t> generation{0};  // 0: never used; odd: being replaced
    std::atomic<const char*> func{""};         // NCCL's literals, valid for the process's life
    std::atomic<const char*> algo{""};
    std::atomic<const char*> proto{""};
    std::atomic<std::uint64_t> nccl_seq{0};
    std::atomic<std::uint64_t> seq{0};
    std::atomic<int> channels{0};
    std::atomic<int> peer{-1};
    std::atomic<std::int64_t> start_ns{0};
    std::atomic<std::uint32_t> kernel_started{0};  // by channel, a bit each
    std::array<Channel, kProfiledChannels> kernel{};
    std::atomic<int> proxy_count{0};  // slots claimed, kProfiledProxyOps at most kept
    std::array<ProxyOp, kProfiledProxyOps> proxies{};
  };

  // The operation `ref` names, when it is still that one's. One that StartOp replaces at that very
  // moment may take a late event of its predecessor: a dump's detail, never a record's state.
  static Op* Find(const ProfileRef& ref);
  static ProxyOp* FindProxy(const ProfileRef& ref);
  // Step `step` of `proxy` while it is in flight.
  static Step* FindStep(ProxyOp* proxy, int step);
  // Ends `slot`'s time on the network, if it was there, as of `now_ns`.
  static void EndNetworkWait(ProxyOp& proxy, Step& slot, std::int64_t now_ns);
  // A copy of `op` as of generation `generation`.
  static OpProfileSnapshot Copy(const Op& op, std::uint32_t generation);

  friend class ProfileTable;

  const std::string comm_id_;
  const int rank_;
  const bool api_events_;
  std::atomic<CommState*> state_{nullptr};
  std::array<Op, kProfiledOps> ops_{};
  std::atomic<std::uint64_t> started_{0};
  PaceLinkTable pace_links_;
};

// Every communicator's profile. One NCCL finalized stays for the dumps up to kMaxProfiles in all;
// the oldest finalized go first (NCCL sends no event for a finalized one).
class ProfileTable {
 public:
  static constexpr std::size_t kMaxProfiles = 256;
  // nullptr when the table holds kMaxProfiles profiles that NCCL has not finalized.
  CommProfile* Open(std::string comm_id, int rank, bool api_events = true);
  void Close(CommProfile* profile);
  // Links `comm` and the newest open profile of its id and rank that is not linked yet, each to
  // the other; that profile, or nullptr when NCCL opened none for it.
  CommProfile* Link(CommState& comm);
  // The newest profile of rank `rank` of communicator `comm_id`.
  std::optional<CommProfileSnapshot> Find(const std::string& comm_id, int rank) const;

 private:
  struct Entry {
    std::unique_ptr<CommProfile> profile;
    bool closed = false;
  };
  mutable Mutex mutex_;
  std::vector<Entry> profiles_ ABSL_GUARDED_BY(mutex_);
};

ProfileTable& GetProfileTable();

}  // namespace ncclguard
