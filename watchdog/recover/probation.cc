#include "watchdog/recover/probation.h"

#include <cuda.h>
#include <linux/futex.h>
#include <nccl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <ctime>

#include "absl/base/thread_annotations.h"
#include "watchdog/common/mutex.h"
#include "watchdog/common/nccl_api.h"
#include "watchdog/state/cuda_driver.h"
#include "watchdog/state/records.h"

namespace ncclguard {
namespace {

// Gate words come from page-locked pages that are never freed: a word is used by one operation,
// and a stream may read it until it has passed the gate, which nothing on the host observes.
// Probation covers a few operations per communicator, so a page lasts for a thousand of them.
class GateWords {
 public:
  std::atomic<std::uint32_t>* Take(const CudaDriver& driver) {
    MutexLock lock(mutex_);
    if (next_ == kWordsPerPage) {
      void* page = nullptr;
      if (driver.cuMemHostAlloc(&page, kPageBytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP) !=
          CUDA_SUCCESS) {
        return nullptr;
      }
      page_ = static_cast<std::atomic<std::uint32_t>*>(page);
      for (std::size_t i = 0; i < kWordsPerPage; ++i) new (&page_[i]) std::atomic<std::uint32_t>(0);
      next_ = 0;
    }
    return &page_[next_++];
  }

 private:
  static constexpr std::size_t kPageBytes = 4096;
  static constexpr std::size_t kWordsPerPage = kPageBytes / sizeof(std::uint32_t);
  Mutex mutex_;
  std::atomic<std::uint32_t>* page_ ABSL_GUARDED_BY(mutex_) = nullptr;
  std::size_t next_ ABSL_GUARDED_BY(mutex_) = kWordsPerPage;
};

GateWords& Words() {
  static auto* words = new GateWords;  // never destroyed: streams may still wait on its words
  return *words;
}

// Runs on the driver's thread once the stream has passed the operation, whether it completed or
// was aborted. The watchdog marks an operation it takes over before it aborts the communicator,
// so an aborted one never opens its gate here. Only atomics: no CUDA call is allowed here.
void CUDA_CB OpenGateUnlessTakenOver(void* data) {
  auto& op = *static_cast<ProbationOp*>(data);
  ProbationState expected = ProbationState::kPending;
  if (op.state.compare_exchange_strong(expected, ProbationState::kReleased, std::memory_order_acq_rel)) {
    OpenGate(op);
    NoteProbationChange();  // the operation queued behind it may go
  }
}

std::atomic<std::uint32_t> g_probation_changes{0};

std::size_t Bytes(std::size_t count, int datatype) { return count * DatatypeSize(datatype); }

bool Overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto a_begin = reinterpret_cast<std::uintptr_t>(a);
  const auto b_begin = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && a_begin < b_begin + b_bytes && b_begin < a_begin + a_bytes;
}

}  // namespace

bool ProbationAvailable() noexcept {
  const CudaDriver* driver = LoadCudaDriver();
  return driver != nullptr && driver->probation;
}

std::size_t OverwrittenInputBytes(const ProbationOp& op, int rank, int nranks) noexcept {
  const std::size_t one = Bytes(op.count, op.datatype);
  const std::size_t all = one * static_cast<std::size_t>(nranks > 0 ? nranks : 1);
  const bool root = op.root_or_peer == rank;
  std::size_t input = 0;
  std::size_t output = 0;
  switch (op.api) {
    case Api::ncclAllReduce:
      input = output = one;
      break;
    case Api::ncclReduceScatter:
      input = all, output = one;
      break;
    case Api::ncclAllGather:
      input = one, output = all;
      break;
    case Api::ncclReduce:  // only the root has an output
      input = one, output = root ? one : 0;
      break;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 3)
    case Api::ncclAlltoAll:
      input = output = all;
      break;
    case Api::ncclGather:
      input = one, output = root ? all : 0;
      break;
    case Api::ncclScatter:  // only the root has an input
      input = root ? all : 0, output = one;
      break;
#endif
    default:  // Broadcast (the root's buffer is only read), Send, Recv
      return 0;
  }
  return Overlap(op.send, input, op.recv, output) ? input : 0;
}

