// Probation's gate on a driver of the test's own: the host function, run on a thread of the
// "driver" at a moment of its choosing, and the watchdog taking the operation over race for every
// gate; exactly one wins, and the gate is open exactly when the host function won. Run under the
// sanitizers, which have no CUDA driver of their own.
#include <cuda.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "watchdog/recover/probation.h"
#include "watchdog/state/cuda_driver.h"
#include "watchdog/state/records.h"

using namespace ncclguard;

namespace {

// A driver whose host functions run on threads of their own after a random pause, as a stream
// would run them once it got there. Its stream waits are only counted.
struct FakeDriver {
  static inline std::mutex mutex;
  static inline std::vector<std::thread> host_threads;
  static inline std::atomic<int> waits{0};
  static inline std::atomic<bool> refuse_host_functions{false};
  static inline std::atomic<bool> refuse_waits{false};
  static inline std::atomic<CUstream> last_host_function_stream{nullptr};

  static CUresult HostAlloc(void** pointer, size_t bytes, unsigned int) {
    *pointer = std::aligned_alloc(64, bytes);
    return *pointer != nullptr ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  }
  static CUresult DevicePointer(CUdeviceptr* device, void* host, unsigned int) {
    *device = reinterpret_cast<CUdeviceptr>(host);
    return CUDA_SUCCESS;
  }
  static CUresult LaunchHostFunc(CUstream stream, CUhostFn function, void* data) {
    if (refuse_host_functions) return CUDA_ERROR_INVALID_VALUE;
    last_host_function_stream = stream;
    thread_local std::minstd_rand random(std::random_device{}());
    const auto pause = std::chrono::microseconds(random() % 200);
    std::lock_guard<std::mutex> lock(mutex);
    host_threads.emplace_back([function, data, pause] {
      std::this_thread::sleep_for(pause);
      function(data);
    });
    return CUDA_SUCCESS;
  }
  static CUresult WaitValue32(CUstream, CUdeviceptr, cuuint32_t, unsigned int) {
    if (refuse_waits) return CUDA_ERROR_NOT_SUPPORTED;
    ++waits;
    return CUDA_SUCCESS;
  }
  static void JoinHostThreads() {
    std::lock_guard<std::mutex> lock(mutex);
    for (std::thread& thread : host_threads) thread.join();
    host_threads.clear();
  }

  FakeDriver() {
    driver.cuMemHostAlloc = HostAlloc;
    driver.cuMemHostGetDevicePointer = DevicePointer;
    driver.cuLaunchHostFunc = LaunchHostFunc;
    driver.cuStreamWaitValue32 = WaitValue32;
    driver.probation = true;
    ReplaceCudaDriverForTesting(&driver);
  }
  ~FakeDriver() {
    JoinHostThreads();
    ReplaceCudaDriverForTesting(nullptr);
    refuse_host_functions = false;
    refuse_waits = false;
  }

  CudaDriver driver;
};

CUstream FakeStream() { return reinterpret_cast<CUstream>(0x5e); }

}  // namespace

TEST_CASE("a gate is opened by its host function or taken over by the watchdog, never both", "[probation]") {
  FakeDriver fake;
  REQUIRE(ProbationAvailable());
  constexpr int kOperations = 300;
  std::vector<ProbationOp> ops(kOperations);
  std::minstd_rand random(7);
  int taken_over = 0;
  for (ProbationOp& op : ops) {
    op.stream = FakeStream();
    REQUIRE(GateStream(op));
    // The watchdog decides at any moment, before or after the stream got past the operation.
    std::this_thread::sleep_for(std::chrono::microseconds(random() % 200));
    if (TakeOverGate(op)) ++taken_over;
  }
  FakeDriver::JoinHostThreads();
  int opened = 0;
  for (const ProbationOp& op : ops) {
    const ProbationState state = op.state.load();
    const bool open = op.gate->load() == 1;
    INFO("state " << static_cast<int>(state) << ", gate " << op.gate->load());
    CHECK((state == ProbationState::kReleased || state == ProbationState::kRecovering));
    CHECK(open == (state == ProbationState::kReleased));
    if (open) ++opened;
  }
  CHECK(opened + taken_over == kOperations);
  CHECK(FakeDriver::waits.load() >= kOperations);
  // Both sides won some races: the test raced them.
  CHECK(opened > 0);
  CHECK(taken_over > 0);
  // A gate taken over stays shut until a replay opens it.
  for (ProbationOp& op : ops) {
    if (op.state.load() == ProbationState::kRecovering) {
      OpenGate(op);
      CHECK(op.gate->load() == 1);
    }
  }
}

