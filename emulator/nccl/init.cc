// Unique ids, rendezvous and the communicator lifecycle: init, split, shrink, finalize, destroy,
// abort, revoke.
#include <fcntl.h>
#include <signal.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "api.h"
#include "comm.h"
#include "debug.h"
#include "faults.h"

namespace ncclemu {
namespace {

// What the 128 bytes of a unique id hold. Real NCCL keeps a magic and the root's socket address.
struct UniqueIdContents {
  uint64_t magic;
  char address[NCCL_UNIQUE_ID_BYTES - sizeof(uint64_t)];  // NCCL_COMM_ID, when the id came from it
};
static_assert(sizeof(UniqueIdContents) == sizeof(ncclUniqueId));

// The rendezvous point of one init, named from the magic: the emulated bootstrap root.
struct RendezvousSegment {
  std::atomic<uint32_t> root_ready;  // NCCL_COMM_ID: rank 0 has (re)created the root
  int32_t root_pid;
  std::atomic<int32_t> nranks;
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> comm_ready;
  std::atomic<uint32_t> mapped;
  char comm_segment_name[64];
  std::atomic<uint32_t> checked_in[kMaxRanks];
  RankInfo info[kMaxRanks];
};

enum class RendezvousKind {
  OneShot,     // id from ncclGetUniqueId: its root serves exactly one init
  CommIdRoot,  // NCCL_COMM_ID: rank 0 starts a fresh root at every init
  Derived,     // split/shrink: over the parent's bootstrap, any rank may create it
};

struct InitRequest {
  RendezvousKind kind;
  uint64_t magic;
  const char* caller;
};

std::string rendezvousName(uint64_t magic) {
  char name[64];
  snprintf(name, sizeof(name), "/ncclemu-rv-%016lx", static_cast<unsigned long>(magic));
  return name;
}

uint64_t hashString(const std::string& text) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) hash = (hash ^ c) * 0x100000001b3ULL;
  return hash;
}

uint64_t hostHash() {
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  return hashString(host);
}

// NCCL reads NCCL_P2P_DISABLE / NCCL_P2P_LEVEL (and NCCL_SHM_DISABLE) once, at the first
// communicator's topology setup, into a static. Each loaded copy of this library has its own, as
// with real NCCL.
struct P2pPolicy {
  bool allowed = true;
  bool shm_allowed = true;  // without P2P and SHM, ranks on one host talk through the network
};

// Emulated topology: every pair of GPUs shares a PCIe switch (path type PXB), where NCCL's
// default P2P level allows P2P.
constexpr int kGpuPathLevel = 5;

int parseP2pLevel(const char* text) {
  static const char* const names[] = {"LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS"};
  for (int i = 0; i < 10; ++i) {
    if (strcasecmp(text, names[i]) == 0) return i;
  }
  char* end = nullptr;
  const long legacy = strtol(text, &end, 10);
  if (end != text && *end == '\0' && legacy >= 0) {
    // NCCL's legacy integers: 0 LOC, 1 PIX, 2 PXB, 3 PHB, 4 and above SYS.
    static const int legacy_levels[] = {0, 4, 5, 8, 9};
    return legacy_levels[std::min(legacy, 4L)];
  }
  return -1;
}

const P2pPolicy& p2pPolicy() {
  static const P2pPolicy* policy = [] {
    auto* p = new P2pPolicy;
    if (const char* level = getNcclEnv("NCCL_P2P_LEVEL")) {
      EMU_INFO("NCCL_P2P_LEVEL set by environment to %s", level);
      const int parsed = parseP2pLevel(level);
      if (parsed < 0)
        EMU_WARN("Invalid NCCL_P2P_LEVEL value '%s', using the default", level);
      else
        p->allowed = parsed >= kGpuPathLevel;
    }
    if (const char* disable = getNcclEnv("NCCL_P2P_DISABLE")) {
      EMU_INFO("NCCL_P2P_DISABLE set by environment to %s", disable);
      if (atoi(disable) != 0) p->allowed = false;
    }
    if (const char* disable = getNcclEnv("NCCL_SHM_DISABLE")) {
      EMU_INFO("NCCL_SHM_DISABLE set by environment to %s", disable);
      if (atoi(disable) != 0) p->shm_allowed = false;
    }
    return p;
  }();
  return *policy;
}

// The K-th distinct communicator this process joined (1-based): the faults' comm= filter.
int communicatorIndex(uint64_t magic) {
  static auto* mutex = new std::mutex;
  static auto* indices = new std::vector<uint64_t>;
  std::lock_guard<std::mutex> lock(*mutex);
  auto found = std::find(indices->begin(), indices->end(), magic);
  if (found != indices->end()) return static_cast<int>(found - indices->begin()) + 1;
  indices->push_back(magic);
  return static_cast<int>(indices->size());
}

uint64_t busIdValue(const char* bus_id) {
  uint64_t value = 0;
  for (const char* p = bus_id; *p; ++p) {
    if (*p == ':' || *p == '.') continue;
    const int digit = (*p >= '0' && *p <= '9') ? *p - '0' : (*p | 0x20) - 'a' + 10;
    if (digit < 0 || digit > 15) break;
    value = value * 16 + digit;
  }
  return value;
}

RankInfo describeRank(int cuda_dev) {
  RankInfo info{};
  info.pid = getpid();
  info.cuda_dev = cuda_dev;
  info.host_hash = hostHash();
  if (cuDeviceGetPCIBusId(info.bus_id, sizeof(info.bus_id), cuda_dev) != CUDA_SUCCESS) {
    snprintf(info.bus_id, sizeof(info.bus_id), "0000:%02x:00.0", cuda_dev + 1);
  }
  return info;
}

