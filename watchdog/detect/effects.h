// The watchdog's real effects: the job directory (named after the first communicator), the
// process's facts, the dump, status, request and P2P verdict files, the cross-rank
// classification, the NCCL calls on a communicator, and the process's exit. Apart from the
// decisions (detect/watchdog.h), which reach all of this only through WatchdogEffects, so that
// a test can replace it with recorded effects.
#pragma once

#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "watchdog/common/mutex.h"
#include "watchdog/detect/board_thread.h"
#include "watchdog/detect/watchdog.h"
#include "watchdog/report/job_board.h"
#include "watchdog/report/job_dir.h"

namespace ncclguard {

// The real effects: the job board and the files of the job directory, NCCL and CUDA calls, the
// process's exit.
class SystemEffects final : public WatchdogEffects {
 public:
  std::string WriteDump(const ProcessSnapshot& snapshot) override;
  bool JobDirectoryKnown() override;
  double BoardWritesPerSecond() override;
  void WriteStatus(const ProcessSnapshot& snapshot) override;
  std::optional<ThreadsSnapshot> CaptureThreads() override;

  // On an application's thread: waits for the statuses and requests handed to the board to be
  // published, a second at most, not at all for a board that never answered or whose call in
  // flight is stuck.
  void FlushBoard();
  // At exit: the same, then publishes nothing more.
  void FinishBoardAtExit();

  // On the watchdog thread, before its first round: the driver and NVML calls behind these facts
  // are made once per process, never on the status path.
  void CollectFacts();

  const ProcessFacts& Facts() override;
  absl::StatusOr<std::string> RecordP2pVerdict(P2pVerdictRecord record) override;
  std::optional<P2pVerdictRecord> FreshP2pVerdict() override;
  void RequestPeerDumps(const std::string& why) override;
  std::vector<Verdict> Classify(const ProcessSnapshot& own_status) override;
  std::vector<Verdict> ClassifyFailSlow() override;
  std::int64_t TakePeerDumpRequest() override;
  ncclResult_t AsyncError(CommState& comm) override;
  std::string LastNcclError() override;
  void Abort(CommState& comm) override;
  RecoveryOutcome RecoverInProcess(CommState& comm, ProbationOp& op,
                                   const std::string& not_ready_reason) override;
  void HoldApplicationCalls() override;
  [[noreturn]] void Exit(int code) override;
  std::int64_t WallNowNs() override;
  void WriteMetrics(const MetricsSample& sample) override;

 private:
  // The application closes communicators (NCCL frees them) while the watchdog may call NCCL on
  // them: each side announces itself, then checks the other (both sequentially consistent).
  static bool EnterComm(CommState& comm);
  static void LeaveComm(CommState& comm);

  // The job directory, settled once a communicator id is known (the fallback job id is made from
  // it); "" before that, and nothing is written then.
  // A copy: the application's thread (status at communicator creation) may ask too.
  std::string JobDir();
  // The job board (NCCLGUARD_STORE), opened once JobDir() has named the job; null before.
  std::shared_ptr<JobBoard> Board();

  static std::vector<int> Devices();
  // Whether a peer's dump request is of this process's job: it names one of this process's
  // communicators, or names none; a process without any communicator cannot tell, and answers.
  // A request of another job is reported once per requester.
  bool RequestApplies(const DumpRequest& request);

  std::set<std::string> ignored_requesters_;  // the watchdog thread's
  std::atomic<bool> metrics_failure_logged_{false};

  Mutex job_dir_mutex_;
  std::string job_id_ ABSL_GUARDED_BY(job_dir_mutex_);
  std::string job_dir_ ABSL_GUARDED_BY(job_dir_mutex_);
  std::shared_ptr<JobBoard> board_ ABSL_GUARDED_BY(job_dir_mutex_);
  // Statuses, dump requests and the look for other processes' requests: never on the thread that
  // asks for them.
  BoardThread board_thread_;
  const std::int64_t started_wall_ns_ = ::ncclguard::WallNowNs();
  const ProcessFacts identity_ = CollectIdentityFacts(RealFactSources());
  ProcessFacts facts_;
  std::atomic<bool> facts_collected_{false};
};

}  // namespace ncclguard
