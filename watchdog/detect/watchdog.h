// The watchdog's decisions: a round follows every communicator's operations on the GPU, notices
// stalls, asynchronous errors and failed calls, dumps, and acts as NCCLGUARD_ACTION says. What it
// does to the outside world is WatchdogEffects (the real ones: detect/effects.h); the threads that
// run its rounds, the monitor of its heartbeat, signals, exit and fork are the runtime's
// (detect/runtime.h). Kept apart so that a test runs the rounds alone, with a fake clock.
#pragma once

#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "watchdog/common/clock.h"
#include "watchdog/common/config.h"
#include "watchdog/common/mutex.h"
#include "watchdog/detect/dump_spacing.h"
#include "watchdog/detect/fail_slow.h"
#include "watchdog/detect/metrics.h"
#include "watchdog/detect/progress.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/recover/in_process.h"
#include "watchdog/recover/p2p_verdict.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/state/gpu_events.h"
#include "watchdog/state/registry.h"

namespace ncclguard {

// Everything the watchdog does to the outside world, behind one interface so that a test can
// run the watchdog's rounds with a fake clock, fake events and recorded effects.
class WatchdogEffects {
 public:
  virtual ~WatchdogEffects() = default;
  // Writes this process's dump; returns its path, or "" when it could not be written. At exit,
  // facts that need the CUDA driver are left out: the driver may already be shutting down.
  virtual std::string WriteDump(const ProcessSnapshot& snapshot) = 0;
  // False until the job directory is known (it is named after the first communicator): status
  // files and dump requests wait for it.
  virtual bool JobDirectoryKnown() = 0;
  // How many statuses per second the whole job may write on its board.
  virtual double BoardWritesPerSecond() { return kJobStatusWritesPerSecond; }
  virtual void WriteStatus(const ProcessSnapshot& snapshot) = 0;
  // Every thread's stack, native and Python, for a dump (report/thread_stacks.h).
  virtual std::optional<ThreadsSnapshot> CaptureThreads() = 0;
  virtual void RequestPeerDumps(const std::string& why) = 0;
  // The cross-rank verdicts from the job directory, this process's own state brought up to date
  // first; empty when the job directory cannot be read.
  virtual std::vector<Verdict> Classify(const ProcessSnapshot& own_status) = 0;
  // The time (epoch ns) of the newest dump request from another process of the job since the
  // previous call; 0 when there is none.
  virtual std::int64_t TakePeerDumpRequest() = 0;
  // The facts of this process that do not change while it runs (environment, kernel, drivers,
  // GPUs), collected once when the watchdog started; identity facts only until then.
  virtual const ProcessFacts& Facts() = 0;
  // Writes the record that this attempt of the job found P2P at fault (its job id filled in);
  // returns the file's path, or why it could not be written.
  virtual absl::StatusOr<std::string> RecordP2pVerdict(P2pVerdictRecord record) = 0;
  // The job directory's P2P verdict record when one was written after this process started (by
  // this attempt of the job, not an earlier one); std::nullopt otherwise.
  virtual std::optional<P2pVerdictRecord> FreshP2pVerdict() = 0;
  // ncclCommGetAsyncError of the communicator (ncclSuccess when it cannot be asked).
  virtual ncclResult_t AsyncError(CommState& comm) = 0;
  virtual std::string LastNcclError() = 0;
  virtual void Abort(CommState& comm) = 0;
  // NCCLGUARD_RECOVER=inprocess: takes part in the recovery of `op`, an operation of `comm` on
  // probation that stalled (recover/in_process.h); `not_ready_reason` says why this rank cannot
  // recover ("" when it can), which makes every rank fall back.
  virtual RecoveryOutcome RecoverInProcess(CommState& comm, ProbationOp& op,
                                           const std::string& not_ready_reason) = 0;
  // From now on, application threads that call NCCL wait: the process is about to exit, and an
  // aborted communicator would otherwise let the application exit first with its own code.
  virtual void HoldApplicationCalls() = 0;
  [[noreturn]] virtual void Exit(int code) = 0;
  virtual std::int64_t WallNowNs() = 0;
  // The fail-slow verdicts (slow_link, slow_rank) from the statuses on the job board; empty when
  // the board cannot be read.
  virtual std::vector<Verdict> ClassifyFailSlow() { return {}; }
  // NCCLGUARD_METRICS_DIR: publishes the sample as this process's metrics file.
  virtual void WriteMetrics(const MetricsSample& sample) { (void)sample; }
};

class Watchdog {
 public:
  Watchdog(const Config& config, Registry& registry, GpuEvents& events, WatchdogEffects& effects)
      : config_(config), registry_(registry), events_(events), effects_(effects) {}