bool processAlive(pid_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

// Sleeps in short steps so that an abort of a non-blocking init is noticed.
bool sleepUnlessInterrupted(CommCore& core, int ms) {
  std::unique_lock<std::mutex> lock(core.mutex);
  return !core.changed.wait_for(lock, std::chrono::milliseconds(ms), [&] { return core.interrupted.load(); });
}

ncclResult_t openRendezvous(CommCore& core, const InitRequest& request, SharedSegment* segment) {
  const std::string name = rendezvousName(request.magic);
  const size_t size = sizeof(RendezvousSegment);
  switch (request.kind) {
    case RendezvousKind::OneShot: {
      const int error = segment->map(name, size, SharedSegment::Open::Existing);
      if (error == 0) return ncclSuccess;
      EMU_WARN(
          "%s: no bootstrap root serves unique id 0x%lx (%s). A unique id from ncclGetUniqueId "
          "serves exactly one communicator init: make a new one, or set NCCL_COMM_ID",
          request.caller, static_cast<unsigned long>(request.magic), strerror(error));
      return ncclSystemError;
    }
    case RendezvousKind::Derived: {
      const int error = segment->map(name, size, SharedSegment::Open::Create);
      if (error == 0) return ncclSuccess;
      EMU_WARN("%s: cannot create bootstrap segment %s: %s", request.caller, name.c_str(), strerror(error));
      return ncclSystemError;
    }
    case RendezvousKind::CommIdRoot:
      break;
  }
  if (core.rank == 0) {
    // A root left by an earlier job with the same NCCL_COMM_ID is stale: start a fresh one.
    shm_unlink(name.c_str());
    const int error = segment->map(name, size, SharedSegment::Open::CreateExclusive);
    if (error != 0) {
      EMU_WARN("%s: cannot start the bootstrap root for NCCL_COMM_ID: %s", request.caller, strerror(error));
      return ncclSystemError;
    }
    auto* rendezvous = static_cast<RendezvousSegment*>(segment->base());
    rendezvous->root_pid = getpid();
    rendezvous->root_ready.store(1, std::memory_order_release);
    futexWakeAll(&rendezvous->root_ready);
    return ncclSuccess;
  }
  // Like a socket connect to a root that is not listening yet: retry until rank 0 starts it.
  while (!core.interrupted.load()) {
    SharedSegment candidate;
    if (candidate.map(name, size, SharedSegment::Open::Existing) == 0) {
      auto* rendezvous = static_cast<RendezvousSegment*>(candidate.base());
      while (rendezvous->root_ready.load(std::memory_order_acquire) == 0 && !core.interrupted.load()) {
        futexWait(&rendezvous->root_ready, 0, 100);
      }
      // A root whose process is gone, or one this rank already checked in at (the previous init
      // with the same NCCL_COMM_ID, not yet removed), is not the one rank 0 is starting now.
      if (processAlive(rendezvous->root_pid) && rendezvous->checked_in[core.rank].load() == 0) {
        *segment = std::move(candidate);
        return ncclSuccess;
      }
    }
    sleepUnlessInterrupted(core, 10);
  }
  return ncclSystemError;
}

template <class Predicate>
bool waitShared(CommCore& core, std::atomic<uint32_t>& word, Predicate done) {
  for (uint32_t value = word.load(std::memory_order_acquire); !done(value);
       value = word.load(std::memory_order_acquire)) {
    if (core.interrupted.load()) return false;
    futexWait(&word, value, 100);
  }
  return true;
}

void logTransport(const CommCore& core) {
  if (!infoEnabled() || core.nranks < 2) return;
  const int next = (core.rank + 1) % core.nranks;
  const RankInfo& mine = core.shared.rankInfo(core.rank);
  const RankInfo& peer = core.shared.rankInfo(next);
  if (core.transport == Transport::P2P) {
    EMU_INFO("Channel 00/0 : %d[%d] -> %d[%d] via P2P/%s", core.rank, mine.cuda_dev, next, peer.cuda_dev,
             mine.pid == peer.pid ? "direct pointer" : "CUMEM");
  } else if (core.transport == Transport::NET) {
    // NCCL's socket transport, which it uses between ranks of one host without P2P and SHM.
    const int prev = (core.rank - 1 + core.nranks) % core.nranks;
    EMU_INFO("Channel 00/0 : %d[%d] -> %d[%d] [receive] via NET/Socket/0", prev,
             core.shared.rankInfo(prev).cuda_dev, core.rank, mine.cuda_dev);
    EMU_INFO("Channel 00/0 : %d[%d] -> %d[%d] [send] via NET/Socket/0", core.rank, mine.cuda_dev, next,
             peer.cuda_dev);
  } else {
    EMU_INFO("Channel 00 : %d[%d] -> %d[%d] via SHM/direct/direct", core.rank, mine.cuda_dev, next,
             peer.cuda_dev);
  }
  EMU_INFO("Connected all rings, use ring PXN 0 GDR 0");
}

Transport chooseTransport(const CommCore& core) {
  if (core.nranks < 2) return Transport::None;
  const Transport fallback = p2pPolicy().shm_allowed ? Transport::SHM : Transport::NET;
  if (!p2pPolicy().allowed) return fallback;
  for (int peer = 0; peer < core.nranks; ++peer) {
    if (peer == core.rank) continue;
    int can_access = 0;
    const int peer_dev = core.shared.rankInfo(peer).cuda_dev;
    if (cuDeviceCanAccessPeer(&can_access, core.cuda_dev, peer_dev) != CUDA_SUCCESS || !can_access) {
      return fallback;
    }
  }
  return Transport::P2P;
}

ncclResult_t checkDistinctGpus(const CommCore& core) {
  for (int a = 0; a < core.nranks; ++a) {
    for (int b = a + 1; b < core.nranks; ++b) {
      const RankInfo& first = core.shared.rankInfo(a);
      const RankInfo& second = core.shared.rankInfo(b);
      if (first.host_hash == second.host_hash && strcmp(first.bus_id, second.bus_id) == 0) {
        EMU_WARN("Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx", a, b,
                 static_cast<unsigned long>(busIdValue(first.bus_id)));
        return ncclInvalidUsage;
      }
    }
  }
  return ncclSuccess;
}

// Checks in at the rendezvous, then maps the communicator segment that the last rank to arrive
// created. Every rank unlinks what it no longer needs, so nothing stays in /dev/shm once all
// ranks are in (a rank that dies during init can leave the rendezvous segment behind).
ncclResult_t rendezvous(CommCore& core, const InitRequest& request) {
  SharedSegment segment;
  if (ncclResult_t result = openRendezvous(core, request, &segment); result != ncclSuccess) return result;
  auto* rendezvous = static_cast<RendezvousSegment*>(segment.base());

  int32_t expected = 0;
  if (!rendezvous->nranks.compare_exchange_strong(expected, core.nranks) && expected != core.nranks) {
    EMU_WARN("%s: rank %d was given nranks %d, but other ranks of this unique id use %d", request.caller,
             core.rank, core.nranks, expected);
    return ncclInvalidUsage;
  }
  if (rendezvous->checked_in[core.rank].exchange(1)) {
    EMU_WARN("%s: rank %d checked in twice with unique id 0x%lx", request.caller, core.rank,
             static_cast<unsigned long>(request.magic));
    return ncclInvalidUsage;
  }
  rendezvous->info[core.rank] = describeRank(core.cuda_dev);
  const uint32_t arrived = rendezvous->arrived.fetch_add(1, std::memory_order_acq_rel) + 1;
  const size_t comm_bytes = CommShared::bytesFor(core.nranks);
  if (arrived == static_cast<uint32_t>(core.nranks)) {
    // The pid and a count make the name unique in this instance; the instance's own random tag
    // keeps it apart from another loaded copy's communicators of the same id in this process.
    static std::atomic<uint32_t> created{0};
    static const uint32_t instance_tag = [] {
      uint32_t tag = 0;
      if (getrandom(&tag, sizeof(tag), 0) != sizeof(tag))
        tag = static_cast<uint32_t>(mixBits(reinterpret_cast<uintptr_t>(&created)));
      return tag;
    }();
    snprintf(rendezvous->comm_segment_name, sizeof(rendezvous->comm_segment_name),
             "/ncclemu-comm-%016lx-%d-%08x-%u", static_cast<unsigned long>(request.magic), getpid(),
             instance_tag, created.fetch_add(1));
    if (int error = core.shared.segment.map(rendezvous->comm_segment_name, comm_bytes,
                                            SharedSegment::Open::CreateExclusive)) {
      EMU_WARN("%s: cannot create communicator segment %s: %s", request.caller, rendezvous->comm_segment_name,
               strerror(error));
      return ncclSystemError;
    }
    core.shared.attach(core.nranks);
    CommSegmentHeader& header = core.shared.header();
    header.magic = request.magic;
    header.nranks = core.nranks;
    for (int r = 0; r < core.nranks; ++r) core.shared.rankInfo(r) = rendezvous->info[r];
    rendezvous->comm_ready.store(1, std::memory_order_release);
    futexWakeAll(&rendezvous->comm_ready);
  } else {
    if (!waitShared(core, rendezvous->comm_ready, [](uint32_t ready) { return ready != 0; })) {
      return ncclSystemError;
    }
    if (int error = core.shared.segment.map(rendezvous->comm_segment_name, comm_bytes,
                                            SharedSegment::Open::Existing)) {
      EMU_WARN("%s: cannot map communicator segment %s: %s", request.caller, rendezvous->comm_segment_name,
               strerror(error));
      return ncclSystemError;
    }
    core.shared.attach(core.nranks);
  }
  const bool last =
      rendezvous->mapped.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(core.nranks);
  futexWakeAll(&rendezvous->mapped);
  if (last) shm_unlink(rendezvous->comm_segment_name);
  if (request.kind != RendezvousKind::CommIdRoot) {
    if (last) shm_unlink(rendezvousName(request.magic).c_str());
    return ncclSuccess;
  }
  // With NCCL_COMM_ID the next init reuses the name, and only rank 0 may retire it: a slow rank
  // removing it by name could remove the next init's root.
  if (core.rank == 0) {
    if (!waitShared(core, rendezvous->mapped,
                    [&](uint32_t mapped) { return mapped == static_cast<uint32_t>(core.nranks); })) {
      return ncclSystemError;
    }
    shm_unlink(rendezvousName(request.magic).c_str());
  }
  return ncclSuccess;
}

ncclResult_t initCommunicatorSteps(CommCore& core, const InitRequest& request) {
  LogDeviceScope log_device(core.cuda_dev);
  if (const std::string error = transportSpecError(); !error.empty()) {
    EMU_WARN("%s", error.c_str());
    return ncclInvalidArgument;
  }
  const FaultPlan& faults = activeFaultPlan();
  p2pPolicy();
  core.magic = request.magic;
  core.comm_index = communicatorIndex(request.magic);
  for (const Fault& fault : faults.faults) {
    if (fault.kind == FaultKind::InitHang && fault.rank == core.rank &&
        (fault.comm_index == 0 || fault.comm_index == core.comm_index)) {
      core.stallUntilInterrupted();
      return ncclSystemError;
    }
  }
  if (ncclResult_t result = rendezvous(core, request); result != ncclSuccess) return result;
  if (ncclResult_t result = checkDistinctGpus(core); result != ncclSuccess) return result;
  core.transport = chooseTransport(core);

  static std::once_flag version_shown;
  if (core.rank == 0) {
    std::call_once(version_shown, [] { EMU_INFO("NCCL version 2.28.9+cuda13.0 (ncclemu)"); });
  }
  logTransport(core);
  // As in NCCL, after the transports are set up and before the proxy would start.
  profilerInitComm(core);
  const RankInfo& mine = core.shared.rankInfo(core.rank);
  EMU_INFO("%s comm %p rank %d nranks %d cudaDev %d nvmlDev %d busId %lx commId 0x%lx - Init COMPLETE",
           request.caller, static_cast<void*>(&core), core.rank, core.nranks, core.cuda_dev, core.cuda_dev,
           static_cast<unsigned long>(busIdValue(mine.bus_id)), static_cast<unsigned long>(request.magic));
  return ncclSuccess;
}

ncclResult_t initCommunicator(const std::shared_ptr<CommCore>& core, const InitRequest& request) {
  const ncclResult_t result = initCommunicatorSteps(*core, request);
  // This rank will never check in (again), so nobody can complete the rendezvous: remove it.
  if (result != ncclSuccess) shm_unlink(rendezvousName(request.magic).c_str());
  return result;
}

ncclResult_t currentDevice(int* device) {
  CUdevice current = 0;
  if (cuCtxGetDevice(&current) != CUDA_SUCCESS) {
    // Real NCCL goes through the runtime, which falls back to device 0.
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&current, 0) != CUDA_SUCCESS) {
      EMU_WARN("Cuda failure: no CUDA device is available");
      return ncclUnhandledCudaError;
    }
  }
  *device = current;
  return ncclSuccess;
}

