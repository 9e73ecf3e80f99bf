// Two instances of the emulated NCCL in one process: the linked libnccl.so.2 and a copy of the
// file dlopen'ed from another path, as in-process recovery uses them. Each reads NCCL_P2P_DISABLE,
// NCCL_DEBUG* and NCCLEMU_FAULTS at its own first init; communicators of the two over the same
// devices and ranks live side by side. ncclCommAbort ends a stuck operation and the stream goes on.
// Each case runs in a process of its own (ctest), since each instance reads its settings once.
#include <cuda.h>
#include <dlfcn.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/support/process.h"

using namespace std::chrono_literals;
using ncclguard::testing::CountOccurrences;
using ncclguard::testing::ReadFile;

namespace {

constexpr int kRanks = 2;
constexpr size_t kCount = 4096;

// One instance's entry points, looked up in its handle.
struct Nccl {
  explicit Nccl(void* library) : handle(library) {
    REQUIRE(handle != nullptr);
    resolve("ncclGetUniqueId", &getUniqueId);
    resolve("ncclCommInitRank", &initRank);
    resolve("ncclGroupStart", &groupStart);
    resolve("ncclGroupEnd", &groupEnd);
    resolve("ncclAllReduce", &allReduce);
    resolve("ncclCommAbort", &abort);
    resolve("ncclCommDestroy", &destroy);
    resolve("ncclCommGetAsyncError", &asyncError);
  }
  template <class F>
  void resolve(const char* name, F* function) {
    *function = reinterpret_cast<F>(dlsym(handle, name));
    INFO(name);
    REQUIRE(*function != nullptr);
  }

  void* handle;
  decltype(&ncclGetUniqueId) getUniqueId = nullptr;
  decltype(&ncclCommInitRank) initRank = nullptr;
  decltype(&ncclGroupStart) groupStart = nullptr;
  decltype(&ncclGroupEnd) groupEnd = nullptr;
  decltype(&ncclAllReduce) allReduce = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclCommGetAsyncError) asyncError = nullptr;
};

// The linked library, through its own symbols (a lookup by soname could find the copy).
Nccl linkedInstance() {
  Dl_info info{};
  REQUIRE(dladdr(reinterpret_cast<void*>(&ncclGetUniqueId), &info) != 0);
  return Nccl(dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD));
}

// A copy of the library file at a path of its own: a second instance, with its own statics.
Nccl privateCopy(const std::string& directory) {
  const std::string copy = directory + "/libnccl.so.2";
  std::filesystem::copy_file(std::string(EMU_LIB_DIR) + "/libnccl.so.2", copy);
  void* library = dlopen(copy.c_str(), RTLD_NOW | RTLD_LOCAL);
  INFO(dlerror());
  return Nccl(library);
}

bool waitForStream(CUstream stream, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  CUresult state;
  while ((state = cuStreamQuery(stream)) == CUDA_ERROR_NOT_READY) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(2ms);
  }
  return state == CUDA_SUCCESS;
}

