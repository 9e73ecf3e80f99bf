#include "runtime.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <system_error>

#include "device_config.h"

namespace ncclemu {

void Marker::complete() {
  std::lock_guard lock(mutex_);
  complete_ = true;
  completion_time_ = Clock::now();
  completed_.notify_all();
}

bool Marker::isComplete() const {
  std::lock_guard lock(mutex_);
  return complete_;
}

void Marker::waitComplete() const {
  std::unique_lock lock(mutex_);
  completed_.wait(lock, [this] { return complete_; });
}

Clock::time_point Marker::completionTime() const {
  std::lock_guard lock(mutex_);
  return completion_time_;
}

}  // namespace ncclemu

std::uint64_t CUstream_st::push(Work work) {
  std::lock_guard lock(mutex_);
  queue_.push_back(std::move(work));
  ++submitted_;
  if (!worker_started_) startWorker();
  changed_.notify_all();
  return submitted_;
}

std::uint64_t CUstream_st::pendingUntil() {
  std::lock_guard lock(mutex_);
  return completed_ < submitted_ ? submitted_ : 0;
}

bool CUstream_st::isIdle() { return pendingUntil() == 0; }

void CUstream_st::waitUntilDone(std::uint64_t position) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return completed_ >= position; });
}

void CUstream_st::retire() {
  std::lock_guard lock(mutex_);
  retired_ = true;
  changed_.notify_all();
}

void CUstream_st::startWorker() {
  // The worker takes no signals: they belong to the application's threads, and a worker stuck in
  // a host function must not swallow a SIGTERM meant for the process.
  sigset_t all_signals;
  sigset_t previous;
  sigfillset(&all_signals);
  pthread_sigmask(SIG_SETMASK, &all_signals, &previous);
  try {
    // Detached and holding its stream: nothing ever joins a worker, so a process whose stream is
    // stuck in a host function still exits, and a destroyed stream drains on its own.
    std::thread([self = shared_from_this()] { self->runWorker(); }).detach();
  } catch (const std::system_error& error) {
    std::fprintf(stderr, "ncclemu: cannot start a stream worker thread: %s\n", error.what());
    std::abort();
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  worker_started_ = true;
}

void CUstream_st::runWorker() {
  pthread_setname_np(pthread_self(), "ncclemu-stream");
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return !queue_.empty() || retired_; });
    if (queue_.empty()) return;
    Work work = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    work();
    work = nullptr;  // release what the work holds before the application learns it is done
    lock.lock();
    ++completed_;
    changed_.notify_all();
  }
}

