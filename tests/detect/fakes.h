// Test doubles for the watchdog: GPU events whose completion the test decides, and effects that
// are recorded instead of performed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include "watchdog/detect/watchdog.h"
#include "watchdog/state/gpu_events.h"
#include "watchdog/state/records.h"
#include "watchdog/state/registry.h"

namespace ncclguard::testing {

class FakeGpuEvents final : public GpuEvents {
 public:
  bool available = true;
  std::set<GpuStream> capturing;

  bool Available() override { return available; }
  GpuContext CurrentContext() override { return reinterpret_cast<GpuContext>(0xc0); }
  bool IsCapturing(GpuStream stream) override {
    std::lock_guard<std::mutex> lock(mutex_);
    ++calls_;
    return capturing.count(stream) != 0;
  }
  GpuEvent Create() override {
    std::lock_guard<std::mutex> lock(mutex_);
    ++calls_;
    return reinterpret_cast<GpuEvent>(++next_event_);
  }
  bool Record(GpuEvent event, GpuStream) override {
    std::lock_guard<std::mutex> lock(mutex_);
    ++calls_;
    recorded_.push_back(event);
    reached_.erase(event);  // a record moves the event to the new point of the stream
    return true;
  }
  EventStatus Query(GpuContext, GpuEvent event) override {
    std::lock_guard<std::mutex> lock(mutex_);
    ++calls_;
    ++queries_[event];
    return reached_.count(event) != 0 || reach_everything_ ? EventStatus::kReached : EventStatus::kNotReached;
  }
  float ElapsedMs(GpuContext, GpuEvent, GpuEvent) override { return 1.5f; }
  void Destroy(GpuContext, GpuEvent event) override {
    std::lock_guard<std::mutex> lock(mutex_);
    destroyed_.push_back(event);
  }
  void PrepareWatchdogThread() override {}

  // The GPU reaches `event` (as recorded so far).
  void Reach(GpuEvent event) {
    std::lock_guard<std::mutex> lock(mutex_);
    reached_.insert(event);
  }
  void ReachEverything() {
    std::lock_guard<std::mutex> lock(mutex_);
    reach_everything_ = true;
  }
  int QueriesOf(GpuEvent event) {
    std::lock_guard<std::mutex> lock(mutex_);
    return queries_[event];
  }
  std::vector<GpuEvent> Destroyed() {
    std::lock_guard<std::mutex> lock(mutex_);
    return destroyed_;
  }
  // Calls that would reach the driver: capture queries, creations, records and queries.
  int Calls() {
    std::lock_guard<std::mutex> lock(mutex_);
    return calls_;
  }
  std::vector<GpuEvent> Recorded() {
    std::lock_guard<std::mutex> lock(mutex_);
    return recorded_;
  }

 private:
  std::mutex mutex_;
  std::uintptr_t next_event_ = 0x1000;
  std::set<GpuEvent> reached_;
  std::vector<GpuEvent> recorded_;
  std::vector<GpuEvent> destroyed_;
  std::map<GpuEvent, int> queries_;
  bool reach_everything_ = false;
  int calls_ = 0;
};

struct ExitCalled : std::runtime_error {
  explicit ExitCalled(int code) : std::runtime_error("exit"), code(code) {}
  int code;
};

class RecordingEffects final : public WatchdogEffects {
 public:
  std::vector<ProcessSnapshot> dumps;
  std::vector<ProcessSnapshot> statuses;
  std::vector<std::string> peer_requests_sent;
  std::vector<CommState*> aborted;
  std::map<CommState*, ncclResult_t> async_errors;
  std::map<CommState*, int> async_error_queries;  // how often ncclCommGetAsyncError was called
  std::int64_t pending_peer_request_ns = 0;
  std::string last_error = "NCCL WARN something broke";
  std::int64_t wall_ns = 1'700'000'000'000'000'000;

