// The rest of the API: versions and error texts, memory, buffer and window registration, and
// user-defined (PreMulSum) reductions.
#include <cstring>

#include "api.h"
#include "comm.h"
#include "debug.h"

using namespace ncclemu;

// Registered windows are bookkeeping only: the emulated data path reads user buffers directly.
struct ncclWindow_vidmem {
  void* base;
  size_t size;
  int flags;
};

namespace {

struct Registration {
  void* base;
  size_t size;
};

template <class Handle>
ncclResult_t forget(ncclComm_t comm, Handle* handle, const char* caller) {
  ncclResult_t result = ncclSuccess;
  auto core = liveCore(comm, caller, &result);
  if (!core) return result;
  std::lock_guard<std::mutex> lock(core->mutex);
  if (handle == nullptr || core->registrations.erase(handle) == 0) {
    EMU_WARN("%s : handle %p is not registered with communicator %p", caller, static_cast<void*>(handle),
             static_cast<void*>(comm));
    return ncclInvalidArgument;
  }
  delete handle;
  return ncclSuccess;
}

}  // namespace

NCCL_EXPORT(ncclResult_t, ncclGetVersion, int* version);
ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) {
    EMU_WARN("ncclGetVersion : version argument is NULL");
    return ncclInvalidArgument;
  }
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

NCCL_EXPORT(const char*, ncclGetErrorString, ncclResult_t result);
const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

NCCL_EXPORT(const char*, ncclGetLastError, ncclComm_t comm);
const char* ncclGetLastError(ncclComm_t) { return lastErrorText(); }

NCCL_EXPORT(void, ncclResetDebugInit);
void ncclResetDebugInit() { resetDebugInit(); }

NCCL_EXPORT(ncclResult_t, ncclMemAlloc, void** ptr, size_t size);
ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  if (ptr == nullptr || size == 0) {
    EMU_WARN("ncclMemAlloc : invalid argument (ptr %p, size %zu)", static_cast<void*>(ptr), size);
    return ncclInvalidArgument;
  }
  CUdeviceptr device_ptr = 0;
  if (CUresult error = cuMemAlloc(&device_ptr, size); error != CUDA_SUCCESS) {
    const char* text = "unknown";
    cuGetErrorString(error, &text);
    EMU_WARN("Cuda failure '%s'", text);
    return ncclUnhandledCudaError;
  }
  *ptr = reinterpret_cast<void*>(device_ptr);
  return ncclSuccess;
}

NCCL_EXPORT(ncclResult_t, ncclMemFree, void* ptr);
ncclResult_t ncclMemFree(void* ptr) {
  if (ptr == nullptr) return ncclSuccess;
  if (CUresult error = cuMemFree(reinterpret_cast<CUdeviceptr>(ptr)); error != CUDA_SUCCESS) {
    const char* text = "unknown";
    cuGetErrorString(error, &text);
    EMU_WARN("Cuda failure '%s'", text);
    return ncclUnhandledCudaError;
  }
  return ncclSuccess;
}

NCCL_EXPORT(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void* buff, size_t size, void** handle);
ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  ncclResult_t result = ncclSuccess;
  auto core = liveCore(comm, "ncclCommRegister", &result);
  if (!core) return result;
  if (buff == nullptr || size == 0 || handle == nullptr) {
    EMU_WARN("ncclCommRegister : invalid argument (buff %p, size %zu, handle %p)", buff, size, static_cast<void*>(handle));
    return ncclInvalidArgument;
  }
  auto* registration = new Registration{buff, size};
  std::lock_guard<std::mutex> lock(core->mutex);
  core->registrations.insert(registration);
  *handle = registration;
  return ncclSuccess;
}

NCCL_EXPORT(ncclResult_t, ncclCommDeregister, const ncclComm_t comm, void* handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  return forget(comm, static_cast<Registration*>(handle), "ncclCommDeregister");
}

NCCL_EXPORT(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
            int winFlags);
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags) {
  ncclResult_t result = ncclSuccess;
  auto core = liveCore(comm, "ncclCommWindowRegister", &result);
  if (!core) return result;
  if (buff == nullptr || size == 0 || win == nullptr || (winFlags & ~NCCL_WIN_COLL_SYMMETRIC) != 0) {
    EMU_WARN("ncclCommWindowRegister : invalid argument (buff %p, size %zu, win %p, flags %d)", buff, size,
             static_cast<void*>(win), winFlags);
    return ncclInvalidArgument;
  }
  auto* window = new ncclWindow_vidmem{buff, size, winFlags};
  std::lock_guard<std::mutex> lock(core->mutex);
  core->registrations.insert(window);
  *win = window;
  return ncclSuccess;
}

NCCL_EXPORT(ncclResult_t, ncclCommWindowDeregister, ncclComm_t comm, ncclWindow_t win);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  return forget(comm, win, "ncclCommWindowDeregister");
}

NCCL_EXPORT(ncclResult_t, ncclRedOpCreatePreMulSum, ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
            ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  ncclResult_t result = ncclSuccess;
  auto core = liveCore(comm, "ncclRedOpCreatePreMulSum", &result);
  if (!core) return result;
  if (op == nullptr || scalar == nullptr || !isValidDatatype(datatype) ||
      (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)) {
    EMU_WARN("ncclRedOpCreatePreMulSum : invalid argument (op %p, scalar %p, datatype %d, residence %d)",
             static_cast<void*>(op), scalar, static_cast<int>(datatype), static_cast<int>(residence));
    return ncclInvalidArgument;
  }
  UserReduction user{datatype, Reduction{}};
  user.reduction.kind = ReduceKind::PreMulSum;
  // A host scalar is read now; a device scalar when each collective runs, as on the GPU.
  if (residence == ncclScalarHostImmediate) memcpy(user.reduction.scalar, scalar, datatypeSize(datatype));
  else user.reduction.device_scalar = scalar;
  std::lock_guard<std::mutex> lock(core->mutex);
  const int id = core->next_user_reduction++;
  core->user_reductions[id] = user;
  *op = static_cast<ncclRedOp_t>(id);
  return ncclSuccess;
}

NCCL_EXPORT(ncclResult_t, ncclRedOpDestroy, ncclRedOp_t op, ncclComm_t comm);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  ncclResult_t result = ncclSuccess;
  auto core = liveCore(comm, "ncclRedOpDestroy", &result);
  if (!core) return result;
  std::lock_guard<std::mutex> lock(core->mutex);
  if (core->user_reductions.erase(static_cast<int>(op)) == 0) {
    EMU_WARN("ncclRedOpDestroy : operation %d is not a user-defined reduction of communicator %p",
             static_cast<int>(op), static_cast<void*>(comm));
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}
