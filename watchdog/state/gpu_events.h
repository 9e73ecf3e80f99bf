// CUDA events as the watchdog uses them, behind an interface so that unit tests can decide when
// the "GPU" reaches an event. The real implementation calls the CUDA driver (libcuda.so.1)
// resolved at run time: ncclguard never links libcuda.
#pragma once

#include <cstdint>

namespace ncclguard {

using GpuContext = void*;  // CUcontext
using GpuStream = void*;   // CUstream / cudaStream_t
using GpuEvent = void*;    // CUevent

enum class EventStatus { kReached, kNotReached, kError };

class GpuEvents {
 public:
  virtual ~GpuEvents() = default;
  // False when no CUDA driver can be found: operations are then recorded but never timed.
  virtual bool Available() = 0;
  virtual GpuContext CurrentContext() = 0;
  // True while `stream` is being captured into a CUDA graph: then events must not be recorded on
  // it nor queried (a record is captured into the graph, and cuEventQuery on it is invalid; the
  // operation is marked "captured" instead, README.md "What it does").
  virtual bool IsCapturing(GpuStream stream) = 0;
  // Creates an event in the calling thread's current context; nullptr on failure.
  virtual GpuEvent Create() = 0;
  virtual bool Record(GpuEvent event, GpuStream stream) = 0;
  virtual EventStatus Query(GpuContext context, GpuEvent event) = 0;
  // GPU time between two reached events in milliseconds; negative when unknown.
  virtual float ElapsedMs(GpuContext context, GpuEvent start, GpuEvent end) = 0;
  virtual void Destroy(GpuContext context, GpuEvent event) = 0;
  // Called once on the watchdog thread before it queries anything: a query from another thread
  // must not invalidate a graph capture of the application (relaxed capture mode).
  virtual void PrepareWatchdogThread() = 0;
};

// The events every recorded operation uses: the CUDA driver's (Available() says whether a driver
// was found), unless a test put its own in place.
GpuEvents& DriverEvents();
void ReplaceGpuEventsForTesting(GpuEvents* events);

}  // namespace ncclguard
