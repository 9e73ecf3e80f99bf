// The communicator: what one rank of it keeps in its process, and the segment its ranks share.
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "datatypes.h"
#include "profiler.h"
#include "shm.h"

namespace ncclemu {

constexpr int kMaxRanks = 1024;
// Collectives move data through two staging slots per rank (double buffering: one barrier per round).
constexpr size_t kStagingSlotBytes = size_t{2} << 20;
// Send/Recv stream bytes through one ring per ordered pair of ranks.
constexpr size_t kRingBytes = size_t{256} << 10;
// What a collective's kernel uses (its data is split between them); a Send/Recv uses one.
constexpr int kCollectiveChannels = 2;

struct RankInfo {
  int32_t pid;
  int32_t cuda_dev;
  uint64_t host_hash;
  char bus_id[32];
};

struct alignas(64) Doorbell {
  std::atomic<uint32_t> rings;
};

struct alignas(64) Channel {
  std::atomic<uint64_t> written;
  std::atomic<uint64_t> consumed;
};

// Host-side exchange between ranks (the emulated bootstrap network), used by split.
struct alignas(64) BootSlot {
  int64_t values[4];
};

struct CommSegmentHeader {
  uint64_t magic;
  int32_t nranks;
  SharedBarrier collective;
  SharedBarrier bootstrap;
};

// A view of the communicator segment: header | ranks | boot slots | doorbells | channels |
// staging slots | rings. Big regions are page aligned; untouched pages cost nothing on tmpfs.
class CommShared {
 public:
  static size_t bytesFor(int nranks);
  void attach(int nranks);

  SharedSegment segment;
  CommSegmentHeader& header() const { return *static_cast<CommSegmentHeader*>(segment.base()); }
  RankInfo& rankInfo(int rank) const { return at<RankInfo>(rank_offset_)[rank]; }
  BootSlot& boot(int rank) const { return at<BootSlot>(boot_offset_)[rank]; }
  Doorbell& doorbell(int rank) const { return at<Doorbell>(doorbell_offset_)[rank]; }
  Channel& channel(int from, int to) const { return at<Channel>(channel_offset_)[from * nranks_ + to]; }
  char* staging(int rank, uint32_t parity) const {
    return at<char>(staging_offset_) + (size_t(rank) * 2 + parity) * kStagingSlotBytes;
  }
  char* ring(int from, int to) const {
    return at<char>(ring_offset_) + (size_t(from) * nranks_ + to) * kRingBytes;
  }

 private:
  template <class T>
  T* at(size_t offset) const {
    return reinterpret_cast<T*>(static_cast<char*>(segment.base()) + offset);
  }
  int nranks_ = 0;
  size_t rank_offset_ = 0, boot_offset_ = 0, doorbell_offset_ = 0, channel_offset_ = 0, staging_offset_ = 0,
         ring_offset_ = 0;
};

// NET: ranks talk through the network proxy (NCCL's socket transport), here when P2P and SHM are
// both disabled; only then does NCCL's proxy run, and the profiler see ProxyOp/ProxyStep events.
enum class Transport { None, P2P, SHM, NET };

struct UserReduction {
  ncclDataType_t datatype;
  Reduction reduction;
};

struct CommCore {
  ~CommCore();

  // Fixed when the handle is created.
  int rank = 0;
  int nranks = 0;
  int cuda_dev = 0;
  bool blocking = true;
  CUcontext context = nullptr;  // retained primary context of cuda_dev
  int comm_index = 0;           // for the faults' comm= filter, set at init
  std::string comm_name;        // ncclConfig_t's commName, when `named`
  bool named = false;
  // Page-locked memory of `context`, freed when the handle is released (see allocateCommMemory).
  std::atomic<void*> host_memory{nullptr};

  // Set by init, read-only afterwards.
  uint64_t magic = 0;
  CommShared shared;
  Transport transport = Transport::None;

