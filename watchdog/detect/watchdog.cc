#include "watchdog/detect/watchdog.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <optional>
#include <cstring>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>

#include "watchdog/common/describe.h"
#include "watchdog/common/libraries.h"
#include "watchdog/report/dump.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/common/log.h"
#include "watchdog/recover/p2p_verdict.h"
#include "watchdog/report/snapshot_builder.h"

namespace ncclguard {

std::int64_t SteadyNowNs() noexcept {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<std::int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

namespace {

std::int64_t ToNs(Seconds seconds) { return static_cast<std::int64_t>(seconds.value * 1e9); }

}  // namespace

// Marks what the watchdog is calling, for the monitor: a CUDA or NCCL call that never returns
// stops the heartbeat, and the monitor then says where the watchdog is stuck.
class Watchdog::Activity {
 public:
  Activity(Watchdog& watchdog, const char* what) : watchdog_(watchdog) {
    watchdog_.activity_since_ns_.store(SteadyNowNs(), std::memory_order_relaxed);
    watchdog_.activity_.store(what, std::memory_order_relaxed);
  }
  ~Activity() { watchdog_.activity_.store(nullptr, std::memory_order_relaxed); }

 private:
  Watchdog& watchdog_;
};

void Watchdog::PollOnce(std::int64_t now_ns) {
  heartbeat_.fetch_add(1, std::memory_order_relaxed);
  for (CommState* comm : registry_.All()) CheckCommunicator(*comm, now_ns);
  CheckInitializations(now_ns);

  AnswerDumpRequest(now_ns);
  if (now_ns >= next_status_ns_ && effects_.JobDirectoryKnown()) {
    int job_processes = 0;
    for (CommState* comm : registry_.All()) job_processes = std::max(job_processes, comm->nranks.load());
    status_interval_ns_ =
        static_cast<std::int64_t>(StatusIntervalSeconds(config_.status_interval.value, job_processes) * 1e9);
    next_status_ns_ = now_ns + status_interval_ns_;
    {
      Activity activity(*this, "writing the status file");
      WriteStatusNow(now_ns);
    }
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
    log::Warn("{} dump signals since the last signal's dump answered by this one dump (at most one per second)",
              signals);
  }
}

void Watchdog::ReleaseClosedCommunicators(std::int64_t now_ns) {
  const std::int64_t keep_ns = status_interval_ns_ > 0 ? status_interval_ns_ : ToNs(config_.status_interval);
  // An application thread writes the status file when a communicator is created (WriteStatusNow):
  // it must not walk a ring or a state freed here.
  std::lock_guard<std::mutex> lock(status_mutex_);
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
      comm->closed_status = std::make_shared<const CommSnapshot>(
          ClosedStatusOf(*comm, effects_.WallNowNs() - now_ns));
      FreeRing(*comm);
    } else if (now_ns - comm->closed_seen_ns >= keep_ns) {
      registry_.Remove(comm);
    }
  }
}

void Watchdog::WriteStatusNow(std::int64_t now_ns) {
  if (!effects_.JobDirectoryKnown()) return;
  std::lock_guard<std::mutex> lock(status_mutex_);
  ProcessSnapshot status = BuildSnapshot(registry_, "status", false, now_ns, effects_.WallNowNs());
  if (reported_stall_) {
    const bool over = std::any_of(status.comms.begin(), status.comms.end(), [this](const CommSnapshot& comm) {
      return comm.id == reported_stall_->comm_id && comm.last_completed >= reported_stall_->seq &&
             reported_stall_->seq != 0;
    });
    if (over) reported_stall_.reset();
  }
  status.stall = reported_stall_;
  effects_.WriteStatus(status);
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
  // application thread uses the ring any more, and the other reader (a status written by an
  // application thread) is held off by the status lock that the caller holds.
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
  if (!record) return;
  ExitForRestart(fmt::format("rank {} ({} pid {}) recorded p2p_suspect for comm {} #{}; exiting with {} so that "
                             "the job restarts with NCCL_P2P_DISABLE=1 (NCCLGUARD_ACTION=reinit)",
                             record->rank, record->host, record->pid, record->comm, record->seq, kRestartExitCode));
}