ncclResult_t configBlocking(const ncclConfig_t* config, bool inherited, const char* caller, bool* blocking) {
  static const bool env_blocking = [] {
    const char* env = getNcclEnv("NCCL_COMM_BLOCKING");
    return env == nullptr || atoi(env) != 0;
  }();
  *blocking = inherited;
  if (config == nullptr) return ncclSuccess;
  if (config->magic != 0xcafebeef || config->size < offsetof(ncclConfig_t, blocking) + sizeof(int)) {
    EMU_WARN("%s: the config was not initialised with NCCL_CONFIG_INITIALIZER", caller);
    return ncclInvalidArgument;
  }
  if (config->blocking == NCCL_CONFIG_UNDEF_INT) {
    *blocking = inherited && env_blocking;
  } else if (config->blocking == 0 || config->blocking == 1) {
    *blocking = config->blocking == 1;
  } else {
    EMU_WARN("%s: invalid config blocking attribute value %d", caller, config->blocking);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

// ncclConfig_t's commName, which the profiler plugin's init receives. As in NCCL, a split or a
// shrink without a config copies its parent's.
void nameCommunicator(CommCore& core, const ncclConfig_t* config, const CommCore* parent) {
  if (config == nullptr) {
    core.named = parent != nullptr && parent->named;
    if (core.named) core.comm_name = parent->comm_name;
    return;
  }
  // A config from an older nccl.h may end before commName.
  if (config->size >= offsetof(ncclConfig_t, commName) + sizeof(config->commName) &&
      config->commName != nullptr) {
    core.named = true;
    core.comm_name = config->commName;
  }
}

// NCCL's own allocations and frees leave a graph that another thread captures meanwhile alone.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { cuThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureMode() { cuThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  CUstreamCaptureMode mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;
};

// NCCL allocates device and page-locked memory per communicator and frees it in destroy and
// abort. Whether such a free waits for the device's queued work is the driver's behaviour
// (NCCLEMU_FREES_WAIT in the emulated one), so the emulated communicator holds a little memory
// of its context too, and frees it at the same point.
void allocateCommMemory(CommCore& core) {
  if (!core.context) return;
  RelaxedCaptureMode relaxed;
  if (cuCtxPushCurrent(core.context) != CUDA_SUCCESS) return;
  void* memory = nullptr;
  if (cuMemHostAlloc(&memory, 256, CU_MEMHOSTALLOC_PORTABLE) == CUDA_SUCCESS) core.host_memory.store(memory);
  CUcontext popped = nullptr;
  cuCtxPopCurrent(&popped);
}

void freeCommMemory(CommCore& core) {
  void* memory = core.host_memory.exchange(nullptr);
  if (memory == nullptr) return;
  RelaxedCaptureMode relaxed;
  cuMemFreeHost(memory);
}

std::shared_ptr<CommCore> makeCore(int rank, int nranks, int cuda_dev, bool blocking) {
  auto core = std::make_shared<CommCore>();
  core->rank = rank;
  core->nranks = nranks;
  core->cuda_dev = cuda_dev;
  core->blocking = blocking;
  CUcontext context = nullptr;
  if (cuDevicePrimaryCtxRetain(&context, cuda_dev) == CUDA_SUCCESS) core->context = context;
  allocateCommMemory(*core);
  core->async_result.store(ncclInProgress);
  return core;
}

ncclComm_t makeHandle(std::shared_ptr<CommCore> core) {
  auto* handle = new ncclComm;
  handle->core = std::move(core);
  return handle;
}

RendezvousKind rendezvousKindForInit(const char* caller, ncclResult_t* error) {
  const char* comm_id = getNcclEnv("NCCL_COMM_ID");
  if (comm_id == nullptr) return RendezvousKind::OneShot;
  if (!validCommIdAddress(comm_id)) {
    EMU_WARN(
        "%s: Invalid NCCL_COMM_ID [%s], please use format: <ipv4>:<port> or [<ipv6>]:<port> or "
        "<hostname>:<port>",
        caller, comm_id);
    *error = ncclInvalidArgument;
  }
  return RendezvousKind::CommIdRoot;
}

ncclResult_t initRankWithId(ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank,
                            const ncclConfig_t* config, int cuda_dev, const char* caller) {
  if (comm == nullptr) {
    EMU_WARN("%s : comm argument is NULL", caller);
    return ncclInvalidArgument;
  }
  *comm = nullptr;
  if (nranks < 1 || nranks > kMaxRanks) {
    EMU_WARN("%s: invalid nranks %d (1..%d)", caller, nranks, kMaxRanks);
    return ncclInvalidArgument;
  }
  if (rank < 0 || rank >= nranks) {
    EMU_WARN("Invalid rank requested : %d/%d", rank, nranks);
    return ncclInvalidArgument;
  }
  bool blocking = true;
  if (ncclResult_t result = configBlocking(config, true, caller, &blocking); result != ncclSuccess)
    return result;
  ncclResult_t result = ncclSuccess;
  const RendezvousKind kind = rendezvousKindForInit(caller, &result);
  if (result != ncclSuccess) return result;
  UniqueIdContents contents;
  memcpy(&contents, &id, sizeof(contents));
  if (contents.magic == 0) {
    EMU_WARN("%s: invalid unique id (all zero): make it with ncclGetUniqueId", caller);
    return ncclInvalidArgument;
  }
  if (cuda_dev < 0 && (result = currentDevice(&cuda_dev)) != ncclSuccess) return result;
  auto core = makeCore(rank, nranks, cuda_dev, blocking);
  nameCommunicator(*core, config, nullptr);
  *comm = makeHandle(core);
  const InitRequest request{kind, contents.magic, caller};
  result = launchJob(Job{core, [core, request] { return initCommunicator(core, request); }});
  if (result != ncclSuccess && result != ncclInProgress) {
    releaseHandle(*comm);
    *comm = nullptr;
  }
  return result;
}

// Either communicator's abort ends the exchange: the parent's, or the child's being made.
bool bootstrapAllGather(CommCore& parent, CommCore& child, const int64_t (&mine)[4],
                        std::vector<BootSlot>* all) {
  BootSlot& slot = parent.shared.boot(parent.rank);
  std::copy(std::begin(mine), std::end(mine), slot.values);
  SharedBarrier& barrier = parent.shared.header().bootstrap;
  auto interrupted = [&] { return parent.interrupted.load() || child.interrupted.load(); };
  if (!barrierWait(barrier, parent.nranks, interrupted)) return false;
  all->assign(&parent.shared.boot(0), &parent.shared.boot(0) + parent.nranks);
  // A second barrier: nobody may overwrite its slot for the next exchange before all have read.
  return barrierWait(barrier, parent.nranks, interrupted);
}

ncclResult_t launchDerived(ncclComm_t* newcomm, std::shared_ptr<CommCore> child,
                           std::shared_ptr<CommCore> reporter, std::function<ncclResult_t()> run) {
  if (child) *newcomm = makeHandle(child);
  const ncclResult_t result = launchJob(Job{std::move(reporter), std::move(run)});
  if (result != ncclSuccess && result != ncclInProgress && *newcomm) {
    releaseHandle(*newcomm);
    *newcomm = nullptr;
  }
  return result;
}

}  // namespace