// The devices 0 and 1, with a stream and a buffer each, shared by both instances' communicators
// (one libcuda in the process).
struct Devices {
  Devices() {
    REQUIRE(cuInit(0) == CUDA_SUCCESS);
    for (int r = 0; r < kRanks; ++r) {
      REQUIRE(cuDevicePrimaryCtxRetain(&contexts[r], r) == CUDA_SUCCESS);
      REQUIRE(cuCtxSetCurrent(contexts[r]) == CUDA_SUCCESS);
      REQUIRE(cuStreamCreate(&streams[r], CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
      CUdeviceptr pointer = 0;
      REQUIRE(cuMemAlloc(&pointer, kCount * sizeof(int32_t)) == CUDA_SUCCESS);
      buffers[r] = reinterpret_cast<int32_t*>(pointer);
    }
  }
  CUcontext contexts[kRanks] = {};
  CUstream streams[kRanks] = {};
  int32_t* buffers[kRanks] = {};
};

// The ranks of one communicator, each on its device, made through `nccl` with an id of its own.
struct Comm {
  ncclComm_t ranks[kRanks] = {};
};

Comm initComm(const Nccl& nccl, const Devices& devices) {
  ncclUniqueId id;
  REQUIRE(nccl.getUniqueId(&id) == ncclSuccess);
  Comm comm;
  REQUIRE(nccl.groupStart() == ncclSuccess);
  for (int r = 0; r < kRanks; ++r) {
    REQUIRE(cuCtxSetCurrent(devices.contexts[r]) == CUDA_SUCCESS);
    REQUIRE(nccl.initRank(&comm.ranks[r], kRanks, id, r) == ncclSuccess);
  }
  REQUIRE(nccl.groupEnd() == ncclSuccess);
  return comm;
}

// Queues one in-place sum over the ranks' buffers, filled with rank + step + element % 5.
void launchAllReduce(const Nccl& nccl, const Comm& comm, Devices& devices, CUstream const* streams,
                     int step) {
  for (int r = 0; r < kRanks; ++r) {
    for (size_t e = 0; e < kCount; ++e) devices.buffers[r][e] = r + step + static_cast<int32_t>(e % 5);
  }
  REQUIRE(nccl.groupStart() == ncclSuccess);
  for (int r = 0; r < kRanks; ++r) {
    REQUIRE(nccl.allReduce(devices.buffers[r], devices.buffers[r], kCount, ncclInt32, ncclSum, comm.ranks[r],
                           streams[r]) == ncclSuccess);
  }
  REQUIRE(nccl.groupEnd() == ncclSuccess);
}

bool resultsCorrect(const Devices& devices, int step) {
  for (int r = 0; r < kRanks; ++r) {
    for (size_t e = 0; e < kCount; ++e) {
      const int32_t expected = 1 + kRanks * step + kRanks * static_cast<int32_t>(e % 5);
      if (devices.buffers[r][e] != expected) return false;
    }
  }
  return true;
}

// Runs one sum on each stream to its end and checks it.
bool allReduceCompletes(const Nccl& nccl, const Comm& comm, Devices& devices, int step) {
  launchAllReduce(nccl, comm, devices, devices.streams, step);
  for (CUstream stream : devices.streams) {
    if (!waitForStream(stream, 20s)) return false;
  }
  return resultsCorrect(devices, step);
}

void destroyComm(const Nccl& nccl, Comm& comm) {
  for (ncclComm_t rank : comm.ranks) REQUIRE(nccl.destroy(rank) == ncclSuccess);
}

void abortComm(const Nccl& nccl, Comm& comm) {
  for (ncclComm_t rank : comm.ranks) REQUIRE(nccl.abort(rank) == ncclSuccess);
}

void countRun(void* counter) { static_cast<std::atomic<int>*>(counter)->fetch_add(1); }

// Whether the operation queued on `stream` is stuck: it does not complete within a while. A
// stuck collective never completes, so this cannot fail on a slow machine.
bool stuck(CUstream stream) { return !waitForStream(stream, 300ms); }

// After an abort: a synchronisation blocked on the stuck operation returns, and work queued
// behind it runs.
void checkStreamsGoOnAfterAbort(const Nccl& nccl, Comm& comm, Devices& devices) {
  std::atomic<int> later_work{0};
  for (int r = 0; r < kRanks; ++r) {
    REQUIRE(cuCtxSetCurrent(devices.contexts[r]) == CUDA_SUCCESS);
    REQUIRE(cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(devices.buffers[r]), 0xabc, kCount,
                             devices.streams[r]) == CUDA_SUCCESS);
    REQUIRE(cuLaunchHostFunc(devices.streams[r], countRun, &later_work) == CUDA_SUCCESS);
  }
  CUstream first = devices.streams[0];
  auto synchronized = std::async(std::launch::async, [first] { return cuStreamSynchronize(first); });
  CHECK(synchronized.wait_for(100ms) == std::future_status::timeout);
  CHECK(later_work == 0);

  abortComm(nccl, comm);
  REQUIRE(synchronized.wait_for(20s) == std::future_status::ready);
  CHECK(synchronized.get() == CUDA_SUCCESS);
  for (CUstream stream : devices.streams) REQUIRE(cuStreamSynchronize(stream) == CUDA_SUCCESS);
  CHECK(later_work == kRanks);
  for (int r = 0; r < kRanks; ++r) CHECK(devices.buffers[r][kCount - 1] == 0xabc);
}

std::string logOf(const std::string& path) { return std::filesystem::exists(path) ? ReadFile(path) : ""; }

}  // namespace

