// What the test profiler plugin (profiler_plugin.cc) tells the test program about every call the
// emulated NCCL makes into it. The plugin finds emuProfilerTestRecord in the program's global
// scope, so the records live in the program and outlive the plugin's unload.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "shim/nccl_profiler.h"

namespace profilertest {

enum class CallKind { Init, Start, Stop, State, Finalize };

struct RecordedCall {
  CallKind kind = CallKind::Init;
  // The plugin numbers its contexts and events from 1, once per process; 0 is "none".
  uint64_t context = 0;              // the context the call came with (Stop, State: the event's)
  int context_rank = -1;             // that communicator's rank: many descriptors leave `rank` at 0
  uint64_t event = 0;                // Start, Stop, State
  uint64_t type = 0;                 // the event's type (ncclProfileColl, ...)
  uint64_t parent = 0;               // Start: descr.parentObj's number
  uint64_t parent_group = 0;         // Start of Coll or P2p: parentGroup's number
  ncclProfilerEventDescr_t descr{};  // Start: as NCCL filled it (its strings are NCCL's literals)
  int state = -1;                    // State
  bool has_args = false;
  ncclProfilerEventStateArgs_t args{};
  // Init
  uint64_t comm_id = 0;
  bool has_name = false;
  std::string comm_name;
  int n_nodes = 0;
  int nranks = 0;
  int rank = -1;
  bool has_logger = false;
  pid_t thread = 0;
  uint64_t ns = 0;  // CLOCK_MONOTONIC (the emulated GPU's clock too) when the plugin was called
};

}  // namespace profilertest

// Exported by the test program (ENABLE_EXPORTS); the plugin reports nothing without it.
extern "C" void emuProfilerTestRecord(const profilertest::RecordedCall* call);
