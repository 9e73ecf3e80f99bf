// Communicator lifecycle of the emulated NCCL, ranks as devices of one process: split, shrink,
// abort, destroy (also with a stream parked at a gate, by default and with NCCLEMU_FREES_WAIT=0),
// revoke, non-blocking and scalable init, argument checking and the small API functions.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "nccl_test_support.h"

namespace {

using nccltest::LocalRanks;
using namespace std::chrono_literals;

// AllReduce(sum) of each rank's value over the given communicators, one per local rank.
std::vector<int32_t> allReduceRanks(LocalRanks& ranks, const std::vector<ncclComm_t>& comms,
                                    const std::vector<int>& local_ranks, const std::vector<int32_t>& values) {
  std::vector<int32_t*> buffers;
  for (size_t i = 0; i < local_ranks.size(); ++i) {
    buffers.push_back(ranks.allocate<int32_t>(local_ranks[i], sizeof(int32_t)));
    *buffers.back() = values[i];
  }
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (size_t i = 0; i < local_ranks.size(); ++i) {
    REQUIRE(ncclAllReduce(buffers[i], buffers[i], 1, ncclInt32, ncclSum, comms[i],
                          ranks.stream(local_ranks[i])) == ncclSuccess);
  }
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  REQUIRE(ranks.synchronize());
  std::vector<int32_t> results;
  for (int32_t* buffer : buffers) results.push_back(*buffer);
  return results;
}

std::string lastError() { return ncclGetLastError(nullptr); }

// The rendezvous segment a unique id names (its first 8 bytes are the magic).
std::string rendezvousPath(const ncclUniqueId& id) {
  uint64_t magic = 0;
  memcpy(&magic, id.internal, sizeof(magic));
  char path[64];
  snprintf(path, sizeof(path), "/dev/shm/ncclemu-rv-%016lx", static_cast<unsigned long>(magic));
  return path;
}

// Parks a rank's stream at a cuStreamWaitValue32 on a page-locked word until the test writes it:
// the gate ncclguard's recovery holds an application stream at while it aborts.
class StreamGate {
 public:
  StreamGate(LocalRanks& ranks, int rank) : stream_(ranks.stream(rank)) {
    ranks.makeCurrent(rank);
    void* host = nullptr;
    REQUIRE(cuMemAllocHost(&host, sizeof(cuuint32_t)) == CUDA_SUCCESS);
    word_ = static_cast<cuuint32_t*>(host);
    *word_ = 0;
  }
  // The stream must be past the wait before the word is freed.
  ~StreamGate() {
    open();
    nccltest::waitForStream(stream_, 10s);
    cuMemFreeHost(word_);
  }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  void park() {
    REQUIRE(cuStreamWaitValue32(stream_, reinterpret_cast<CUdeviceptr>(word_), 1, CU_STREAM_WAIT_VALUE_GEQ) ==
            CUDA_SUCCESS);
  }
  void open() { std::atomic_ref<cuuint32_t>(*word_).store(1); }

 private:
  CUstream stream_;
  cuuint32_t* word_ = nullptr;
};

void countRun(void* counter) { static_cast<std::atomic<int>*>(counter)->fetch_add(1); }

// Rank 0's AllReduce on its stream: the application's collective, queued before the gate.
void allReduceOnRank0(LocalRanks& ranks) {
  int32_t* buffer = ranks.allocate<int32_t>(0, 1024);
  REQUIRE(ncclAllReduce(buffer, buffer, 256, ncclInt32, ncclSum, ranks.comm(0), ranks.stream(0)) ==
          ncclSuccess);
}

// Aborts or destroys rank 0's communicator from another thread, as ncclguard's recovery does.
std::future<ncclResult_t> endOnAnotherThread(LocalRanks& ranks, ncclResult_t (*end)(ncclComm_t)) {
  ncclComm_t comm = ranks.comm(0);
  ranks.comm(0) = nullptr;
  return std::async(std::launch::async, [comm, end] { return end(comm); });
}

}  // namespace

