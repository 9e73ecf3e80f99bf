// What one thread's NCCL calls share in the records (operations.cc): the groups it is inside,
// the operations and creations they defer to the outermost ncclGroupEnd, its thread id.
#pragma once

#include <cstdint>
#include <vector>

namespace ncclguard {

struct CommState;

namespace record {

// ncclGroupStart/End nest per thread; operations issued inside wait for the outermost end.
// Those ncclguard holds (in-process recovery) are not here: NCCL does not see them.
struct GroupedOperation {
  CommState* comm;
  std::uint64_t seq;
};
// Communicators created inside the group: NCCL creates them at its outermost end.
struct GroupedCreation {
  CommState* comm;
  int init_token;
};

// Plain data (no TLS constructor), reached once per entry point through ThisThread(): each use of
// a thread_local of a dlopen()ed library is a call into the loader (__tls_get_addr), one of the
// larger costs of a collective's few hundred instructions.
struct ThreadCalls {
  int group_depth;
  std::uint64_t group_id;
  std::int64_t thread_id;                   // 0 until asked
  std::vector<GroupedOperation>* grouped;   // this thread's, once it has used it
  std::vector<GroupedCreation>* creations;  // likewise
};

namespace internal {
// constinit: no dynamic initialisation, so other files reach it without the TLS wrapper's call.
extern constinit thread_local ThreadCalls t_thread_calls;
std::int64_t KernelThreadId() noexcept;
std::vector<GroupedOperation>& FirstGrouped(ThreadCalls& thread);
}  // namespace internal

// Inline, as every operation and group call asks.
inline ThreadCalls& ThisThread() noexcept { return internal::t_thread_calls; }
inline std::int64_t ThreadId(ThreadCalls& thread) noexcept {
  if (thread.thread_id == 0) [[unlikely]]
    thread.thread_id = internal::KernelThreadId();
  return thread.thread_id;
}
// The operations and the creations of the group the thread is inside; freed when it ends.
inline std::vector<GroupedOperation>& Grouped(ThreadCalls& thread) {
  return thread.grouped != nullptr ? *thread.grouped : internal::FirstGrouped(thread);
}
std::vector<GroupedCreation>& Creations(ThreadCalls& thread);

}  // namespace record
}  // namespace ncclguard