CommCore::~CommCore() {
  if (context) cuDevicePrimaryCtxRelease(cuda_dev);
}

void CommCore::interrupt() {
  interrupted.store(true);
  {
    std::lock_guard<std::mutex> lock(mutex);
    changed.notify_all();
  }
  if (shared.segment.base()) {
    futexWakeAll(&shared.header().collective.generation);
    futexWakeAll(&shared.header().bootstrap.generation);
    futexWakeAll(&shared.doorbell(rank).rings);
  }
}

void CommCore::stallUntilInterrupted() {
  std::unique_lock<std::mutex> lock(mutex);
  changed.wait(lock, [&] { return interrupted.load(); });
}

void CommCore::setAsyncResult(ncclResult_t result) {
  std::lock_guard<std::mutex> lock(mutex);
  async_result.store(result);
  changed.notify_all();
}

bool validCommIdAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) return false;
  const std::string host = address.substr(0, colon);
  if (host.front() == '[' && host.back() != ']') return false;
  char* end = nullptr;
  const long port = strtol(address.c_str() + colon + 1, &end, 10);
  return *end == '\0' && port > 0 && port < 65536;
}

std::shared_ptr<CommCore> liveCore(ncclComm_t comm, const char* caller, ncclResult_t* error) {
  if (comm == nullptr) {
    EMU_WARN("%s : comm argument is NULL", caller);
    *error = ncclInvalidArgument;
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(comm->mutex);
  if (!comm->core) {
    EMU_WARN("%s : communicator %p was already destroyed or aborted", caller, static_cast<void*>(comm));
    *error = ncclInvalidArgument;
  }
  return comm->core;
}

ncclResult_t ensureReady(CommCore& core) {
  const auto result = static_cast<ncclResult_t>(core.async_result.load());
  if (result == ncclInProgress) {
    EMU_WARN("Attempt to use communicator before the previous operation returned ncclSuccess");
    return ncclInvalidArgument;
  }
  return result;
}

void releaseHandle(ncclComm_t comm) {
  std::shared_ptr<CommCore> core;
  {
    std::lock_guard<std::mutex> lock(comm->mutex);
    core = comm->core;
  }
  // Before the handle goes, as NCCL frees while the communicator still exists. With frees that
  // wait (NCCLEMU_FREES_WAIT), destroy and abort wait here for the context's streams; abort has
  // interrupted the communicator's operations by now, so their streams move on up to whatever
  // else holds them.
  if (core) freeCommMemory(*core);
  // NCCL's commFree: the plugin hears nothing more of this communicator after finalize.
  if (core) profilerFinalizeComm(*core);
  std::lock_guard<std::mutex> lock(comm->mutex);
  comm->core.reset();
}

}  // namespace ncclemu

