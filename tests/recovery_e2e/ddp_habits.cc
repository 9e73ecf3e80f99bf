// A job that calls NCCL the way PyTorch's ProcessGroupNCCL and DistributedDataParallel do, so
// that ncclguard is tested against those habits rather than against a program written for it:
//
//  - the default group's communicator comes from ncclCommInitRankConfig with a config that sets
//    a few fields (non-blocking with --nonblocking, as TORCH_NCCL_USE_COMM_NONBLOCKING=1 does:
//    every call answering ncclInProgress is followed by polling ncclCommGetAsyncError);
//  - the data-parallel group is ncclCommSplit of it, and every collective runs on that group;
//  - collectives run on a dedicated non-blocking NCCL stream, which first waits on an event
//    recorded on the compute stream; each one's end event is recorded on the NCCL stream and
//    handed to a "framework watchdog" thread that polls the end events with cuEventQuery and the
//    communicators with ncclCommGetAsyncError every 100 ms, and aborts the communicators and the
//    process on an error or when a collective takes longer than --framework-timeout;
//  - sync_module_states broadcasts every parameter from rank 0 back to back, then waits once
//    (with --wait-each, as a program that synchronises after every collective does, it waits
//    after each), and says how long that took;
//  - each step all-reduces the gradient buckets in place back to back, then waits once;
//  - at the end the communicators are destroyed (finalized first when non-blocking).
//
// The parent process makes the unique id and forks the ranks (rank R on device R). Each rank
// checks every result against what it can compute itself and prints a checksum of all of them.
//
//   ddp_habits --ranks N [--params P] [--steps S] [--buckets B] [--nonblocking] [--wait-each]
//              [--framework-timeout SECONDS]
#include <cuda.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/recovery_e2e/fork_ranks.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int ranks = 2;
  int params = 6;
  int steps = 5;
  int buckets = 4;
  bool nonblocking = false;
  bool wait_each = false;
  double framework_timeout_s = 60;
};

int g_rank = -1;  // the rank this process is, for messages; -1 in the parent

[[noreturn]] void Fail(const std::string& what) {
  std::printf("rank %d: FAILED: %s\n", g_rank, what.c_str());
  std::fflush(nullptr);
  _exit(1);
}

std::string CudaError(CUresult result) {
  const char* name = nullptr;
  if (cuGetErrorName(result, &name) != CUDA_SUCCESS || name == nullptr) name = "unknown CUresult";
  return std::string(name) + " (" + std::to_string(static_cast<int>(result)) + ")";
}

void CheckCuda(CUresult result, const char* call) {
  if (result != CUDA_SUCCESS) Fail(std::string(call) + " failed with " + CudaError(result));
}

std::string Seconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", seconds);
  return text;
}

