// NCCL loads one profiler plugin per process, the one NCCL_PROFILER_PLUGIN names, at its first
// communicator. ncclguard serves that API itself (shim/profiler.cc): before the first communicator
// it points the variable at its own library and keeps what the user had named there, whose plugin
// then gets every event through ncclguard's (hooks::ProfilerPluginOfUser).
#pragma once

#include "watchdog/common/config.h"

namespace ncclguard {

// Unless NCCLGUARD_PROFILER=0 or NCCL_PROFILER_PLUGIN=none. Called once, at ncclguard's start on
// the first NCCL call.
void PointNcclAtOwnProfiler(const Config& config);

}  // namespace ncclguard
