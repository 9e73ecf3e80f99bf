// Streams and events: order, blocking, timing, the legacy and per-thread default streams.
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "cuda_test_support.h"

using emutest::Gate;
using emutest::PrimaryContext;
using namespace std::chrono_literals;

namespace {

struct OrderLog {
  std::mutex mutex;
  std::vector<int> entries;
};

struct OrderEntry {
  OrderLog* log;
  int value;
};

void appendEntry(void* entry) {
  auto* e = static_cast<OrderEntry*>(entry);
  std::lock_guard lock(e->log->mutex);
  e->log->entries.push_back(e->value);
}

void sleepHundredMs(void*) { std::this_thread::sleep_for(100ms); }

// Whether `call` is still blocked after a short while: the only way to observe that a wait waits.
bool staysBlocked(std::future<CUresult>& call) { return call.wait_for(100ms) == std::future_status::timeout; }

}  // namespace

TEST_CASE("work on a stream runs in the order it was queued", "[streams]") {
  PrimaryContext context;
  CUstream stream;
  REQUIRE(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  OrderLog log;
  std::vector<OrderEntry> entries;
  for (int i = 0; i < 200; ++i) entries.push_back({&log, i});
  for (OrderEntry& entry : entries) REQUIRE(cuLaunchHostFunc(stream, appendEntry, &entry) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(stream) == CUDA_SUCCESS);
  std::vector<int> expected;
  for (int i = 0; i < 200; ++i) expected.push_back(i);
  CHECK(log.entries == expected);
  REQUIRE(cuStreamDestroy(stream) == CUDA_SUCCESS);
}

TEST_CASE("a blocked host function holds back everything queued after it", "[streams]") {
  PrimaryContext context;
  CUstream stream;
  REQUIRE(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUevent before, after;
  REQUIRE(cuEventCreate(&before, CU_EVENT_DEFAULT) == CUDA_SUCCESS);
  REQUIRE(cuEventCreate(&after, CU_EVENT_DEFAULT) == CUDA_SUCCESS);
  Gate gate;
  std::atomic<int> runs{0};

  REQUIRE(cuEventRecord(before, stream) == CUDA_SUCCESS);
  REQUIRE(cuLaunchHostFunc(stream, Gate::hostFunction, &gate) == CUDA_SUCCESS);
  REQUIRE(cuEventRecord(after, stream) == CUDA_SUCCESS);
  REQUIRE(cuLaunchHostFunc(stream, emutest::countRun, &runs) == CUDA_SUCCESS);
  gate.waitUntilEntered();

  CHECK(cuEventQuery(before) == CUDA_SUCCESS);
  CHECK(cuEventQuery(after) == CUDA_ERROR_NOT_READY);
  CHECK(cuStreamQuery(stream) == CUDA_ERROR_NOT_READY);
  auto stream_sync = std::async(std::launch::async, [&] { return cuStreamSynchronize(stream); });
  auto event_sync = std::async(std::launch::async, [&] { return cuEventSynchronize(after); });
  CHECK(staysBlocked(stream_sync));
  CHECK(staysBlocked(event_sync));
  CHECK(runs == 0);

  gate.open();
  CHECK(stream_sync.get() == CUDA_SUCCESS);
  CHECK(event_sync.get() == CUDA_SUCCESS);
  CHECK(runs == 1);
  CHECK(cuEventQuery(after) == CUDA_SUCCESS);
  CHECK(cuStreamQuery(stream) == CUDA_SUCCESS);
  cuEventDestroy(before);
  cuEventDestroy(after);
  cuStreamDestroy(stream);
}

TEST_CASE("elapsed time between events measures the work between them", "[streams]") {
  PrimaryContext context;
  CUstream stream;
  REQUIRE(cuStreamCreate(&stream, CU_STREAM_DEFAULT) == CUDA_SUCCESS);
  CUevent start, end, untimed, never_recorded;
  REQUIRE(cuEventCreate(&start, CU_EVENT_DEFAULT) == CUDA_SUCCESS);
  REQUIRE(cuEventCreate(&end, CU_EVENT_BLOCKING_SYNC) == CUDA_SUCCESS);
  REQUIRE(cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
  REQUIRE(cuEventCreate(&never_recorded, CU_EVENT_DEFAULT) == CUDA_SUCCESS);
  Gate gate;

  REQUIRE(cuLaunchHostFunc(stream, Gate::hostFunction, &gate) == CUDA_SUCCESS);
  REQUIRE(cuEventRecord(start, stream) == CUDA_SUCCESS);
  REQUIRE(cuLaunchHostFunc(stream, sleepHundredMs, nullptr) == CUDA_SUCCESS);
  REQUIRE(cuEventRecord(end, stream) == CUDA_SUCCESS);
  REQUIRE(cuEventRecord(untimed, stream) == CUDA_SUCCESS);
  float milliseconds = -1;
  CHECK(cuEventElapsedTime(&milliseconds, start, end) == CUDA_ERROR_NOT_READY);

  gate.open();
  REQUIRE(cuEventSynchronize(end) == CUDA_SUCCESS);
  REQUIRE(cuEventElapsedTime(&milliseconds, start, end) == CUDA_SUCCESS);
  CHECK(milliseconds >= 95.0f);
  CHECK(milliseconds < 5000.0f);
  CHECK(cuEventElapsedTime(&milliseconds, start, untimed) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuEventElapsedTime(&milliseconds, start, never_recorded) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuEventQuery(never_recorded) == CUDA_SUCCESS);
  for (CUevent event : {start, end, untimed, never_recorded}) cuEventDestroy(event);
  cuStreamDestroy(stream);
}

TEST_CASE("the legacy default stream waits for blocking streams and they wait for it", "[streams]") {
  PrimaryContext context;
  CUstream blocking, non_blocking;
  REQUIRE(cuStreamCreate(&blocking, CU_STREAM_DEFAULT) == CUDA_SUCCESS);
  REQUIRE(cuStreamCreate(&non_blocking, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);

  SECTION("legacy work waits for earlier work on a blocking stream") {
    Gate gate;
    std::atomic<int> runs{0};
    REQUIRE(cuLaunchHostFunc(blocking, Gate::hostFunction, &gate) == CUDA_SUCCESS);
    gate.waitUntilEntered();
    REQUIRE(cuLaunchHostFunc(CU_STREAM_LEGACY, emutest::countRun, &runs) == CUDA_SUCCESS);
    REQUIRE(cuLaunchHostFunc(non_blocking, emutest::countRun, &runs) == CUDA_SUCCESS);
    REQUIRE(cuStreamSynchronize(non_blocking) == CUDA_SUCCESS);
    CHECK(runs == 1);  // only the non-blocking stream's work ran
    CHECK(cuStreamQuery(nullptr) == CUDA_ERROR_NOT_READY);
    gate.open();
    REQUIRE(cuStreamSynchronize(nullptr) == CUDA_SUCCESS);
    CHECK(runs == 2);
  }

  SECTION("blocking-stream work waits for earlier legacy work; non-blocking work does not") {
    Gate gate;
    std::atomic<int> blocking_runs{0};
    std::atomic<int> non_blocking_runs{0};
    REQUIRE(cuLaunchHostFunc(nullptr, Gate::hostFunction, &gate) == CUDA_SUCCESS);
    gate.waitUntilEntered();
    REQUIRE(cuLaunchHostFunc(blocking, emutest::countRun, &blocking_runs) == CUDA_SUCCESS);
    REQUIRE(cuLaunchHostFunc(CU_STREAM_PER_THREAD, emutest::countRun, &blocking_runs) == CUDA_SUCCESS);
    REQUIRE(cuLaunchHostFunc(non_blocking, emutest::countRun, &non_blocking_runs) == CUDA_SUCCESS);
    REQUIRE(cuStreamSynchronize(non_blocking) == CUDA_SUCCESS);
    CHECK(non_blocking_runs == 1);
    CHECK(cuStreamQuery(blocking) == CUDA_ERROR_NOT_READY);
    CHECK(cuStreamQuery(CU_STREAM_PER_THREAD) == CUDA_ERROR_NOT_READY);
    CHECK(blocking_runs == 0);
    gate.open();
    REQUIRE(cuStreamSynchronize(blocking) == CUDA_SUCCESS);
    REQUIRE(cuStreamSynchronize(CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
    CHECK(blocking_runs == 2);
  }

  cuStreamDestroy(blocking);
  cuStreamDestroy(non_blocking);
}

TEST_CASE("each thread has its own per-thread default stream", "[streams]") {
  PrimaryContext context;
  unsigned long long main_thread_stream = 0;
  unsigned long long legacy_stream = 0;
  REQUIRE(cuStreamGetId(CU_STREAM_PER_THREAD, &main_thread_stream) == CUDA_SUCCESS);
  REQUIRE(cuStreamGetId(CU_STREAM_LEGACY, &legacy_stream) == CUDA_SUCCESS);
  unsigned long long again = 0;
  REQUIRE(cuStreamGetId(CU_STREAM_PER_THREAD, &again) == CUDA_SUCCESS);
  CHECK(again == main_thread_stream);
  CHECK(legacy_stream != main_thread_stream);

  unsigned long long other_thread_stream = 0;
  CUresult other_result = CUDA_ERROR_UNKNOWN;
  std::thread([&] {
    cuCtxSetCurrent(context.get());
    other_result = cuStreamGetId(CU_STREAM_PER_THREAD, &other_thread_stream);
  }).join();
  REQUIRE(other_result == CUDA_SUCCESS);
  CHECK(other_thread_stream != main_thread_stream);
  CHECK(other_thread_stream != legacy_stream);
}

TEST_CASE("cuStreamWaitEvent makes one stream wait for another's event", "[streams]") {
  PrimaryContext context;
  CUstream producer, consumer;
  REQUIRE(cuStreamCreate(&producer, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  REQUIRE(cuStreamCreate(&consumer, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUevent produced;
  REQUIRE(cuEventCreate(&produced, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
  Gate gate;
  std::atomic<int> consumed{0};

  REQUIRE(cuLaunchHostFunc(producer, Gate::hostFunction, &gate) == CUDA_SUCCESS);
  REQUIRE(cuEventRecord(produced, producer) == CUDA_SUCCESS);
  REQUIRE(cuStreamWaitEvent(consumer, produced, 0) == CUDA_SUCCESS);
  REQUIRE(cuLaunchHostFunc(consumer, emutest::countRun, &consumed) == CUDA_SUCCESS);
  // Recording the event again later does not move what the consumer already waits for.
  REQUIRE(cuEventRecord(produced, consumer) == CUDA_SUCCESS);
  gate.waitUntilEntered();
  CHECK(cuStreamQuery(consumer) == CUDA_ERROR_NOT_READY);
  CHECK(consumed == 0);

  gate.open();
  REQUIRE(cuStreamSynchronize(consumer) == CUDA_SUCCESS);
  CHECK(consumed == 1);
  cuEventDestroy(produced);
  cuStreamDestroy(producer);
  cuStreamDestroy(consumer);
}

TEST_CASE("destroying a stream with pending work returns at once and the work still runs", "[streams]") {
  PrimaryContext context;
  CUstream stream;
  REQUIRE(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUevent done;
  REQUIRE(cuEventCreate(&done, CU_EVENT_DEFAULT) == CUDA_SUCCESS);
  Gate gate;
  std::atomic<int> runs{0};
  REQUIRE(cuLaunchHostFunc(stream, Gate::hostFunction, &gate) == CUDA_SUCCESS);
  REQUIRE(cuLaunchHostFunc(stream, emutest::countRun, &runs) == CUDA_SUCCESS);
  REQUIRE(cuEventRecord(done, stream) == CUDA_SUCCESS);

  REQUIRE(cuStreamDestroy(stream) == CUDA_SUCCESS);
  CHECK(cuStreamQuery(stream) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuStreamDestroy(stream) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuEventQuery(done) == CUDA_ERROR_NOT_READY);
  gate.open();
  REQUIRE(cuEventSynchronize(done) == CUDA_SUCCESS);
  CHECK(runs == 1);
  cuEventDestroy(done);
}

TEST_CASE("cuCtxSynchronize waits for every stream of the context", "[streams]") {
  PrimaryContext context;
  CUstream stream;
  REQUIRE(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  Gate gate;
  REQUIRE(cuLaunchHostFunc(stream, Gate::hostFunction, &gate) == CUDA_SUCCESS);
  auto synchronize = std::async(std::launch::async, [&] {
    cuCtxSetCurrent(context.get());
    return cuCtxSynchronize();
  });
  CHECK(staysBlocked(synchronize));
  gate.open();
  CHECK(synchronize.get() == CUDA_SUCCESS);
  cuStreamDestroy(stream);
}

TEST_CASE("stream and event handles are checked", "[streams]") {
  PrimaryContext context;
  CUstream stream;
  REQUIRE(cuStreamCreateWithPriority(&stream, CU_STREAM_NON_BLOCKING, -100) == CUDA_SUCCESS);
  int priority = 0;
  REQUIRE(cuStreamGetPriority(stream, &priority) == CUDA_SUCCESS);
  int least = 1, greatest = 1;
  REQUIRE(cuCtxGetStreamPriorityRange(&least, &greatest) == CUDA_SUCCESS);
  CHECK(priority == greatest);
  CUcontext owner = nullptr;
  REQUIRE(cuStreamGetCtx(stream, &owner) == CUDA_SUCCESS);
  CHECK(owner == context.get());
  REQUIRE(cuStreamDestroy(stream) == CUDA_SUCCESS);
  CHECK(cuLaunchHostFunc(stream, emutest::countRun, nullptr) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuStreamCreate(&stream, 0x80) == CUDA_ERROR_INVALID_VALUE);

  CUevent event;
  REQUIRE(cuEventCreate(&event, CU_EVENT_DEFAULT) == CUDA_SUCCESS);
  REQUIRE(cuEventDestroy(event) == CUDA_SUCCESS);
  CHECK(cuEventQuery(event) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuEventRecord(event, nullptr) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuEventCreate(&event, CU_EVENT_INTERPROCESS) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuLaunchHostFunc(nullptr, nullptr, nullptr) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("a thread without a current context gets CUDA_ERROR_INVALID_CONTEXT", "[streams]") {
  PrimaryContext context;
  CUresult launch = CUDA_SUCCESS, create = CUDA_SUCCESS, device = CUDA_SUCCESS;
  std::thread([&] {
    CUstream stream;
    CUdevice ordinal;
    launch = cuLaunchHostFunc(nullptr, emutest::countRun, nullptr);
    create = cuStreamCreate(&stream, 0);
    device = cuCtxGetDevice(&ordinal);
  }).join();
  CHECK(launch == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(create == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(device == CUDA_ERROR_INVALID_CONTEXT);
}
