// Plain copies of ncclguard's state, taken by the watchdog thread, from which dumps and status
// files are written. Nothing here points into live state: a snapshot can be formatted at leisure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "watchdog/common/pace.h"
#include "watchdog/common/profile_events.h"

namespace ncclguard {

// One collective or point-to-point operation, as recorded in a communicator's ring.
struct OpSnapshot {
  std::uint64_t seq = 0;  // per communicator, from 1: this rank's order of its operations
  // The collectives issued up to it (itself included; before it for a Send or Recv): the same on
  // every rank for a collective, where seq differs when the ranks' sends and receives do. 0 when
  // not known (files of earlier versions).
  std::uint64_t coll_seq = 0;
  std::string op;                // "AllReduce", "Broadcast", "Send", ...
  std::string dtype;             // "float32", "bfloat16", ...
  std::uint64_t count = 0;       // elements, as passed to NCCL
  std::uint64_t bytes = 0;       // count × element size
  int root = -1;                 // rooted collectives
  int peer = -1;                 // Send/Recv
  std::string reduction;         // "sum", "max", ..., "" when none
  std::uint64_t stream = 0;      // the cudaStream_t, as a number
  std::uint64_t group = 0;       // id of the ncclGroupStart/End block, 0 when not grouped
  std::int64_t host_thread = 0;  // kernel thread id of the caller
  // Times in nanoseconds since the Unix epoch; 0 when not (yet) known. start/end are when the
  // watchdog saw the GPU reach the start/end event, gpu_ms the GPU's own elapsed time.
  std::int64_t enqueue_ns = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  double gpu_ms = -1;
  int result = 0;     // what the NCCL call returned
  std::string state;  // enqueued|started|completed|failed|aborted|captured
};

struct CommSnapshot {
  std::string id;            // 16 hex digits, the same on every rank of the communicator
  std::uint64_t handle = 0;  // the ncclComm_t in this process
  int rank = -1;
  int nranks = 0;
  int device = -1;
  std::string created_by;    // "ncclCommInitRank", "ncclCommSplit", ...
  std::string parent_id;     // for split/shrink children
  std::string library_path;  // the libnccl serving it
  int nccl_version = 0;
  std::string state;   // initializing|ready|failed|aborted|revoked|finalized|destroyed
  std::string timing;  // what times its operations: "profiler" or "cuda_events" (records.h)
  std::int64_t init_start_ns = 0;
  std::int64_t init_end_ns = 0;
  std::uint64_t last_enqueued = 0;   // highest seq enqueued
  std::uint64_t collectives = 0;     // collectives enqueued (0 also when not known)
  std::uint64_t last_started = 0;    // highest seq seen started on the GPU
  std::uint64_t last_completed = 0;  // highest seq seen completed
  std::string async_error;           // ncclCommGetAsyncError's answer when not success, else ""
  std::uint64_t dropped = 0;         // operations not recorded (ring full of unfinished ones)
  std::vector<OpSnapshot> ring;      // oldest first; empty in status files
  // Status files only: OperationSignature (op_signature.h) of the latest operations, the first
  // for #signatures_first_seq, kNoSignature where nothing can be compared.
  std::uint64_t signatures_first_seq = 0;
  std::vector<std::uint32_t> signatures;
  // Dumps only: what NCCL's profiler told of its latest operations (shim/profiler.cc), oldest first;
  // empty when NCCL did not load ncclguard's profiler plugin.
  std::vector<OpProfileSnapshot> profile;
  // Its latest complete pace blocks (common/pace.h), oldest first: what the fail-slow rules compare.
  std::vector<PaceBlockSnapshot> pace;
};

// What the watchdog found wrong.
struct StallSnapshot {
  std::string kind;  // "not_completed" (started on the GPU), "not_started", "init"
  std::string comm_id;
  std::uint64_t seq = 0;        // 0 for "init"
  double seconds = 0;           // for how long
  std::string message;          // the log line
  std::string verdict;          // the cross-rank verdict's kind at the time ("" when unknown)
  std::string verdict_message;  // and its sentence
  // Stalls of the same operation found since its last dump and not dumped (detect/dump_spacing.h).
  int skipped_dumps = 0;
};

// A communicator initialisation that had not returned when the snapshot was taken.
struct PendingInitSnapshot {
  std::string comm_id;
  std::string api;  // "ncclCommInitRank", ...
  int rank = -1;
  int nranks = 0;
  std::int64_t start_ns = 0;  // since the Unix epoch
  std::string result;         // the error it returned ("ncclInvalidArgument"), "" while it has not
};

// One frame of a thread's stack, innermost first. Native frames name a function (demangled, ""
// when unknown), the module and the offset in it, and file:line where debug information exists;
// Python frames name the function, file and line only.
struct FrameSnapshot {
  std::string function;
  std::string file;
  int line = 0;
  std::string module;        // native frames: the object's path
  std::uint64_t offset = 0;  // native frames: the address's offset in the module
};

// One thread of the process when its stacks were taken (report/thread_stacks.h).
struct ThreadSnapshot {
  std::int64_t tid = 0;  // kernel thread id
  std::string name;      // its comm (pthread_setname_np)
  // From /proc/self/task/<tid>: its scheduler state ("running", "sleeping", "disk_sleep",
  // "stopped", ...), the kernel function it waits in, the system call it is blocked in ("" when
  // none) and, for one on a file descriptor, what the descriptor is ("pipe:[42]", a path, ...).
  std::string state;
  std::string wchan;
  std::string syscall;
  int fd = -1;
  std::string fd_target;
  double blocked_seconds = -1;  // how long it has not run, -1 when unknown or running
  // Why it has no native frames ("" when it has them): it blocks signals, sleeps uninterruptibly,
  // did not answer in time, is in a call that a signal would cut short, ...
  std::string native_missing;
  std::vector<FrameSnapshot> native;  // innermost first
  std::vector<FrameSnapshot> python;  // its Python frames, innermost first, when it runs Python
  bool frames_omitted = false;        // the dump's budget for stacks was spent before this thread
};

// Every thread's stack, taken when the process dumps.
struct ThreadsSnapshot {
  std::int64_t time_ns = 0;  // when taken (epoch ns)
  double took_ms = 0;
  int total = 0;               // threads of the process; `threads` lists the first of them (a bounded number)
  std::string native_note;     // why no thread has native frames, "" when some could
  std::string symbols_note;    // why native frames lack names, files or lines, "" when they do not
  std::string python_version;  // of the interpreter in the process, "" when none
  std::string python_note;     // why Python frames are missing, "" when taken or no Python
  std::vector<ThreadSnapshot> threads;
};

// A fail-slow verdict (slow_link, slow_rank) that the process judging the job's pace holds now.
struct FailSlowSnapshot {
  std::string kind;
  std::string comm_id;
  std::vector<int> ranks;
  std::string message;
};

struct ProcessSnapshot {
  std::string reason;        // "stall", "async_error", "error_return", "signal", "peer_request", "exit"
  std::int64_t time_ns = 0;  // since the Unix epoch
  int rank = -1;             // best known: a communicator's rank, else the launcher's
  std::string in_nccl_call;  // the NCCL function a thread of this process is inside now, or ""
  std::vector<CommSnapshot> comms;
  std::optional<StallSnapshot> stall;
  std::string last_nccl_warning;  // ncclGetLastError's text
  std::vector<PendingInitSnapshot> pending_inits;
  bool exiting = false;                    // taken on the way out of a normal exit (atexit)
  std::optional<ThreadsSnapshot> threads;  // dumps only; none when not taken
  // The process that judges the job's pace (detect/fail_slow.h): what it finds now; empty elsewhere.
  std::vector<FailSlowSnapshot> fail_slow;
};

}  // namespace ncclguard
