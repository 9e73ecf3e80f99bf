// Helpers for the emulated NCCL's tests: several ranks of one communicator in this process, each
// on its own device and stream, driven from one thread as a multi-GPU program would.
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace nccltest {

// Waits for a stream with a deadline: a stuck collective must fail a test, not hang it.
inline bool waitForStream(CUstream stream, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const CUresult state = cuStreamQuery(stream);
    if (state == CUDA_SUCCESS) return true;
    if (state != CUDA_ERROR_NOT_READY || std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

inline bool waitForAsyncResult(ncclComm_t comm, ncclResult_t wanted, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    ncclResult_t state = ncclInProgress;
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return false;
    if (state == wanted) return true;
    if (state != ncclInProgress || std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

class LocalRanks {
 public:
  // Devices and streams only; communicators come from initAll() or the test itself.
  explicit LocalRanks(int n) : contexts_(n), streams_(n), comms_(n, nullptr) {
    REQUIRE(cuInit(0) == CUDA_SUCCESS);
    for (int r = 0; r < n; ++r) {
      REQUIRE(cuDevicePrimaryCtxRetain(&contexts_[r], r) == CUDA_SUCCESS);
      REQUIRE(cuCtxSetCurrent(contexts_[r]) == CUDA_SUCCESS);
      REQUIRE(cuStreamCreate(&streams_[r], CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    }
  }

  ~LocalRanks() {
    for (int r = 0; r < size(); ++r) {
      if (comms_[r] != nullptr) ncclCommAbort(comms_[r]);
      cuCtxSetCurrent(contexts_[r]);
      waitForStream(streams_[r], std::chrono::seconds(10));
      cuStreamDestroy(streams_[r]);
    }
    for (auto& [rank, pointer] : allocations_) {
      cuCtxSetCurrent(contexts_[rank]);
      cuMemFree(pointer);
    }
    for (int r = 0; r < size(); ++r) cuDevicePrimaryCtxRelease(r);
    cuCtxSetCurrent(nullptr);
  }

  LocalRanks(const LocalRanks&) = delete;
  LocalRanks& operator=(const LocalRanks&) = delete;

  void initAll() { REQUIRE(ncclCommInitAll(comms_.data(), size(), nullptr) == ncclSuccess); }

  int size() const { return static_cast<int>(streams_.size()); }
  ncclComm_t& comm(int rank) { return comms_[rank]; }
  CUstream stream(int rank) const { return streams_[rank]; }
  void makeCurrent(int rank) const { REQUIRE(cuCtxSetCurrent(contexts_[rank]) == CUDA_SUCCESS); }
  CUcontext context(int rank) const { return contexts_[rank]; }

  // Device memory of the rank's GPU; the emulator's device pointers are host addresses.
  template <class T = char>
  T* allocate(int rank, size_t bytes) {
    makeCurrent(rank);
    CUdeviceptr pointer = 0;
    REQUIRE(cuMemAlloc(&pointer, bytes == 0 ? 1 : bytes) == CUDA_SUCCESS);
    allocations_.emplace_back(rank, pointer);
    return reinterpret_cast<T*>(pointer);
  }

  bool synchronize(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    for (int r = 0; r < size(); ++r) {
      if (!waitForStream(streams_[r], timeout)) return false;
    }
    return true;
  }

  // Destroys every communicator (they must be idle).
  void destroyAll() {
    for (ncclComm_t& comm : comms_) {
      if (comm != nullptr) REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
      comm = nullptr;
    }
  }

 private:
  std::vector<CUcontext> contexts_;
  std::vector<CUstream> streams_;
  std::vector<ncclComm_t> comms_;
  std::vector<std::pair<int, CUdeviceptr>> allocations_;
};

}  // namespace nccltest