using namespace ncclemu;

NCCL_EXPORT(ncclResult_t, ncclGetUniqueId, ncclUniqueId* uniqueId);
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (uniqueId == nullptr) {
    EMU_WARN("ncclGetUniqueId : uniqueId argument is NULL");
    return ncclInvalidArgument;
  }
  UniqueIdContents contents{};
  if (const char* comm_id = getNcclEnv("NCCL_COMM_ID")) {
    // Every process derives the same id from the same address, as real NCCL does.
    if (!validCommIdAddress(comm_id)) {
      EMU_WARN(
          "Invalid NCCL_COMM_ID [%s], please use format: <ipv4>:<port> or [<ipv6>]:<port> or "
          "<hostname>:<port>",
          comm_id);
      return ncclInvalidArgument;
    }
    contents.magic = mixBits(hashString(comm_id)) | 1;
    snprintf(contents.address, sizeof(contents.address), "%s", comm_id);
  } else {
    do {
      if (getrandom(&contents.magic, sizeof(contents.magic), 0) != sizeof(contents.magic)) {
        EMU_WARN("ncclGetUniqueId: getrandom failed: %s", strerror(errno));
        return ncclSystemError;
      }
    } while (contents.magic == 0);
    // This process is the root of the id: it opens the rendezvous that the ranks will check in at.
    SharedSegment root;
    if (int error = root.map(rendezvousName(contents.magic), sizeof(RendezvousSegment),
                             SharedSegment::Open::CreateExclusive)) {
      EMU_WARN("ncclGetUniqueId: cannot create the bootstrap root segment: %s", strerror(error));
      return ncclSystemError;
    }
  }
  memcpy(uniqueId, &contents, sizeof(contents));
  return ncclSuccess;
}

