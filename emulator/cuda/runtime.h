// The emulated driver's objects. Every handle type of cuda.h is an incomplete struct there; the
// emulator completes it here, so a handle is a pointer to one of these.
//
// Locking: State::mutex guards the registries, contexts, captures and the fields marked below.
// It may be held while taking a stream's mutex, never the other way round. A stream worker holds
// only its own stream's mutex, and none while it runs work, so work may block forever.
#pragma once

#include <cuda.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

using StreamPtr = std::shared_ptr<CUstream_st>;
using Work = std::function<void()>;
// Queues one captured operation again, on the stream a graph is launched into (State::mutex held).
using Replay = std::function<CUresult(const StreamPtr&)>;

namespace ncclemu {

using Clock = std::chrono::steady_clock;

// One recorded position of an event: complete once the stream's worker has reached it.
class Marker {
 public:
  void complete();
  bool isComplete() const;
  void waitComplete() const;
  Clock::time_point completionTime() const;

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable completed_;
  bool complete_ = false;
  Clock::time_point completion_time_;
};

struct Capture {
  unsigned long long id = 0;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::thread::id thread;
  CUstream_st* origin = nullptr;
  bool invalidated = false;
  bool ended = false;
  std::unique_ptr<CUgraph_st> graph;
  std::vector<StreamPtr> members;  // streams that joined through cuStreamWaitEvent, origin included
};
using CapturePtr = std::shared_ptr<Capture>;

}  // namespace ncclemu

struct CUstream_st : std::enable_shared_from_this<CUstream_st> {
  enum class Kind { kCreated, kLegacy, kPerThread };

  CUstream_st(CUctx_st* owner, Kind stream_kind, unsigned stream_flags, int stream_priority, unsigned long long stream_id)
      : context(owner), kind(stream_kind), flags(stream_flags), priority(stream_priority), id(stream_id) {}

  // Whether the legacy default stream and this stream wait for each other's earlier work.
  bool synchronizesWithLegacy() const { return kind == Kind::kPerThread || (kind == Kind::kCreated && !(flags & CU_STREAM_NON_BLOCKING)); }

  // Appends work; starts the worker on first use. Returns the work's position.
  std::uint64_t push(Work work);
  // The position of the last queued work if some is not done yet, else 0.
  std::uint64_t pendingUntil();
  bool isIdle();
  void waitUntilDone(std::uint64_t position);
  // The stream is gone for the application: the worker finishes what is queued, then exits.
  void retire();

  CUctx_st* const context;
  const Kind kind;
  const unsigned flags;
  const int priority;
  const unsigned long long id;

  // Guarded by State::mutex.
  ncclemu::CapturePtr capture;
  bool registered = true;

 private:
  void startWorker();
  void runWorker();

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Work> queue_;
  std::uint64_t submitted_ = 0;
  std::uint64_t completed_ = 0;
  bool worker_started_ = false;
  bool retired_ = false;
};

struct CUctx_st {
  int device = 0;
  bool primary = false;
  bool active = false;
  unsigned flags = 0;
  unsigned long long id = 0;
  StreamPtr legacy_stream;
  std::vector<StreamPtr> streams;  // created and per-thread streams
};

struct CUevent_st {
  CUctx_st* context = nullptr;
  unsigned flags = 0;
  // Guarded by State::mutex.
  std::shared_ptr<ncclemu::Marker> last_record;
  ncclemu::CapturePtr recorded_in_capture;  // set while the last record went into a capture
};

// An application object whose lifetime graphs share (cuUserObjectCreate): its destructor runs
// once the last reference, the application's or a graph's, is released.
struct CUuserObject_st {
  void* pointer = nullptr;
  CUhostFn destroy = nullptr;
  unsigned references = 0;  // guarded by State::mutex
};

// References a graph (or an executable graph, or a launch in flight) holds, per user object.
using UserObjectReferences = std::map<CUuserObject_st*, unsigned>;

struct CUgraph_st {
  std::vector<Replay> nodes;
  UserObjectReferences user_objects;
};

struct CUgraphExec_st {
  std::vector<Replay> nodes;
  UserObjectReferences user_objects;
};

namespace ncclemu {

struct Allocation {
  std::size_t size;
  CUctx_st* context;
  bool host;
  // Host memory the application owns, registered with cuMemHostRegister: never freed by the driver.
  bool registered = false;
  unsigned host_flags = 0;  // CU_MEMHOSTALLOC_* or CU_MEMHOSTREGISTER_* as given
  // A free is waiting for the device (NCCLEMU_FREES_WAIT): a second free of it is refused.
  bool freeing = false;
};

struct Device {
  std::size_t allocated_bytes = 0;
  unsigned primary_retains = 0;
  unsigned primary_flags = 0;
  std::unique_ptr<CUctx_st> primary_context;
};

struct State {
  State();

  std::mutex mutex;
  bool initialized = false;

  // Configuration, read once when the state is created.
  int device_count;
  std::string gpu_name;
  std::size_t gpu_memory_bytes;
  int driver_version;
  std::vector<std::vector<bool>> p2p_access;
  bool frees_wait;

  std::vector<Device> devices;
  std::unordered_map<CUctx_st*, std::unique_ptr<CUctx_st>> created_contexts;
  std::unordered_map<CUstream_st*, StreamPtr> streams;
  std::unordered_map<CUevent_st*, std::shared_ptr<CUevent_st>> events;
  std::unordered_map<CUgraph_st*, std::unique_ptr<CUgraph_st>> graphs;
  std::unordered_map<CUgraphExec_st*, std::unique_ptr<CUgraphExec_st>> graph_execs;
  std::map<std::uintptr_t, Allocation> allocations;
  std::vector<CapturePtr> active_captures;
  std::unordered_map<CUuserObject_st*, std::unique_ptr<CUuserObject_st>> user_objects;
  // Destructors of user objects released to zero, run once State::mutex is released: they may
  // free what calls back into the driver.
  std::vector<std::pair<CUhostFn, void*>> pending_destructors;
  unsigned long long next_id = 1;
};

struct ThreadState {
  ~ThreadState();

  std::vector<CUctx_st*> context_stack;
  std::map<CUctx_st*, StreamPtr> per_thread_streams;
  CUstreamCaptureMode capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
};

// The process's driver state. A forked child gets a fresh one: the parent's workers do not exist
// there, so it must not wait on anything the parent had queued.
State& state();
ThreadState& threadState();

// The helpers below expect State::mutex to be held.

// The calling thread's current context, or null if it has none or it was destroyed.
CUctx_st* currentContext(State& s);
bool isLiveContext(State& s, CUctx_st* context);
// NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD resolve through the current context.
CUresult resolveStream(State& s, CUstream handle, StreamPtr& out);
StreamPtr createStream(State& s, CUctx_st* context, CUstream_st::Kind kind, unsigned flags, int priority);
void destroyStream(State& s, const StreamPtr& stream);
// Releases everything a context owns; pending work still runs to its end.
void releaseContextResources(State& s, CUctx_st* context);
// Adds (or drops) references; a user object dropped to zero queues its destructor.
void retainUserObjects(const UserObjectReferences& references);
void releaseUserObject(State& s, CUuserObject_st* object, unsigned count);
void releaseUserObjects(State& s, UserObjectReferences& references);
// Queues work on a stream, or appends `replay` to the graph of the capture the stream is in.
CUresult enqueueWork(const StreamPtr& stream, Work work, Replay replay);
// The allocation containing [address, address + bytes), or null.
const Allocation* findAllocation(State& s, std::uintptr_t address, std::size_t bytes);

}  // namespace ncclemu
