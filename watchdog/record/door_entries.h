// The door of hooks.h as one table of function pointers. libncclguard.so's front end carries only
// the shim; it loads the core (libncclguard-core.so, which needs Abseil, simdjson and the rest) at
// the first NCCL call and reaches it through this table alone, so that a process that never calls
// NCCL maps nothing but the front end and the C and C++ runtimes. The table and the front end's
// trampolines (shim/door.cc) are both generated from the list below: a door function is one line.
#pragma once

#include <cstdint>
#include <string_view>

#include "watchdog/record/hooks.h"

// X(field, function, result, parameters, arguments, without_core): `function` is the name in
// namespace ncclguard, `without_core` what the front end returns when the core cannot be loaded
// (empty for void): what makes it forward every call unchanged. A signature that differs from the
// declaration in hooks.h does not compile.
// clang-format off
#define NCCLGUARD_FOR_EACH_DOOR_FUNCTION(X)                                                                  \
  X(before_creation, BeforeCreation, Ticket, (Api api, const CreationArguments& arguments),                  \
    (api, arguments), Ticket{})                                                                              \
  X(after_creation, AfterCreation, void,                                                                     \
    (const Ticket& ticket, Api api, int library, ncclResult_t result, ncclComm_t* comms, int count),         \
    (ticket, api, library, result, comms, count), )                                                          \
  X(before_comm_call, BeforeCommCall, Ticket, (Api api, ncclComm_t comm), (api, comm), Ticket{})             \
  X(after_comm_call, AfterCommCall, void, (Api api, ncclComm_t comm, ncclResult_t result),                   \
    (api, comm, result), )                                                                                   \
  X(after_async_error_query, AfterAsyncErrorQuery, void,                                                     \
    (ncclComm_t comm, const ncclResult_t* async_error, ncclResult_t result), (comm, async_error, result), )  \
  X(disabled, hooks::Disabled, bool, (), (), true)                                                           \
  X(active, hooks::Active, bool, (RealLibraries& libraries), (libraries), false)                             \
  X(resolve_communicator, hooks::ResolveCommunicator, ncclComm_t, (ncclComm_t comm, int* library),           \
    (comm, library), comm)                                                                                   \
  X(resolves_communicators, hooks::ResolvesCommunicators, bool, (), (), false)                              \
  X(nested_call, hooks::NestedCall, void, (Api api, Api outer), (api, outer), )                              \
  X(nccl_library_of_user, hooks::NcclLibraryOfUser, const char*, (), (), "")                                 \
  X(report_nccl_library_problem, hooks::ReportNcclLibraryProblem, void,                                      \
    (const std::string& configured, const std::string& problem), (configured, problem), )                    \
  X(profiler_plugin_of_user, hooks::ProfilerPluginOfUser, const char*, (), (), "")                           \
  X(report_profiler_plugin_of_user, hooks::ReportProfilerPluginOfUser, void,                                 \
    (const std::string& name, const char* plugin_name, bool opened, const char* wanted, const char* error),  \
    (name, plugin_name, opened, wanted, error), )                                                            \
  X(profiler_open, hooks::profiler::Open, CommProfile*, (int rank, int nranks, bool api_events),            \
    (rank, nranks, api_events), nullptr)                                                                     \
  X(profiler_close, hooks::profiler::Close, void, (CommProfile* profile), (profile), )                       \
  X(profiler_start_api, hooks::profiler::StartApi, ProfileRef, (CommProfile* profile, bool graph_captured),  \
    (profile, graph_captured), ProfileRef{})                                                                 \
  X(profiler_start_op, hooks::profiler::StartOp, ProfileRef,                                                 \
    (CommProfile* profile, const ProfiledOpStart& start, const ProfileRef& api), (profile, start, api),      \
    ProfileRef{})                                                                                            \
  X(profiler_start_channel, hooks::profiler::StartChannel, ProfileRef,                                       \
    (const ProfileRef& op, int channel, std::int64_t gpu_ns), (op, channel, gpu_ns), ProfileRef{})           \
  X(profiler_stop_channel, hooks::profiler::StopChannel, void,                                               \
    (const ProfileRef& channel, std::int64_t gpu_ns), (channel, gpu_ns), )                                   \
  X(profiler_start_proxy_op, hooks::profiler::StartProxyOp, ProfileRef,                                      \
    (const ProfileRef& op, int channel, int peer, bool send, int steps), (op, channel, peer, send, steps),   \
    ProfileRef{})                                                                                            \
  X(profiler_stop_proxy_op, hooks::profiler::StopProxyOp, void, (const ProfileRef& proxy), (proxy), )        \
  X(profiler_start_step, hooks::profiler::StartStep, ProfileRef, (const ProfileRef& proxy, int step),        \
    (proxy, step), ProfileRef{})                                                                             \
  X(profiler_set_step_wait, hooks::profiler::SetStepWait, void,                                              \
    (const ProfileRef& step, StepWait wait, std::size_t bytes), (step, wait, bytes), )                                                                                          \
  X(profiler_stop_step, hooks::profiler::StopStep, void, (const ProfileRef& step), (step), )                 \
  X(report_missing_function, hooks::ReportMissingFunction, void, (Api api, int library), (api, library), )   \
  X(wait_if_exiting, hooks::WaitIfExiting, void, (), (), )                                                   \
  X(enter_nccl, hooks::EnterNccl, void, (Api api), (api), )                                                  \
  X(leave_nccl, hooks::LeaveNccl, void, (), (), )                                                            \
  X(logged_call_detail, hooks::LoggedCallDetail, hooks::CallDetail, (), (), hooks::CallDetail::kNone)        \
  X(log_call, hooks::LogCall, void,                                                                          \
    (hooks::CallDetail detail, const std::string& call, const std::string& returned),                        \
    (detail, call, returned), )                                                                              \
  X(enter_operation, hooks::EnterOperation, Ticket,                                                          \
    (Api api, int library, const OperationArguments& arguments), (api, library, arguments), Ticket{})        \
  X(leave_operation, hooks::LeaveOperation, void, (const Ticket& ticket, ncclResult_t result),               \
    (ticket, result), )                                                                                      \
  X(enter_group_call, hooks::EnterGroupCall, void, (Api api), (api), )                                       \
  X(leave_group_call, hooks::LeaveGroupCall, void, (Api api, ncclResult_t result), (api, result), )
