// Stream memory operations (cuStreamWaitValue32/64, cuStreamWriteValue32/64) and the host memory
// they are meant for: page-locked memory registered with cuMemHostRegister and the device
// pointers of host memory. A wait is work on the stream like any other: the stream's worker polls
// the word, sleeping between looks, so later work waits without a thread spinning, and a capture
// records the operation like a copy.
#pragma GCC visibility push(default)
#include <cuda.h>
#pragma GCC visibility pop

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>

#include "runtime.h"

using ncclemu::State;

namespace {

// How long a waiting worker sleeps between looks at the word: short at first, for a value about
// to be written, then at most a millisecond, which costs a sleeping stream next to no CPU.
constexpr std::chrono::microseconds kFirstPoll{20};
constexpr std::chrono::microseconds kLongestPoll{1000};

constexpr unsigned kWaitConditionMask = 0xf;

template <typename Word>
bool conditionHolds(Word current, Word value, unsigned condition) {
  using Signed = std::make_signed_t<Word>;
  switch (condition) {
    case CU_STREAM_WAIT_VALUE_GEQ:
      return static_cast<Signed>(current - value) >= 0;  // cyclic, as documented
    case CU_STREAM_WAIT_VALUE_EQ:
      return current == value;
    case CU_STREAM_WAIT_VALUE_AND:
      return (current & value) != 0;
    case CU_STREAM_WAIT_VALUE_NOR:
      return static_cast<Word>(~(current | value)) != 0;
    default:
      return false;
  }
}

template <typename Word>
void waitForValue(Word* address, Word value, unsigned condition) {
  std::atomic_ref<Word> word(*address);
  std::chrono::microseconds pause = kFirstPoll;
  while (!conditionHolds(word.load(std::memory_order_acquire), value, condition)) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, kLongestPoll);
  }
}

