#include "watchdog/common/describe.h"

#include <nccl.h>

#include <iterator>
#include <string_view>

namespace ncclguard {

std::string_view ResultName(ncclResult_t result) {
  static constexpr std::string_view kNames[] = {
      "ncclSuccess",         "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
      "ncclInvalidArgument", "ncclInvalidUsage",       "ncclRemoteError", "ncclInProgress"};
  const int code = static_cast<int>(result);
  return code >= 0 && code < static_cast<int>(std::size(kNames)) ? kNames[code] : "ncclResult?";
}

}  // namespace ncclguard