  std::string WriteDump(const ProcessSnapshot& snapshot) override {
    dumps.push_back(snapshot);
    return "/dumps/dump-" + std::to_string(dumps.size()) + ".json";
  }
  bool job_directory_known = true;
  bool JobDirectoryKnown() override { return job_directory_known; }
  void WriteStatus(const ProcessSnapshot& snapshot) override { statuses.push_back(snapshot); }
  int thread_captures = 0;
  std::optional<ThreadsSnapshot> CaptureThreads() override {
    ++thread_captures;
    ThreadsSnapshot threads;
    threads.total = 1;
    threads.threads.emplace_back().tid = 1;
    return threads;
  }
  void RequestPeerDumps(const std::string& why) override { peer_requests_sent.push_back(why); }
  std::vector<Verdict> verdicts;  // what Classify answers
  int classifications = 0;
  std::vector<Verdict> Classify(const ProcessSnapshot&) override {
    ++classifications;
    return verdicts;
  }
  std::vector<Verdict> fail_slow;  // what ClassifyFailSlow answers
  int fail_slow_looks = 0;
  std::vector<Verdict> ClassifyFailSlow() override {
    ++fail_slow_looks;
    return fail_slow;
  }
  std::int64_t TakePeerDumpRequest() override { return std::exchange(pending_peer_request_ns, 0); }
  ProcessFacts facts;
  const ProcessFacts& Facts() override { return facts; }
  std::vector<P2pVerdictRecord> p2p_records;  // what RecordP2pVerdict wrote
  bool p2p_record_writable = true;
  absl::StatusOr<std::string> RecordP2pVerdict(P2pVerdictRecord record) override {
    if (!p2p_record_writable) return absl::PermissionDeniedError("read-only job directory");
    p2p_records.push_back(std::move(record));
    return std::string("/job/p2p-verdict.json");
  }
  std::optional<P2pVerdictRecord> fresh_p2p_verdict;  // what FreshP2pVerdict answers
  int p2p_verdict_reads = 0;
  std::optional<P2pVerdictRecord> FreshP2pVerdict() override {
    ++p2p_verdict_reads;
    return fresh_p2p_verdict;
  }
  ncclResult_t AsyncError(CommState& comm) override {
    ++async_error_queries[&comm];
    const auto found = async_errors.find(&comm);
    return found == async_errors.end() ? ncclSuccess : found->second;
  }
  std::string LastNcclError() override { return last_error; }
  void Abort(CommState& comm) override {
    aborted.push_back(&comm);
    comm.aborted_by_ncclguard.store(true);
    comm.lifecycle.store(CommLifecycle::kAborted);
  }
  bool holding_application_calls = false;
  // In-process recoveries asked for: the operation and this rank's reason not to (or "").
  std::vector<std::pair<std::uint64_t, std::string>> recoveries;
  RecoveryOutcome recovery_outcome;
  void HoldApplicationCalls() override { holding_application_calls = true; }
  RecoveryOutcome RecoverInProcess(CommState&, ProbationOp& op,
                                   const std::string& not_ready_reason) override {
    recoveries.push_back({op.seq, not_ready_reason});
    return recovery_outcome;
  }
  [[noreturn]] void Exit(int code) override { throw ExitCalled(code); }
  std::int64_t WallNowNs() override { return wall_ns; }
  std::vector<MetricsSample> metrics;  // every publication
  void WriteMetrics(const MetricsSample& sample) override { metrics.push_back(sample); }
};

// Puts an AllReduce handed to NCCL at `enqueued_at` into `comm`'s ring, its CUDA events recorded
// (neither reached yet): what the shim's wrapper leaves for the watchdog.
inline OpRecord& EnqueueAllReduce(CommState& comm, FakeGpuEvents& events, std::int64_t enqueued_at,
                                  ncclDataType_t datatype = ncclFloat32, std::size_t count = 1024) {
  const std::uint64_t seq = comm.last_enqueued.load() + 1;
  OpRecord& op = comm.Slot(seq);
  op.api = Api::ncclAllReduce;
  op.datatype = datatype;
  op.count = count;
  op.reduction = ncclSum;
  op.enqueue_ns = enqueued_at;
  op.start_event = events.Create();
  op.end_event = events.Create();
  events.Record(op.start_event, nullptr);
  events.Record(op.end_event, nullptr);
  op.start_recorded = true;
  op.end_recorded = true;
  op.seq = seq;
  op.state.store(OpState::kEnqueued);
  comm.last_enqueued = seq;
  return op;
}

// A watchdog of its own over one ready communicator of 4 ranks, id 1111222233334444, whose rounds
// the test runs with the time it gives: fake GPU events, recorded effects.
struct WatchdogFixture {
  WatchdogFixture(const Config& given, int rank)
      : config(given), watchdog(config, registry, events, effects) {
    comm = registry.Add(reinterpret_cast<ncclComm_t>(0xabc0), 0, 16);
    std::snprintf(comm->id, sizeof(comm->id), "1111222233334444");
    comm->rank = rank;
    comm->nranks = 4;
    comm->lifecycle = CommLifecycle::kReady;
  }

  Config config;
  Registry registry;
  FakeGpuEvents events;
  RecordingEffects effects;
  Watchdog watchdog;
  CommState* comm;
};

}  // namespace ncclguard::testing
