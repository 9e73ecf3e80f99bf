// A profiler plugin for the emulated NCCL's tests: exports ncclProfiler_v5 ("emu-recorder") and
// reports every call to the test program (profiler_recorder.h). At each init it sets the
// activation mask to EMU_PROFILER_MASK (if set), and returns ncclInternalError from every call
// when EMU_PROFILER_ERRORS=1, so that a test sees NCCL go on regardless.
#include <dlfcn.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>

#include "profiler_recorder.h"

namespace {

using profilertest::CallKind;
using profilertest::RecordedCall;

struct Context {
  uint64_t id;
  int rank;
};

// Never freed: NCCL may name an event as a parent after its stop, and stop it again.
struct Event {
  uint64_t id;
  uint64_t type;
  const Context* context;
};

std::atomic<uint64_t> g_next_id{1};

void report(RecordedCall& call) {
  using Sink = void (*)(const RecordedCall*);
  static const auto sink = reinterpret_cast<Sink>(dlsym(RTLD_DEFAULT, "emuProfilerTestRecord"));
  call.thread = static_cast<pid_t>(syscall(SYS_gettid));
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  call.ns = static_cast<uint64_t>(now.tv_sec) * 1000000000ull + static_cast<uint64_t>(now.tv_nsec);
  if (sink != nullptr) sink(&call);
}

ncclResult_t outcome() {
  const char* errors = getenv("EMU_PROFILER_ERRORS");
  return errors != nullptr && errors[0] == '1' ? ncclInternalError : ncclSuccess;
}

uint64_t idOf(const void* event) { return event ? static_cast<const Event*>(event)->id : 0; }

void describe(RecordedCall& call, const Event* event) {
  if (event == nullptr) return;
  call.event = event->id;
  call.type = event->type;
  call.context = event->context ? event->context->id : 0;
  call.context_rank = event->context ? event->context->rank : -1;
}

ncclResult_t init(void** context, uint64_t comm_id, int* mask, const char* comm_name, int n_nodes, int nranks,
                  int rank, ncclProfilerLogger_t logger) {
  auto* created = new Context{g_next_id++, rank};
  *context = created;
  if (const char* wanted = getenv("EMU_PROFILER_MASK")) *mask = static_cast<int>(strtol(wanted, nullptr, 0));
  if (logger != nullptr)
    logger(3, 0x4000, __FILE__, __LINE__, "emu-recorder: init rank %d of %d", rank, nranks);
  RecordedCall call;
  call.kind = CallKind::Init;
  call.context = created->id;
  call.context_rank = rank;
  call.comm_id = comm_id;
  call.has_name = comm_name != nullptr;
  call.comm_name = comm_name ? comm_name : "";
  call.n_nodes = n_nodes;
  call.nranks = nranks;
  call.rank = rank;
  call.has_logger = logger != nullptr;
  report(call);
  return outcome();
}

ncclResult_t startEvent(void* context, void** handle, ncclProfilerEventDescr_t* descr) {
  const auto* owner = static_cast<const Context*>(context);
  auto* event = new Event{g_next_id++, descr->type, owner};
  *handle = event;
  RecordedCall call;
  call.kind = CallKind::Start;
  describe(call, event);
  call.parent = idOf(descr->parentObj);
  if (descr->type == ncclProfileColl) call.parent_group = idOf(descr->coll.parentGroup);
  if (descr->type == ncclProfileP2p) call.parent_group = idOf(descr->p2p.parentGroup);
  call.descr = *descr;
  report(call);
  return outcome();
}

ncclResult_t stopEvent(void* handle) {
  RecordedCall call;
  call.kind = CallKind::Stop;
  describe(call, static_cast<const Event*>(handle));
  report(call);
  return outcome();
}

ncclResult_t recordEventState(void* handle, ncclProfilerEventState_t state,
                              ncclProfilerEventStateArgs_t* args) {
  RecordedCall call;
  call.kind = CallKind::State;
  describe(call, static_cast<const Event*>(handle));
  call.state = state;
  call.has_args = args != nullptr;
  if (args != nullptr) call.args = *args;
  report(call);
  return outcome();
}

ncclResult_t finalize(void* context) {
  const auto* owner = static_cast<const Context*>(context);
  RecordedCall call;
  call.kind = CallKind::Finalize;
  call.context = owner ? owner->id : 0;
  call.context_rank = owner ? owner->rank : -1;
  report(call);
  return outcome();
}

}  // namespace

extern "C" {
__attribute__((visibility("default")))
ncclProfiler_t ncclProfiler_v5 = {"emu-recorder", init, startEvent, stopEvent, recordEventState, finalize};
}  // extern "C"
