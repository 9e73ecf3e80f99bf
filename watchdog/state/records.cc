#include "watchdog/state/records.h"

#include <nccl.h>
#include <sys/mman.h>

#include <cstddef>
#include <memory>
#include <new>
#include <string>
#include <string_view>

#include "watchdog/common/nccl_api.h"

namespace ncclguard {

RingPointer MapRing(std::size_t size) {
  void* memory =
      mmap(nullptr, size * sizeof(OpRecord), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) throw std::bad_alloc();
  auto* ring = static_cast<OpRecord*>(memory);
  for (std::size_t i = 0; i < size; ++i) new (&ring[i]) OpRecord();
  return RingPointer(ring, RingUnmapper{size});
}

void RingUnmapper::operator()(OpRecord* ring) const noexcept {
  std::destroy_n(ring, size);
  munmap(ring, size * sizeof(OpRecord));
}

std::string_view OpStateName(OpState state) {
  static constexpr std::string_view kNames[] = {"free",   "enqueued", "started",  "completed",
                                                "failed", "aborted",  "captured", "untimed"};
  return kNames[static_cast<int>(state)];
}

std::string_view TimingSourceName(TimingSource source) {
  return source == TimingSource::kProfiler ? "profiler" : "cuda_events";
}

std::string_view CommLifecycleName(CommLifecycle lifecycle) {
  static constexpr std::string_view kNames[] = {"initializing", "ready",     "failed",   "aborted",
                                                "revoked",      "finalized", "destroyed"};
  return kNames[static_cast<int>(lifecycle)];
}

std::string_view OperationName(Api api) {
  if (api == Api::ncclBcast) return "Broadcast";
  std::string_view name = Describe(api).name;
  return name.substr(4);  // drop "nccl"
}

std::string_view DatatypeName(int datatype) {
  switch (datatype) {
    case ncclInt8:
      return "int8";
    case ncclUint8:
      return "uint8";
    case ncclInt32:
      return "int32";
    case ncclUint32:
      return "uint32";
    case ncclInt64:
      return "int64";
    case ncclUint64:
      return "uint64";
    case ncclFloat16:
      return "float16";
    case ncclFloat32:
      return "float32";
    case ncclFloat64:
      return "float64";
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    case ncclBfloat16:
      return "bfloat16";
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
    case ncclFloat8e4m3:
      return "float8_e4m3";
    case ncclFloat8e5m2:
      return "float8_e5m2";
#endif
    default:
      return "unknown";
  }
}

std::size_t DatatypeSize(int datatype) {
  switch (datatype) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    case ncclBfloat16:
      return 2;
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
#endif
    default:
      return 0;
  }
}

std::string ReductionName(int reduction) {
  switch (reduction) {
    case -1:
      return "";
    case ncclSum:
      return "sum";
    case ncclProd:
      return "prod";
    case ncclMax:
      return "max";
    case ncclMin:
      return "min";
    case ncclAvg:
      return "avg";
    default:
      return "premulsum#" + std::to_string(reduction);  // a user-created reduction
  }
}

}  // namespace ncclguard