NCCL_EXPORT(ncclResult_t, ncclCommInitRankConfig, ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
            ncclConfig_t* config);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  return initRankWithId(comm, nranks, commId, rank, config, -1, "ncclCommInitRankConfig");
}

NCCL_EXPORT(ncclResult_t, ncclCommInitRank, ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return initRankWithId(comm, nranks, commId, rank, nullptr, -1, "ncclCommInitRank");
}

NCCL_EXPORT(ncclResult_t, ncclCommInitRankScalable, ncclComm_t* newcomm, int nranks, int myrank, int nId,
            ncclUniqueId* commIds, ncclConfig_t* config);
ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId* commIds, ncclConfig_t* config) {
  if (nId < 1 || nId > nranks) {
    EMU_WARN("improper usage of ncclCommInitRank: nId = %d, nranks=%d", nId, nranks);
    return ncclInvalidArgument;
  }
  if (commIds == nullptr) {
    EMU_WARN("ncclCommInitRankScalable : commId argument is NULL");
    return ncclInvalidArgument;
  }
  // The first id carries the rendezvous; the others only retire their roots, since one
  // emulated root can serve any number of ranks.
  const ncclResult_t result =
      initRankWithId(newcomm, nranks, commIds[0], myrank, config, -1, "ncclCommInitRankScalable");
  if (getNcclEnv("NCCL_COMM_ID") == nullptr && (result == ncclSuccess || result == ncclInProgress)) {
    for (int i = 1; i < nId; ++i) {
      UniqueIdContents contents;
      memcpy(&contents, &commIds[i], sizeof(contents));
      shm_unlink(rendezvousName(contents.magic).c_str());
    }
  }
  return result;
}

