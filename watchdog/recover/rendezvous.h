// The meeting at which the ranks of a stuck communicator agree, through the job board (the job
// directory, local or shared by every node, or Redis), to re-create it in their own processes: all of them
// or none. Each rank votes; rank 0, once every rank is ready, makes the new communicator's unique
// id; and one decision file, which only its first writer can create, carries either that unique
// id or the reason to fall back. The files are described in docs/recovery.md.
//
// Independent of NCCL: the caller hands rank 0 a function that makes the unique id.
#pragma once

#include <nccl.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "watchdog/report/job_board.h"

namespace ncclguard {

// <job_dir>/recovery/<comm>/<epoch>/ holds one meeting's files.
inline constexpr char kRecoveryDirectory[] = "recovery";
inline constexpr char kRecoveryDecisionFile[] = "decision.json";
inline constexpr int kRendezvousFormatVersion = 1;
// How often a rank looks at the meeting's files while it waits.
inline constexpr std::chrono::milliseconds kRendezvousPollInterval{20};

struct RendezvousRequest {
  std::shared_ptr<JobBoard> board;  // the job's board, the same on every rank
  std::string comm_id;              // the communicator's id (CommState::id): 16 lowercase hex digits
  // The recovery attempt of this communicator, from 1: each attempt meets in a directory of its
  // own, so a later attempt never reads an earlier one's decision.
  int epoch = 1;
  int nranks = 0;
  int rank = -1;
  // The other ranks of the communicator that this process drives (several GPUs per process): it
  // votes for them as well, with the same readiness, and leads the meeting if one is rank 0.
  std::vector<int> other_local_ranks;
  bool ready = false;            // whether this rank can recover
  std::string not_ready_reason;  // why not, for the others and the user
  // How long this rank waits for the decision, from the call, on the steady clock. Every rank
  // should be given the same; a decision seen at the deadline is still followed.
  std::chrono::milliseconds timeout{0};
};

struct RendezvousOutcome {
  bool recover = false;
  ncclUniqueId unique_id{};  // the new communicator's, when `recover`
  // When falling back: why, naming the rank(s) and their reason, or the ranks that did not vote.
  // When recovering: a short account ("all 4 ranks are ready").
  std::string reason;
};

using UniqueIdMaker = std::function<absl::StatusOr<ncclUniqueId>()>;

// Takes part in the meeting as `request.rank` (and its other local ranks) and returns what was
// decided. The process that votes for rank 0 calls `make_unique_id` (at most once, and only when
// every rank voted ready); the others may pass an empty function. Blocks until the decision is known or the
// timeout has passed, polling every kRendezvousPollInterval. Past the timeout, the file operations that
// publish or read the decision still get a few seconds (a file system that stops answering holds a write up
// to kWriteDeadline).
//
// A fallback is an outcome, not an error: the caller then goes on as without recovery. A non-OK
// status means the request itself is invalid (or memory ran out): this rank took no part, and the
// others fall back when their deadline passes.
//
// The decision file cannot hold two decisions, so no two ranks that read it disagree. One race
// remains: a rank that cannot read the decision at all (its file system stops answering, its
// process stalls past the deadline while the others have read the unique id) falls back on its
// own; the others then wait for it in the new communicator's initialisation until their own
// watchdog's init timeout falls back in turn.
absl::StatusOr<RendezvousOutcome> MeetToRecover(const RendezvousRequest& request,
                                                const UniqueIdMaker& make_unique_id) noexcept;

// "recovery/<comm>/<epoch>": the board's folder where the meeting of `request` keeps its records;
// and where that is, for messages ("<job_dir>/recovery/<comm>/<epoch>" on a directory board).
std::string RendezvousFolder(const RendezvousRequest& request);
std::string RendezvousDirectory(const RendezvousRequest& request);

}  // namespace ncclguard
