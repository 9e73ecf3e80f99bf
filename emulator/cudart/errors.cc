// cudaGetErrorName / cudaGetErrorString for every cudaError_t of driver_types.h (13.0), and the
// thread's last error.
#pragma GCC visibility push(default)
#include <cuda_runtime_api.h>
#pragma GCC visibility pop

#include "runtime_state.h"

namespace {

struct RuntimeError {
  cudaError_t code;
  const char* name;
};

// The name is spelled through the preprocessor so that it always matches the enumerator.
#define NCCLEMU_RUNTIME_ERROR(code) {code, #code}
constexpr RuntimeError kErrors[] = {
    NCCLEMU_RUNTIME_ERROR(cudaSuccess),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidValue),
    NCCLEMU_RUNTIME_ERROR(cudaErrorMemoryAllocation),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInitializationError),
    NCCLEMU_RUNTIME_ERROR(cudaErrorCudartUnloading),
    NCCLEMU_RUNTIME_ERROR(cudaErrorProfilerDisabled),
    NCCLEMU_RUNTIME_ERROR(cudaErrorProfilerNotInitialized),
    NCCLEMU_RUNTIME_ERROR(cudaErrorProfilerAlreadyStarted),
    NCCLEMU_RUNTIME_ERROR(cudaErrorProfilerAlreadyStopped),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidConfiguration),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidPitchValue),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidSymbol),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidHostPointer),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidDevicePointer),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidTexture),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidTextureBinding),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidChannelDescriptor),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidMemcpyDirection),
    NCCLEMU_RUNTIME_ERROR(cudaErrorAddressOfConstant),
    NCCLEMU_RUNTIME_ERROR(cudaErrorTextureFetchFailed),
    NCCLEMU_RUNTIME_ERROR(cudaErrorTextureNotBound),
    NCCLEMU_RUNTIME_ERROR(cudaErrorSynchronizationError),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidFilterSetting),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidNormSetting),
    NCCLEMU_RUNTIME_ERROR(cudaErrorMixedDeviceExecution),
    NCCLEMU_RUNTIME_ERROR(cudaErrorNotYetImplemented),
    NCCLEMU_RUNTIME_ERROR(cudaErrorMemoryValueTooLarge),
    NCCLEMU_RUNTIME_ERROR(cudaErrorStubLibrary),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInsufficientDriver),
    NCCLEMU_RUNTIME_ERROR(cudaErrorCallRequiresNewerDriver),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidSurface),
    NCCLEMU_RUNTIME_ERROR(cudaErrorDuplicateVariableName),
    NCCLEMU_RUNTIME_ERROR(cudaErrorDuplicateTextureName),
    NCCLEMU_RUNTIME_ERROR(cudaErrorDuplicateSurfaceName),
    NCCLEMU_RUNTIME_ERROR(cudaErrorDevicesUnavailable),
    NCCLEMU_RUNTIME_ERROR(cudaErrorIncompatibleDriverContext),
    NCCLEMU_RUNTIME_ERROR(cudaErrorMissingConfiguration),
    NCCLEMU_RUNTIME_ERROR(cudaErrorPriorLaunchFailure),
    NCCLEMU_RUNTIME_ERROR(cudaErrorLaunchMaxDepthExceeded),
    NCCLEMU_RUNTIME_ERROR(cudaErrorLaunchFileScopedTex),
    NCCLEMU_RUNTIME_ERROR(cudaErrorLaunchFileScopedSurf),
    NCCLEMU_RUNTIME_ERROR(cudaErrorSyncDepthExceeded),
    NCCLEMU_RUNTIME_ERROR(cudaErrorLaunchPendingCountExceeded),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidDeviceFunction),
    NCCLEMU_RUNTIME_ERROR(cudaErrorNoDevice),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidDevice),
    NCCLEMU_RUNTIME_ERROR(cudaErrorDeviceNotLicensed),
    NCCLEMU_RUNTIME_ERROR(cudaErrorSoftwareValidityNotEstablished),
    NCCLEMU_RUNTIME_ERROR(cudaErrorStartupFailure),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidKernelImage),
    NCCLEMU_RUNTIME_ERROR(cudaErrorDeviceUninitialized),
    NCCLEMU_RUNTIME_ERROR(cudaErrorMapBufferObjectFailed),
    NCCLEMU_RUNTIME_ERROR(cudaErrorUnmapBufferObjectFailed),
    NCCLEMU_RUNTIME_ERROR(cudaErrorArrayIsMapped),
    NCCLEMU_RUNTIME_ERROR(cudaErrorAlreadyMapped),
    NCCLEMU_RUNTIME_ERROR(cudaErrorNoKernelImageForDevice),
    NCCLEMU_RUNTIME_ERROR(cudaErrorAlreadyAcquired),
    NCCLEMU_RUNTIME_ERROR(cudaErrorNotMapped),
    NCCLEMU_RUNTIME_ERROR(cudaErrorNotMappedAsArray),
    NCCLEMU_RUNTIME_ERROR(cudaErrorNotMappedAsPointer),
    NCCLEMU_RUNTIME_ERROR(cudaErrorECCUncorrectable),
    NCCLEMU_RUNTIME_ERROR(cudaErrorUnsupportedLimit),
    NCCLEMU_RUNTIME_ERROR(cudaErrorDeviceAlreadyInUse),
    NCCLEMU_RUNTIME_ERROR(cudaErrorPeerAccessUnsupported),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidPtx),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidGraphicsContext),
    NCCLEMU_RUNTIME_ERROR(cudaErrorNvlinkUncorrectable),
    NCCLEMU_RUNTIME_ERROR(cudaErrorJitCompilerNotFound),
    NCCLEMU_RUNTIME_ERROR(cudaErrorUnsupportedPtxVersion),
    NCCLEMU_RUNTIME_ERROR(cudaErrorJitCompilationDisabled),
    NCCLEMU_RUNTIME_ERROR(cudaErrorUnsupportedExecAffinity),
    NCCLEMU_RUNTIME_ERROR(cudaErrorUnsupportedDevSideSync),
    NCCLEMU_RUNTIME_ERROR(cudaErrorContained),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidSource),
    NCCLEMU_RUNTIME_ERROR(cudaErrorFileNotFound),
    NCCLEMU_RUNTIME_ERROR(cudaErrorSharedObjectSymbolNotFound),
    NCCLEMU_RUNTIME_ERROR(cudaErrorSharedObjectInitFailed),
    NCCLEMU_RUNTIME_ERROR(cudaErrorOperatingSystem),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidResourceHandle),
    NCCLEMU_RUNTIME_ERROR(cudaErrorIllegalState),
    NCCLEMU_RUNTIME_ERROR(cudaErrorLossyQuery),
    NCCLEMU_RUNTIME_ERROR(cudaErrorSymbolNotFound),
    NCCLEMU_RUNTIME_ERROR(cudaErrorNotReady),
    NCCLEMU_RUNTIME_ERROR(cudaErrorIllegalAddress),
    NCCLEMU_RUNTIME_ERROR(cudaErrorLaunchOutOfResources),
    NCCLEMU_RUNTIME_ERROR(cudaErrorLaunchTimeout),
    NCCLEMU_RUNTIME_ERROR(cudaErrorLaunchIncompatibleTexturing),
    NCCLEMU_RUNTIME_ERROR(cudaErrorPeerAccessAlreadyEnabled),
    NCCLEMU_RUNTIME_ERROR(cudaErrorPeerAccessNotEnabled),
    NCCLEMU_RUNTIME_ERROR(cudaErrorSetOnActiveProcess),
    NCCLEMU_RUNTIME_ERROR(cudaErrorContextIsDestroyed),
    NCCLEMU_RUNTIME_ERROR(cudaErrorAssert),
    NCCLEMU_RUNTIME_ERROR(cudaErrorTooManyPeers),
    NCCLEMU_RUNTIME_ERROR(cudaErrorHostMemoryAlreadyRegistered),
    NCCLEMU_RUNTIME_ERROR(cudaErrorHostMemoryNotRegistered),
    NCCLEMU_RUNTIME_ERROR(cudaErrorHardwareStackError),
    NCCLEMU_RUNTIME_ERROR(cudaErrorIllegalInstruction),
    NCCLEMU_RUNTIME_ERROR(cudaErrorMisalignedAddress),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidAddressSpace),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidPc),
    NCCLEMU_RUNTIME_ERROR(cudaErrorLaunchFailure),
    NCCLEMU_RUNTIME_ERROR(cudaErrorCooperativeLaunchTooLarge),
    NCCLEMU_RUNTIME_ERROR(cudaErrorTensorMemoryLeak),
    NCCLEMU_RUNTIME_ERROR(cudaErrorNotPermitted),
    NCCLEMU_RUNTIME_ERROR(cudaErrorNotSupported),
    NCCLEMU_RUNTIME_ERROR(cudaErrorSystemNotReady),
    NCCLEMU_RUNTIME_ERROR(cudaErrorSystemDriverMismatch),
    NCCLEMU_RUNTIME_ERROR(cudaErrorCompatNotSupportedOnDevice),
    NCCLEMU_RUNTIME_ERROR(cudaErrorMpsConnectionFailed),
    NCCLEMU_RUNTIME_ERROR(cudaErrorMpsRpcFailure),
    NCCLEMU_RUNTIME_ERROR(cudaErrorMpsServerNotReady),
    NCCLEMU_RUNTIME_ERROR(cudaErrorMpsMaxClientsReached),
    NCCLEMU_RUNTIME_ERROR(cudaErrorMpsMaxConnectionsReached),
    NCCLEMU_RUNTIME_ERROR(cudaErrorMpsClientTerminated),
    NCCLEMU_RUNTIME_ERROR(cudaErrorCdpNotSupported),
    NCCLEMU_RUNTIME_ERROR(cudaErrorCdpVersionMismatch),
    NCCLEMU_RUNTIME_ERROR(cudaErrorStreamCaptureUnsupported),
    NCCLEMU_RUNTIME_ERROR(cudaErrorStreamCaptureInvalidated),
    NCCLEMU_RUNTIME_ERROR(cudaErrorStreamCaptureMerge),
    NCCLEMU_RUNTIME_ERROR(cudaErrorStreamCaptureUnmatched),
    NCCLEMU_RUNTIME_ERROR(cudaErrorStreamCaptureUnjoined),
    NCCLEMU_RUNTIME_ERROR(cudaErrorStreamCaptureIsolation),
    NCCLEMU_RUNTIME_ERROR(cudaErrorStreamCaptureImplicit),
    NCCLEMU_RUNTIME_ERROR(cudaErrorCapturedEvent),
    NCCLEMU_RUNTIME_ERROR(cudaErrorStreamCaptureWrongThread),
    NCCLEMU_RUNTIME_ERROR(cudaErrorTimeout),
    NCCLEMU_RUNTIME_ERROR(cudaErrorGraphExecUpdateFailure),
    NCCLEMU_RUNTIME_ERROR(cudaErrorExternalDevice),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidClusterSize),
    NCCLEMU_RUNTIME_ERROR(cudaErrorFunctionNotLoaded),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidResourceType),
    NCCLEMU_RUNTIME_ERROR(cudaErrorInvalidResourceConfiguration),
    NCCLEMU_RUNTIME_ERROR(cudaErrorUnknown),
};
#undef NCCLEMU_RUNTIME_ERROR

