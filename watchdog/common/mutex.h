// std::mutex with clang's thread-safety annotations: members marked ABSL_GUARDED_BY(mutex_) are
// checked at compile time by the clang build of scripts/check-static.sh. Same object and same fork
// behaviour as std::mutex (a child may construct one anew in place).
#pragma once

#include <mutex>

#include "absl/base/thread_annotations.h"

namespace ncclguard {

class ABSL_LOCKABLE Mutex {
 public:
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mutex_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { mutex_.unlock(); }

 private:
  std::mutex mutex_;
};

// Holds `mutex` for the scope. A std::condition_variable_any waits on the Mutex itself.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) ABSL_EXCLUSIVE_LOCK_FUNCTION(mutex) : mutex_(mutex) { mutex_.lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mutex_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mutex_;
};

}  // namespace ncclguard