TEST_CASE("a copy of libnccl is a separate instance: P2P on the linked one, SHM on the copy, side by side",
          "[instances]") {
  ncclguard::testing::TemporaryDirectory directory;
  const std::string linked_log = directory.path() + "/linked.log", copy_log = directory.path() + "/copy.log";
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_FILE", linked_log.c_str(), 1);
  Devices devices;
  const Nccl linked = linkedInstance();
  Comm on_linked = initComm(linked, devices);
  REQUIRE(allReduceCompletes(linked, on_linked, devices, 1));

  // What a recovering rank does: P2P off for the copy's first init, its own log file.
  setenv("NCCL_P2P_DISABLE", "1", 1);
  setenv("NCCL_DEBUG_FILE", copy_log.c_str(), 1);
  const Nccl copy = privateCopy(directory.path());
  REQUIRE(copy.allReduce != linked.allReduce);
  Comm on_copy = initComm(copy, devices);

  // Same devices, same ranks, both alive: each works, in turn and at the same time.
  REQUIRE(allReduceCompletes(copy, on_copy, devices, 2));
  REQUIRE(allReduceCompletes(linked, on_linked, devices, 3));
  CUstream second_streams[kRanks];
  for (int r = 0; r < kRanks; ++r) {
    REQUIRE(cuCtxSetCurrent(devices.contexts[r]) == CUDA_SUCCESS);
    REQUIRE(cuStreamCreate(&second_streams[r], CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  }
  std::vector<int32_t> other(kRanks * kCount);
  for (int round = 0; round < 5; ++round) {
    REQUIRE(linked.groupStart() == ncclSuccess);
    for (int r = 0; r < kRanks; ++r) {
      for (size_t e = 0; e < kCount; ++e) other[r * kCount + e] = 10 * r + round;
      REQUIRE(linked.allReduce(&other[r * kCount], &other[r * kCount], kCount, ncclInt32, ncclSum,
                               on_linked.ranks[r], second_streams[r]) == ncclSuccess);
    }
    REQUIRE(linked.groupEnd() == ncclSuccess);
    launchAllReduce(copy, on_copy, devices, devices.streams, round);
    for (int r = 0; r < kRanks; ++r) {
      REQUIRE(waitForStream(second_streams[r], 20s));
      REQUIRE(waitForStream(devices.streams[r], 20s));
    }
    CHECK(resultsCorrect(devices, round));
    for (int r = 0; r < kRanks; ++r) CHECK(other[r * kCount + kCount - 1] == 10 + 2 * round);
  }

  // Aborting one instance's communicator leaves the other's alone.
  abortComm(linked, on_linked);
  REQUIRE(allReduceCompletes(copy, on_copy, devices, 6));
  destroyComm(copy, on_copy);

  const std::string linked_text = logOf(linked_log), copy_text = logOf(copy_log);
  INFO("linked log:\n" << linked_text << "\ncopy log:\n" << copy_text);
  CHECK(CountOccurrences(linked_text, "via P2P/direct pointer") == kRanks);
  CHECK(CountOccurrences(linked_text, "via SHM") == 0);
  CHECK(CountOccurrences(copy_text, "via SHM/direct/direct") == kRanks);
  CHECK(CountOccurrences(copy_text, "via P2P") == 0);
  CHECK(CountOccurrences(copy_text, "NCCL_P2P_DISABLE set by environment to 1") == 1);
  // Nothing of either communicator is left in /dev/shm.
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename();
    if (name.rfind("ncclemu-comm-", 0) == 0) {
      // Other tests' communicators may be alive; ours carry this process's pid.
      CHECK(name.find("-" + std::to_string(getpid()) + "-") == std::string::npos);
    }
  }
}

TEST_CASE("a unique id serves the instance that made it, and another one too", "[instances_mixed_id]") {
  ncclguard::testing::TemporaryDirectory directory;
  Devices devices;
  const Nccl linked = linkedInstance();
  const Nccl copy = privateCopy(directory.path());
  // The emulated id names a rendezvous in /dev/shm, which any instance can reach.
  ncclUniqueId id;
  REQUIRE(linked.getUniqueId(&id) == ncclSuccess);
  Comm comm;
  REQUIRE(copy.groupStart() == ncclSuccess);
  for (int r = 0; r < kRanks; ++r) {
    REQUIRE(cuCtxSetCurrent(devices.contexts[r]) == CUDA_SUCCESS);
    REQUIRE(copy.initRank(&comm.ranks[r], kRanks, id, r) == ncclSuccess);
  }
  REQUIRE(copy.groupEnd() == ncclSuccess);
  REQUIRE(allReduceCompletes(copy, comm, devices, 1));
  destroyComm(copy, comm);
}

// NCCL calls some of its exported functions through the PLT (ncclBcast calls ncclBroadcast), so
// in a copy loaded with RTLD_LOCAL that call binds to the first definition in the global scope:
// the linked library's (or an LD_PRELOAD'ed wrapper's). RTLD_DEEPBIND keeps it in the copy.
// Which instance ran the call shows in whose ncclGetLastError the argument check's WARN lands.
TEST_CASE("a copy's internal calls bind to the global scope unless loaded with RTLD_DEEPBIND",
          "[instances_plt]") {
  ncclguard::testing::TemporaryDirectory directory;
  Devices devices;
  const std::string path = directory.path() + "/libnccl.so.2";
  std::filesystem::copy_file(std::string(EMU_LIB_DIR) + "/libnccl.so.2", path);
  const std::string deep_path = directory.path() + "/deep-libnccl.so.2";
  std::filesystem::copy_file(std::string(EMU_LIB_DIR) + "/libnccl.so.2", deep_path);
  const Nccl linked = linkedInstance();
  using LastError = decltype(&ncclGetLastError);
  using Bcast = decltype(&ncclBcast);
  auto lastErrorOf = [](void* library) {
    return reinterpret_cast<LastError>(dlsym(library, "ncclGetLastError"));
  };
  const LastError linked_last_error = lastErrorOf(linked.handle);

  for (const bool deep : {false, true}) {
    INFO((deep ? "RTLD_DEEPBIND" : "RTLD_LOCAL"));
    const Nccl copy(
        dlopen((deep ? deep_path : path).c_str(), RTLD_NOW | RTLD_LOCAL | (deep ? RTLD_DEEPBIND : 0)));
    Comm comm = initComm(copy, devices);
    const auto bcast = reinterpret_cast<Bcast>(dlsym(copy.handle, "ncclBcast"));
    REQUIRE(bcast != nullptr);
    const std::string root = deep ? "9" : "7";
    int32_t value = 0;
    CHECK(bcast(&value, 1, ncclInt32, std::stoi(root), comm.ranks[0], devices.streams[0]) ==
          ncclInvalidArgument);
    const std::string copy_text = lastErrorOf(copy.handle)(nullptr), linked_text = linked_last_error(nullptr);
    const bool in_copy = copy_text.find("invalid root " + root) != std::string::npos;
    const bool in_linked = linked_text.find("invalid root " + root) != std::string::npos;
    CHECK(in_copy == deep);
    CHECK(in_linked == !deep);
    // The copy's own ncclBroadcast stays in the copy either way.
    REQUIRE(allReduceCompletes(copy, comm, devices, 1));
    destroyComm(copy, comm);
  }
}

TEST_CASE("ncclCommAbort ends a hung collective; the stream goes on; new communicators work",
          "[abort_hang]") {
  ncclguard::testing::TemporaryDirectory directory;
  // Rank 1's second operation of the first communicator never completes; rank 0 waits for it.
  setenv("NCCLEMU_FAULTS", "hang:rank=1,seq=2,comm=1", 1);
  Devices devices;
  const Nccl linked = linkedInstance();
  Comm first = initComm(linked, devices);
  REQUIRE(allReduceCompletes(linked, first, devices, 1));
  launchAllReduce(linked, first, devices, devices.streams, 2);
  for (CUstream stream : devices.streams) REQUIRE(stuck(stream));
  checkStreamsGoOnAfterAbort(linked, first, devices);

  // The same instance: its second communicator is not concerned by the fault.
  Comm second = initComm(linked, devices);
  REQUIRE(allReduceCompletes(linked, second, devices, 3));
  destroyComm(linked, second);

  // A copy reads NCCLEMU_FAULTS at its own first init and counts its own communicators: with the
  // variable still set, its first communicator hangs the same way.
  const Nccl copy = privateCopy(directory.path());
  Comm copy_first = initComm(copy, devices);
  REQUIRE(allReduceCompletes(copy, copy_first, devices, 4));
  launchAllReduce(copy, copy_first, devices, devices.streams, 5);
  for (CUstream stream : devices.streams) REQUIRE(stuck(stream));
  checkStreamsGoOnAfterAbort(copy, copy_first, devices);
  Comm copy_second = initComm(copy, devices);
  REQUIRE(allReduceCompletes(copy, copy_second, devices, 6));
  destroyComm(copy, copy_second);
}

TEST_CASE("p2p_stall stalls the instance with P2P; the copy without it completes the same collectives",
          "[abort_p2p_stall]") {
  ncclguard::testing::TemporaryDirectory directory;
  setenv("NCCLEMU_FAULTS", "p2p_stall:after=1", 1);
  Devices devices;
  const Nccl linked = linkedInstance();
  Comm stalled = initComm(linked, devices);
  REQUIRE(allReduceCompletes(linked, stalled, devices, 1));
  launchAllReduce(linked, stalled, devices, devices.streams, 2);
  for (CUstream stream : devices.streams) REQUIRE(stuck(stream));

  // The copy, P2P off at its first init, runs while the stalled communicator is still stuck.
  setenv("NCCL_P2P_DISABLE", "1", 1);
  const Nccl copy = privateCopy(directory.path());
  Comm recovered = initComm(copy, devices);
  CUstream other_streams[kRanks];
  for (int r = 0; r < kRanks; ++r) {
    REQUIRE(cuCtxSetCurrent(devices.contexts[r]) == CUDA_SUCCESS);
    REQUIRE(cuStreamCreate(&other_streams[r], CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  }
  std::vector<int32_t> data(kRanks * kCount);
  for (int step = 1; step <= 4; ++step) {
    REQUIRE(copy.groupStart() == ncclSuccess);
    for (int r = 0; r < kRanks; ++r) {
      for (size_t e = 0; e < kCount; ++e) data[r * kCount + e] = r + step;
      REQUIRE(copy.allReduce(&data[r * kCount], &data[r * kCount], kCount, ncclInt32, ncclSum,
                             recovered.ranks[r], other_streams[r]) == ncclSuccess);
    }
    REQUIRE(copy.groupEnd() == ncclSuccess);
    for (CUstream stream : other_streams) REQUIRE(waitForStream(stream, 20s));
    for (int r = 0; r < kRanks; ++r) CHECK(data[r * kCount] == 1 + 2 * step);
  }
  for (CUstream stream : devices.streams) CHECK(cuStreamQuery(stream) == CUDA_ERROR_NOT_READY);

  checkStreamsGoOnAfterAbort(linked, stalled, devices);
  // The linked instance keeps its P2P setting: a new communicator there stalls again.
  Comm again = initComm(linked, devices);
  REQUIRE(allReduceCompletes(linked, again, devices, 7));
  launchAllReduce(linked, again, devices, devices.streams, 8);
  for (CUstream stream : devices.streams) REQUIRE(stuck(stream));
  checkStreamsGoOnAfterAbort(linked, again, devices);
  // And the copy still works after all that, on the original streams.
  REQUIRE(allReduceCompletes(copy, recovered, devices, 9));
  destroyComm(copy, recovered);
}