  // Abort and revoke raise it; every wait in the data path and in init watches it.
  std::atomic<bool> interrupted{false};
  std::atomic<bool> revoked{false};
  std::atomic<bool> finalized{false};
  // ncclInProgress while init or finalize runs, then the first error (or success).
  std::atomic<int> async_result{ncclSuccess};
  uint64_t issued_operations = 0;  // guarded by mutex

  std::mutex mutex;
  std::condition_variable changed;
  // Tasks of this communicator run in launch order even when the user spreads them over streams.
  uint64_t next_ticket = 0;
  uint64_t running_ticket = 0;
  bool executing = false;  // a task is running: tasks launched from graphs wait for it too
  int outstanding_tasks = 0;
  uint64_t derived_communicators = 0;  // splits and shrinks issued so far: names their rendezvous
  std::map<int, UserReduction> user_reductions;
  int next_user_reduction = ncclNumOps;
  std::set<void*> registrations;
  CommProfiler profiler;

  void interrupt();
  // Waits (sleeping) until interrupted; what a stuck kernel looks like from the host.
  void stallUntilInterrupted();
  void setAsyncResult(ncclResult_t result);
};

enum class OpKind {
  AllReduce,
  Broadcast,
  Reduce,
  AllGather,
  ReduceScatter,
  AlltoAll,
  Gather,
  Scatter,
  Send,
  Recv
};

struct Operation {
  OpKind kind;
  const void* send;
  void* recv;
  size_t count;
  ncclDataType_t datatype;
  Reduction reduction;
  int root_or_peer;
  CUstream stream;
  uint64_t seq = 0;
  std::vector<ProfiledTask> profiled;  // empty without a profiler plugin
};

const char* opName(OpKind kind);

// A unit of host-side work (an init, a split) that a group runs concurrently at ncclGroupEnd.
struct Job {
  std::shared_ptr<CommCore> core;  // whose async_result reports it
  std::function<ncclResult_t()> run;
};

// Group handling (enqueue.cc).
bool insideGroup();
// Inside a group: runs at the outermost ncclGroupEnd. Else blocking: runs now; non-blocking: runs in
// the background and the call returns ncclInProgress.
ncclResult_t launchJob(Job job);
ncclResult_t enqueueOperation(ncclComm_t comm, Operation op, ncclRedOp_t reduce_op);

// Data path (execute.cc): the host function a task runs on its stream.
struct Task {
  std::shared_ptr<CommCore> core;
  std::vector<Operation> operations;
  uint64_t ticket = 0;
  bool waits_only = false;  // joins a second stream to a task running on another one
  // Set (under the core's mutex) once the launching thread has handed the task's operations over
  // to the profiler: their events are the parents of what the task's kernel reports.
  bool handed_over = false;
};
// Runs a task launched outside a capture, once, and frees it.
void CUDA_CB runTask(void* task);
// Runs a task captured into a graph, at every launch of the graph; the graph frees it.
void CUDA_CB runCapturedTask(void* task);

// Parses NCCL_COMM_ID-style "host:port"; false if malformed.
bool validCommIdAddress(const std::string& address);

}  // namespace ncclemu

// The handle the application holds. Never freed: a use after destroy or abort is reported as an
// error instead of touching freed memory (ncclguard may abort from another thread).
struct ncclComm {
  std::mutex mutex;
  std::shared_ptr<ncclemu::CommCore> core;  // null once destroyed or aborted
};

namespace ncclemu {
// The core behind a live handle, or nullptr (with a WARN naming the caller and *error set).
std::shared_ptr<CommCore> liveCore(ncclComm_t comm, const char* caller, ncclResult_t* error);
// Like NCCL's ncclCommEnsureReady: an init or finalize still in progress is a usage error.
ncclResult_t ensureReady(CommCore& core);
// Detaches the core from the handle (destroy, abort, failed blocking init).
void releaseHandle(ncclComm_t comm);

void groupStartInternal();
ncclResult_t groupEndInternal();
}  // namespace ncclemu