// The runtime's own texts, for codes the driver has no number for; every other code reads as
// the driver's error of the same number does.
struct RuntimeText {
  cudaError_t code;
  const char* text;
};
constexpr RuntimeText kRuntimeTexts[] = {
    {cudaErrorMissingConfiguration, "__global__ function call is not configured"},
    {cudaErrorInvalidConfiguration, "invalid configuration argument"},
    {cudaErrorInvalidPitchValue, "invalid pitch argument"},
    {cudaErrorInvalidSymbol, "invalid device symbol"},
    {cudaErrorInvalidHostPointer, "invalid host pointer"},
    {cudaErrorInvalidDevicePointer, "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy"},
    {cudaErrorInvalidDeviceFunction, "invalid device function"},
};

const char* nameOf(cudaError_t error) {
  for (const RuntimeError& entry : kErrors) {
    if (entry.code == error) return entry.name;
  }
  return nullptr;
}

}  // namespace

const char* cudaGetErrorName(cudaError_t error) {
  const char* name = nameOf(error);
  return name != nullptr ? name : "unrecognized error code";
}

const char* cudaGetErrorString(cudaError_t error) {
  for (const RuntimeText& entry : kRuntimeTexts) {
    if (entry.code == error) return entry.text;
  }
  const char* text = nullptr;
  if (nameOf(error) != nullptr && cuGetErrorString(static_cast<CUresult>(error), &text) == CUDA_SUCCESS) return text;
  return "unrecognized error code";
}

cudaError_t cudaGetLastError() { return cudartemu::takeLastError(); }

cudaError_t cudaPeekAtLastError() { return cudartemu::peekLastError(); }