TEST_CASE("an operation whose stream cannot be gated is not on probation, and nothing waits at a gate",
          "[probation]") {
  FakeDriver fake;
  SECTION("no host function") {
    FakeDriver::refuse_host_functions = true;
    ProbationOp op;
    op.stream = FakeStream();
    const int waits = FakeDriver::waits.load();
    CHECK_FALSE(GateStream(op));
    CHECK(op.state.load() == ProbationState::kNone);
    CHECK(FakeDriver::waits.load() == waits);  // no wait queued for a gate nobody opens
    CHECK_FALSE(TakeOverGate(op));
  }
  SECTION("no stream wait") {
    FakeDriver::refuse_waits = true;
    ProbationOp op;
    op.stream = FakeStream();
    CHECK_FALSE(GateStream(op));
    FakeDriver::JoinHostThreads();
    // The host function may have opened the gate nobody waits at; the watchdog never takes it over.
    CHECK(op.state.load() != ProbationState::kPending);
    CHECK_FALSE(TakeOverGate(op));
  }
}

TEST_CASE("a held operation: its stream waits from the call, its host function is armed on the issuing stream "
          "only once ncclguard issued it, and opening its gate wakes the issuing thread",
          "[probation]") {
  FakeDriver fake;
  ProbationOp op;
  op.stream = FakeStream();
  const int waits_before = FakeDriver::waits.load();
  REQUIRE(TakeGate(op));
  REQUIRE(WaitAtGate(op));
  CHECK(FakeDriver::waits.load() == waits_before + 1);
  CHECK(op.gate->load() == 0);
  CHECK_FALSE(Unreleased(op));  // not published yet
  op.state.store(ProbationState::kHeld);
  CHECK(Unreleased(op));
  // The watchdog cannot take over what NCCL has not seen: only a pending operation is taken over.
  CHECK_FALSE(TakeOverGate(op));

  const std::uint32_t seen = ProbationChanges();
  auto* issuing_stream = reinterpret_cast<CUstream>(0x15);
  REQUIRE(ArmGate(op, issuing_stream));
  CHECK(FakeDriver::last_host_function_stream.load() == issuing_stream);
  FakeDriver::JoinHostThreads();
  CHECK(op.state.load() == ProbationState::kReleased);
  CHECK(op.gate->load() == 1);
  CHECK_FALSE(Unreleased(op));
  CHECK(ProbationChanges() != seen);
  const auto start = std::chrono::steady_clock::now();
  AwaitProbationChange(seen, 5000);  // the change happened already: no wait
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));
}

TEST_CASE("the issuing thread's wait for a probation change ends when one is noted, and otherwise at its timeout",
          "[probation]") {
  const std::uint32_t seen = ProbationChanges();
  std::thread noter([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    NoteProbationChange();
  });
  const auto start = std::chrono::steady_clock::now();
  AwaitProbationChange(seen, 10000);
  const auto waited = std::chrono::steady_clock::now() - start;
  noter.join();
  CHECK(ProbationChanges() != seen);
  CHECK(waited < std::chrono::seconds(5));

  const std::uint32_t now = ProbationChanges();
  const auto timed_start = std::chrono::steady_clock::now();
  AwaitProbationChange(now, 100);
  CHECK(std::chrono::steady_clock::now() - timed_start < std::chrono::seconds(5));
  CHECK(ProbationChanges() == now);
}
