// The core's door: everything the shim calls, and nothing else. Plain functions, no templates;
// sorting a call's arguments by type is the shim's (shim/calls.h). libncclguard.so's front end
// reaches them through one table (door_entries.h): a function added here is added there too.
//
// The shim decides nothing: whether ncclguard is on, what is logged and what a call means are
// settled behind these functions.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "watchdog/common/nccl_api.h"
#include "watchdog/common/operation_arguments.h"
#include "watchdog/common/profile_events.h"

namespace ncclguard {

class RealLibraries;
struct CommState;
struct ProbationOp;

// What the shim must do with a call, and what the After hook needs to know.
struct Ticket {
  bool forward = true;  // false: do not call NCCL, return `result` (the communicator is gone)
  Api api{};
  ncclResult_t result = ncclSuccess;
  CommState* comm = nullptr;
  std::uint64_t seq = 0;  // the operation recorded, 0 when none
  bool grouped = false;   // issued inside a group: launched at its outermost end
  int init_token = -1;
  std::int64_t start_ns = 0;
  char comm_id[17] = {};  // of the communicator being created
  // The library slot that is to serve the call instead of the wrapper's own (-1): lets the core
  // send a communicator's creation to another library instance.
  int slot = -1;
  ProbationOp* probation = nullptr;      // the operation is on probation: its stream is gated after it
  const ncclConfig_t* config = nullptr;  // of the communicator being created: the application's
};

// Every wrapper first turns each communicator it is given into the real one behind it, and the
// library slot to call: hooks::ResolveCommunicator, which leaves communicators as they are unless
// NCCLGUARD_RECOVER=inprocess hands out ncclguard's handles (common/in_process_recovery.h). The
// core only ever sees real communicators.

// How a communicator creation call identifies the new communicator.
struct CreationArguments {
  const ncclUniqueId* unique_id = nullptr;  // InitRank, InitRankConfig, InitRankScalable
  ncclComm_t parent = nullptr;              // Split, Shrink
  int color = 0;                            // Split
  const ncclConfig_t* config = nullptr;     // the Config and Scalable forms, Split, Shrink
  int rank = -1;
  int nranks = 0;
};

Ticket BeforeOperation(Api api, int library, const OperationArguments& arguments) noexcept;
void AfterOperation(const Ticket& ticket, ncclResult_t result) noexcept;

Ticket BeforeCreation(Api api, const CreationArguments& arguments) noexcept;
// `comms` are the communicators the call returned (several for ncclCommInitAll), created by the
// library in slot `library`. With NCCLGUARD_RECOVER=inprocess each is replaced, in place, by a
// handle of ncclguard's that stands for it (null stays null).
void AfterCreation(const Ticket& ticket, Api api, int library, ncclResult_t result, ncclComm_t* comms,
                   int count) noexcept;

// Group calls are always forwarded to NCCL.
void BeforeGroupCall(Api api) noexcept;
void AfterGroupCall(Api api, ncclResult_t result) noexcept;

// Any other call that names a communicator: refused when ncclguard aborted it.
Ticket BeforeCommCall(Api api, ncclComm_t comm) noexcept;
void AfterCommCall(Api api, ncclComm_t comm, ncclResult_t result) noexcept;
// The application's own ncclCommGetAsyncError: an error it returns is recorded as if the watchdog
// had found it.
void AfterAsyncErrorQuery(ncclComm_t comm, const ncclResult_t* async_error, ncclResult_t result) noexcept;

namespace hooks {

// True when NCCLGUARD_DISABLE asks for pure pass-through. Parses the configuration on first use
// and starts nothing.
bool Disabled() noexcept;

// Starts ncclguard on the first call (configuration, log), with `libraries` as the way to the real
// NCCL and CUDA functions, and says whether calls are to be reported. False when disabled, or when
// ncclguard could not start: it then said so once and every call is forwarded unchanged.
bool Active(RealLibraries& libraries) noexcept;

// A call made by NCCL itself while serving `outer` on this thread: forwarded, not reported as a
// call of its own (ncclBcast calling ncclBroadcast is one operation). Visible at trace level.
void NestedCall(Api api, Api outer) noexcept;

// The profiler plugin the user named in NCCL_PROFILER_PLUGIN before ncclguard pointed NCCL at its
// own (profiler_plugin.cc); "" when none. The shim loads it and forwards NCCL's events to it.
// Valid until ncclguard starts again (in a forked child). Plain characters, as every string the door
// returns: libncclguard.so's front end and its core may each have a C++ runtime of their own.
const char* ProfilerPluginOfUser() noexcept;
// What became of loading it: `opened` the library, `plugin_name` its plugin's name (nullptr when
// it has none of the structures `wanted` names, those of the version NCCL speaks), `error`
// dlerror()'s text. Logged once.
void ReportProfilerPluginOfUser(const std::string& name, const char* plugin_name, bool opened,
                                const char* wanted, const char* error) noexcept;

// NCCL's profiler events, as shim/profiler.cc passes them on: what ncclguard records of them
// (state/profiles.h). All noexcept, on NCCL's threads; a reference that a newer operation made stale
// is ignored.
namespace profiler {
// NCCL initialised its profiler for a communicator being created, rank `rank` of `nranks`: its
// profile, or nullptr when none is kept. `api_events`: NCCL's version of the plugin API sends Coll
// and P2p API events (version 5 and later), which tie its events to ncclguard's operations.
CommProfile* Open(int rank, int nranks, bool api_events) noexcept;
void Close(CommProfile* profile) noexcept;  // NCCL finalized it
// A Coll or P2p API event: on the application's thread, inside its call.
ProfileRef StartApi(CommProfile* profile, bool graph_captured) noexcept;
// A Coll or P2p event; `api` is its parent's.
ProfileRef StartOp(CommProfile* profile, const ProfiledOpStart& start, const ProfileRef& api) noexcept;
ProfileRef StartChannel(const ProfileRef& op, int channel, std::int64_t gpu_ns) noexcept;
void StopChannel(const ProfileRef& channel, std::int64_t gpu_ns) noexcept;
ProfileRef StartProxyOp(const ProfileRef& op, int channel, int peer, bool send, int steps) noexcept;
void StopProxyOp(const ProfileRef& proxy) noexcept;
ProfileRef StartStep(const ProfileRef& proxy, int step) noexcept;
// `bytes`: the step's size as NCCL gives it with the state (transSize), 0 when it gives none.
void SetStepWait(const ProfileRef& step, StepWait wait, std::size_t bytes) noexcept;
void StopStep(const ProfileRef& step) noexcept;
}  // namespace profiler

// Logs, once per function, that the library in slot `library` lacks it.
void ReportMissingFunction(Api api, int library) noexcept;

// Called at the start of every reported call: waits for ever once the watchdog is exiting the
// process (NCCLGUARD_ACTION=exit).
void WaitIfExiting() noexcept;

// The communicator NCCL must see for `comm`: `comm` itself unless NCCLGUARD_RECOVER=inprocess,
// which resolves ncclguard's handles (InProcessRecovery::Resolve), with `*library` set to the slot
// that serves it, after waiting out a recovery that re-points them.
ncclComm_t ResolveCommunicator(ncclComm_t comm, int* library) noexcept;
// Whether ResolveCommunicator does more than return `comm`: fixed once ncclguard has started.
bool ResolvesCommunicators() noexcept;

// NCCLGUARD_NCCL_LIBRARY: the NCCL library the user named, "" when none. Starts nothing.
const char* NcclLibraryOfUser() noexcept;
// Logs once, when the log exists, that the library the user named was not used, and why.
void ReportNcclLibraryProblem(const std::string& configured, const std::string& problem) noexcept;

// Around the real call: how many threads are inside NCCL, and in which function.
void EnterNccl(Api api) noexcept;
void LeaveNccl() noexcept;

// How much of each call the log wants: nothing, its name and result (debug), or its arguments too
// (trace). Fixed once ncclguard has started (the log's level is set then): the front end asks once.
enum class CallDetail { kNone, kName, kArguments };
CallDetail LoggedCallDetail() noexcept;
// `call` is the name, or "name(arguments)" when `detail` (what LoggedCallDetail said) asks for them.
void LogCall(CallDetail detail, const std::string& call, const std::string& returned) noexcept;

// An operation's or a group call's steps on each side of its real call, so that a call crosses the
// front end's door (door_entries.h) once on each side rather than once per step: WaitIfExiting,
// BeforeOperation (BeforeGroupCall), then EnterNccl unless the ticket says not to call NCCL; after
// the call, LeaveNccl and AfterOperation (AfterGroupCall). A group call is always forwarded.
Ticket EnterOperation(Api api, int library, const OperationArguments& arguments) noexcept;
void LeaveOperation(const Ticket& ticket, ncclResult_t result) noexcept;
void EnterGroupCall(Api api) noexcept;
void LeaveGroupCall(Api api, ncclResult_t result) noexcept;

}  // namespace hooks
}  // namespace ncclguard