namespace ncclemu {
namespace {

std::atomic<State*> g_state{nullptr};
// A plain pointer, deliberately never freed: thread_local destructors run before atexit handlers,
// and programs (and the libraries they preload) may still call the driver from those.
thread_local ThreadState* t_thread_state = nullptr;

// Deliberately leaks the parent's objects: their mutexes may be held by threads that do not
// exist in the child, and their workers are gone.
void forgetParentStateInChild() {
  g_state.store(nullptr, std::memory_order_release);
  t_thread_state = nullptr;
}

}  // namespace

State::State()
    : device_count(readDeviceCount()),
      gpu_name(readGpuName()),
      gpu_memory_bytes(readGpuMemoryBytes()),
      driver_version(readCudaDriverVersion()),
      p2p_access(readP2pMatrix(device_count)),
      frees_wait(readFreesWait()),
      devices(device_count) {}

State& state() {
  State* current = g_state.load(std::memory_order_acquire);
  if (current != nullptr) return *current;
  static std::once_flag atfork_registered;
  std::call_once(atfork_registered, [] { pthread_atfork(nullptr, nullptr, forgetParentStateInChild); });
  // Never deleted: stream workers may still run at exit, so no destructor may pull their state away.
  auto* fresh = new State();
  if (g_state.compare_exchange_strong(current, fresh, std::memory_order_acq_rel)) return *fresh;
  delete fresh;
  return *current;
}

ThreadState& threadState() {
  if (t_thread_state == nullptr) t_thread_state = new ThreadState();
  return *t_thread_state;
}

ThreadState::~ThreadState() {
  // A thread's per-thread default streams end with the thread.
  if (per_thread_streams.empty()) return;
  State& s = state();
  std::lock_guard lock(s.mutex);
  for (auto& [context, stream] : per_thread_streams) destroyStream(s, stream);
}

bool isLiveContext(State& s, CUctx_st* context) {
  if (context == nullptr) return false;
  if (s.created_contexts.count(context) != 0) return true;
  for (Device& device : s.devices) {
    if (device.primary_context.get() == context) return context->active;
  }
  return false;
}

CUctx_st* currentContext(State& s) {
  ThreadState& thread = threadState();
  if (thread.context_stack.empty()) return nullptr;
  CUctx_st* context = thread.context_stack.back();
  return isLiveContext(s, context) ? context : nullptr;
}

StreamPtr createStream(State& s, CUctx_st* context, CUstream_st::Kind kind, unsigned flags, int priority) {
  auto stream = std::make_shared<CUstream_st>(context, kind, flags, priority, s.next_id++);
  if (kind == CUstream_st::Kind::kCreated) s.streams.emplace(stream.get(), stream);
  if (kind != CUstream_st::Kind::kLegacy) context->streams.push_back(stream);
  return stream;
}

void destroyStream(State& s, const StreamPtr& stream) {
  if (!stream->registered) return;
  stream->registered = false;
  // A capture cannot outlive the stream that began it: it ends, invalid, so that nothing keeps
  // refusing calls on its behalf.
  if (CapturePtr capture = stream->capture; capture && capture->origin == stream.get()) {
    capture->invalidated = true;
    capture->ended = true;
    for (const StreamPtr& member : capture->members) member->capture.reset();
    std::erase(s.active_captures, capture);
    releaseUserObjects(s, capture->graph->user_objects);
  }
  s.streams.erase(stream.get());
  auto& siblings = stream->context->streams;
  siblings.erase(std::remove(siblings.begin(), siblings.end(), stream), siblings.end());
  stream->retire();
}

CUresult resolveStream(State& s, CUstream handle, StreamPtr& out) {
  if (handle == nullptr || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
    CUctx_st* context = currentContext(s);
    if (context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (handle != CU_STREAM_PER_THREAD) {
      out = context->legacy_stream;
      return CUDA_SUCCESS;
    }
    StreamPtr& slot = threadState().per_thread_streams[context];
    if (!slot || !slot->registered) slot = createStream(s, context, CUstream_st::Kind::kPerThread, CU_STREAM_DEFAULT, 0);
    out = slot;
    return CUDA_SUCCESS;
  }
  auto found = s.streams.find(handle);
  if (found == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  out = found->second;
  return CUDA_SUCCESS;
}

void releaseContextResources(State& s, CUctx_st* context) {
  bool idle = context->legacy_stream->isIdle();
  for (const StreamPtr& stream : std::vector<StreamPtr>(context->streams)) {
    idle = idle && stream->isIdle();
    destroyStream(s, stream);
  }
  context->legacy_stream->retire();
  context->legacy_stream.reset();
  std::erase_if(s.events, [context](const auto& entry) { return entry.second->context == context; });
  // Work still queued may write the context's memory, so it is only returned once the context is
  // idle; otherwise it stays mapped (and no longer counted), as the device would drop it at reset.
  for (auto it = s.allocations.begin(); it != s.allocations.end();) {
    if (it->second.context != context) {
      ++it;
      continue;
    }
    if (!it->second.host) s.devices[context->device].allocated_bytes -= it->second.size;
    // Registered host memory is the application's: the registration ends, the memory stays.
    if (idle && !it->second.registered) std::free(reinterpret_cast<void*>(it->first));
    it = s.allocations.erase(it);
  }
}

void retainUserObjects(const UserObjectReferences& references) {
  for (const auto& [object, count] : references) object->references += count;
}

void releaseUserObject(State& s, CUuserObject_st* object, unsigned count) {
  object->references -= std::min(count, object->references);
  if (object->references != 0) return;
  s.pending_destructors.emplace_back(object->destroy, object->pointer);
  s.user_objects.erase(object);
}

void releaseUserObjects(State& s, UserObjectReferences& references) {
  for (const auto& [object, count] : references) releaseUserObject(s, object, count);
  references.clear();
}

}  // namespace ncclemu