// Waits for a non-blocking communicator's last call to complete, as ProcessGroupNCCL does after
// a call answers ncclInProgress: ncclCommGetAsyncError until it says something else.
void WaitWhileInProgress(ncclComm_t comm, const char* call, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t queried = ncclCommGetAsyncError(comm, &state);
    if (queried != ncclSuccess) {
      Fail(std::string("ncclCommGetAsyncError after ") + call + " failed: " + ncclGetErrorString(queried));
    }
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      Fail(std::string(call) + " failed asynchronously: " + ncclGetErrorString(state));
    }
    if (Clock::now() > deadline) {
      Fail(std::string(call) + " still in progress after " + Seconds(timeout_s) + " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// ncclSuccess goes on; ncclInProgress (a non-blocking communicator) is waited for on `comm`.
void CheckNccl(ncclResult_t result, const char* call, ncclComm_t comm, double timeout_s) {
  if (result == ncclInProgress && comm != nullptr) {
    WaitWhileInProgress(comm, call, timeout_s);
    return;
  }
  if (result != ncclSuccess) Fail(std::string(call) + " failed: " + ncclGetErrorString(result));
}

// A collective's end event. Shared: the watchdog queries it until it completes, and the step
// may wait on the last one; whoever lets go last destroys it.
class EndEvent {
 public:
  EndEvent(int seq, const char* name) : seq_(seq), name_(name), issued_(Clock::now()) {
    CheckCuda(cuEventCreate(&event_, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  }
  ~EndEvent() { cuEventDestroy(event_); }
  EndEvent(const EndEvent&) = delete;
  EndEvent& operator=(const EndEvent&) = delete;

  CUevent event() const { return event_; }
  int seq() const { return seq_; }
  const char* name() const { return name_; }
  Clock::time_point issued() const { return issued_; }

 private:
  CUevent event_ = nullptr;
  int seq_;
  const char* name_;
  Clock::time_point issued_;
};

// What ProcessGroupNCCL's watchdog thread does: every 100 ms, the end event of every outstanding
// collective (cuEventQuery) and the asynchronous error of every communicator. An error, or a
// collective outstanding for longer than the timeout, aborts the communicators and ends the
// process with status 1.
class FrameworkWatchdog {
 public:
  FrameworkWatchdog(CUcontext context, double timeout_s) : context_(context), timeout_s_(timeout_s) {
    thread_ = std::thread([this] { Run(); });
  }
  FrameworkWatchdog(const FrameworkWatchdog&) = delete;
  FrameworkWatchdog& operator=(const FrameworkWatchdog&) = delete;
  ~FrameworkWatchdog() { Stop(); }

  // Once the communicator has been created (a non-blocking one: once it is no longer in progress).
  void Watch(ncclComm_t comm, const char* name) {
    std::lock_guard<std::mutex> lock(mutex_);
    comms_.push_back({comm, name});
  }

  void Enqueue(std::shared_ptr<EndEvent> end) {
    std::lock_guard<std::mutex> lock(mutex_);
    outstanding_.push_back(std::move(end));
    ++handed_;
  }

  // A last look at the outstanding events, then the report. Before the communicators are
  // destroyed: their handles are no longer valid afterwards.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
    std::printf("rank %d: framework watchdog saw %d of %d collectives complete\n", g_rank, completed_,
                handed_);
    std::fflush(nullptr);
  }

 private:
  struct Comm {
    ncclComm_t comm;
    const char* name;
  };

  void Run() {
    std::unique_lock<std::mutex> lock(mutex_);
    // A thread of its own needs the device's context for the event queries.
    if (const CUresult set = cuCtxSetCurrent(context_); set != CUDA_SUCCESS) {
      Abort("cuCtxSetCurrent on its thread failed with " + CudaError(set));
    }
    for (;;) {
      const bool last = stopping_;
      Poll();
      if (last) return;
      wake_.wait_for(lock, std::chrono::milliseconds(100));
    }
  }

  // With mutex_ held.
  void Poll() {
    for (const Comm& comm : comms_) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t queried = ncclCommGetAsyncError(comm.comm, &state);
      if (queried != ncclSuccess) {
        Abort(std::string("ncclCommGetAsyncError of communicator ") + comm.name +
              " failed: " + ncclGetErrorString(queried));
      }
      if (state != ncclSuccess && state != ncclInProgress) {
        Abort(std::string("communicator ") + comm.name +
              " reported an asynchronous error: " + ncclGetErrorString(state));
      }
    }
    const Clock::time_point now = Clock::now();
    for (auto it = outstanding_.begin(); it != outstanding_.end();) {
      const EndEvent& end = **it;
      const CUresult queried = cuEventQuery(end.event());
      if (queried == CUDA_SUCCESS) {
        ++completed_;
        it = outstanding_.erase(it);
        continue;
      }
      if (queried != CUDA_ERROR_NOT_READY) {
        Abort("cuEventQuery of collective #" + std::to_string(end.seq()) + " (" + end.name() +
              ") failed with " + CudaError(queried));
      }
      if (now - end.issued() > std::chrono::duration<double>(timeout_s_)) {
        Abort("collective #" + std::to_string(end.seq()) + " timed out after " + Seconds(timeout_s_) + " s");
      }
      ++it;
    }
  }

  // As ProcessGroupNCCL: abort every communicator, then end the process.
  [[noreturn]] void Abort(const std::string& what) {
    std::printf("rank %d: framework watchdog: %s; aborting\n", g_rank, what.c_str());
    std::fflush(nullptr);
    for (auto it = comms_.rbegin(); it != comms_.rend(); ++it) ncclCommAbort(it->comm);
    std::fflush(nullptr);
    _exit(1);
  }

  CUcontext context_;
  double timeout_s_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::vector<Comm> comms_;
  std::vector<std::shared_ptr<EndEvent>> outstanding_;
  int handed_ = 0;
  int completed_ = 0;  // written by the watchdog thread only, read after it is joined
  std::thread thread_;
};

// FNV-1a over the bytes, carried over from one buffer to the next.
class Checksum {
 public:
  void Add(const std::vector<float>& values) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
    for (size_t i = 0; i < values.size() * sizeof(float); ++i) hash_ = (hash_ ^ bytes[i]) * 1099511628211ull;
  }
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 14695981039346656037ull;
};

size_t ParamCount(int param) { return 1000 * static_cast<size_t>(param + 1); }

// Different sizes, the largest first (DDP fills its buckets in reverse order of the parameters).
size_t BucketCount(int bucket, int buckets) {
  return 2048 * static_cast<size_t>(buckets - bucket) + 37 * static_cast<size_t>(bucket);
}

// Rank 0's parameters are the model; the others start from something else, which the broadcast
// must overwrite.
float ParamValue(int rank, int param, size_t index) {
  if (rank == 0) return static_cast<float>(static_cast<long>((param * 7 + index) % 251)) * 0.25f - 3.0f;
  return 1.0e6f + static_cast<float>(rank * 100 + param);
}

// Small integers: sums over the ranks are exact in float, whatever the reduction order.
float GradientValue(int rank, int step, int bucket, size_t index) {
  return static_cast<float>(static_cast<long>((rank * 5 + step * 3 + bucket * 7 + index) % 13) - 6);
}

struct Rank {
  const Options& options;
  int rank;
  CUcontext context = nullptr;
  CUstream compute = nullptr;
  CUstream nccl_stream = nullptr;
  ncclComm_t world = nullptr;
  ncclComm_t dp = nullptr;
  int issued = 0;  // collectives on dp so far, numbered from 1 as NCCL's operations are

  void Check(ncclResult_t result, const char* call, ncclComm_t comm) const {
    CheckNccl(result, call, options.nonblocking ? comm : nullptr, options.framework_timeout_s);
  }

  // The NCCL stream waits for the compute stream's work so far (the inputs' copies), as
  // ProcessGroupNCCL's syncStream does before every collective.
  CUevent SyncStreams() const {
    CUevent ready = nullptr;
    CheckCuda(cuEventCreate(&ready, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    CheckCuda(cuEventRecord(ready, compute), "cuEventRecord");
    CheckCuda(cuStreamWaitEvent(nccl_stream, ready, 0), "cuStreamWaitEvent");
    return ready;
  }

  std::shared_ptr<EndEvent> RecordEnd(FrameworkWatchdog& watchdog, const char* name) {
    auto end = std::make_shared<EndEvent>(++issued, name);
    CheckCuda(cuEventRecord(end->event(), nccl_stream), "cuEventRecord");
    watchdog.Enqueue(end);
    return end;
  }
};

void CopyIn(const Rank& self, CUdeviceptr device, const std::vector<float>& host) {
  // Queued on the compute stream: `host` must stay alive until the step's wait.
  CheckCuda(cuMemcpyHtoDAsync(device, host.data(), host.size() * sizeof(float), self.compute),
            "cuMemcpyHtoDAsync");
}

std::vector<float> CopyOut(CUdeviceptr device, size_t count) {
  std::vector<float> values(count);
  CheckCuda(cuMemcpyDtoH(values.data(), device, count * sizeof(float)), "cuMemcpyDtoH");
  return values;
}

void SyncModuleStates(Rank& self, FrameworkWatchdog& watchdog, const std::vector<CUdeviceptr>& params,
                      bool wait_each, Checksum& checksum) {
  std::vector<std::vector<float>> host(params.size());
  std::vector<CUevent> ready;
  for (size_t p = 0; p < params.size(); ++p) {
    host[p].resize(ParamCount(static_cast<int>(p)));
    for (size_t i = 0; i < host[p].size(); ++i) host[p][i] = ParamValue(self.rank, static_cast<int>(p), i);
    CopyIn(self, params[p], host[p]);
  }
  // Back to back, with no wait in between (unless --wait-each).
  const auto start = std::chrono::steady_clock::now();
  for (size_t p = 0; p < params.size(); ++p) {
    ready.push_back(self.SyncStreams());
    self.Check(ncclBroadcast(reinterpret_cast<const void*>(params[p]), reinterpret_cast<void*>(params[p]),
                             host[p].size(), ncclFloat, 0, self.dp, self.nccl_stream),
               "ncclBroadcast", self.dp);
    self.RecordEnd(watchdog, "Broadcast");
    if (wait_each) CheckCuda(cuStreamSynchronize(self.nccl_stream), "cuStreamSynchronize");
  }
  // One wait for all of them.
  CheckCuda(cuStreamSynchronize(self.nccl_stream), "cuStreamSynchronize");
  const double took_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("rank %d: sync_module_states: %zu broadcasts %s in %.3f ms\n", self.rank, params.size(),
              wait_each ? "each waited for" : "queued", took_ms);
  for (CUevent event : ready) CheckCuda(cuEventDestroy(event), "cuEventDestroy");
  for (size_t p = 0; p < params.size(); ++p) {
    const std::vector<float> values = CopyOut(params[p], host[p].size());
    for (size_t i = 0; i < values.size(); ++i) {
      const float expected = ParamValue(0, static_cast<int>(p), i);
      if (values[i] != expected) {
        Fail("broadcast of parameter " + std::to_string(p) + ": element " + std::to_string(i) + " is " +
             std::to_string(values[i]) + ", expected " + std::to_string(expected));
      }
    }
    checksum.Add(values);
  }
}

void Step(Rank& self, FrameworkWatchdog& watchdog, const std::vector<CUdeviceptr>& buckets, int step,
          Checksum& checksum) {
  const int count = static_cast<int>(buckets.size());
  std::vector<std::vector<float>> host(buckets.size());
  std::vector<CUevent> ready;
  std::shared_ptr<EndEvent> last;
  for (int b = 0; b < count; ++b) {
    host[b].resize(BucketCount(b, count));
    for (size_t i = 0; i < host[b].size(); ++i) host[b][i] = GradientValue(self.rank, step, b, i);
    CopyIn(self, buckets[b], host[b]);
    ready.push_back(self.SyncStreams());
    // In place, as DDP's buckets are reduced.
    self.Check(ncclAllReduce(reinterpret_cast<const void*>(buckets[b]), reinterpret_cast<void*>(buckets[b]),
                             host[b].size(), ncclFloat, ncclSum, self.dp, self.nccl_stream),
               "ncclAllReduce", self.dp);
    last = self.RecordEnd(watchdog, "AllReduce");
  }
  // One wait, on the last bucket's end event.
  CheckCuda(cuEventSynchronize(last->event()), "cuEventSynchronize");
  for (CUevent event : ready) CheckCuda(cuEventDestroy(event), "cuEventDestroy");
  for (int b = 0; b < count; ++b) {
    const std::vector<float> values = CopyOut(buckets[b], host[b].size());
    for (size_t i = 0; i < values.size(); ++i) {
      float expected = 0;
      for (int r = 0; r < self.options.ranks; ++r) expected += GradientValue(r, step, b, i);
      if (values[i] != expected) {
        Fail("step " + std::to_string(step) + ", bucket " + std::to_string(b) + ": element " +
             std::to_string(i) + " is " + std::to_string(values[i]) + ", expected " +
             std::to_string(expected));
      }
    }
    checksum.Add(values);
  }
}

// ProcessGroupNCCL's shutdown: a non-blocking communicator is finalized (and waited for) before
// it is destroyed.
void Destroy(const Rank& self, ncclComm_t comm) {
  if (self.options.nonblocking) self.Check(ncclCommFinalize(comm), "ncclCommFinalize", comm);
  const ncclResult_t destroyed = ncclCommDestroy(comm);
  if (destroyed != ncclSuccess && !(self.options.nonblocking && destroyed == ncclInProgress)) {
    Fail(std::string("ncclCommDestroy failed: ") + ncclGetErrorString(destroyed));
  }
}

int RunRank(const Options& options, int rank, const ncclUniqueId& id) {
  g_rank = rank;
  Rank self{options, rank};
  CheckCuda(cuInit(0), "cuInit");
  int devices = 0;
  CheckCuda(cuDeviceGetCount(&devices), "cuDeviceGetCount");
  CUdevice device = 0;
  CheckCuda(cuDeviceGet(&device, rank % devices), "cuDeviceGet");
  char device_name[128] = {};
  CheckCuda(cuDeviceGetName(device_name, sizeof(device_name), device), "cuDeviceGetName");
  CheckCuda(cuDevicePrimaryCtxRetain(&self.context, device), "cuDevicePrimaryCtxRetain");
  CheckCuda(cuCtxSetCurrent(self.context), "cuCtxSetCurrent");
  int version = 0;
  CheckNccl(ncclGetVersion(&version), "ncclGetVersion", nullptr, 0);
  std::printf("rank %d/%d: device %d (%s), NCCL %d.%d.%d, %s, pid %d\n", rank, options.ranks, rank % devices,
              device_name, version / 10000, version / 100 % 100, version % 100,
              options.nonblocking ? "non-blocking" : "blocking", static_cast<int>(getpid()));
  std::fflush(nullptr);

  // The fields users set through ProcessGroupNCCL.Options.config.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.cgaClusterSize = 2;
  config.commName = "default_pg";
  if (options.nonblocking) config.blocking = 0;
  // The call first, then the check: the check polls the communicator the call wrote.
  const ncclResult_t initialised = ncclCommInitRankConfig(&self.world, options.ranks, id, rank, &config);
  self.Check(initialised, "ncclCommInitRankConfig", self.world);
  FrameworkWatchdog watchdog(self.context, options.framework_timeout_s);
  watchdog.Watch(self.world, "default_pg");
  const ncclResult_t split = ncclCommSplit(self.world, 0, rank, &self.dp, nullptr);
  self.Check(split, "ncclCommSplit", self.dp);
  watchdog.Watch(self.dp, "dp");

  CheckCuda(cuStreamCreate(&self.compute, CU_STREAM_DEFAULT), "cuStreamCreate");
  CheckCuda(cuStreamCreate(&self.nccl_stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  std::vector<CUdeviceptr> params(options.params);
  for (int p = 0; p < options.params; ++p) {
    CheckCuda(cuMemAlloc(&params[p], ParamCount(p) * sizeof(float)), "cuMemAlloc");
  }
  std::vector<CUdeviceptr> buckets(options.buckets);
  for (int b = 0; b < options.buckets; ++b) {
    CheckCuda(cuMemAlloc(&buckets[b], BucketCount(b, options.buckets) * sizeof(float)), "cuMemAlloc");
  }

  Checksum checksum;
  SyncModuleStates(self, watchdog, params, self.options.wait_each, checksum);
  std::printf("rank %d: %d parameters broadcast from rank 0, correct\n", rank, options.params);
  std::fflush(nullptr);
  for (int step = 0; step < options.steps; ++step) Step(self, watchdog, buckets, step, checksum);
  std::printf("rank %d: %d steps of %d buckets all-reduced, correct\n", rank, options.steps, options.buckets);
  std::printf("rank %d checksum 0x%016" PRIx64 "\n", rank, checksum.value());
  std::fflush(nullptr);

  watchdog.Stop();
  Destroy(self, self.dp);
  Destroy(self, self.world);
  for (CUdeviceptr buffer : params) CheckCuda(cuMemFree(buffer), "cuMemFree");
  for (CUdeviceptr buffer : buckets) CheckCuda(cuMemFree(buffer), "cuMemFree");
  CheckCuda(cuStreamDestroy(self.nccl_stream), "cuStreamDestroy");
  CheckCuda(cuStreamDestroy(self.compute), "cuStreamDestroy");
  std::fflush(nullptr);
  return 0;
}

[[noreturn]] void Usage() {
  std::fprintf(stderr,
               "usage: ddp_habits --ranks N [--params P] [--steps S] [--buckets B] [--nonblocking] [--wait-each] "
               "[--framework-timeout SECONDS]\n");
  std::exit(2);
}

Options Parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const bool has_value = i + 1 < argc;
    if (flag == "--ranks" && has_value) {
      options.ranks = std::atoi(argv[++i]);
    } else if (flag == "--params" && has_value) {
      options.params = std::atoi(argv[++i]);
    } else if (flag == "--steps" && has_value) {
      options.steps = std::atoi(argv[++i]);
    } else if (flag == "--buckets" && has_value) {
      options.buckets = std::atoi(argv[++i]);
    } else if (flag == "--nonblocking") {
      options.nonblocking = true;
    } else if (flag == "--wait-each") {
      options.wait_each = true;
    } else if (flag == "--framework-timeout" && has_value) {
      options.framework_timeout_s = std::atof(argv[++i]);
    } else {
      Usage();
    }
  }
  if (options.ranks < 2 || options.params < 1 || options.steps < 1 || options.buckets < 1 ||
      !(options.framework_timeout_s > 0)) {
    std::fprintf(stderr,
                 "ddp_habits: --ranks must be 2 or more, --params, --steps and --buckets 1 or more, "
                 "--framework-timeout above 0\n");
    std::exit(2);
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = Parse(argc, argv);
  // The launcher's unique id (torchrun passes it through its store): it serves the rendezvous
  // until every rank has joined.
  ncclUniqueId id;
  CheckNccl(ncclGetUniqueId(&id), "ncclGetUniqueId", nullptr, 0);
  std::fflush(nullptr);
  const int failed = ncclguard::testing::ForkRanks(
      "ddp_habits", options.ranks, [&](int rank) { return RunRank(options, rank, id); });
  if (failed == 0) {
    std::printf("ddp_habits: all %d ranks finished\n", options.ranks);
  } else {
    std::printf("ddp_habits: job failed: %d of %d ranks failed\n", failed, options.ranks);
  }
  return failed == 0 ? 0 : 1;
}
