// Graph capture: captured work runs only when the graph is launched, and the calls CUDA forbids
// during a capture fail the way CUDA's do.
#include <thread>

#include "cuda_test_support.h"

using emutest::PrimaryContext;

namespace {

CUstreamCaptureStatus captureStatus(CUstream stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
  REQUIRE(cuStreamIsCapturing(stream, &status) == CUDA_SUCCESS);
  return status;
}

// Runs `call` on a thread of its own with the given capture mode.
template <typename Call>
CUresult onOtherThread(CUcontext context, CUstreamCaptureMode mode, Call call) {
  CUresult result = CUDA_ERROR_UNKNOWN;
  std::thread([&] {
    cuCtxSetCurrent(context);
    CUstreamCaptureMode previous = mode;
    cuThreadExchangeStreamCaptureMode(&previous);
    result = call();
  }).join();
  return result;
}

}  // namespace

TEST_CASE("captured host functions and event records run only when the graph is launched", "[capture]") {
  PrimaryContext context;
  CUstream stream;
  REQUIRE(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUevent recorded;
  REQUIRE(cuEventCreate(&recorded, CU_EVENT_DEFAULT) == CUDA_SUCCESS);
  std::atomic<int> runs{0};

  CHECK(captureStatus(stream) == CU_STREAM_CAPTURE_STATUS_NONE);
  REQUIRE(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CHECK(captureStatus(stream) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CUstreamCaptureStatus status;
  cuuint64_t first_id = 0;
  CUgraph graph_in_progress = nullptr;
  REQUIRE(cuStreamGetCaptureInfo(stream, &status, &first_id, &graph_in_progress, nullptr, nullptr, nullptr) == CUDA_SUCCESS);
  CHECK(status == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CHECK(first_id != 0);
  CHECK(graph_in_progress != nullptr);

  REQUIRE(cuLaunchHostFunc(stream, emutest::countRun, &runs) == CUDA_SUCCESS);
  REQUIRE(cuEventRecord(recorded, stream) == CUDA_SUCCESS);
  REQUIRE(cuLaunchHostFunc(stream, emutest::countRun, &runs) == CUDA_SUCCESS);
  // An event last recorded into a capture cannot be queried, even by a relaxed thread.
  CHECK(onOtherThread(context.get(), CU_STREAM_CAPTURE_MODE_RELAXED, [&] { return cuEventQuery(recorded); }) ==
        CUDA_ERROR_CAPTURED_EVENT);

  CUgraph graph = nullptr;
  REQUIRE(cuStreamEndCapture(stream, &graph) == CUDA_SUCCESS);
  CHECK(graph == graph_in_progress);
  CHECK(captureStatus(stream) == CU_STREAM_CAPTURE_STATUS_NONE);
  REQUIRE(cuStreamSynchronize(stream) == CUDA_SUCCESS);
  CHECK(runs == 0);

  CUgraphExec exec;
  REQUIRE(cuGraphInstantiate(&exec, graph, 0) == CUDA_SUCCESS);
  REQUIRE(cuGraphLaunch(exec, stream) == CUDA_SUCCESS);
  REQUIRE(cuGraphLaunch(exec, stream) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(stream) == CUDA_SUCCESS);
  CHECK(runs == 4);
  CHECK(cuEventQuery(recorded) == CUDA_SUCCESS);

  // A second capture has an id of its own.
  REQUIRE(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
  cuuint64_t second_id = 0;
  REQUIRE(cuStreamGetCaptureInfo(stream, &status, &second_id, nullptr, nullptr, nullptr, nullptr) == CUDA_SUCCESS);
  CHECK(second_id != first_id);
  CUgraph empty;
  REQUIRE(cuStreamEndCapture(stream, &empty) == CUDA_SUCCESS);

  CHECK(cuGraphExecDestroy(exec) == CUDA_SUCCESS);
  CHECK(cuGraphDestroy(graph) == CUDA_SUCCESS);
  CHECK(cuGraphDestroy(empty) == CUDA_SUCCESS);
  CHECK(cuGraphDestroy(graph) == CUDA_ERROR_INVALID_VALUE);
  cuEventDestroy(recorded);
  cuStreamDestroy(stream);
}

TEST_CASE("another thread's query during a global capture fails and invalidates the capture", "[capture]") {
  PrimaryContext context;
  CUstream stream;
  REQUIRE(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUevent unrelated;
  REQUIRE(cuEventCreate(&unrelated, CU_EVENT_DEFAULT) == CUDA_SUCCESS);
  REQUIRE(cuEventRecord(unrelated, stream) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(stream) == CUDA_SUCCESS);

  REQUIRE(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  SECTION("a thread in global mode is refused") {
    CHECK(onOtherThread(context.get(), CU_STREAM_CAPTURE_MODE_GLOBAL, [&] { return cuEventQuery(unrelated); }) ==
          CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK(captureStatus(stream) == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    CHECK(cuLaunchHostFunc(stream, emutest::countRun, nullptr) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CUgraph graph = reinterpret_cast<CUgraph>(0x1);
    CHECK(cuStreamEndCapture(stream, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK(graph == nullptr);
  }
  SECTION("a thread in relaxed mode may query") {
    CHECK(onOtherThread(context.get(), CU_STREAM_CAPTURE_MODE_RELAXED, [&] { return cuEventQuery(unrelated); }) == CUDA_SUCCESS);
    CHECK(captureStatus(stream) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CUgraph graph = nullptr;
    CHECK(cuStreamEndCapture(stream, &graph) == CUDA_SUCCESS);
    CHECK(cuGraphDestroy(graph) == CUDA_SUCCESS);
  }
  cuEventDestroy(unrelated);
  cuStreamDestroy(stream);
}

TEST_CASE("synchronising a capturing stream fails and invalidates the capture", "[capture]") {
  PrimaryContext context;
  CUstream stream;
  REQUIRE(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  REQUIRE(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
  CHECK(cuStreamSynchronize(stream) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK(cuStreamQuery(stream) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUgraph graph;
  CHECK(cuStreamEndCapture(stream, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CHECK(cuStreamEndCapture(stream, &graph) == CUDA_ERROR_ILLEGAL_STATE);
  cuStreamDestroy(stream);
}

TEST_CASE("the legacy stream cannot capture nor depend on a capturing blocking stream", "[capture]") {
  PrimaryContext context;
  CHECK(cuStreamBeginCapture(nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUstream blocking;
  REQUIRE(cuStreamCreate(&blocking, CU_STREAM_DEFAULT) == CUDA_SUCCESS);
  REQUIRE(cuStreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
  CUstreamCaptureStatus status;
  CHECK(cuStreamIsCapturing(nullptr, &status) == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  CHECK(cuLaunchHostFunc(nullptr, emutest::countRun, nullptr) == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  CUgraph graph;
  CHECK(cuStreamEndCapture(blocking, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  cuStreamDestroy(blocking);
}

TEST_CASE("a stream that waits on a capturing stream's event joins the capture", "[capture]") {
  PrimaryContext context;
  CUstream origin, side;
  REQUIRE(cuStreamCreate(&origin, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  REQUIRE(cuStreamCreate(&side, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  CUevent fork_point, join_point;
  REQUIRE(cuEventCreate(&fork_point, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
  REQUIRE(cuEventCreate(&join_point, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
  std::atomic<int> runs{0};

  REQUIRE(cuStreamBeginCapture(origin, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  REQUIRE(cuEventRecord(fork_point, origin) == CUDA_SUCCESS);
  REQUIRE(cuStreamWaitEvent(side, fork_point, 0) == CUDA_SUCCESS);
  CHECK(captureStatus(side) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  REQUIRE(cuLaunchHostFunc(side, emutest::countRun, &runs) == CUDA_SUCCESS);
  REQUIRE(cuEventRecord(join_point, side) == CUDA_SUCCESS);
  REQUIRE(cuStreamWaitEvent(origin, join_point, 0) == CUDA_SUCCESS);
  CUgraph graph;
  REQUIRE(cuStreamEndCapture(origin, &graph) == CUDA_SUCCESS);
  CHECK(captureStatus(side) == CU_STREAM_CAPTURE_STATUS_NONE);
  CHECK(runs == 0);

  CUgraphExec exec;
  REQUIRE(cuGraphInstantiate(&exec, graph, 0) == CUDA_SUCCESS);
  REQUIRE(cuGraphLaunch(exec, origin) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(origin) == CUDA_SUCCESS);
  CHECK(runs == 1);
  cuGraphExecDestroy(exec);
  cuGraphDestroy(graph);
  cuEventDestroy(fork_point);
  cuEventDestroy(join_point);
  cuStreamDestroy(origin);
  cuStreamDestroy(side);
}

TEST_CASE("destroying a capturing stream ends its capture", "[capture]") {
  PrimaryContext context;
  CUstream stream;
  REQUIRE(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  REQUIRE(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS);
  REQUIRE(cuStreamDestroy(stream) == CUDA_SUCCESS);
  // With the thread's own capture still under way this would be refused.
  CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
}

TEST_CASE("a user object lives as long as the graphs holding it and the launches in flight", "[capture]") {
  PrimaryContext context;
  CUstream stream;
  REQUIRE(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  std::atomic<int> destroyed{0};
  CUuserObject object = nullptr;
  CHECK(cuUserObjectCreate(&object, &destroyed, emutest::countRun, 1, 0) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuUserObjectCreate(&object, &destroyed, emutest::countRun, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) ==
          CUDA_SUCCESS);

  REQUIRE(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CUstreamCaptureStatus status;
  CUgraph capturing = nullptr;
  REQUIRE(cuStreamGetCaptureInfo(stream, &status, nullptr, &capturing, nullptr, nullptr, nullptr) == CUDA_SUCCESS);
  // The caller's reference moves to the graph being captured.
  REQUIRE(cuGraphRetainUserObject(capturing, object, 1, CU_GRAPH_USER_OBJECT_MOVE) == CUDA_SUCCESS);
  emutest::Gate gate;
  REQUIRE(cuLaunchHostFunc(stream, emutest::Gate::hostFunction, &gate) == CUDA_SUCCESS);
  CUgraph graph = nullptr;
  REQUIRE(cuStreamEndCapture(stream, &graph) == CUDA_SUCCESS);
  CUgraphExec executable = nullptr;
  REQUIRE(cuGraphInstantiate(&executable, graph, 0) == CUDA_SUCCESS);
  REQUIRE(cuGraphDestroy(graph) == CUDA_SUCCESS);
  CHECK(destroyed == 0);  // the executable graph holds it

  REQUIRE(cuGraphLaunch(executable, stream) == CUDA_SUCCESS);
  gate.waitUntilEntered();
  REQUIRE(cuGraphExecDestroy(executable) == CUDA_SUCCESS);
  CHECK(destroyed == 0);  // the launch still runs
  gate.open();
  REQUIRE(cuStreamSynchronize(stream) == CUDA_SUCCESS);
  CHECK(destroyed == 1);
  CHECK(cuUserObjectRelease(object, 1) == CUDA_ERROR_INVALID_VALUE);  // gone
  REQUIRE(cuStreamDestroy(stream) == CUDA_SUCCESS);
}

TEST_CASE("an invalidated capture releases its graph's user objects", "[capture]") {
  PrimaryContext context;
  CUstream stream;
  REQUIRE(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  std::atomic<int> destroyed{0};
  CUuserObject object = nullptr;
  REQUIRE(cuUserObjectCreate(&object, &destroyed, emutest::countRun, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) ==
          CUDA_SUCCESS);
  REQUIRE(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CUstreamCaptureStatus status;
  CUgraph capturing = nullptr;
  REQUIRE(cuStreamGetCaptureInfo(stream, &status, nullptr, &capturing, nullptr, nullptr, nullptr) == CUDA_SUCCESS);
  REQUIRE(cuGraphRetainUserObject(capturing, object, 2, 0) == CUDA_SUCCESS);
  CHECK(cuStreamSynchronize(stream) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUgraph graph = nullptr;
  CHECK(cuStreamEndCapture(stream, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CHECK(destroyed == 0);  // the caller's own reference remains
  REQUIRE(cuUserObjectRelease(object, 1) == CUDA_SUCCESS);
  CHECK(destroyed == 1);
  REQUIRE(cuStreamDestroy(stream) == CUDA_SUCCESS);
}
