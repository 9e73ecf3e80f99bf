#include "watchdog/record/thread_calls.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

namespace ncclguard::record {

constinit thread_local ThreadCalls internal::t_thread_calls{};

namespace {

// Touched only by grouped calls, through ThreadCalls' pointers; freed when the thread ends.
thread_local std::vector<GroupedOperation> t_grouped;
thread_local std::vector<GroupedCreation> t_grouped_creations;

}  // namespace

std::int64_t internal::KernelThreadId() noexcept { return syscall(SYS_gettid); }

std::vector<GroupedOperation>& internal::FirstGrouped(ThreadCalls& thread) {
  thread.grouped = &t_grouped;
  return *thread.grouped;
}

std::vector<GroupedCreation>& Creations(ThreadCalls& thread) {
  if (thread.creations == nullptr) thread.creations = &t_grouped_creations;
  return *thread.creations;
}

}  // namespace ncclguard::record