TEST_CASE("emulated NCCL split: color and key semantics, NOCOLOR gives NULL", "[nccl]") {
  LocalRanks ranks(4);
  ranks.initAll();
  std::vector<ncclComm_t> children(4, nullptr);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < 4; ++r) {
    // Ranks 0 and 2 form one group ordered by descending key; rank 3 leaves; rank 1 is alone.
    const int color = r == 3 ? NCCL_SPLIT_NOCOLOR : r % 2;
    REQUIRE(ncclCommSplit(ranks.comm(r), color, -r, &children[r], nullptr) == ncclSuccess);
  }
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  REQUIRE(children[3] == nullptr);
  int count = 0, rank = -1, device = -1;
  REQUIRE(ncclCommCount(children[0], &count) == ncclSuccess);
  REQUIRE(count == 2);
  REQUIRE(ncclCommUserRank(children[0], &rank) == ncclSuccess);
  REQUIRE(rank == 1);
  REQUIRE(ncclCommUserRank(children[2], &rank) == ncclSuccess);
  REQUIRE(rank == 0);
  REQUIRE(ncclCommCount(children[1], &count) == ncclSuccess);
  REQUIRE(count == 1);
  REQUIRE(ncclCommCuDevice(children[2], &device) == ncclSuccess);
  REQUIRE(device == 2);
  const auto sums = allReduceRanks(ranks, {children[0], children[1], children[2]}, {0, 1, 2}, {10, 20, 30});
  REQUIRE(sums == std::vector<int32_t>{40, 20, 40});
  for (int r = 0; r < 3; ++r) REQUIRE(ncclCommDestroy(children[r]) == ncclSuccess);
  ranks.destroyAll();
}

TEST_CASE("emulated NCCL shrink: survivors keep their order without a new unique id", "[nccl]") {
  LocalRanks ranks(4);
  ranks.initAll();
  int excluded[] = {1};
  std::vector<ncclComm_t> children(4, nullptr);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r : {0, 2, 3}) {
    REQUIRE(ncclCommShrink(ranks.comm(r), excluded, 1, &children[r], nullptr, NCCL_SHRINK_DEFAULT) ==
            ncclSuccess);
  }
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  int rank = -1, count = 0;
  REQUIRE(ncclCommCount(children[3], &count) == ncclSuccess);
  REQUIRE(count == 3);
  REQUIRE(ncclCommUserRank(children[3], &rank) == ncclSuccess);
  REQUIRE(rank == 2);
  REQUIRE(allReduceRanks(ranks, {children[0], children[2], children[3]}, {0, 2, 3}, {1, 2, 3}) ==
          std::vector<int32_t>{6, 6, 6});
  // An excluded rank must not take part.
  ncclComm_t unused = nullptr;
  REQUIRE(ncclCommShrink(ranks.comm(1), excluded, 1, &unused, nullptr, NCCL_SHRINK_DEFAULT) ==
          ncclInvalidArgument);
  for (int r : {0, 2, 3}) REQUIRE(ncclCommDestroy(children[r]) == ncclSuccess);
  ranks.destroyAll();
}

TEST_CASE("emulated NCCL abort unblocks the local rank's stuck collective only", "[nccl]") {
  LocalRanks ranks(2);
  ranks.initAll();
  int32_t* buffer = ranks.allocate<int32_t>(0, 1024);
  // Rank 1 never joins: rank 0's AllReduce waits for it, like a kernel spinning on a dead peer.
  REQUIRE(ncclAllReduce(buffer, buffer, 256, ncclInt32, ncclSum, ranks.comm(0), ranks.stream(0)) ==
          ncclSuccess);
  REQUIRE_FALSE(nccltest::waitForStream(ranks.stream(0), 300ms));
  REQUIRE(ncclCommAbort(ranks.comm(0)) == ncclSuccess);
  ranks.comm(0) = nullptr;
  REQUIRE(nccltest::waitForStream(ranks.stream(0), 5s));
  REQUIRE(ncclCommAbort(ranks.comm(1)) == ncclSuccess);
  ranks.comm(1) = nullptr;
}

TEST_CASE("emulated NCCL destroy waits on a stuck communicator until an abort", "[nccl]") {
  LocalRanks ranks(2);
  ranks.initAll();
  int32_t* buffer = ranks.allocate<int32_t>(0, 64);
  REQUIRE(ncclBroadcast(buffer, buffer, 16, ncclInt32, 1, ranks.comm(0), ranks.stream(0)) == ncclSuccess);
  ncclComm_t stuck = ranks.comm(0);
  auto destroyed = std::async(std::launch::async, [stuck] { return ncclCommDestroy(stuck); });
  REQUIRE(destroyed.wait_for(400ms) == std::future_status::timeout);
  // What a watchdog does from another thread: abort makes the stuck work return.
  REQUIRE(ncclCommAbort(stuck) == ncclSuccess);
  REQUIRE(destroyed.wait_for(5s) == std::future_status::ready);
  REQUIRE(destroyed.get() == ncclSuccess);
  ranks.comm(0) = nullptr;
  int count = 0;
  REQUIRE(ncclCommCount(stuck, &count) == ncclInvalidArgument);
  REQUIRE(lastError().find("already destroyed or aborted") != std::string::npos);
  REQUIRE(ncclCommAbort(ranks.comm(1)) == ncclSuccess);
  ranks.comm(1) = nullptr;
}