namespace {

bool IsError(int result) { return result != ncclSuccess && result != ncclInProgress; }

// The application, told by its own ncclCommGetAsyncError that the initialisation is complete, may
// already be destroying the communicator: the watchdog asks NCCL about it only while it is not.
bool CompleteRegistrationUnlessClosing(CommState& comm) {
  comm.watchdog_in_call.store(true, std::memory_order_seq_cst);
  const bool completed = !comm.closing.load(std::memory_order_seq_cst) && CompleteRegistration(comm);
  comm.watchdog_in_call.store(false, std::memory_order_seq_cst);
  return completed;
}

}  // namespace

bool RecordAsyncError(CommState& comm, ncclResult_t error) noexcept {
  int known = comm.async_error.load(std::memory_order_acquire);
  while (!IsError(known)) {
    if (comm.async_error.compare_exchange_weak(known, error, std::memory_order_acq_rel)) return IsError(error);
  }
  return false;
}

bool Watchdog::ReportNewAsyncError(CommState& comm, std::int64_t now_ns, bool act) {
  const int error = comm.async_error.load(std::memory_order_acquire);
  if (!IsError(error) || error == comm.reported_async_error) return false;
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
  if (lifecycle == CommLifecycle::kInitializing && error == ncclSuccess && CompleteRegistrationUnlessClosing(comm)) {
    next_status_ns_ = 0;  // on record in the job directory from now on
  }
  if (ReportNewAsyncError(comm, now_ns, true) || IsError(comm.async_error.load(std::memory_order_acquire))) return;
  if (const auto stall = FindOperationStall(comm, now_ns, ToNs(config_.timeout))) {
    if (stall->seq != comm.reported_stall_seq) {
      comm.reported_stall_seq = stall->seq;
      comm.stall_acted_on = false;
      OnStall(&comm, *stall, now_ns);
    } else if (!comm.stall_acted_on && now_ns >= comm.stall_recheck_ns) {
      const std::vector<Verdict> verdicts = CurrentVerdicts(ToSnapshot(*stall, StallMessage(*stall)), now_ns);
      log::Warn("{} — still waiting; verdict: {}", StallMessage(*stall),
                verdicts.empty() ? std::string("unknown")
                                 : fmt::format("{}: {}", VerdictKindName(verdicts[0].kind), verdicts[0].message));
      DecideOnStall(&comm, *stall, verdicts, now_ns);
    }
  }
}

void Watchdog::CheckInitializations(std::int64_t now_ns) {
  for (const PendingInit& init : registry_.PendingInits()) {
    const auto stall = FindInitStall(init, now_ns, ToNs(config_.init_timeout));
    if (stall && reported_inits_.insert(init.comm_id + "/" + std::to_string(init.thread)).second) {
      OnStall(nullptr, *stall, now_ns);
    }
  }
}

std::string Watchdog::Dump(const std::string& reason, const std::optional<StallSnapshot>& stall,
                           std::int64_t now_ns) {
  ProcessSnapshot snapshot = BuildSnapshot(registry_, reason, true, now_ns, effects_.WallNowNs());
  snapshot.stall = stall;
  {
    Activity activity(*this, "ncclGetLastError");
    snapshot.last_nccl_warning = effects_.LastNcclError();
  }
  Activity activity(*this, "writing a dump");
  last_dump_wall_ns_ = snapshot.time_ns;
  return effects_.WriteDump(snapshot);
}

ProcessSnapshot Watchdog::FinalStatus(std::int64_t now_ns) {
  for (CommState* comm : registry_.All()) {
    const CommLifecycle lifecycle = comm->lifecycle.load(std::memory_order_acquire);
    if (lifecycle != CommLifecycle::kDestroyed && lifecycle != CommLifecycle::kAborted &&
        !comm->aborted_by_ncclguard.load(std::memory_order_acquire)) {
      AdvanceOperations(*comm, events_, now_ns);
    }
  }
  ProcessSnapshot status = BuildSnapshot(registry_, "status", false, now_ns, effects_.WallNowNs());
  std::lock_guard<std::mutex> lock(status_mutex_);
  status.stall = reported_stall_;
  status.exiting = true;
  return status;
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
  {
    std::lock_guard<std::mutex> lock(status_mutex_);
    reported_stall_ = stall_snapshot;
  }
  const std::string path = Dump("stall", stall_snapshot, now_ns);
  log::Warn("{} — verdict: {} — dump: {}", message,
            verdicts.empty() ? std::string("unknown (the job directory could not be read)")
                             : fmt::format("{}: {}", VerdictKindName(verdicts[0].kind), verdicts[0].message),
            path.empty() ? "not written" : path);
  effects_.RequestPeerDumps(message);
  DecideOnStall(comm, stall, verdicts, now_ns);
}

