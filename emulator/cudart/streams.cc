// Streams, events, host functions, graph capture, graphs and user objects: the runtime's handles
// are the driver's, so each call is the driver call on the current device.
#pragma GCC visibility push(default)
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#pragma GCC visibility pop

#include <memory>

#include "runtime_state.h"

using cudartemu::onDevice;
using cudartemu::remember;

cudaError_t cudaStreamCreate(cudaStream_t* pStream) {
  return onDevice([&] { return cuStreamCreate(pStream, CU_STREAM_DEFAULT); });
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  return onDevice([&] { return cuStreamCreate(pStream, flags); });
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* pStream, unsigned int flags, int priority) {
  return onDevice([&] { return cuStreamCreateWithPriority(pStream, flags, priority); });
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  return onDevice([&] { return cuStreamDestroy(stream); });
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return onDevice([&] { return cuStreamSynchronize(stream); });
}

// Not ready is an answer, not a failure: it does not become the last error.
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (cudaError_t error = cudartemu::useCurrentDevice(); error != cudaSuccess) return remember(error);
  const cudaError_t state = cudartemu::toRuntimeError(cuStreamQuery(stream));
  return state == cudaErrorNotReady ? state : remember(state);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  return onDevice([&] { return cuStreamWaitEvent(stream, event, flags); });
}

cudaError_t cudaStreamGetFlags(cudaStream_t hStream, unsigned int* flags) {
  return onDevice([&] { return cuStreamGetFlags(hStream, flags); });
}

cudaError_t cudaStreamGetPriority(cudaStream_t hStream, int* priority) {
  return onDevice([&] { return cuStreamGetPriority(hStream, priority); });
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  return onDevice([&] { return cuLaunchHostFunc(stream, fn, userData); });
}

namespace {

// A legacy stream callback, run as a host function: it learns its stream and that all went well.
struct StreamCallback {
  cudaStreamCallback_t callback;
  cudaStream_t stream;
  void* user_data;

  static void CUDA_CB Run(void* raw) {
    std::unique_ptr<StreamCallback> self(static_cast<StreamCallback*>(raw));
    self->callback(self->stream, cudaSuccess, self->user_data);
  }
};

}  // namespace

cudaError_t cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t callback, void* userData,
                                  unsigned int flags) {
  if (callback == nullptr || flags != 0) return remember(cudaErrorInvalidValue);
  auto pending = std::make_unique<StreamCallback>(StreamCallback{callback, stream, userData});
  const cudaError_t result = onDevice([&] {
    // Not capturable in CUDA; here it would also run, and free itself, at every graph launch.
    CUstreamCaptureStatus capturing = CU_STREAM_CAPTURE_STATUS_NONE;
    if (cuStreamIsCapturing(stream, &capturing) == CUDA_SUCCESS && capturing != CU_STREAM_CAPTURE_STATUS_NONE) {
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return cuLaunchHostFunc(stream, StreamCallback::Run, pending.get());
  });
  if (result == cudaSuccess) pending.release();  // the callback frees itself when it runs
  return result;
}

// Profiling is the tools' business: without a profiler attached these do nothing, as in CUDA.
cudaError_t cudaProfilerStart() { return cudaSuccess; }

cudaError_t cudaProfilerStop() { return cudaSuccess; }

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return onDevice([&] { return cuEventCreate(event, CU_EVENT_DEFAULT); });
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  return onDevice([&] { return cuEventCreate(event, flags); });
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  return onDevice([&] { return cuEventRecord(event, stream); });
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
  return onDevice([&] { return cuEventRecordWithFlags(event, stream, flags); });
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (cudaError_t error = cudartemu::useCurrentDevice(); error != cudaSuccess) return remember(error);
  const cudaError_t state = cudartemu::toRuntimeError(cuEventQuery(event));
  return state == cudaErrorNotReady ? state : remember(state);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return onDevice([&] { return cuEventSynchronize(event); });
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  return onDevice([&] { return cuEventElapsedTime(ms, start, end); });
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  return onDevice([&] { return cuEventDestroy(event); });
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  if (cudaError_t error = cudartemu::startDriver(); error != cudaSuccess) return remember(error);
  return remember(cuThreadExchangeStreamCaptureMode(reinterpret_cast<CUstreamCaptureMode*>(mode)));
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  return onDevice([&] { return cuStreamBeginCapture(stream, static_cast<CUstreamCaptureMode>(mode)); });
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  return onDevice([&] { return cuStreamEndCapture(stream, pGraph); });
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* pCaptureStatus) {
  return onDevice(
      [&] { return cuStreamIsCapturing(stream, reinterpret_cast<CUstreamCaptureStatus*>(pCaptureStatus)); });
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, cudaStreamCaptureStatus* captureStatus_out,
                                     unsigned long long* id_out, cudaGraph_t* graph_out,
                                     const cudaGraphNode_t** dependencies_out, const cudaGraphEdgeData** edgeData_out,
                                     size_t* numDependencies_out) {
  return onDevice([&] {
    return cuStreamGetCaptureInfo(stream, reinterpret_cast<CUstreamCaptureStatus*>(captureStatus_out),
                                  reinterpret_cast<cuuint64_t*>(id_out),
                                  graph_out, dependencies_out, reinterpret_cast<const CUgraphEdgeData**>(edgeData_out),
                                  numDependencies_out);
  });
}

cudaError_t cudaGraphCreate(cudaGraph_t* pGraph, unsigned int flags) {
  return onDevice([&] { return cuGraphCreate(pGraph, flags); });
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph, unsigned long long flags) {
  return onDevice([&] { return cuGraphInstantiate(pGraphExec, graph, flags); });
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* pGraphExec, cudaGraph_t graph, unsigned long long flags) {
  return onDevice([&] { return cuGraphInstantiateWithFlags(pGraphExec, graph, flags); });
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
  return onDevice([&] { return cuGraphLaunch(graphExec, stream); });
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
  return onDevice([&] { return cuGraphExecDestroy(graphExec); });
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  return onDevice([&] { return cuGraphDestroy(graph); });
}

cudaError_t cudaUserObjectCreate(cudaUserObject_t* object_out, void* ptr, cudaHostFn_t destroy,
                                 unsigned int initialRefcount, unsigned int flags) {
  return onDevice([&] { return cuUserObjectCreate(object_out, ptr, destroy, initialRefcount, flags); });
}

cudaError_t cudaUserObjectRetain(cudaUserObject_t object, unsigned int count) {
  return onDevice([&] { return cuUserObjectRetain(object, count); });
}

cudaError_t cudaUserObjectRelease(cudaUserObject_t object, unsigned int count) {
  return onDevice([&] { return cuUserObjectRelease(object, count); });
}

cudaError_t cudaGraphRetainUserObject(cudaGraph_t graph, cudaUserObject_t object, unsigned int count,
                                      unsigned int flags) {
  return onDevice([&] { return cuGraphRetainUserObject(graph, object, count, flags); });
}

cudaError_t cudaGraphReleaseUserObject(cudaGraph_t graph, cudaUserObject_t object, unsigned int count) {
  return onDevice([&] { return cuGraphReleaseUserObject(graph, object, count); });
}