// The tests below declare the future of a call that waits for the gate before the gate itself:
// a failed check then opens the gate before the future waits for the call to end.

// Run by the ctest entry emulator.nccl.lifecycle_frees_return, with NCCLEMU_FREES_WAIT=0.
TEST_CASE("with frees that return, abort returns while the stream is parked at a gate behind the operation",
          "[.frees_return]") {
  LocalRanks ranks(2);
  ranks.initAll();
  std::future<ncclResult_t> aborted;
  StreamGate gate(ranks, 0);
  allReduceOnRank0(ranks);
  gate.park();
  aborted = endOnAnotherThread(ranks, ncclCommAbort);
  REQUIRE(aborted.wait_for(5s) == std::future_status::ready);
  REQUIRE(aborted.get() == ncclSuccess);
  REQUIRE_FALSE(nccltest::waitForStream(ranks.stream(0), 100ms));
  gate.open();
  REQUIRE(nccltest::waitForStream(ranks.stream(0), 5s));
}

TEST_CASE("emulated NCCL abort first ends the operation, then waits for the parked stream", "[nccl]") {
  LocalRanks ranks(2);
  ranks.initAll();
  std::future<ncclResult_t> aborted;
  StreamGate gate(ranks, 0);
  // Rank 1 never joins: the AllReduce is stuck until the abort; the gate comes after it.
  allReduceOnRank0(ranks);
  std::atomic<int> after_operation{0};
  REQUIRE(cuLaunchHostFunc(ranks.stream(0), countRun, &after_operation) == CUDA_SUCCESS);
  gate.park();
  REQUIRE_FALSE(nccltest::waitForStream(ranks.stream(0), 100ms));
  REQUIRE(after_operation == 0);

  aborted = endOnAnotherThread(ranks, ncclCommAbort);
  REQUIRE(aborted.wait_for(200ms) == std::future_status::timeout);
  // The aborted operation has returned and the stream has moved on, up to the gate.
  REQUIRE(after_operation == 1);
  gate.open();
  REQUIRE(aborted.wait_for(5s) == std::future_status::ready);
  REQUIRE(aborted.get() == ncclSuccess);
  REQUIRE(nccltest::waitForStream(ranks.stream(0), 5s));
  // Rank 1's device has nothing queued: its abort returns at once.
  REQUIRE(ncclCommAbort(ranks.comm(1)) == ncclSuccess);
  ranks.comm(1) = nullptr;
}

TEST_CASE("emulated NCCL destroy waits for a stream of its device parked at a gate", "[nccl]") {
  LocalRanks ranks(1);
  ranks.initAll();
  std::future<ncclResult_t> destroyed;
  StreamGate gate(ranks, 0);
  allReduceOnRank0(ranks);
  gate.park();
  destroyed = endOnAnotherThread(ranks, ncclCommDestroy);
  REQUIRE(destroyed.wait_for(200ms) == std::future_status::timeout);
  gate.open();
  REQUIRE(destroyed.wait_for(5s) == std::future_status::ready);
  REQUIRE(destroyed.get() == ncclSuccess);
}