NCCL_EXPORT(ncclResult_t, ncclCommInitAll, ncclComm_t* comms, int ndev, const int* devlist);
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (comms == nullptr || ndev < 1) {
    EMU_WARN("ncclCommInitAll : invalid arguments (comms %p, ndev %d)", static_cast<void*>(comms), ndev);
    return ncclInvalidArgument;
  }
  int device_count = 0;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&device_count) != CUDA_SUCCESS) {
    EMU_WARN("ncclCommInitAll : Cuda failure: cannot count devices");
    return ncclUnhandledCudaError;
  }
  for (int i = 0; i < ndev; ++i) {
    const int dev = devlist ? devlist[i] : i;
    if (dev < 0 || dev >= device_count) {
      EMU_WARN("ncclCommInitAll : invalid device %d (%d devices)", dev, device_count);
      return ncclInvalidArgument;
    }
    for (int j = 0; j < i; ++j) {
      if (devlist && devlist[j] == dev) {
        EMU_WARN("ncclCommInitAll : duplicate device %d in devlist", dev);
        return ncclInvalidUsage;
      }
    }
  }
  // Like real NCCL, through the exported symbol: an interposer sees this call.
  ncclUniqueId id;
  if (ncclResult_t result = ncclGetUniqueId(&id); result != ncclSuccess) return result;
  groupStartInternal();
  ncclResult_t first_error = ncclSuccess;
  for (int i = 0; i < ndev; ++i) {
    const ncclResult_t result =
        initRankWithId(&comms[i], ndev, id, i, nullptr, devlist ? devlist[i] : i, "ncclCommInitAll");
    if (first_error == ncclSuccess) first_error = result;
  }
  const ncclResult_t group_result = groupEndInternal();
  return first_error != ncclSuccess ? first_error : group_result;
}

NCCL_EXPORT(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
            ncclConfig_t* config);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  ncclResult_t result = ncclSuccess;
  auto parent = liveCore(comm, "ncclCommSplit", &result);
  if (!parent) return result;
  if ((result = ensureReady(*parent)) != ncclSuccess) return result;
  if (newcomm == nullptr || (color < 0 && color != NCCL_SPLIT_NOCOLOR)) {
    EMU_WARN("ncclCommSplit : invalid arguments (newcomm %p, color %d)", static_cast<void*>(newcomm), color);
    return ncclInvalidArgument;
  }
  *newcomm = nullptr;
  bool blocking = parent->blocking;
  if ((result = configBlocking(config, parent->blocking, "ncclCommSplit", &blocking)) != ncclSuccess)
    return result;
  uint64_t split_number;
  {
    std::lock_guard<std::mutex> lock(parent->mutex);
    split_number = parent->derived_communicators++;
  }
  std::shared_ptr<CommCore> child;
  if (color != NCCL_SPLIT_NOCOLOR) {
    child = makeCore(0, 0, parent->cuda_dev, blocking);
    nameCommunicator(*child, config, parent.get());
  }
  // A rank that leaves with NOCOLOR still takes part in the exchange; its progress is reported
  // nowhere, like in NCCL.
  auto reporter = child ? child : makeCore(parent->rank, parent->nranks, parent->cuda_dev, blocking);
  auto run = [parent, child, reporter, color, key, split_number]() -> ncclResult_t {
    LogDeviceScope log_device(parent->cuda_dev);
    std::vector<BootSlot> all;
    if (!bootstrapAllGather(*parent, *reporter, {color, key, static_cast<int64_t>(split_number), 0}, &all)) {
      return ncclSystemError;
    }
    if (!child) return ncclSuccess;
    std::vector<int> members;
    for (int r = 0; r < parent->nranks; ++r) {
      if (all[r].values[0] == color) members.push_back(r);
    }
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return all[a].values[1] < all[b].values[1]; });
    child->nranks = static_cast<int>(members.size());
    child->rank = static_cast<int>(std::find(members.begin(), members.end(), parent->rank) - members.begin());
    const uint64_t magic =
        mixBits(parent->magic ^ mixBits(2 * split_number + 1) ^ mixBits(static_cast<uint64_t>(color) << 1));
    return initCommunicator(child, InitRequest{RendezvousKind::Derived, magic, "ncclCommSplit"});
  };
  return launchDerived(newcomm, child, reporter, run);
}

NCCL_EXPORT(ncclResult_t, ncclCommShrink, ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
            ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                            ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  ncclResult_t result = ncclSuccess;
  auto parent = liveCore(comm, "ncclCommShrink", &result);
  if (!parent) return result;
  if (newcomm == nullptr || excludeRanksCount < 0 || (excludeRanksCount > 0 && excludeRanksList == nullptr) ||
      (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT)) {
    EMU_WARN("ncclCommShrink : invalid arguments (newcomm %p, excludeRanksCount %d, shrinkFlags %d)",
             static_cast<void*>(newcomm), excludeRanksCount, shrinkFlags);
    return ncclInvalidArgument;
  }
  *newcomm = nullptr;
  std::vector<bool> excluded(parent->nranks, false);
  for (int i = 0; i < excludeRanksCount; ++i) {
    const int r = excludeRanksList[i];
    if (r < 0 || r >= parent->nranks) {
      EMU_WARN("ncclCommShrink : excluded rank %d is out of range 0..%d", r, parent->nranks - 1);
      return ncclInvalidArgument;
    }
    excluded[r] = true;
  }
  if (excluded[parent->rank]) {
    EMU_WARN("ncclCommShrink : rank %d is in the exclude list; excluded ranks must not call ncclCommShrink",
             parent->rank);
    return ncclInvalidArgument;
  }
  if (shrinkFlags == NCCL_SHRINK_ABORT) {
    parent->revoked.store(true);
    parent->interrupt();
  } else if ((result = ensureReady(*parent)) != ncclSuccess) {
    return result;
  }
  bool blocking = parent->blocking;
  if ((result = configBlocking(config, parent->blocking, "ncclCommShrink", &blocking)) != ncclSuccess)
    return result;
  uint64_t shrink_number;
  {
    std::lock_guard<std::mutex> lock(parent->mutex);
    shrink_number = parent->derived_communicators++;
  }
  uint64_t excluded_hash = 0;
  int child_rank = 0, child_nranks = 0;
  for (int r = 0; r < parent->nranks; ++r) {
    if (excluded[r]) {
      excluded_hash = mixBits(excluded_hash ^ static_cast<uint64_t>(r));
      continue;
    }
    if (r == parent->rank) child_rank = child_nranks;
    ++child_nranks;
  }
  auto child = makeCore(child_rank, child_nranks, parent->cuda_dev, blocking);
  nameCommunicator(*child, config, parent.get());
  // Over the parent's bootstrap: the survivors derive the same rendezvous without a new unique id.
  const uint64_t magic = mixBits(parent->magic ^ mixBits(2 * shrink_number + 2) ^ excluded_hash);
  auto run = [child, magic] {
    return initCommunicator(child, InitRequest{RendezvousKind::Derived, magic, "ncclCommShrink"});
  };
  return launchDerived(newcomm, child, child, run);
}

