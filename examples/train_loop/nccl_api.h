// The NCCL functions train_loop uses, reached through one table so that the same job code runs
// whichever way libnccl was loaded. The pointer types are those of the declarations in nccl.h.
#pragma once

#include <nccl.h>

#include <string_view>

struct NcclApi {
  decltype(&ncclGetVersion) getVersion;
  decltype(&ncclGetUniqueId) getUniqueId;
  decltype(&ncclCommInitRank) commInitRank;
  decltype(&ncclBroadcast) broadcast;
  decltype(&ncclAllReduce) allReduce;
  decltype(&ncclCommDestroy) commDestroy;
  decltype(&ncclGetErrorString) getErrorString;
  decltype(&ncclGetLastError) getLastError;
};

enum class NcclLoader { linked, dlopen, rtld_local };

std::string_view loader_name(NcclLoader loader);

// Whether this executable has libnccl among its NEEDED libraries (train_loop_linked) or loads it
// at run time (train_loop). Each loader runs in the executable built for it.
bool executable_links_nccl();

// Fills the table for `loader`; prints what went wrong and exits the process on failure.
NcclApi load_nccl(NcclLoader loader);

// The function the RTLD_LOCAL module exports, looked up by name with dlsym.
using FillNcclApiFn = void(NcclApi*);
inline constexpr const char* kModuleFillFunction = "train_nccl_module_api";
inline constexpr const char* kModuleFileName = "libtrain_nccl_module.so";