TEST_CASE("emulated NCCL non-blocking init reports ncclInProgress, then ncclSuccess", "[nccl]") {
  LocalRanks ranks(3);
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  // Without a group, from one thread: each init returns at once and completes in the background.
  for (int r = 0; r < 3; ++r) {
    ranks.makeCurrent(r);
    REQUIRE(ncclCommInitRankConfig(&ranks.comm(r), 3, id, r, &config) == ncclInProgress);
    REQUIRE(ranks.comm(r) != nullptr);
  }
  for (int r = 0; r < 3; ++r) REQUIRE(nccltest::waitForAsyncResult(ranks.comm(r), ncclSuccess, 10s));
  int count = 0;
  REQUIRE(ncclCommCount(ranks.comm(2), &count) == ncclSuccess);
  REQUIRE(count == 3);
  REQUIRE(allReduceRanks(ranks, {ranks.comm(0), ranks.comm(1), ranks.comm(2)}, {0, 1, 2}, {1, 1, 1}) ==
          std::vector<int32_t>{3, 3, 3});
  for (int r = 0; r < 3; ++r) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t finalized = ncclCommFinalize(ranks.comm(r));
    REQUIRE((finalized == ncclSuccess || finalized == ncclInProgress));
    REQUIRE(nccltest::waitForAsyncResult(ranks.comm(r), ncclSuccess, 10s));
    REQUIRE(ncclCommGetAsyncError(ranks.comm(r), &state) == ncclSuccess);
    REQUIRE(state == ncclSuccess);
  }
  ranks.destroyAll();
}

TEST_CASE("emulated NCCL group init: one thread initialises every rank, complete at GroupEnd", "[nccl]") {
  LocalRanks ranks(4);
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < 4; ++r) {
    ranks.makeCurrent(r);
    REQUIRE(ncclCommInitRank(&ranks.comm(r), 4, id, r) == ncclSuccess);
  }
  // Not created before GroupEnd: using it then is refused with NCCL's warning, which becomes the
  // last error; asking for its asynchronous error is fine.
  ncclResult_t state = ncclSuccess;
  REQUIRE(ncclCommGetAsyncError(ranks.comm(0), &state) == ncclSuccess);
  REQUIRE(state == ncclInProgress);
  int count = 0;
  REQUIRE(ncclCommCount(ranks.comm(0), &count) == ncclInvalidArgument);
  REQUIRE(
      lastError().find("Attempt to use communicator before the previous operation returned ncclSuccess") !=
      std::string::npos);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  REQUIRE(ncclCommCount(ranks.comm(0), &count) == ncclSuccess);
  REQUIRE(count == 4);
  int device = -1;
  REQUIRE(ncclCommCuDevice(ranks.comm(3), &device) == ncclSuccess);
  REQUIRE(device == 3);
  ranks.destroyAll();

  // The id served its one init: reusing it (without NCCL_COMM_ID) fails clearly.
  ranks.makeCurrent(0);
  ncclComm_t again = nullptr;
  REQUIRE(ncclCommInitRank(&again, 4, id, 0) == ncclSystemError);
  REQUIRE(again == nullptr);
  REQUIRE(lastError().find("serves exactly one communicator init") != std::string::npos);
}

TEST_CASE("emulated NCCL revoke: later collectives are a usage error", "[nccl]") {
  LocalRanks ranks(2);
  ranks.initAll();
  int32_t* buffer = ranks.allocate<int32_t>(0, 64);
  REQUIRE(ncclCommRevoke(ranks.comm(0), 1) == ncclInvalidArgument);
  REQUIRE(ncclCommRevoke(ranks.comm(0), NCCL_REVOKE_DEFAULT) == ncclSuccess);
  REQUIRE(ncclAllReduce(buffer, buffer, 4, ncclInt32, ncclSum, ranks.comm(0), ranks.stream(0)) ==
          ncclInvalidUsage);
  REQUIRE(lastError().find("revoked") != std::string::npos);
  ranks.destroyAll();
}