NCCL_EXPORT(ncclResult_t, ncclCommFinalize, ncclComm_t comm);
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  ncclResult_t result = ncclSuccess;
  auto core = liveCore(comm, "ncclCommFinalize", &result);
  if (!core) return result;
  if ((result = ensureReady(*core)) != ncclSuccess) return result;
  if (core->finalized.exchange(true)) {
    EMU_WARN("ncclCommFinalize: communicator %p is already finalized", static_cast<void*>(comm));
    return ncclInvalidUsage;
  }
  core->setAsyncResult(ncclInProgress);
  auto drain = [core]() -> ncclResult_t {
    std::unique_lock<std::mutex> lock(core->mutex);
    core->changed.wait(lock, [&] { return core->outstanding_tasks == 0; });
    return ncclSuccess;
  };
  if (core->blocking) {
    result = drain();
    core->setAsyncResult(result);
    return result;
  }
  std::thread([core, drain] { core->setAsyncResult(drain()); }).detach();
  return ncclInProgress;
}

NCCL_EXPORT(ncclResult_t, ncclCommDestroy, ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  ncclResult_t result = ncclSuccess;
  auto core = liveCore(comm, "ncclCommDestroy", &result);
  if (!core) return result;
  {
    // Like NCCL, wait for the communicator's work to finish: a stuck collective hangs here.
    std::unique_lock<std::mutex> lock(core->mutex);
    core->changed.wait(
        lock, [&] { return core->outstanding_tasks == 0 && core->async_result.load() != ncclInProgress; });
  }
  releaseHandle(comm);
  return ncclSuccess;
}

NCCL_EXPORT(ncclResult_t, ncclCommAbort, ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  ncclResult_t result = ncclSuccess;
  auto core = liveCore(comm, "ncclCommAbort", &result);
  if (!core) return result;
  // Local, as in NCCL: this rank's stuck work returns (its output is garbage); peers stay stuck
  // until they abort too. Queued tasks keep the core alive until they have drained.
  core->interrupt();
  {
    // An init still running is interrupted too; like NCCL, wait until it has given up, so that it
    // has cleaned up before the process moves on (or exits).
    std::unique_lock<std::mutex> lock(core->mutex);
    core->changed.wait(lock,
                       [&] { return core->async_result.load() != ncclInProgress || core->finalized.load(); });
  }
  releaseHandle(comm);
  return ncclSuccess;
}

NCCL_EXPORT(ncclResult_t, ncclCommRevoke, ncclComm_t comm, int revokeFlags);
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  ncclResult_t result = ncclSuccess;
  auto core = liveCore(comm, "ncclCommRevoke", &result);
  if (!core) return result;
  if (revokeFlags != NCCL_REVOKE_DEFAULT) {
    EMU_WARN("ncclCommRevoke: revokeFlags must be NCCL_REVOKE_DEFAULT (0), got %d", revokeFlags);
    return ncclInvalidArgument;
  }
  core->revoked.store(true);
  core->interrupt();
  return ncclSuccess;
}

NCCL_EXPORT(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  ncclResult_t result = ncclSuccess;
  auto core = liveCore(comm, "ncclCommGetAsyncError", &result);
  if (!core) return result;
  if (asyncError == nullptr) {
    EMU_WARN("ncclCommGetAsyncError : asyncError argument is NULL");
    return ncclInvalidArgument;
  }
  *asyncError = static_cast<ncclResult_t>(core->async_result.load());
  return ncclSuccess;
}

namespace {
template <class Getter>
ncclResult_t queryComm(ncclComm_t comm, int* out, const char* caller, Getter get) {
  ncclResult_t result = ncclSuccess;
  auto core = liveCore(comm, caller, &result);
  if (!core) return result;
  if (out == nullptr) {
    EMU_WARN("%s : output argument is NULL", caller);
    return ncclInvalidArgument;
  }
  if ((result = ensureReady(*core)) != ncclSuccess) return result;
  *out = get(*core);
  return ncclSuccess;
}
}  // namespace

NCCL_EXPORT(ncclResult_t, ncclCommCount, const ncclComm_t comm, int* count);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return queryComm(comm, count, "ncclCommCount", [](const CommCore& core) { return core.nranks; });
}

NCCL_EXPORT(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int* device);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return queryComm(comm, device, "ncclCommCuDevice", [](const CommCore& core) { return core.cuda_dev; });
}

NCCL_EXPORT(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int* rank);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return queryComm(comm, rank, "ncclCommUserRank", [](const CommCore& core) { return core.rank; });
}