  // One round: progress, stalls, errors, dump requests, status. `steady_now_ns` is the time now;
  // `due_ns`, when the runtime scheduled the round (none: on time). A round much later than that
  // (LateRound: the process was stopped or starved) re-arms the stall timers and reports nothing:
  // what it sees may have been seen after the process's own GPU work and peers were set back.
  void PollOnce(std::int64_t steady_now_ns, std::optional<std::int64_t> due_ns = std::nullopt);

  // Requests a dump at the next round (from the signal handler, an exit hook, a failed call).
  void RequestDump(const char* reason) noexcept { pending_dump_reason_.store(reason); }
  // The dump signal's request (async-signal-safe): at most one such dump per second; the signals
  // in between are counted and folded into the next dump.
  void RequestSignalDump() noexcept {
    dump_signals_.fetch_add(1, std::memory_order_relaxed);
    pending_dump_reason_.store(kSignalReason);
  }

  std::uint64_t heartbeat() const { return heartbeat_.load(std::memory_order_relaxed); }
  // What the watchdog is calling right now (nullptr when nothing) and since when.
  const char* activity() const { return activity_.load(std::memory_order_relaxed); }
  std::int64_t activity_since_ns() const { return activity_since_ns_.load(std::memory_order_relaxed); }

  std::string Dump(const std::string& reason, const std::optional<StallSnapshot>& stall,
                   std::int64_t steady_now_ns);

  // Writes this process's status now (once the job directory is known). On the watchdog's thread:
  // a board that does not answer holds only the watchdog.
  void WriteStatusNow(std::int64_t steady_now_ns);
  // Has the next round write the status whatever the interval says (from any thread, lock-free): a
  // communicator's initialisation completed, and the process must be on record before it can die.
  void RequestStatus() noexcept { status_requested_.store(true, std::memory_order_release); }

  // At exit, once the watchdog thread has stopped: reports the asynchronous errors the
  // application saw but the watchdog did not yet, and writes the dump a failed call asked for.
  void FlushAtExit(std::int64_t steady_now_ns);

  // The last status of a process that ends normally: the GPU is asked once more how far every
  // communicator got (the watchdog thread has stopped), and the status says it is exiting.
  ProcessSnapshot FinalStatus(std::int64_t steady_now_ns);

  // Publishes the metrics (effects' WriteMetrics); `running` is false for the last, at exit.
  void PublishMetrics(bool running);

 private:
  static constexpr const char* kSignalReason = "signal";
  static constexpr std::int64_t kSignalDumpSpacingNs = 1'000'000'000;

