#pragma once

#include "watchdog/common/nccl_api.h"

namespace ncclguard::shim {

// The wrapper of `api` bound to the NCCL library in slot `library` (0: the exported function).
void* Wrapper(int library, Api api) noexcept;

}  // namespace ncclguard::shim