void Watchdog::DecideOnStall(CommState* comm, const Stall& stall, const std::vector<Verdict>& verdicts,
                             std::int64_t now_ns) {
  // Without a verdict (no job directory), the timeout alone decides, as it always would; so it
  // does for an initialisation, which has no communicator to wait on yet.
  const bool act_now = comm == nullptr || verdicts.empty() || ActOnTimeout(verdicts) ||
                       stall.seconds >= config_.hard_timeout.value;
  if (act_now) {
    if (comm != nullptr) comm->stall_acted_on = true;
    Act(comm, "the stall", verdicts);
    return;
  }
  comm->stall_recheck_ns = now_ns + ToNs(config_.timeout);
  if (config_.action != Action::kWarn) {
    log::Warn("not acting yet (NCCLGUARD_ACTION={}): the late rank is busy outside NCCL; acting after "
              "NCCLGUARD_HARD_TIMEOUT={} s unless that changes",
              ActionName(config_.action), config_.hard_timeout.value);
  }
}

void Watchdog::OnAsyncError(CommState& comm, ncclResult_t error, std::int64_t now_ns, bool act) {
  const std::string last_error = effects_.LastNcclError();
  const std::string message =
      fmt::format("rank {} comm {}: NCCL reports an asynchronous error: {} ({})",
                  comm.rank.load(std::memory_order_relaxed), comm.id, ResultName(error),
                  last_error.empty() ? "no NCCL warning text" : last_error);
  const std::string path = Dump("async_error", std::nullopt, now_ns);
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
        log::Warn("NCCLGUARD_ACTION=abort: nothing to abort for {} (the communicator does not exist yet)", what);
        return;
      }
      log::Warn("aborting comm {} (NCCLGUARD_ACTION=abort): its calls now return errors", culprit->id);
      effects_.Abort(*culprit);
      return;
    case Action::kExit:
      ExitForRestart(fmt::format("exiting with code {} after {} (NCCLGUARD_ACTION=exit)", kRestartExitCode, what));
      return;
    case Action::kReinit: {
      const VerdictKind verdict = verdicts.empty() ? VerdictKind::kUnknown : verdicts[0].kind;
      if (verdict == VerdictKind::kP2pSuspect) {
        if (const std::optional<std::string> path = RecordP2pVerdict(culprit, verdicts[0])) {
          ExitForRestart(fmt::format("recorded p2p_suspect in {}; exiting with {} so that the job restarts with "
                                     "NCCL_P2P_DISABLE=1 (NCCLGUARD_ACTION=reinit)",
                                     *path, kRestartExitCode));
          return;
        }
      }
      ExitForRestart(fmt::format("exiting with code {} after {} (NCCLGUARD_ACTION=reinit; verdict {}: the restarted "
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
      log::Warn("p2p_suspect, but {}={} is set explicitly: a restart would not change P2P, so no P2P verdict is "
                "recorded",
                name, value);
      return std::nullopt;
    }
  }
  const absl::StatusOr<std::string> path = effects_.RecordP2pVerdict(P2pVerdictRecord{
      .job_id = "",
      .message = verdict.message,
      .comm = verdict.comm,
      .seq = verdict.seq,
      .ranks = verdict.ranks,
      .host = facts.host,
      .pid = facts.pid,
      .rank = culprit != nullptr ? culprit->rank.load(std::memory_order_relaxed) : LauncherRank(facts),
      .time_ns = effects_.WallNowNs()});
  if (!path.ok()) {
    log::Error("cannot record p2p_suspect for the next attempt ({}): it will keep P2P", std::string(path.status().message()));
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
    if (lifecycle != CommLifecycle::kDestroyed && lifecycle != CommLifecycle::kAborted) effects_.Abort(*comm);
  }
  log::Error("{}", why);
  effects_.Exit(kRestartExitCode);
}