// clang-format on

namespace ncclguard {

// What the core exports under kDoorEntriesSymbol, and nothing else.
struct DoorEntries {
  std::uint64_t abi;  // DoorAbi() of the build that made the core
// NOLINTBEGIN(bugprone-macro-parentheses): `field` is a member's name.
#define NCCLGUARD_DOOR_FIELD(field, function, result, parameters, arguments, without_core) \
  decltype(&::ncclguard::function) field;
  NCCLGUARD_FOR_EACH_DOOR_FUNCTION(NCCLGUARD_DOOR_FIELD)
#undef NCCLGUARD_DOOR_FIELD
  // NOLINTEND(bugprone-macro-parentheses)
};

inline constexpr char kDoorEntriesSymbol[] = "ncclguard_core_entries";

// Changes with the list's text and the sizes of what crosses the door, so that a front end never
// calls a core of another build whose door differs (a half-updated installation).
constexpr std::uint64_t DoorAbi() {
#define NCCLGUARD_DOOR_TEXT(field, function, result, parameters, arguments, without_core) \
#field " " #result " " #parameters ";"
  constexpr std::string_view kText = NCCLGUARD_FOR_EACH_DOOR_FUNCTION(NCCLGUARD_DOOR_TEXT);
#undef NCCLGUARD_DOOR_TEXT
  std::uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a (common/fnv1a.h), here at compile time
  auto mix = [&hash](std::uint64_t byte) {
    hash ^= byte;
    hash *= 0x100000001b3ULL;
  };
  for (const char c : kText) mix(static_cast<unsigned char>(c));
  for (const std::uint64_t size : {sizeof(DoorEntries), sizeof(Ticket), sizeof(OperationArguments),
                                   sizeof(CreationArguments), sizeof(ProfileRef), sizeof(ProfiledOpStart)}) {
    mix(size);
  }
  return hash;
}

}  // namespace ncclguard