bool SaveInput(ProbationOp& op, std::size_t bytes) noexcept {
  const CudaDriver* driver = LoadCudaDriver();
  if (driver == nullptr || !driver->probation) return false;
  CUdeviceptr copy = 0;
  // Kept until the process ends: freeing device memory may wait for every stream, and one of
  // them may be the stuck one. At most NCCLGUARD_PROBATION_OPS copies per communicator.
  if (driver->cuMemAlloc(&copy, bytes) != CUDA_SUCCESS) return false;
  if (driver->cuMemcpyDtoDAsync(copy, reinterpret_cast<CUdeviceptr>(op.send), bytes,
                                static_cast<CUstream>(op.stream)) != CUDA_SUCCESS) {
    return false;
  }
  op.saved_input = copy;
  op.saved_bytes = bytes;
  return true;
}

bool TakeGate(ProbationOp& op) noexcept {
  const CudaDriver* driver = LoadCudaDriver();
  if (driver == nullptr || !driver->probation) return false;
  op.gate = Words().Take(*driver);
  if (op.gate == nullptr) return false;
  CUdeviceptr device = 0;
  if (driver->cuMemHostGetDevicePointer(&device, op.gate, 0) != CUDA_SUCCESS) return false;
  op.gate_device = device;
  return true;
}

bool WaitAtGate(ProbationOp& op) noexcept {
  const CudaDriver* driver = LoadCudaDriver();
  return driver != nullptr && driver->probation && op.gate_device != 0 &&
         driver->cuStreamWaitValue32(static_cast<CUstream>(op.stream), op.gate_device, 1,
                                     CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS;
}

bool ArmGate(ProbationOp& op, void* exec_stream) noexcept {
  const CudaDriver* driver = LoadCudaDriver();
  if (driver == nullptr || !driver->probation) return false;
  // Pending before the host function can run: it opens only a pending gate.
  op.state.store(ProbationState::kPending, std::memory_order_release);
  if (driver->cuLaunchHostFunc(static_cast<CUstream>(exec_stream), OpenGateUnlessTakenOver, &op) !=
      CUDA_SUCCESS) {
    op.state.store(ProbationState::kNone, std::memory_order_release);
    return false;
  }
  return true;
}

bool GateStream(ProbationOp& op) noexcept {
  if (!TakeGate(op) || !ArmGate(op, op.stream)) return false;
  if (!WaitAtGate(op)) {
    // The host function still runs and opens a gate nobody waits at; the operation cannot be
    // held, so it is not on probation.
    ProbationState expected = ProbationState::kPending;
    op.state.compare_exchange_strong(expected, ProbationState::kNone, std::memory_order_acq_rel);
    return false;
  }
  return true;
}

bool Unreleased(const ProbationOp& op) noexcept {
  const ProbationState state = op.state.load(std::memory_order_acquire);
  return state == ProbationState::kHeld || state == ProbationState::kPending ||
         state == ProbationState::kRecovering;
}

ProbationOp* PendingProbationOp(CommState& comm, std::uint64_t seq) noexcept {
  for (ProbationOp& op : comm.TakenProbation()) {
    // The state first: it publishes the rest of the slot.
    if (op.state.load(std::memory_order_acquire) == ProbationState::kPending && op.seq == seq) return &op;
  }
  return nullptr;
}

bool KeepGatesClosed(CommState& comm) noexcept {
  bool kept = false;
  for (ProbationOp& op : comm.TakenProbation()) kept = TakeOverGate(op) || kept;
  return kept;
}

void NoteProbationChange() noexcept {
  g_probation_changes.fetch_add(1, std::memory_order_release);
  syscall(SYS_futex, &g_probation_changes, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

std::uint32_t ProbationChanges() noexcept { return g_probation_changes.load(std::memory_order_acquire); }

void AwaitProbationChange(std::uint32_t seen, int timeout_ms) noexcept {
  const timespec timeout{timeout_ms / 1000, (timeout_ms % 1000) * 1'000'000L};
  // std::atomic<uint32_t> is a plain word: the kernel compares it with `seen`.
  syscall(SYS_futex, &g_probation_changes, FUTEX_WAIT_PRIVATE, seen, &timeout, nullptr, 0);
}

bool TakeOverGate(ProbationOp& op) noexcept {
  ProbationState expected = ProbationState::kPending;
  return op.state.compare_exchange_strong(expected, ProbationState::kRecovering, std::memory_order_acq_rel);
}

void OpenGate(ProbationOp& op) noexcept {
  if (op.gate != nullptr) op.gate->store(1, std::memory_order_release);
}

}  // namespace ncclguard
