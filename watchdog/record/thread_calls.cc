#include "watchdog/record/thread_calls.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

namespace ncclguard::record {
namespace {

thread_local ThreadCalls t_thread_calls;
// Touched only by grouped calls, through ThreadCalls' pointers; freed when the thread ends.
thread_local std::vector<GroupedOperation> t_grouped;
thread_local std::vector<GroupedCreation> t_grouped_creations;

}  // namespace

ThreadCalls& ThisThread() noexcept { return t_thread_calls; }

std::int64_t ThreadId(ThreadCalls& thread) noexcept {
  if (thread.thread_id == 0) thread.thread_id = syscall(SYS_gettid);
  return thread.thread_id;
}

std::vector<GroupedOperation>& Grouped(ThreadCalls& thread) {
  if (thread.grouped == nullptr) thread.grouped = &t_grouped;
  return *thread.grouped;
}

std::vector<GroupedCreation>& Creations(ThreadCalls& thread) {
  if (thread.creations == nullptr) thread.creations = &t_grouped_creations;
  return *thread.creations;
}

}  // namespace ncclguard::record