namespace {

// Set by NCCLGUARD_ACTION=exit just before it aborts: application threads entering NCCL wait.
std::atomic<bool> g_holding_application_calls{false};

// The real effects: files in the job directory, NCCL and CUDA calls, the process's exit.
class SystemEffects final : public WatchdogEffects {
 public:
  std::string WriteDump(const ProcessSnapshot& snapshot) override {
    if (JobDir().empty()) return "";
    FactSources sources = RealFactSources();
    if (snapshot.reason == "exit") sources.cuda = [](const std::vector<int>&) { return CudaFacts{}; };
    const DumpResult written = ncclguard::WriteDump(JobDir(), snapshot, CollectProcessFacts(sources, Devices()));
    return written.ok() ? *written : "";
  }

  bool JobDirectoryKnown() override { return !JobDir().empty(); }

  void WriteStatus(const ProcessSnapshot& snapshot) override {
    if (JobDir().empty()) return;
    // A failure was logged where it happened; the next interval tries again.
    const auto written = ncclguard::WriteStatus(JobDir(), snapshot, Facts());
    (void)written;
  }

  // On the watchdog thread, before its first round: the driver and NVML calls behind these facts
  // are made once per process, never on the status path.
  void CollectFacts() {
    facts_ = CollectMatchingFacts(RealFactSources());
    facts_collected_.store(true, std::memory_order_release);
  }