  void CheckCommunicator(CommState& comm, std::int64_t now_ns);
  // Writes the requested dump, unless it is a signal's and the last one was under a second ago.
  void AnswerDumpRequest(std::int64_t now_ns);
  // Frees what the application has closed: at once its ring (and Find() forgets the handle), after
  // one status interval the state, so that the status files show it closed once.
  void ReleaseClosedCommunicators(std::int64_t now_ns);
  void FreeRing(CommState& comm);  // its CUDA events too
  void CheckInitializations(std::int64_t now_ns);
  void OnStall(CommState* comm, const Stall& stall, std::int64_t now_ns);
  // Gathers the facts of a stall and carries out what DecideOnStall (stall_decision.h) says.
  void DecideOnStall(CommState* comm, const Stall& stall, const std::vector<Verdict>& verdicts,
                     std::int64_t now_ns);
  // NCCLGUARD_RECOVER=inprocess, for a stall of operation `op` on probation: recovers the
  // communicator in-process, all ranks or none (`not_mendable`: why this rank votes not ready).
  // True when the stall is dealt with (recovered, or the process is exiting); false when it fell
  // back and the stall goes on as without recovery.
  bool RecoverStalledOnProbation(CommState& comm, ProbationOp& op, const Stall& stall,
                                 const std::string& not_mendable);
  std::vector<Verdict> CurrentVerdicts(const StallSnapshot& stall, std::int64_t now_ns);
  // Reports the communicator's asynchronous error unless reported already; acts on it when `act`
  // (not for a communicator already closed, nor at exit). True when it reported one.
  bool ReportNewAsyncError(CommState& comm, std::int64_t now_ns, bool act);
  void OnAsyncError(CommState& comm, ncclResult_t error, std::int64_t now_ns, bool act);
  // Dumps for another process's request (unless a dump of our own answers it) and, under
  // NCCLGUARD_ACTION=reinit, follows a P2P verdict that this attempt of the job recorded.
  void AnswerPeerRequest(std::int64_t requested_ns, std::int64_t now_ns);
  // Whether this process has the communicator that a P2P verdict names. A record that names none
  // of its communicators is another job's (one that shares the job id, or its board): reported
  // once, at WARN, and not followed.
  bool P2pVerdictApplies(const P2pVerdictRecord& record);
  // `verdicts`: the cross-rank verdicts behind the action, empty when there are none.
  void Act(CommState* culprit, const char* what, const std::vector<Verdict>& verdicts);
  // NCCLGUARD_ACTION=reinit with a p2p_suspect verdict: records it for the next attempt and asks
  // every process of the job to follow. Returns the record's path; std::nullopt when nothing was
  // recorded (the user set P2P explicitly, or the record could not be written), which is logged.
  std::optional<std::string> RecordP2pVerdict(CommState* culprit, const Verdict& verdict);
  // Holds the application's NCCL calls, aborts every communicator, logs `why` and exits with
  // kRestartExitCode (returns only where a test's effects do).
  void ExitForRestart(const std::string& why);

  // Marks what the watchdog is calling, for the monitor: a CUDA or NCCL call that never returns
  // stops the heartbeat, and the monitor then says where the watchdog is stuck.
  class Activity {
   public:
    Activity(Watchdog& watchdog, const char* what) : watchdog_(watchdog) {
      watchdog_.activity_since_ns_.store(SteadyNowNs(), std::memory_order_relaxed);
      watchdog_.activity_.store(what, std::memory_order_relaxed);
    }
    ~Activity() { watchdog_.activity_.store(nullptr, std::memory_order_relaxed); }
    Activity(const Activity&) = delete;
    Activity& operator=(const Activity&) = delete;

   private:
    Watchdog& watchdog_;
  };

  // NCCLGUARD_SLOW_INTERVAL: judges the job's pace when due and this process is the judge
  // (detect/fail_slow.h), and logs what changed.
  void JudgePace(std::int64_t now_ns);

  const Config& config_;
  Registry& registry_;
  GpuEvents& events_;
  WatchdogEffects& effects_;
  std::atomic<const char*> pending_dump_reason_{nullptr};
  std::atomic<std::uint64_t> heartbeat_{0};
  std::atomic<const char*> activity_{nullptr};
  std::atomic<std::int64_t> activity_since_ns_{0};
  std::int64_t next_status_ns_ = 0;
  std::atomic<bool> status_requested_{false};
  // Held while a status is built and handed to the effects, which publish it on a thread of their
  // own: never across a board call (the exit hook builds the last status on the application's thread).
  Mutex status_mutex_;
  std::int64_t status_interval_ns_ = 0;
  std::atomic<std::uint64_t> dump_signals_{0};
  std::int64_t last_signal_dump_ns_ = 0;
  bool signal_dumped_ = false;
  // The stall last reported, carried in every status file until its operation completes: the
  // classifier counts an operation as stuck once some process reported it.
  std::optional<StallSnapshot> reported_stall_ ABSL_GUARDED_BY(status_mutex_);
  std::int64_t last_dump_wall_ns_ = 0;
  std::int64_t ignored_p2p_verdict_ns_ = 0;  // the time of the last foreign record reported
  std::set<std::string> reported_inits_;
  FailSlowReport fail_slow_ ABSL_GUARDED_BY(status_mutex_);
  std::int64_t next_pace_ns_ = 0;
  // The last late round: stall timers count from then (time the process did not run is no stall).
  std::int64_t counted_from_ns_ = 0;
  StallDumpSpacing dump_spacing_;
  WatchdogMetrics metrics_;
};

}  // namespace ncclguard
