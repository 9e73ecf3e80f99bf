// The watchdog's decisions: what a round looks at (progress, stalls, asynchronous errors, failed
// calls, dump requests) and what it does about it. Everything it does to the outside world goes
// through WatchdogEffects (detect/effects.h has the real ones), and the time is given to each
// round, so that the tests run these rounds with a fake clock, fake events and recorded effects.
// The threads that run the rounds are the runtime's (detect/runtime.h).
#include "watchdog/detect/watchdog.h"

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "watchdog/common/clock.h"
#include "watchdog/common/config.h"
#include "watchdog/common/describe.h"
#include "watchdog/common/log.h"
#include "watchdog/common/mutex.h"
#include "watchdog/detect/dump_spacing.h"
#include "watchdog/detect/progress.h"
#include "watchdog/detect/stall_decision.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/recover/held_operations.h"
#include "watchdog/recover/in_process.h"
#include "watchdog/recover/p2p_verdict.h"
#include "watchdog/recover/probation.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/report/snapshot_builder.h"
#include "watchdog/state/gpu_events.h"
#include "watchdog/state/pace.h"
#include "watchdog/state/records.h"
#include "watchdog/state/registration.h"
#include "watchdog/state/registry.h"

namespace ncclguard {

namespace {

std::int64_t ToNs(Seconds seconds) { return static_cast<std::int64_t>(seconds.value * 1e9); }

// The application, told by its own ncclCommGetAsyncError that the initialisation is complete, may
// already be destroying the communicator: the watchdog asks NCCL about it only while it is not.
bool CompleteRegistrationUnlessClosing(CommState& comm) {
  comm.watchdog_in_call.store(true, std::memory_order_seq_cst);
  const bool completed =
      !comm.closing.load(std::memory_order_seq_cst) && CompleteRegistration(comm, SteadyNowNs());
  comm.watchdog_in_call.store(false, std::memory_order_seq_cst);
  return completed;
}

// The verdict about `comm`: with several communicators stalled at once, the first may name another.
VerdictKind VerdictAbout(const CommState& comm, const std::vector<Verdict>& verdicts) {
  const auto about = std::find_if(verdicts.begin(), verdicts.end(),
                                  [&comm](const Verdict& verdict) { return verdict.comm == comm.id; });
  if (about != verdicts.end()) return about->kind;
  return verdicts.empty() ? VerdictKind::kUnknown : verdicts[0].kind;
}

// A probation operation's host function, still queued on its stream (one the application aborted
// may run much later), reads the state: it is freed only once none is.
bool AwaitsProbationHostFunction(CommState& comm) {
  return HasHeld(comm) || std::ranges::any_of(comm.TakenProbation(), [](const ProbationOp& op) {
           return op.state.load(std::memory_order_acquire) == ProbationState::kPending;
         });
}

}  // namespace

void Watchdog::PollOnce(std::int64_t now_ns, std::optional<std::int64_t> due_ns) {
  heartbeat_.fetch_add(1, std::memory_order_relaxed);
  if (due_ns && LateRound(*due_ns, now_ns, ToNs(config_.poll_interval), ToNs(config_.timeout))) {
    // Timers re-armed to now: no stall can be found in this round, so any stall is one that a
    // round on time still sees.
    counted_from_ns_ = now_ns;
    metrics_.CountLateRound();
    log::Info("this process did not run for {:.1f} s (stopped or starved): stall timers restart now",
              static_cast<double>(now_ns - *due_ns) / 1e9);
  }
  for (CommState* comm : registry_.All()) CheckCommunicator(*comm, now_ns);
  CheckInitializations(now_ns);

  AnswerDumpRequest(now_ns);
  if ((now_ns >= next_status_ns_ || status_requested_.load(std::memory_order_acquire)) &&
      effects_.JobDirectoryKnown()) {
    // Cleared before the status is built: a communicator created meanwhile asks for another.
    status_requested_.store(false, std::memory_order_release);
    int job_processes = 0;
    for (CommState* comm : registry_.All()) job_processes = std::max(job_processes, comm->nranks.load());
    status_interval_ns_ = static_cast<std::int64_t>(
        StatusIntervalSeconds(config_.status_interval.value, job_processes, effects_.BoardWritesPerSecond()) *
        1e9);
    next_status_ns_ = now_ns + status_interval_ns_;
    {
      Activity activity(*this, "writing the status file");
      WriteStatusNow(now_ns);
    }
    PublishMetrics(true);
  }
  JudgePace(now_ns);
  // Every round: the board is looked at after each status, apart from the rounds, and a request
  // found there is answered at the next round, not a status interval later.
  if (effects_.JobDirectoryKnown()) {
    const std::int64_t requested_ns = effects_.TakePeerDumpRequest();
    if (requested_ns != 0) AnswerPeerRequest(requested_ns, now_ns);
  }
  ReleaseClosedCommunicators(now_ns);
}

void Watchdog::AnswerDumpRequest(std::int64_t now_ns) {
  const char* reason = pending_dump_reason_.load();
  if (reason == nullptr) return;
  const bool by_signal = std::string_view(reason) == kSignalReason;  // literals may differ by address
  // A stream of signals must not fill the job directory: the request waits for the second to pass.
  if (by_signal && signal_dumped_ && now_ns - last_signal_dump_ns_ < kSignalDumpSpacingNs) return;
  pending_dump_reason_.compare_exchange_strong(reason, nullptr);
  const std::string path = Dump(reason, std::nullopt, now_ns);
  log::Info("dumped state ({}): {}", reason, path.empty() ? "not written" : path);
  if (!by_signal) return;
  signal_dumped_ = true;
  last_signal_dump_ns_ = now_ns;
  const std::uint64_t signals = dump_signals_.exchange(0, std::memory_order_relaxed);
  if (signals > 1) {
    log::Warn(
        "{} dump signals since the last signal's dump answered by this one dump (at most one per second)",
        signals);
  }
}

void Watchdog::ReleaseClosedCommunicators(std::int64_t now_ns) {
  const std::int64_t keep_ns = status_interval_ns_ > 0 ? status_interval_ns_ : ToNs(config_.status_interval);
  // A status built on another thread (WriteStatusNow) must not walk a ring or a state freed here.
  MutexLock lock(status_mutex_);
  for (CommState* comm : registry_.All()) {
    const CommLifecycle lifecycle = comm->lifecycle.load(std::memory_order_acquire);
    // ncclguard's own abort leaves the handle in the application's hands: its calls are answered
    // from the state, which therefore stays.
    if ((lifecycle != CommLifecycle::kDestroyed && lifecycle != CommLifecycle::kAborted) ||
        comm->aborted_by_ncclguard.load(std::memory_order_acquire)) {
      continue;
    }
    if (comm->ring != nullptr) {
      comm->closed_seen_ns = now_ns;
      registry_.Unlink(comm);
      comm->closed_status =
          std::make_shared<const CommSnapshot>(ClosedStatusOf(*comm, effects_.WallNowNs() - now_ns));
      FreeRing(*comm);
    } else if (now_ns - comm->closed_seen_ns >= keep_ns && !AwaitsProbationHostFunction(*comm)) {
      registry_.Remove(comm);
    }
  }
}

void Watchdog::FlushAtExit(std::int64_t now_ns) {
  bool dumped = false;
  for (CommState* comm : registry_.All()) dumped = ReportNewAsyncError(*comm, now_ns, false) || dumped;
  const char* reason = pending_dump_reason_.exchange(nullptr);
  if (reason != nullptr && !dumped) {
    const std::string path = Dump(reason, std::nullopt, now_ns);
    log::Info("dumped state at exit ({}): {}", reason, path.empty() ? "not written" : path);
  }
}

void Watchdog::FreeRing(CommState& comm) {
  // The destroy or abort gave every operation its final state before publishing the lifecycle: no
  // application thread uses the ring any more, and the other reader (a status being built) is
  // held off by the status lock that the caller holds.
  for (std::size_t slot = 0; slot < comm.ring_size; ++slot) {
    for (GpuEvent event : {comm.ring[slot].start_event, comm.ring[slot].end_event}) {
      if (event != nullptr) events_.Destroy(comm.context, event);
    }
  }
  comm.ring.reset();
}

void Watchdog::AnswerPeerRequest(std::int64_t requested_ns, std::int64_t now_ns) {
  // A request answered by a dump of our own from about the same time (every process notices a
  // job-wide stall at once) would only duplicate it.
  if (last_dump_wall_ns_ < requested_ns - ToNs(config_.status_interval)) {
    const std::string path = Dump("peer_request", std::nullopt, now_ns);
    log::Info("dumped state at another process's request: {}", path.empty() ? "not written" : path);
  }
  if (config_.action != Action::kReinit) return;
  // The process that records a P2P verdict asks for dumps right after: every process of the job
  // then restarts, stalled or not, since the restarted job needs all of them.
  // A process whose P2P is off already (a launcher that restarts ranks one by one started it
  // after the record) has nothing to gain from a restart.
  if (P2pDisabledBy(effects_.Facts().environment)) return;
  const std::optional<P2pVerdictRecord> record = effects_.FreshP2pVerdict();
  if (!record || !P2pVerdictApplies(*record)) return;
  ExitForRestart(
      fmt::format("rank {} ({} pid {}) recorded p2p_suspect for comm {} #{}; exiting with {} so that "
                  "the job restarts with NCCL_P2P_DISABLE=1 (NCCLGUARD_ACTION=reinit)",
                  record->rank, record->host, record->pid, record->comm, record->seq, kRestartExitCode));
}

bool Watchdog::P2pVerdictApplies(const P2pVerdictRecord& record) {
  for (const CommState* comm : registry_.All()) {
    if (std::string_view(comm->id) == record.comm) return true;
  }
  if (record.time_ns != ignored_p2p_verdict_ns_) {
    ignored_p2p_verdict_ns_ = record.time_ns;
    log::Warn(
        "P2P verdict of another job ignored: rank {} ({} pid {}, launch '{}') recorded p2p_suspect for comm "
        "{} #{} under job id {}, and this process has no comm {}; it keeps running with its P2P setting",
        record.rank, record.host, record.pid, record.launch, record.comm, record.seq, record.job_id,
        record.comm);
  }
  return false;
}

bool Watchdog::ReportNewAsyncError(CommState& comm, std::int64_t now_ns, bool act) {
  const int error = comm.async_error.load(std::memory_order_acquire);
  if (!IsNcclError(static_cast<ncclResult_t>(error)) || error == comm.reported_async_error) return false;
  comm.reported_async_error = error;
  OnAsyncError(comm, static_cast<ncclResult_t>(error), now_ns, act);
  return true;
}

void Watchdog::CheckCommunicator(CommState& comm, std::int64_t now_ns) {
  const CommLifecycle lifecycle = comm.lifecycle.load(std::memory_order_acquire);
  if (lifecycle == CommLifecycle::kDestroyed || lifecycle == CommLifecycle::kAborted ||
      comm.aborted_by_ncclguard.load(std::memory_order_acquire)) {
    ReportNewAsyncError(comm, now_ns, false);  // one the application saw before it closed the communicator
    return;
  }
  // Not created yet: NCCL makes it at the group's end, and must not hear of it before.
  if (comm.awaiting_group_end.load(std::memory_order_acquire)) return;
  ncclResult_t error;
  {
    Activity activity(*this, "ncclCommGetAsyncError");
    error = effects_.AsyncError(comm);
  }
  RecordAsyncError(comm, error);
  {
    Activity activity(*this, "cuEventQuery");
    AdvanceOperations(comm, events_, now_ns);
  }
  FoldPace(comm, now_ns);
  if (lifecycle == CommLifecycle::kInitializing && error == ncclSuccess &&
      CompleteRegistrationUnlessClosing(comm)) {
    next_status_ns_ = 0;  // on record in the job directory from now on
  }
  if (ReportNewAsyncError(comm, now_ns, true) ||
      IsNcclError(static_cast<ncclResult_t>(comm.async_error.load(std::memory_order_acquire)))) {
    return;
  }
  std::optional<Stall> stall = FindOperationStall(comm, now_ns, ToNs(config_.timeout));
  // Only a stall not reported yet waits for a timeout of time the process ran: once reported, its
  // age counts on towards NCCLGUARD_HARD_TIMEOUT, which long rounds (dumps) must not put off.
  if (stall && stall->seq != comm.reported_stall_seq) {
    stall = FindOperationStall(comm, now_ns, ToNs(config_.timeout), counted_from_ns_);
  }
  if (stall) {
    if (stall->seq != comm.reported_stall_seq) {
      comm.reported_stall_seq = stall->seq;
      comm.stall_reported_ns = now_ns;
      comm.stall_acted_on = false;
      OnStall(&comm, *stall, now_ns);
    } else if (!comm.stall_acted_on && now_ns >= comm.stall_recheck_ns) {
      const std::vector<Verdict> verdicts = CurrentVerdicts(ToSnapshot(*stall, StallMessage(*stall)), now_ns);
      if (!comm.verdict_settling) {
        log::Warn("{} — still waiting; verdict: {}", StallMessage(*stall),
                  verdicts.empty()
                      ? std::string("unknown")
                      : fmt::format("{}: {}", VerdictKindName(verdicts[0].kind), verdicts[0].message));
      }
      DecideOnStall(&comm, *stall, verdicts, now_ns);
    }
  }
}

void Watchdog::CheckInitializations(std::int64_t now_ns) {
  for (const PendingInit& init : registry_.PendingInits()) {
    const auto stall = FindInitStall(init, now_ns, ToNs(config_.init_timeout), counted_from_ns_);
    if (stall && reported_inits_.insert(init.comm_id + "/" + std::to_string(init.thread)).second) {
      OnStall(nullptr, *stall, now_ns);
    }
  }
}

std::string Watchdog::Dump(const std::string& reason, const std::optional<StallSnapshot>& stall,
                           std::int64_t now_ns) {
  ProcessSnapshot snapshot = BuildSnapshot(registry_, reason, true, now_ns, effects_.WallNowNs());
  snapshot.stall = stall;
  // Where every thread is: for a late rank, the answer its peers' dump requests are after. Not at
  // exit, when the process's threads are being torn down.
  if (reason != "exit") {
    Activity activity(*this, "taking every thread's stack");
    snapshot.threads = effects_.CaptureThreads();
  }
  {
    Activity activity(*this, "ncclGetLastError");
    snapshot.last_nccl_warning = effects_.LastNcclError();
  }
  Activity activity(*this, "writing a dump");
  last_dump_wall_ns_ = snapshot.time_ns;
  std::string path = effects_.WriteDump(snapshot);
  metrics_.CountDump(!path.empty());
  return path;
}

std::vector<Verdict> Watchdog::CurrentVerdicts(const StallSnapshot& stall, std::int64_t now_ns) {
  Activity activity(*this, "reading the job directory");
  // Our own status carries the stall: for the classifier, a reported stall is what makes an
  // operation stuck rather than merely in flight.
  ProcessSnapshot own = BuildSnapshot(registry_, "status", false, now_ns, effects_.WallNowNs());
  own.stall = stall;
  return effects_.Classify(own);
}

void Watchdog::OnStall(CommState* comm, const Stall& stall, std::int64_t now_ns) {
  const std::string message = StallMessage(stall);
  StallSnapshot stall_snapshot = ToSnapshot(stall, message);
  const std::vector<Verdict> verdicts = CurrentVerdicts(stall_snapshot, now_ns);
  if (!verdicts.empty()) {
    stall_snapshot.verdict = VerdictKindName(verdicts[0].kind);
    stall_snapshot.verdict_message = verdicts[0].message;
  }
  metrics_.CountStall(comm == nullptr, verdicts.empty() ? "unknown" : VerdictKindName(verdicts[0].kind));
  {
    MutexLock lock(status_mutex_);
    reported_stall_ = stall_snapshot;
  }
  const StallDumpSpacing::Decision spacing =
      comm == nullptr ? StallDumpSpacing::Decision{}
                      : dump_spacing_.Decide(stall, now_ns, ToNs(config_.timeout),
                                             std::max(ToNs(config_.hard_timeout), ToNs(config_.timeout)));
  if (spacing.dump) stall_snapshot.skipped_dumps = spacing.skipped;
  // The peers' verdicts read the stall from the status file: published before the dump, whose
  // stacks take a while to gather (hundreds of milliseconds on a busy node), so that in-process
  // recovery and the late ranks' dump requests do not wait for them.
  WriteStatusNow(now_ns);
  const std::string verdict_text =
      verdicts.empty() ? std::string("unknown (the job directory could not be read)")
                       : fmt::format("{}: {}", VerdictKindName(verdicts[0].kind), verdicts[0].message);
  if (spacing.dump) {
    const std::string path = Dump("stall", stall_snapshot, now_ns);
    log::Warn("{} — verdict: {} — dump: {}{}", message, verdict_text, path.empty() ? "not written" : path,
              spacing.skipped == 0
                  ? std::string()
                  : fmt::format(" ({} stalls of the same operation not dumped since its last dump)",
                                spacing.skipped));
    effects_.RequestPeerDumps(message);
  } else {
    // Neither this process nor its peers dump again what the last dump of this operation showed.
    log::Warn(
        "{} — verdict: {} — not dumped: the same operation stalled before ({} not dumped since its last "
        "dump; the next in {:.1f} s at the earliest)",
        message, verdict_text, spacing.skipped, static_cast<double>(spacing.next_dump_ns - now_ns) / 1e9);
  }
  PublishMetrics(true);
  DecideOnStall(comm, stall, verdicts, now_ns);
}

void Watchdog::DecideOnStall(CommState* comm, const Stall& stall, const std::vector<Verdict>& verdicts,
                             std::int64_t now_ns) {
  StallFacts facts;
  facts.has_comm = comm != nullptr;
  facts.verdicts = verdicts;
  facts.stall_ns = static_cast<std::int64_t>(stall.seconds * 1e9);
  facts.now_ns = now_ns;
  facts.in_process_recovery = config_.recover == RecoverMode::kInProcess;
  facts.timeout_ns = ToNs(config_.timeout);
  facts.hard_timeout_ns = ToNs(config_.hard_timeout);
  facts.status_interval_ns = status_interval_ns_ > 0 ? status_interval_ns_ : ToNs(config_.status_interval);
  facts.poll_interval_ns = ToNs(config_.poll_interval);
  ProbationOp* probation = nullptr;
  if (comm != nullptr) {
    facts.verdict_about_comm = VerdictAbout(*comm, verdicts);
    facts.first_look = now_ns == comm->stall_reported_ns;
    if (facts.in_process_recovery) probation = PendingProbationOp(*comm, stall.seq);
    facts.on_probation = probation != nullptr;
    comm->verdict_settling = false;
  }
  const StallDecision decision = ncclguard::DecideOnStall(facts);
  switch (decision.step) {
    case StallDecision::Step::kSettleVerdict:
      comm->verdict_settling = true;
      comm->stall_recheck_ns = decision.look_again_ns;
      return;
    case StallDecision::Step::kRecoverInProcess:
      comm->stall_acted_on = true;
      if (RecoverStalledOnProbation(*comm, *probation, stall, decision.not_mendable)) return;
      Act(comm, "the stall", verdicts);
      return;
    case StallDecision::Step::kAct:
      if (comm != nullptr) comm->stall_acted_on = true;
      Act(comm, "the stall", verdicts);
      return;
    case StallDecision::Step::kWaitForLateRank:
      comm->stall_recheck_ns = decision.look_again_ns;
      if (config_.action != Action::kWarn) {
        log::Warn(
            "not acting yet (NCCLGUARD_ACTION={}): the late rank is busy outside NCCL or stopped; acting "
            "after "
            "NCCLGUARD_HARD_TIMEOUT={} s unless that changes",
            ActionName(config_.action), config_.hard_timeout.value);
      }
      return;
  }
}

bool Watchdog::RecoverStalledOnProbation(CommState& comm, ProbationOp& op, const Stall& stall,
                                         const std::string& not_mendable) {
  const std::string what = fmt::format("comm {} #{} {}", comm.id, stall.seq, OperationName(stall.api));
  log::Warn("{} stalled on probation: recovering it in-process (NCCLGUARD_RECOVER=inprocess){}", what,
            not_mendable.empty() ? "" : fmt::format("; this rank cannot: {}", not_mendable));
  RecoveryOutcome outcome;
  {
    Activity activity(*this, "recovering a communicator in-process");
    outcome = effects_.RecoverInProcess(comm, op, not_mendable);
  }
  metrics_.CountRecovery(outcome.result);
  PublishMetrics(true);
  switch (outcome.result) {
    case RecoveryOutcome::Result::kRecovered: {
      log::Warn(
          "{}: re-created with P2P disabled on a private NCCL instance and replayed ({}); the "
          "application goes on, {} ms after the stall was found",
          what, outcome.detail, (outcome.replay_completed_ns - comm.stall_reported_ns) / 1'000'000);
      MutexLock lock(status_mutex_);
      reported_stall_.reset();
      next_status_ns_ = 0;  // the others see at once that it completed
      return true;
    }
    case RecoveryOutcome::Result::kFellBack:
      log::Warn("{}: in-process recovery falls back: {}", what, outcome.detail);
      return false;
    case RecoveryOutcome::Result::kBroken:
      ExitForRestart(
          fmt::format("{}: in-process recovery failed after the communicator was aborted ({}); exiting "
                      "with code {}",
                      what, outcome.detail, kRestartExitCode));
      return true;
  }
  return false;
}

void Watchdog::OnAsyncError(CommState& comm, ncclResult_t error, std::int64_t now_ns, bool act) {
  const std::string last_error = effects_.LastNcclError();
  const std::string message =
      fmt::format("rank {} comm {}: NCCL reports an asynchronous error: {} ({})",
                  comm.rank.load(std::memory_order_relaxed), comm.id, ResultName(error),
                  last_error.empty() ? "no NCCL warning text" : last_error);
  metrics_.CountAsyncError();
  const std::string path = Dump("async_error", std::nullopt, now_ns);
  PublishMetrics(true);
  log::Warn("{} — dump: {}", message, path.empty() ? "not written" : path);
  effects_.RequestPeerDumps(message);
  if (act) Act(&comm, "the asynchronous error", {});
}

void Watchdog::Act(CommState* culprit, const char* what, const std::vector<Verdict>& verdicts) {
  switch (config_.action) {
    case Action::kWarn:
      return;
    case Action::kAbort:
      if (culprit == nullptr) {
        log::Warn("NCCLGUARD_ACTION=abort: nothing to abort for {} (the communicator does not exist yet)",
                  what);
        return;
      }
      log::Warn("aborting comm {} (NCCLGUARD_ACTION=abort): its calls now return errors", culprit->id);
      effects_.Abort(*culprit);
      metrics_.CountAbort();
      PublishMetrics(true);
      return;
    case Action::kExit:
      ExitForRestart(
          fmt::format("exiting with code {} after {} (NCCLGUARD_ACTION=exit)", kRestartExitCode, what));
      return;
    case Action::kReinit: {
      const VerdictKind verdict = verdicts.empty() ? VerdictKind::kUnknown : verdicts[0].kind;
      if (verdict == VerdictKind::kP2pSuspect) {
        if (const std::optional<std::string> path = RecordP2pVerdict(culprit, verdicts[0])) {
          ExitForRestart(
              fmt::format("recorded p2p_suspect in {}; exiting with {} so that the job restarts with "
                          "NCCL_P2P_DISABLE=1 (NCCLGUARD_ACTION=reinit)",
                          *path, kRestartExitCode));
          return;
        }
      }
      ExitForRestart(
          fmt::format("exiting with code {} after {} (NCCLGUARD_ACTION=reinit; verdict {}: the restarted "
                      "job keeps its P2P setting)",
                      kRestartExitCode, what, VerdictKindName(verdict)));
      return;
    }
  }
}

std::optional<std::string> Watchdog::RecordP2pVerdict(CommState* culprit, const Verdict& verdict) {
  const ProcessFacts& facts = effects_.Facts();
  for (const auto& [name, value] : facts.environment) {
    // NCCL_P2P_DISABLE=1 leaves no p2p_suspect to get here; any other explicit setting is the
    // user's, and it wins at the next attempt too.
    if (std::ranges::find(kNcclP2pVariables, name) != std::end(kNcclP2pVariables)) {
      log::Warn(
          "p2p_suspect, but {}={} is set explicitly: a restart would not change P2P, so no P2P verdict is "
          "recorded",
          name, value);
      return std::nullopt;
    }
  }
  const absl::StatusOr<std::string> path = effects_.RecordP2pVerdict(P2pVerdictRecord{
      .job_id = "",  // the job id and the launch id are the effects' to fill in
      .launch = "",
      .message = verdict.message,
      .comm = verdict.comm,
      .seq = verdict.seq,
      .ranks = verdict.ranks,
      .host = facts.host,
      .pid = facts.pid,
      .rank = culprit != nullptr ? culprit->rank.load(std::memory_order_relaxed) : LauncherRank(facts),
      .time_ns = effects_.WallNowNs()});
  if (!path.ok()) {
    log::Error("cannot record p2p_suspect for the next attempt ({}): it will keep P2P",
               std::string(path.status().message()));
    return std::nullopt;
  }
  // The processes that have not stalled (yet) look for the record when they see this request.
  effects_.RequestPeerDumps("p2p_suspect recorded: every process restarts");
  return *path;
}

void Watchdog::ExitForRestart(const std::string& why) {
  effects_.HoldApplicationCalls();
  for (CommState* comm : registry_.All()) {
    const CommLifecycle lifecycle = comm->lifecycle.load(std::memory_order_acquire);
    if (lifecycle == CommLifecycle::kDestroyed || lifecycle == CommLifecycle::kAborted) continue;
    // An operation on probation must not open its gate now: the application's stream would go on
    // to its results, which the application could check, and fail on, before the exit below. Such
    // a communicator is not aborted: on a driver whose frees wait for the device (a real one
    // does, scripts/gpu-check.sh `parked`), its abort would wait for the stream held at the gate
    // for ever; the exit ends it.
    if (KeepGatesClosed(*comm)) continue;
    effects_.Abort(*comm);
  }
  log::Error("{}", why);
  metrics_.CountExit();
  PublishMetrics(false);
  effects_.Exit(kRestartExitCode);
}

}  // namespace ncclguard