  // A status written from another thread waits, a bounded time, for the facts the watchdog
  // collects as it starts (a few milliseconds): peers' verdicts may read that status alone.
  void WaitForFacts(std::chrono::milliseconds at_most) const {
    const auto give_up = std::chrono::steady_clock::now() + at_most;
    while (!facts_collected_.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  const ProcessFacts& Facts() override {
    return facts_collected_.load(std::memory_order_acquire) ? facts_ : identity_;
  }

  absl::StatusOr<std::string> RecordP2pVerdict(P2pVerdictRecord record) override {
    if (JobDir().empty()) return absl::FailedPreconditionError("the job directory is not known yet");
    record.job_id = job_id_;
    if (absl::Status written = WriteP2pVerdict(JobDir(), record); !written.ok()) return written;
    return JobDir() + "/" + kP2pVerdictFile;
  }

  std::optional<P2pVerdictRecord> FreshP2pVerdict() override {
    if (JobDir().empty()) return std::nullopt;
    absl::StatusOr<P2pVerdictRecord> record = ReadP2pVerdict(JobDir(), job_id_);
    if (!record.ok()) {
      if (!absl::IsNotFound(record.status())) log::Warn("{}", std::string(record.status().message()));
      return std::nullopt;
    }
    // A record older than this process is the one its own attempt was restarted for.
    if (record->time_ns < started_wall_ns_) return std::nullopt;
    return *std::move(record);
  }

  void RequestPeerDumps(const std::string& why) override {
    if (JobDir().empty()) return;
    const auto written = RequestDumps(JobDir(), why);  // a failure was logged where it happened
    (void)written;
  }

  std::vector<Verdict> Classify(const ProcessSnapshot& own_status) override {
    if (JobDir().empty()) return {};
    WriteStatus(own_status);  // the others' files are as fresh as their last interval; ours is now
    const double interval = StatusIntervalSeconds(GetConfig().status_interval.value, 0);
    const absl::StatusOr<JobView> job = ReadJobDirectory(JobDir(), WallNow(), interval, JobDirectoryOrigin::kOwn);
    if (!job.ok()) return {};
    return ncclguard::Classify(*job, ProcessKnownBad().entries);
  }

  std::int64_t TakePeerDumpRequest() override {
    if (JobDir().empty()) return 0;
    if (!request_watcher_) {
      request_watcher_.emplace(JobDir(), log::HostName(), static_cast<int>(getpid()), started_wall_ns_);
    }
    const auto requests = request_watcher_->Poll();
    std::int64_t newest = 0;
    if (requests.ok()) {
      for (const DumpRequest& request : *requests) newest = std::max(newest, std::max<std::int64_t>(request.time_ns, 1));
    }
    return newest;
  }

  ncclResult_t AsyncError(CommState& comm) override {
    using Function = decltype(&::ncclCommGetAsyncError);
    auto get = reinterpret_cast<Function>(Real().Function(comm.library, Api::ncclCommGetAsyncError));
    ncclResult_t error = ncclSuccess;
    if (get == nullptr || !EnterComm(comm)) return ncclSuccess;
    if (get(comm.handle, &error) != ncclSuccess) error = ncclSuccess;
    LeaveComm(comm);
    return error;
  }

  std::string LastNcclError() override {
    using Function = decltype(&::ncclGetLastError);
    auto get = reinterpret_cast<Function>(Real().Function(0, Api::ncclGetLastError));
    const char* text = get != nullptr ? get(nullptr) : nullptr;
    return text != nullptr ? text : "";
  }

  void Abort(CommState& comm) override {
    using Function = decltype(&::ncclCommAbort);
    auto abort = reinterpret_cast<Function>(Real().Function(comm.library, Api::ncclCommAbort));
    if (abort == nullptr || !EnterComm(comm)) return;
    comm.aborted_by_ncclguard.store(true, std::memory_order_release);
    const ncclResult_t result = abort(comm.handle);
    comm.lifecycle.store(CommLifecycle::kAborted, std::memory_order_release);
    LeaveComm(comm);
    if (result != ncclSuccess) log::Warn("ncclCommAbort of comm {} returned {}", comm.id, ResultName(result));
  }

  void HoldApplicationCalls() override { g_holding_application_calls.store(true, std::memory_order_seq_cst); }

  [[noreturn]] void Exit(int code) override {
    if (spdlog::logger* logger = log::Get()) logger->flush();
    // Not exit(): atexit handlers and static destructors may wait for the stuck GPU work.
    _exit(code);
  }

  std::int64_t WallNowNs() override { return WallNow(); }

  static std::int64_t WallNow() {
    timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return static_cast<std::int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
  }

 private:
  // The application closes communicators (NCCL frees them) while the watchdog may call NCCL on
  // them: each side announces itself, then checks the other (both sequentially consistent).
  static bool EnterComm(CommState& comm) {
    comm.watchdog_in_call.store(true, std::memory_order_seq_cst);
    if (comm.closing.load(std::memory_order_seq_cst)) {
      comm.watchdog_in_call.store(false, std::memory_order_seq_cst);
      return false;
    }
    return true;
  }
  static void LeaveComm(CommState& comm) { comm.watchdog_in_call.store(false, std::memory_order_seq_cst); }

  // The job directory, settled once a communicator id is known (the fallback job id is made from
  // it); "" before that, and nothing is written then.
  // A copy: the application's thread (status at communicator creation) may ask too.
  std::string JobDir() {
    std::lock_guard<std::mutex> lock(job_dir_mutex_);
    if (!job_dir_.empty()) return job_dir_;
    std::string first_comm;
    for (CommState* comm : GetRegistry().All()) {
      if (first_comm.empty()) first_comm = comm->id;
    }
    for (const PendingInit& init : GetRegistry().PendingInits()) {
      if (first_comm.empty()) first_comm = init.comm_id;
    }
    if (first_comm.empty()) return job_dir_;
    job_id_ = JobId(ReadProcessEnvironment, first_comm);
    job_dir_ = JobDirectory(GetConfig(), job_id_);
    log::Info("job directory: {}", job_dir_);
    return job_dir_;
  }

  static std::vector<int> Devices() {
    std::vector<int> devices;
    for (CommState* comm : GetRegistry().All()) {
      const int device = comm->device.load(std::memory_order_relaxed);
      if (device >= 0 && std::find(devices.begin(), devices.end(), device) == devices.end()) {
        devices.push_back(device);
      }
    }
    return devices;
  }


  std::mutex job_dir_mutex_;
  std::string job_id_;  // guarded by job_dir_mutex_
  std::string job_dir_;  // guarded by job_dir_mutex_
  const std::int64_t started_wall_ns_ = SystemEffects::WallNow();
  const ProcessFacts identity_ = CollectIdentityFacts(RealFactSources());
  ProcessFacts facts_;
  std::atomic<bool> facts_collected_{false};
  std::optional<DumpRequestWatcher> request_watcher_;
};

// Counts the watchdog's rounds, so that an application thread that has just met an error can have
// the next round begin at once and wait until it is over: the error is logged and dumped before
// the application can abort() or be killed. Part of the runtime, which a forked child makes anew.
class RoundClock {
 public:
  void BeginRound() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++started_;
    round_wanted_ = false;
  }
  void EndRound() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++finished_;
    }
    changed_.notify_all();
  }
  // The pause between rounds, cut short when a round is wanted.
  void Pause(std::chrono::duration<double> interval) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_for(lock, interval, [this] { return round_wanted_; });
  }
  // Waits for a whole round that begins after this call, at most `deadline`.
  void RunRoundAndWait(std::chrono::milliseconds deadline) {
    std::unique_lock<std::mutex> lock(mutex_);
    const std::uint64_t round = started_ + 1;
    round_wanted_ = true;
    changed_.notify_all();
    changed_.wait_for(lock, deadline, [this, round] { return finished_ >= round; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::uint64_t started_ = 0;
  std::uint64_t finished_ = 0;
  bool round_wanted_ = false;
};

struct Runtime {
  SystemEffects effects;
  Watchdog watchdog{GetConfig(), GetRegistry(), DriverEvents(), effects};
  RoundClock rounds;
};

std::atomic<Runtime*> g_runtime{nullptr};
// At exit the CUDA driver and NCCL are being torn down: the watchdog stops calling them.
std::atomic<bool> g_exiting{false};
std::atomic<bool> g_in_round{false};
thread_local bool t_watchdog_thread = false;
std::mutex g_start_mutex;
struct sigaction g_previous_dump_action;

void OnDumpSignal(int signal, siginfo_t* info, void* context) {
  // Only an atomic store: the watchdog thread does the work at its next round.
  if (Runtime* runtime = g_runtime.load(std::memory_order_acquire)) runtime->watchdog.RequestSignalDump();
  // The application's own handler of the signal still runs.
  if (g_previous_dump_action.sa_flags & SA_SIGINFO) {
    if (g_previous_dump_action.sa_sigaction != nullptr) g_previous_dump_action.sa_sigaction(signal, info, context);
  } else if (g_previous_dump_action.sa_handler != SIG_DFL && g_previous_dump_action.sa_handler != SIG_IGN) {
    g_previous_dump_action.sa_handler(signal);
  }
}

void InstallDumpSignal(int signal) {
  if (signal == 0) return;
  struct sigaction action = {};
  action.sa_sigaction = OnDumpSignal;
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&action.sa_mask);
  if (sigaction(signal, &action, &g_previous_dump_action) != 0) {
    log::Warn("cannot install the dump signal handler: {}", std::strerror(errno));
  }
}

void DumpAtExit() {
  if (Runtime* runtime = g_runtime.load(std::memory_order_acquire)) {
    const std::string path = runtime->watchdog.Dump("exit", std::nullopt, SteadyNowNs());
    log::Info("dumped state at exit: {}", path.empty() ? "not written" : path);
  }
}

void RunWatchdog(Runtime* runtime) {
  pthread_setname_np(pthread_self(), "ncclguard-wd");
  t_watchdog_thread = true;
  DriverEvents().PrepareWatchdogThread();
  const auto interval = std::chrono::duration<double>(GetConfig().poll_interval.value);
  bool facts_collected = false;
  for (;;) {
    g_in_round.store(true, std::memory_order_seq_cst);
    if (g_exiting.load(std::memory_order_seq_cst)) {
      g_in_round.store(false, std::memory_order_seq_cst);
      return;
    }
    runtime->rounds.BeginRound();
    try {
      // Within a round: the exit hook waits for it before the driver goes away.
      if (!std::exchange(facts_collected, true)) runtime->effects.CollectFacts();
      runtime->watchdog.PollOnce(SteadyNowNs());
    } catch (const std::exception& error) {
      log::Error("watchdog round failed: {}", error.what());
    }
    g_in_round.store(false, std::memory_order_seq_cst);
    runtime->rounds.EndRound();
    runtime->rounds.Pause(interval);
  }
}

// Runs before the exit dump (atexit handlers run in reverse order) and before libraries' own
// clean-up: waits, a bounded time, for a round in flight to finish.
void StopWatchdogAtExit() {
  g_exiting.store(true, std::memory_order_seq_cst);
  const std::int64_t give_up = SteadyNowNs() + 2'000'000'000;
  while (g_in_round.load(std::memory_order_seq_cst) && SteadyNowNs() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // A last status that says the process ended normally: its peers' verdicts then say "finished"
  // rather than "gone". (A killed process writes none.)
  // Our handlers were registered after the CUDA driver's (at the first communicator), so they run
  // before the driver's own clean-up: asking about events is still fine here.
  if (Runtime* runtime = g_runtime.load(std::memory_order_acquire)) {
    if (!g_in_round.load(std::memory_order_seq_cst)) {
      // An error the application met just before it exits is on disk before the process is gone.
      runtime->watchdog.FlushAtExit(SteadyNowNs());
      runtime->effects.WriteStatus(runtime->watchdog.FinalStatus(SteadyNowNs()));
    }
  }
}

// Watches the watchdog's heartbeat: when a round takes far longer than it should, the watchdog is
// stuck inside a CUDA or NCCL call (or a file system), and that is worth saying.
void RunMonitor(Runtime* runtime) {
  pthread_setname_np(pthread_self(), "ncclguard-mon");
  HeartbeatMonitor monitor(std::max<std::int64_t>(10'000'000'000, 20 * ToNs(GetConfig().poll_interval)));
  for (;;) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    if (const auto message = monitor.Check(runtime->watchdog.heartbeat(), runtime->watchdog.activity(),
                                           SteadyNowNs())) {
      log::Error("{}", *message);
    }
  }
}

void StartThread(void (*body)(Runtime*), Runtime* runtime) {
  // With every signal blocked, so the application's signals go to its own threads.
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  std::thread(body, runtime).detach();
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

}  // namespace

std::optional<std::string> HeartbeatMonitor::Check(std::uint64_t heartbeat, const char* activity,
                                                   std::int64_t now_ns) {
  if (last_change_ns_ < 0 || heartbeat != last_heartbeat_) {
    last_heartbeat_ = heartbeat;
    last_change_ns_ = now_ns;
    reported_ = false;
    return std::nullopt;
  }
  if (reported_ || now_ns - last_change_ns_ <= stuck_after_ns_) return std::nullopt;
  reported_ = true;
  return fmt::format("the watchdog has been stuck for {:.0f} s in {}: stalls are not being detected",
                     static_cast<double>(now_ns - last_change_ns_) / 1e9,
                     activity != nullptr ? activity : "its round");
}

void EnsureWatchdogStarted() noexcept {
  if (g_runtime.load(std::memory_order_acquire) != nullptr) return;
  try {
    std::lock_guard<std::mutex> lock(g_start_mutex);
    if (g_runtime.load(std::memory_order_acquire) != nullptr) return;
    static std::atomic<bool> fork_handlers{false};
    if (!fork_handlers.exchange(true)) {
      pthread_atfork([] { g_start_mutex.lock(); }, [] { g_start_mutex.unlock(); },
                     [] {
                       // The child has none of the parent's threads: it starts its own watchdog
                       // if it uses NCCL itself, and never reports the parent's communicators.
                       g_start_mutex.unlock();
                       g_runtime.store(nullptr, std::memory_order_release);  // the parent's is leaked
                       g_in_round.store(false, std::memory_order_relaxed);
                       GetRegistry().ForgetAfterFork();
                     });
    }
    auto* runtime = new Runtime;  // lives until the process ends
    g_runtime.store(runtime, std::memory_order_release);
    InstallDumpSignal(GetConfig().dump_signal.number);
    static std::atomic<bool> exit_hooks{false};
    if (!exit_hooks.exchange(true)) {
      if (GetConfig().dump_on_exit) std::atexit(DumpAtExit);
      std::atexit(StopWatchdogAtExit);
    }
    StartThread(RunWatchdog, runtime);
    StartThread(RunMonitor, runtime);
    log::Info("watchdog started (timeout {} s, init timeout {} s, action {})", GetConfig().timeout.value,
              GetConfig().init_timeout.value, ActionName(GetConfig().action));
  } catch (const std::exception& error) {
    log::Error("cannot start the watchdog ({}): NCCL calls are forwarded unwatched", error.what());
  }
}

void WaitIfExiting() noexcept {
  while (g_holding_application_calls.load(std::memory_order_relaxed)) pause();
}

void NoteFailedCall(Api api, CommState* comm, ncclResult_t result) noexcept {
  using GetLastError = decltype(&::ncclGetLastError);
  auto last_error = reinterpret_cast<GetLastError>(
      Real().Function(comm != nullptr ? comm->library : 0, Api::ncclGetLastError));
  const char* text = last_error != nullptr ? last_error(nullptr) : nullptr;
  const std::string on = comm != nullptr ? fmt::format(" on comm {}", comm->id) : std::string();
  // An application that retries in a loop must not flood the log or the job directory: a few
  // lines per process, and one dump per communicator (and one for calls without one).
  static constexpr int kLoggedFailures = 20;
  static std::atomic<int> logged{0};
  const int count = logged.fetch_add(1, std::memory_order_relaxed);
  if (count < kLoggedFailures) {
    log::Warn("{}{} returned {}: {}{}", Describe(api).name, on, ResultName(result),
              text != nullptr && *text != '\0' ? text : "NCCL gave no warning text",
              count + 1 == kLoggedFailures ? " (further failed calls are not logged)" : "");
  }
  static std::atomic<bool> dumped_without_comm{false};
  std::atomic<bool>& dumped = comm != nullptr ? comm->failure_dumped : dumped_without_comm;
  if (dumped.exchange(true)) return;
  if (Runtime* runtime = g_runtime.load(std::memory_order_acquire)) runtime->watchdog.RequestDump("error_return");
  ReportBeforeReturning();
}

void ReportBeforeReturning() noexcept {
  Runtime* runtime = g_runtime.load(std::memory_order_acquire);
  if (runtime == nullptr || t_watchdog_thread || g_exiting.load(std::memory_order_seq_cst)) return;
  // Bounded: a watchdog stuck in a CUDA call must not hold the application.
  constexpr std::chrono::milliseconds kDeadline{5000};
  try {
    runtime->rounds.RunRoundAndWait(kDeadline);
  } catch (const std::exception& error) {
    log::Error("cannot wait for the watchdog to report an error: {}", error.what());
  }
}

bool CompleteRegistration(CommState& comm) noexcept {
  // Once: the application's thread (blocking init) or the watchdog (non-blocking) may get here.
  CommLifecycle initializing = CommLifecycle::kInitializing;
  if (!comm.lifecycle.compare_exchange_strong(initializing, CommLifecycle::kReady,
                                              std::memory_order_acq_rel)) {
    return false;
  }
  // The function's type comes from nccl.h; only NCCL's own function (of the comm's library) is called.
  auto query = [&comm](Api api, auto type, std::atomic<int>& field) {
    using Function = typename decltype(type)::type;
    auto function = reinterpret_cast<Function>(Real().Function(comm.library, api));
    int value = -1;
    if (function != nullptr && function(comm.handle, &value) == ncclSuccess) field.store(value, std::memory_order_relaxed);
  };
  query(Api::ncclCommUserRank, std::type_identity<decltype(&::ncclCommUserRank)>{}, comm.rank);
  query(Api::ncclCommCount, std::type_identity<decltype(&::ncclCommCount)>{}, comm.nranks);
  query(Api::ncclCommCuDevice, std::type_identity<decltype(&::ncclCommCuDevice)>{}, comm.device);
  if (comm.init_end_ns.load(std::memory_order_acquire) == 0) comm.init_end_ns.store(SteadyNowNs(), std::memory_order_release);
  if (comm.parent_id[0] == '\0') log::SetRank(comm.rank.load(std::memory_order_relaxed));
  const int version = Real().Version(comm.library);
  log::Info("comm {} rank {}/{} on device {} created by {} in {:.1f} ms through NCCL {}.{}.{} at {}", comm.id,
            comm.rank.load(), comm.nranks.load(), comm.device.load(), Describe(comm.created_by).name,
            static_cast<double>(comm.init_end_ns.load() - comm.init_start_ns) / 1e6, version / 10000,
            version / 100 % 100, version % 100, Real().Path(comm.library));
  return true;
}

void WriteStatusAtInit() noexcept {
  try {
    if (Runtime* runtime = g_runtime.load(std::memory_order_acquire)) {
      runtime->effects.WaitForFacts(std::chrono::seconds(2));
      runtime->watchdog.WriteStatusNow(SteadyNowNs());
    }
  } catch (const std::exception& error) {
    log::Error("cannot write the status file at communicator creation: {}", error.what());
  }
}

}  // namespace ncclguard