TEST_CASE("emulated NCCL argument checking and error texts", "[nccl]") {
  LocalRanks ranks(2);
  ranks.initAll();
  int32_t* buffer = ranks.allocate<int32_t>(0, 64);
  CUstream stream = ranks.stream(0);
  REQUIRE(ncclAllReduce(buffer, buffer, 4, ncclInt32, ncclSum, nullptr, stream) == ncclInvalidArgument);
  REQUIRE(lastError() == "AllReduce : comm argument is NULL");
  REQUIRE(ncclAllReduce(buffer, buffer, 4, static_cast<ncclDataType_t>(42), ncclSum, ranks.comm(0), stream) ==
          ncclInvalidArgument);
  REQUIRE(lastError() == "AllReduce : invalid type 42");
  REQUIRE(ncclAllReduce(buffer, buffer, 4, ncclInt32, static_cast<ncclRedOp_t>(17), ranks.comm(0), stream) ==
          ncclInvalidArgument);
  REQUIRE(lastError() == "AllReduce : invalid reduction operation 17");
  REQUIRE(ncclBroadcast(buffer, buffer, 4, ncclInt32, 2, ranks.comm(0), stream) == ncclInvalidArgument);
  REQUIRE(lastError().find("invalid root 2") != std::string::npos);
  REQUIRE(ncclSend(nullptr, 4, ncclInt32, 1, ranks.comm(0), stream) == ncclInvalidArgument);
  REQUIRE(ncclGroupEnd() == ncclInvalidUsage);

  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  REQUIRE(ncclCommInitRank(&comm, 2, id, 5) == ncclInvalidArgument);
  REQUIRE(lastError() == "Invalid rank requested : 5/2");
  // Use the id, so that its rendezvous does not stay behind in /dev/shm.
  REQUIRE(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess);
  REQUIRE(ncclCommDestroy(comm) == ncclSuccess);

  REQUIRE(std::string(ncclGetErrorString(ncclSuccess)) == "no error");
  REQUIRE(std::string(ncclGetErrorString(ncclUnhandledCudaError)) ==
          "unhandled cuda error (run with NCCL_DEBUG=INFO for details)");
  REQUIRE(std::string(ncclGetErrorString(ncclSystemError)) ==
          "unhandled system error (run with NCCL_DEBUG=INFO for details)");
  REQUIRE(std::string(ncclGetErrorString(ncclInternalError)) ==
          "internal error - please report this issue to the NCCL developers");
  REQUIRE(std::string(ncclGetErrorString(ncclInvalidArgument)) ==
          "invalid argument (run with NCCL_DEBUG=WARN for details)");
  REQUIRE(std::string(ncclGetErrorString(ncclInvalidUsage)) ==
          "invalid usage (run with NCCL_DEBUG=WARN for details)");
  REQUIRE(std::string(ncclGetErrorString(ncclRemoteError)) ==
          "remote process exited or there was a network error");
  REQUIRE(std::string(ncclGetErrorString(ncclInProgress)) == "NCCL operation in progress");
  REQUIRE(std::string(ncclGetErrorString(static_cast<ncclResult_t>(99))) == "unknown result code");
  int version = 0;
  REQUIRE(ncclGetVersion(&version) == ncclSuccess);
  REQUIRE(version == 22809);
  ranks.destroyAll();
}

TEST_CASE("emulated NCCL ranks on the same GPU are rejected like real NCCL", "[nccl]") {
  LocalRanks ranks(1);
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comms[2] = {nullptr, nullptr};
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < 2; ++r) REQUIRE(ncclCommInitRank(&comms[r], 2, id, r) == ncclSuccess);
  REQUIRE(ncclGroupEnd() == ncclInvalidUsage);
  REQUIRE(lastError().find("Duplicate GPU detected : rank 0 and rank 1") != std::string::npos);
  for (ncclComm_t comm : comms) ncclCommDestroy(comm);
}

TEST_CASE("emulated NCCL memory, registration and simulated groups", "[nccl]") {
  LocalRanks ranks(2);
  ranks.initAll();
  ranks.makeCurrent(0);
  void* memory = nullptr;
  REQUIRE(ncclMemAlloc(&memory, 1 << 20) == ncclSuccess);
  REQUIRE(memory != nullptr);
  void* handle = nullptr;
  REQUIRE(ncclCommRegister(ranks.comm(0), memory, 1 << 20, &handle) == ncclSuccess);
  ncclWindow_t window = nullptr;
  REQUIRE(ncclCommWindowRegister(ranks.comm(0), memory, 1 << 20, &window, NCCL_WIN_COLL_SYMMETRIC) ==
          ncclSuccess);
  REQUIRE(ncclCommWindowDeregister(ranks.comm(0), window) == ncclSuccess);
  REQUIRE(ncclCommDeregister(ranks.comm(0), handle) == ncclSuccess);
  REQUIRE(ncclCommDeregister(ranks.comm(0), handle) == ncclInvalidArgument);
  REQUIRE(ncclMemFree(memory) == ncclSuccess);

  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  int32_t* buffer = ranks.allocate<int32_t>(0, 4096);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  REQUIRE(ncclAllReduce(buffer, buffer, 1024, ncclInt32, ncclSum, ranks.comm(0), ranks.stream(0)) ==
          ncclSuccess);
  REQUIRE(ncclGroupSimulateEnd(&info) == ncclSuccess);
  REQUIRE(info.estimatedTime > 0);
  // Nothing was launched: rank 0 is not waiting for rank 1.
  REQUIRE(nccltest::waitForStream(ranks.stream(0), 1s));
  ranks.destroyAll();
}

