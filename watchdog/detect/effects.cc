// The real effects of the watchdog (see effects.h).
#include "watchdog/detect/effects.h"

#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "watchdog/common/clock.h"
#include "watchdog/common/config.h"
#include "watchdog/common/describe.h"
#include "watchdog/common/libraries.h"
#include "watchdog/common/log.h"
#include "watchdog/common/mutex.h"
#include "watchdog/common/nccl_api.h"
#include "watchdog/detect/metrics.h"
#include "watchdog/detect/runtime.h"
#include "watchdog/diagnose/job_view.h"
#include "watchdog/diagnose/known_bad.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/recover/in_process.h"
#include "watchdog/recover/p2p_verdict.h"
#include "watchdog/report/dump.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/flight_recorder.h"
#include "watchdog/report/job_board.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/report/job_id.h"
#include "watchdog/report/job_read.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/report/thread_stacks.h"
#include "watchdog/state/records.h"
#include "watchdog/state/registry.h"

namespace ncclguard {
namespace {

// How long the judge of the job's pace may read the statuses: its watchdog waits meanwhile.
constexpr std::chrono::milliseconds kFailSlowReadDeadline{2000};

}  // namespace

std::atomic<bool> internal::g_holding_application_calls{false};

std::string SystemEffects::WriteDump(const ProcessSnapshot& snapshot) {
  if (JobDir().empty()) return "";
  FactSources sources = RealFactSources();
  if (snapshot.reason == "exit") sources.cuda = [](const std::vector<int>&) { return CudaFacts{}; };
  const ProcessFacts facts = CollectProcessFacts(sources, Devices());
  const DumpResult written = ncclguard::WriteDump(JobDir(), snapshot, facts);
  if (const std::string& directory = GetConfig().flight_recorder_dir; !directory.empty()) {
    // Failures are logged once by the file layer; the dump itself is what the job directory needs.
    (void)WriteOwnFlightRecorder(directory, snapshot, facts);
  }
  return written.ok() ? *written : "";
}

bool SystemEffects::JobDirectoryKnown() { return !JobDir().empty(); }

double SystemEffects::BoardWritesPerSecond() {
  const std::shared_ptr<JobBoard> board = Board();
  return board ? board->StatusWritesPerSecond() : kJobStatusWritesPerSecond;
}

std::optional<ThreadsSnapshot> SystemEffects::CaptureThreads() { return CaptureThreadStacks(); }

void SystemEffects::WriteStatus(const ProcessSnapshot& snapshot) {
  std::shared_ptr<JobBoard> board = Board();
  if (!board) return;
  board_thread_.PostStatus(std::move(board), snapshot, &Facts());
}

void SystemEffects::FlushBoard() {
  // A board that answers takes a millisecond or two; one that has held its call in flight this long
  // is not answering, and the application does not wait for it, nor for one whose last call
  // failed. A board that has not answered yet is waited for alike: a short job exits while its
  // first write is in flight (or before the board's thread, on a busy machine, has begun it), and
  // that write is its only status. One that never answers costs the exit kStuckAfter at most.
  constexpr std::chrono::milliseconds kDeadline{1000};
  constexpr std::chrono::milliseconds kStuckAfter{100};
  board_thread_.Flush(kDeadline, kStuckAfter);
}

void SystemEffects::FinishBoardAtExit() {
  FlushBoard();
  board_thread_.Stop();
}

void SystemEffects::CollectFacts() {
  facts_ = CollectMatchingFacts(RealFactSources());
  facts_collected_.store(true, std::memory_order_release);
}

const ProcessFacts& SystemEffects::Facts() {
  return facts_collected_.load(std::memory_order_acquire) ? facts_ : identity_;
}

absl::StatusOr<std::string> SystemEffects::RecordP2pVerdict(P2pVerdictRecord record) {
  const std::shared_ptr<JobBoard> board = Board();
  if (!board) return absl::FailedPreconditionError("the job directory is not known yet");
  record.job_id = board->JobId();
  record.launch = LaunchId(ReadProcessEnvironment);
  if (absl::Status written = WriteP2pVerdict(board, record); !written.ok()) return written;
  return board->Where() + "/" + kP2pVerdictFile;
}

std::optional<P2pVerdictRecord> SystemEffects::FreshP2pVerdict() {
  const std::shared_ptr<JobBoard> board = Board();
  if (!board) return std::nullopt;
  absl::StatusOr<P2pVerdictRecord> record = ReadP2pVerdict(board, board->JobId());
  if (!record.ok()) {
    if (!absl::IsNotFound(record.status())) log::Warn("{}", std::string(record.status().message()));
    return std::nullopt;
  }
  // A record older than this process is the one its own attempt was restarted for.
  if (record->time_ns < started_wall_ns_) return std::nullopt;
  return *std::move(record);
}

namespace {

// The ids of this process's communicators, those being created included.
std::set<std::string> OwnCommunicators() {
  std::set<std::string> ids;
  for (const CommState* comm : GetRegistry().All()) ids.emplace(comm->id);
  for (const PendingInit& init : GetRegistry().PendingInits()) ids.insert(init.comm_id);
  ids.erase("");
  return ids;
}

}  // namespace

void SystemEffects::RequestPeerDumps(const std::string& why) {
  std::shared_ptr<JobBoard> board = Board();
  if (!board) return;
  const std::set<std::string> comms = OwnCommunicators();
  board_thread_.PostDumpRequest(std::move(board), why, std::vector<std::string>(comms.begin(), comms.end()));
}

bool SystemEffects::RequestApplies(const DumpRequest& request) {
  if (request.comms.empty()) return true;
  const std::set<std::string> own = OwnCommunicators();
  if (own.empty()) return true;
  for (const std::string& comm : request.comms) {
    if (own.contains(comm)) return true;
  }
  if (ignored_requesters_.size() < 64 &&
      ignored_requesters_.insert(absl::StrCat(request.host, ":", request.pid)).second) {
    log::Warn(
        "dump request of another job ignored: {} pid {} asked for dumps ({}) about comm{} {}, and this "
        "process has none of them",
        request.host, request.pid, request.requester, request.comms.size() > 1 ? "s" : "",
        absl::StrJoin(request.comms, ", "));
  }
  return false;
}

std::vector<Verdict> SystemEffects::Classify(const ProcessSnapshot& own_status) {
  const std::shared_ptr<JobBoard> board = Board();
  if (!board) return {};
  // The others' statuses are as fresh as their last interval; ours is now. Written here, not by the
  // board's thread: the job is read next. A failure was logged where it happened.
  (void)board->PublishStatus(own_status, Facts());
  const double interval = StatusIntervalSeconds(GetConfig().status_interval.value, 0);
  absl::StatusOr<JobView> job =
      ReadJob(board, ::ncclguard::WallNowNs(), interval, JobDirectoryOrigin::kOwn, JobReadLimits{});
  if (!job.ok()) {
    log::Warn("no verdict: {}", std::string(job.status().message()));
    return {};
  }
  // A file not read can make a live rank look absent: the verdict's reader should know. A few
  // lines at most: a directory full of junk must not flood the log at every stall.
  constexpr std::size_t kProblemsLogged = 5;
  for (std::size_t i = 0; i < std::min(job->problems.size(), kProblemsLogged); ++i) {
    log::Warn("the verdict leaves out {}", job->problems[i]);
  }
  if (job->problems.size() > kProblemsLogged) {
    log::Warn("the verdict leaves out {} more files of {}", job->problems.size() - kProblemsLogged,
              board->Where());
  }
  return ncclguard::Classify(*job, ProcessKnownBad().entries);
}

std::vector<Verdict> SystemEffects::ClassifyFailSlow() {
  const std::shared_ptr<JobBoard> board = Board();
  if (!board) return {};
  // The watchdog waits for this read: bounded well below any stall timeout. Statuses only: a job
  // that runs has no dumps worth the time.
  JobReadLimits limits;
  limits.deadline = kFailSlowReadDeadline;
  limits.sampled_dumps = 0;
  const double interval = StatusIntervalSeconds(GetConfig().status_interval.value, 0);
  absl::StatusOr<JobView> job =
      ReadJob(board, ::ncclguard::WallNowNs(), interval, JobDirectoryOrigin::kOwn, limits);
  if (!job.ok()) {
    log::Info("no pace judged: {}", std::string(job.status().message()));
    return {};
  }
  return ncclguard::ClassifyFailSlow(*job);
}

std::int64_t SystemEffects::TakePeerDumpRequest() {
  std::int64_t newest = 0;
  for (const DumpRequest& request : board_thread_.TakeDumpRequests()) {
    if (RequestApplies(request)) newest = std::max(newest, std::max<std::int64_t>(request.time_ns, 1));
  }
  return newest;
}

ncclResult_t SystemEffects::AsyncError(CommState& comm) {
  ncclResult_t error = ncclSuccess;
  if (!EnterComm(comm)) return ncclSuccess;
  // As its wrapper calls it: a private instance's calls of its own functions reach that instance.
  const ncclResult_t asked =
      CallRealNccl(comm.library.load(), Api::ncclCommGetAsyncError, [&](void* function) {
        return reinterpret_cast<decltype(&::ncclCommGetAsyncError)>(function)(comm.handle.load(), &error);
      });
  if (asked != ncclSuccess) error = ncclSuccess;
  LeaveComm(comm);
  return error;
}

std::string SystemEffects::LastNcclError() {
  using Function = decltype(&::ncclGetLastError);
  auto get = reinterpret_cast<Function>(Real().Function(0, Api::ncclGetLastError));
  const char* text = get != nullptr ? get(nullptr) : nullptr;
  return text != nullptr ? text : "";
}

void SystemEffects::Abort(CommState& comm) {
  const int library = comm.library.load();
  if (Real().Function(library, Api::ncclCommAbort) == nullptr || !EnterComm(comm)) return;
  comm.aborted_by_ncclguard.store(true, std::memory_order_release);
  const ncclResult_t result = CallRealNccl(library, Api::ncclCommAbort, [&comm](void* function) {
    return reinterpret_cast<decltype(&::ncclCommAbort)>(function)(comm.handle.load());
  });
  comm.lifecycle.store(CommLifecycle::kAborted, std::memory_order_release);
  LeaveComm(comm);
  if (result != ncclSuccess) log::Warn("ncclCommAbort of comm {} returned {}", comm.id, ResultName(result));
}

RecoveryOutcome SystemEffects::RecoverInProcess(CommState& comm, ProbationOp& op,
                                                const std::string& not_ready_reason) {
  const std::string job_dir = JobDir();
  const std::shared_ptr<JobBoard> board = Board();
  const Config& config = GetConfig();
  // Every rank finds the stall within about one timeout of the others; a meeting shorter than a
  // few seconds would fall back for a rank that merely polled later.
  const auto timeout = std::chrono::milliseconds(
      static_cast<std::int64_t>(std::clamp(config.timeout.value, 5.0, 60.0) * 1000));
  return RecoverCommunicator(comm, op,
                             RecoveryRequest{.job_dir = job_dir,
                                             .board = board,
                                             .not_ready_reason = job_dir.empty() && not_ready_reason.empty()
                                                                     ? "the job directory is not known"
                                                                     : not_ready_reason,
                                             .meeting_timeout = timeout,
                                             .replay_timeout = timeout});
}

void SystemEffects::HoldApplicationCalls() {
  internal::g_holding_application_calls.store(true, std::memory_order_seq_cst);
}

void SystemEffects::Exit(int code) {
  // The stall's status and the dump requests are on the board before the process is gone, unless
  // the board does not answer.
  constexpr std::chrono::milliseconds kBoardDeadline{3000};
  board_thread_.Flush(kBoardDeadline, kBoardDeadline);
  if (spdlog::logger* logger = log::Get()) logger->flush();
  // Not exit(): atexit handlers and static destructors may wait for the stuck GPU work.
  _exit(code);
}

std::int64_t SystemEffects::WallNowNs() { return ::ncclguard::WallNowNs(); }

bool SystemEffects::EnterComm(CommState& comm) {
  comm.watchdog_in_call.store(true, std::memory_order_seq_cst);
  if (comm.closing.load(std::memory_order_seq_cst)) {
    comm.watchdog_in_call.store(false, std::memory_order_seq_cst);
    return false;
  }
  return true;
}

void SystemEffects::LeaveComm(CommState& comm) {
  comm.watchdog_in_call.store(false, std::memory_order_seq_cst);
}

std::string SystemEffects::JobDir() {
  MutexLock lock(job_dir_mutex_);
  if (!job_dir_.empty()) return job_dir_;
  std::string first_comm;
  for (CommState* comm : GetRegistry().All()) {
    if (first_comm.empty()) first_comm = comm->id;
  }
  for (const PendingInit& init : GetRegistry().PendingInits()) {
    if (first_comm.empty()) first_comm = init.comm_id;
  }
  if (first_comm.empty()) return job_dir_;
  job_id_ = ::ncclguard::JobId(ReadProcessEnvironment, first_comm);
  job_dir_ = JobDirectory(GetConfig(), job_id_);
  log::Info("job directory: {}", job_dir_);
  const BoardIdentity identity{
      .host = log::HostName(), .pid = static_cast<int>(getpid()), .started_wall_ns = started_wall_ns_};
  absl::StatusOr<std::shared_ptr<JobBoard>> board =
      OpenJobBoard(GetConfig().store, job_dir_, job_id_, identity);
  if (!board.ok()) {
    log::Warn("{}; the job directory is the job board", std::string(board.status().message()));
    board = OpenJobBoard("", job_dir_, job_id_, identity);
  }
  if (board.ok()) {
    board_ = *std::move(board);
    if (!board_->StatusesAreFiles()) log::Info("job board: {}", board_->Where());
  }
  return job_dir_;
}

void SystemEffects::WriteMetrics(const MetricsSample& sample) {
  // A metrics directory on a file system that hangs holds the watchdog this long at most.
  constexpr std::chrono::milliseconds kMetricsWriteDeadline{1000};
  const std::string& directory = GetConfig().metrics_dir;
  if (directory.empty() || JobDir().empty()) return;
  const ProcessFacts& facts = Facts();
  MetricsLabels labels{.job = "", .host = facts.host, .pid = facts.pid, .rank = LauncherRank(facts)};
  {
    MutexLock lock(job_dir_mutex_);
    labels.job = job_id_;
  }
  for (const CommState* comm : GetRegistry().All()) {
    if (labels.rank < 0) labels.rank = comm->rank.load(std::memory_order_relaxed);
  }
  const absl::Status written = WriteMetricsFile(directory, MetricsFileName(labels),
                                                PrometheusText(sample, labels), kMetricsWriteDeadline);
  if (!written.ok() && !metrics_failure_logged_.exchange(true)) {
    log::Warn("metrics not written (NCCLGUARD_METRICS_DIR): {}; later failures are not logged",
              std::string(written.message()));
  }
}

std::shared_ptr<JobBoard> SystemEffects::Board() {
  if (JobDir().empty()) return nullptr;
  MutexLock lock(job_dir_mutex_);
  return board_;
}

std::vector<int> SystemEffects::Devices() {
  std::vector<int> devices;
  for (CommState* comm : GetRegistry().All()) {
    const int device = comm->device.load(std::memory_order_relaxed);
    if (device >= 0 && std::find(devices.begin(), devices.end(), device) == devices.end()) {
      devices.push_back(device);
    }
  }
  return devices;
}

}  // namespace ncclguard
