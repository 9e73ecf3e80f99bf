// What NCCL says of a registered communicator (see registration.h).
#include "watchdog/state/registration.h"

#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "watchdog/common/config.h"
#include "watchdog/common/describe.h"
#include "watchdog/common/libraries.h"
#include "watchdog/common/log.h"
#include "watchdog/common/nccl_api.h"
#include "watchdog/state/profiles.h"
#include "watchdog/state/records.h"

namespace ncclguard {
namespace {

// Links the communicator to NCCL's profile of it and chooses its timing source (records.h): the
// profiler where NCCL profiles its calls, and says which, once. Before the application's first
// operation on it: NCCL has initialised its profiler by the time its creation completes.
void ChooseTimingSource(CommState& comm) {
  const CommProfile* profile = GetProfileTable().Link(comm);
  const char* why_not = nullptr;
  if (profile == nullptr) {
    why_not = GetConfig().profiler ? "NCCL did not open ncclguard's profiler for it" : "NCCLGUARD_PROFILER=0";
  } else if (!profile->api_events()) {
    why_not = "this NCCL's profiler API (version 4) has no API events";
  } else if (comm.nranks.load(std::memory_order_relaxed) <= 1) {
    why_not = "NCCL profiles no operation of a one-rank communicator";
  } else if (GetConfig().recover == RecoverMode::kInProcess) {
    why_not = "NCCLGUARD_RECOVER=inprocess holds operations on their streams";
  }
  const TimingSource source = why_not == nullptr ? TimingSource::kProfiler : TimingSource::kCudaEvents;
  comm.timing.store(source, std::memory_order_release);
  if (why_not == nullptr) {
    log::Info("comm {}: operations timed by NCCL's profiler (kernel channels, GPU timestamps)", comm.id);
  } else {
    log::Info("comm {}: operations timed by CUDA events ({})", comm.id, why_not);
  }
}

}  // namespace

bool CompleteRegistration(CommState& comm, std::int64_t steady_now_ns) noexcept {
  // Once: the application's thread (blocking init) or the watchdog (non-blocking) may get here.
  CommLifecycle initializing = CommLifecycle::kInitializing;
  if (!comm.lifecycle.compare_exchange_strong(initializing, CommLifecycle::kReady,
                                              std::memory_order_acq_rel)) {
    return false;
  }
  // The function's type comes from nccl.h; only NCCL's own function (of the comm's library) is called.
  auto query = [&comm](Api api, auto type, std::atomic<int>& field) {
    using Function = typename decltype(type)::type;
    int value = -1;
    // As its wrapper calls it: the library's calls of its own functions reach that library.
    const ncclResult_t result = CallRealNccl(comm.library.load(), api, [&](void* function) {
      return reinterpret_cast<Function>(function)(comm.handle.load(), &value);
    });
    if (result == ncclSuccess) field.store(value, std::memory_order_relaxed);
  };
  query(Api::ncclCommUserRank, std::type_identity<decltype(&::ncclCommUserRank)>{}, comm.rank);
  query(Api::ncclCommCount, std::type_identity<decltype(&::ncclCommCount)>{}, comm.nranks);
  query(Api::ncclCommCuDevice, std::type_identity<decltype(&::ncclCommCuDevice)>{}, comm.device);
  if (comm.init_end_ns.load(std::memory_order_acquire) == 0)
    comm.init_end_ns.store(steady_now_ns, std::memory_order_release);
  if (comm.parent_id[0] == '\0') log::SetRank(comm.rank.load(std::memory_order_relaxed));
  ChooseTimingSource(comm);
  const int version = Real().Version(comm.library.load());
  log::Info("comm {} rank {}/{} on device {} created by {} in {:.1f} ms through NCCL {}.{}.{} at {}", comm.id,
            comm.rank.load(), comm.nranks.load(), comm.device.load(), Describe(comm.created_by).name,
            static_cast<double>(comm.init_end_ns.load() - comm.init_start_ns) / 1e6, version / 10000,
            version / 100 % 100, version % 100, Real().Path(comm.library.load()));
  return true;
}

bool RecordAsyncError(CommState& comm, ncclResult_t error) noexcept {
  int known = comm.async_error.load(std::memory_order_acquire);
  while (!IsNcclError(static_cast<ncclResult_t>(known))) {
    if (comm.async_error.compare_exchange_weak(known, error, std::memory_order_acq_rel))
      return IsNcclError(error);
  }
  return false;
}

}  // namespace ncclguard