TEST_CASE("emulated NCCL InitRankScalable: one thread per rank, one or several unique ids", "[nccl]") {
  LocalRanks ranks(4);
  const int id_count = GENERATE(1, 2, 4);
  std::vector<ncclUniqueId> ids(id_count);
  for (ncclUniqueId& id : ids) REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  std::vector<std::thread> threads;
  std::vector<ncclResult_t> results(4, ncclInternalError);
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      if (cuCtxSetCurrent(ranks.context(r)) != CUDA_SUCCESS) return;
      results[r] = ncclCommInitRankScalable(&ranks.comm(r), 4, r, id_count, ids.data(), nullptr);
    });
  }
  for (std::thread& thread : threads) thread.join();
  REQUIRE(results == std::vector<ncclResult_t>(4, ncclSuccess));
  for (int r = 0; r < 4; ++r) {
    int rank = -1, device = -1;
    REQUIRE(ncclCommUserRank(ranks.comm(r), &rank) == ncclSuccess);
    REQUIRE(rank == r);
    REQUIRE(ncclCommCuDevice(ranks.comm(r), &device) == ncclSuccess);
    REQUIRE(device == r);
  }
  REQUIRE(allReduceRanks(ranks, {ranks.comm(0), ranks.comm(1), ranks.comm(2), ranks.comm(3)}, {0, 1, 2, 3},
                         {1, 10, 100, 1000}) == std::vector<int32_t>(4, 1111));
  // Every id's bootstrap root is retired, including those no rank needed.
  for (const ncclUniqueId& id : ids) CHECK_FALSE(std::filesystem::exists(rendezvousPath(id)));
  ranks.destroyAll();
}

TEST_CASE("emulated NCCL InitRankScalable: nId must be 1..nranks, as in NCCL", "[nccl]") {
  LocalRanks ranks(1);
  std::vector<ncclUniqueId> ids(3);
  ncclComm_t comm = nullptr;
  REQUIRE(ncclCommInitRankScalable(&comm, 2, 0, 3, ids.data(), nullptr) == ncclInvalidArgument);
  REQUIRE(lastError() == "improper usage of ncclCommInitRank: nId = 3, nranks=2");
  REQUIRE(ncclCommInitRankScalable(&comm, 2, 0, 0, ids.data(), nullptr) == ncclInvalidArgument);
  REQUIRE(lastError() == "improper usage of ncclCommInitRank: nId = 0, nranks=2");
  REQUIRE(comm == nullptr);
}

TEST_CASE("emulated NCCL shrink with NCCL_SHRINK_ABORT ends the parent's stuck collective first", "[nccl]") {
  LocalRanks ranks(4);
  ranks.initAll();
  // Ranks 0, 2 and 3 enter an AllReduce that rank 1 never joins: their streams are stuck.
  std::vector<int32_t*> buffers(4, nullptr);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r : {0, 2, 3}) {
    buffers[r] = ranks.allocate<int32_t>(r, 64 * sizeof(int32_t));
    REQUIRE(ncclAllReduce(buffers[r], buffers[r], 64, ncclInt32, ncclSum, ranks.comm(r), ranks.stream(r)) ==
            ncclSuccess);
  }
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  REQUIRE_FALSE(nccltest::waitForStream(ranks.stream(0), 200ms));

  int excluded[] = {1};
  std::vector<ncclComm_t> children(4, nullptr);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r : {0, 2, 3}) {
    REQUIRE(ncclCommShrink(ranks.comm(r), excluded, 1, &children[r], nullptr, NCCL_SHRINK_ABORT) ==
            ncclSuccess);
  }
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  // The stuck collectives returned, so the survivors' streams run again, and the child works.
  for (int r : {0, 2, 3}) REQUIRE(nccltest::waitForStream(ranks.stream(r), 5s));
  REQUIRE(allReduceRanks(ranks, {children[0], children[2], children[3]}, {0, 2, 3}, {1, 2, 3}) ==
          std::vector<int32_t>{6, 6, 6});
  // The parent is done for: nothing more can be issued on it.
  REQUIRE(ncclAllReduce(buffers[0], buffers[0], 64, ncclInt32, ncclSum, ranks.comm(0), ranks.stream(0)) ==
          ncclInvalidUsage);
  for (int r : {0, 2, 3}) REQUIRE(ncclCommDestroy(children[r]) == ncclSuccess);
  ranks.destroyAll();
}