// The checks CUDA makes when the operation is queued: a driver that is up, a known stream, and an
// aligned address inside memory the device can reach (device memory, page-locked or registered
// host memory).
template <typename Word>
CUresult checkTarget(State& s, CUstream handle, CUdeviceptr address, StreamPtr& stream) {
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (CUresult result = ncclemu::resolveStream(s, handle, stream); result != CUDA_SUCCESS) return result;
  if (address == 0 || address % sizeof(Word) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (ncclemu::findAllocation(s, static_cast<std::uintptr_t>(address), sizeof(Word)) == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

template <typename Word>
CUresult enqueueWait(const StreamPtr& stream, CUdeviceptr address, Word value, unsigned condition) {
  auto* word = reinterpret_cast<Word*>(address);
  return ncclemu::enqueueWork(
      stream, [word, value, condition] { waitForValue(word, value, condition); },
      [address, value, condition](const StreamPtr& target) {
        return enqueueWait(target, address, value, condition);
      });
}

template <typename Word>
CUresult enqueueWrite(const StreamPtr& stream, CUdeviceptr address, Word value) {
  auto* word = reinterpret_cast<Word*>(address);
  return ncclemu::enqueueWork(
      stream,
      [word, value] {
        // The default flag's fence: the stream's earlier writes are visible before this one.
        std::atomic_thread_fence(std::memory_order_seq_cst);
        std::atomic_ref<Word>(*word).store(value, std::memory_order_release);
      },
      [address, value](const StreamPtr& target) { return enqueueWrite(target, address, value); });
}

template <typename Word>
CUresult streamWaitValue(CUstream handle, CUdeviceptr address, Word value, unsigned flags) {
  const unsigned condition = flags & kWaitConditionMask;
  if ((flags & ~(kWaitConditionMask | CU_STREAM_WAIT_VALUE_FLUSH)) != 0 ||
      condition > CU_STREAM_WAIT_VALUE_NOR) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  State& s = ncclemu::state();
  std::lock_guard lock(s.mutex);
  StreamPtr stream;
  if (CUresult result = checkTarget<Word>(s, handle, address, stream); result != CUDA_SUCCESS) return result;
  // CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES reads 0, as on most platforms.
  if (flags & CU_STREAM_WAIT_VALUE_FLUSH) return CUDA_ERROR_NOT_SUPPORTED;
  return enqueueWait(stream, address, value, condition);
}

template <typename Word>
CUresult streamWriteValue(CUstream handle, CUdeviceptr address, Word value, unsigned flags) {
  if (flags != CU_STREAM_WRITE_VALUE_DEFAULT && flags != CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  State& s = ncclemu::state();
  std::lock_guard lock(s.mutex);
  StreamPtr stream;
  if (CUresult result = checkTarget<Word>(s, handle, address, stream); result != CUDA_SUCCESS) return result;
  // cuda.h: CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER "is not supported in the v2 API".
  if (flags == CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER) return CUDA_ERROR_NOT_SUPPORTED;
  return enqueueWrite(stream, address, value);
}

}  // namespace

// --- Host memory the device reaches -------------------------------------------------------------

CUresult cuMemHostRegister(void* p, size_t bytesize, unsigned int Flags) {
  constexpr unsigned kKnownFlags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                                   CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
  State& s = ncclemu::state();
  std::lock_guard lock(s.mutex);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (p == nullptr || bytesize == 0 || (Flags & ~kKnownFlags) != 0) return CUDA_ERROR_INVALID_VALUE;
  // Neither I/O memory nor read-only mappings are modelled (their device attributes read 0).
  if (Flags & (CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY)) return CUDA_ERROR_NOT_SUPPORTED;
  CUctx_st* context = ncclemu::currentContext(s);
  if (context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  const auto begin = reinterpret_cast<std::uintptr_t>(p);
  // Any overlap with memory the driver already knows is refused, as CUDA refuses a second
  // registration of the same pages.
  auto next = s.allocations.lower_bound(begin);
  if (next != s.allocations.end() && next->first < begin + bytesize)
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  if (next != s.allocations.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second.size > begin) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  }
  s.allocations.emplace(begin, ncclemu::Allocation{bytesize, context, true, true, Flags});
  return CUDA_SUCCESS;
}

CUresult cuMemHostUnregister(void* p) {
  State& s = ncclemu::state();
  std::lock_guard lock(s.mutex);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto found = s.allocations.find(reinterpret_cast<std::uintptr_t>(p));
  if (found == s.allocations.end() || !found->second.registered) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  s.allocations.erase(found);
  return CUDA_SUCCESS;
}

// With unified addressing the device pointer of mapped host memory is its host address.
CUresult cuMemHostGetDevicePointer(CUdeviceptr* pdptr, void* p, unsigned int Flags) {
  State& s = ncclemu::state();
  std::lock_guard lock(s.mutex);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (pdptr == nullptr || p == nullptr || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (ncclemu::currentContext(s) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  const ncclemu::Allocation* allocation = ncclemu::findAllocation(s, reinterpret_cast<std::uintptr_t>(p), 1);
  if (allocation == nullptr || !allocation->host) return CUDA_ERROR_INVALID_VALUE;
  *pdptr = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

CUresult cuMemHostGetFlags(unsigned int* pFlags, void* p) {
  State& s = ncclemu::state();
  std::lock_guard lock(s.mutex);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (pFlags == nullptr || p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ncclemu::Allocation* allocation = ncclemu::findAllocation(s, reinterpret_cast<std::uintptr_t>(p), 1);
  if (allocation == nullptr || !allocation->host || allocation->registered) return CUDA_ERROR_INVALID_VALUE;
  // Page-locked memory is mapped whatever the flags said (unified addressing).
  *pFlags = allocation->host_flags | CU_MEMHOSTALLOC_DEVICEMAP;
  return CUDA_SUCCESS;
}

// --- Stream memory operations (the v2 API) ------------------------------------------------------

CUresult cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  return streamWaitValue<cuuint32_t>(stream, addr, value, flags);
}

CUresult cuStreamWaitValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  return streamWaitValue<cuuint64_t>(stream, addr, value, flags);
}

CUresult cuStreamWriteValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  return streamWriteValue<cuuint32_t>(stream, addr, value, flags);
}

CUresult cuStreamWriteValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  return streamWriteValue<cuuint64_t>(stream, addr, value, flags);
}

// --- Earlier revisions ---------------------------------------------------------------------------

#define NCCLEMU_EXPORT extern "C" __attribute__((visibility("default")))

// The v1 stream memory operations work only where the kernel module enables them
// (CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, which reads 0 here, as by default).
#undef cuStreamWaitValue32
#undef cuStreamWaitValue64
#undef cuStreamWriteValue32
#undef cuStreamWriteValue64
NCCLEMU_EXPORT CUresult cuStreamWaitValue32(CUstream, CUdeviceptr, cuuint32_t, unsigned int) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
NCCLEMU_EXPORT CUresult cuStreamWaitValue64(CUstream, CUdeviceptr, cuuint64_t, unsigned int) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
NCCLEMU_EXPORT CUresult cuStreamWriteValue32(CUstream, CUdeviceptr, cuuint32_t, unsigned int) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
NCCLEMU_EXPORT CUresult cuStreamWriteValue64(CUstream, CUdeviceptr, cuuint64_t, unsigned int) {
  return CUDA_ERROR_NOT_SUPPORTED;
}

#undef cuMemHostRegister
NCCLEMU_EXPORT CUresult cuMemHostRegister(void* p, size_t bytesize, unsigned int Flags) {
  return cuMemHostRegister_v2(p, bytesize, Flags);
}
