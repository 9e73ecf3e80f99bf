// NCCL loads one profiler plugin per process, the one NCCL_PROFILER_PLUGIN names, at its first
// communicator. ncclguard serves that API itself (shim/profiler.cc): before the first communicator
// it points the variable at its own library and keeps what the user had named there, whose plugin
// then gets every event through ncclguard's (hooks::ProfilerPluginOfUser).
#pragma once

#include <vector>

#include "watchdog/common/config.h"

namespace ncclguard {

struct NcclConfigFile;  // recover/p2p_policy.h

// Unless NCCLGUARD_PROFILER=0 or NCCL_PROFILER_PLUGIN=none, in the environment or else in NCCL's
// config files (`nccl_config_files`, as ReadNcclConfigFiles read them). Called once, at
// ncclguard's start on the first NCCL call.
void PointNcclAtOwnProfiler(const Config& config, const std::vector<NcclConfigFile>& nccl_config_files);

}  // namespace ncclguard
