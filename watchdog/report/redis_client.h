// The Redis job board's client (job_board_redis.cc): one connection per board, hiredis loaded
// privately at its first use, the credentials of NCCLGUARD_STORE_AUTH_FILE sent at each connection,
// and every way the server can fail or refuse the board said once at WARN, and again when it works.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "watchdog/common/mutex.h"
#include "watchdog/report/job_board.h"

struct redisContext;  // NOLINT(readability-identifier-naming): hiredis's own name

namespace ncclguard {

using RedisCommand = std::vector<std::string>;

// One reply, copied out of hiredis's (so that nothing of hiredis outlives the lock).
struct RedisReply {
  enum class Type { kString, kInteger, kArray, kNil, kStatus, kError };
  Type type = Type::kNil;
  std::string text;  // string, status or error
  long long integer = 0;
  std::vector<RedisReply> elements;
};

// What NCCLGUARD_STORE_AUTH_FILE holds: the password alone (requirepass, the `default` user), or
// an ACL user and its password, one per line. The file must be a regular file of the process's
// user that nobody else may read (mode 0600): a readable one would hand the board to everyone.
struct RedisCredentials {
  std::string user;  // empty: the `default` user
  std::string password;
};
absl::StatusOr<RedisCredentials> ReadRedisCredentials(const std::string& path);

// One connection to Redis, shared by the process's threads one command batch at a time. A Redis
// that fails is left alone for a while (doubling up to kLastRetry): meanwhile every call answers
// Unavailable at once, so that the watchdog keeps its pace. A server that refuses the board
// (NOAUTH, WRONGPASS: the connection is closed and tried again, the credentials file read anew;
// NOPERM, WRONGTYPE: the replies stand) is said at WARN once per process, whichever of its
// connections met it, and so is its return.
class RedisConnection {
 public:
  explicit RedisConnection(RedisAddress address);
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;
  ~RedisConnection();

  // Sends `commands` in one round trip (pipelined) and returns their replies in order. An error
  // reply of one command is its reply, not a failure of the batch.
  absl::StatusOr<std::vector<RedisReply>> Run(const std::vector<RedisCommand>& commands);

  // Sends `rounds` of pipelined commands, each round before the replies of the one before are taken
  // in, so that Redis answers one round while this process handles the last. `take(round, replies)`
  // gets each round's replies in order, and returns false to stop there (the round already sent is
  // read and dropped). A failure is returned after `take` had the rounds before it. The connection
  // is held throughout (a round is always in flight): the process's other calls wait, within the
  // caller's deadline and each round's command timeout.
  absl::Status RunRounds(const std::vector<std::vector<RedisCommand>>& rounds,
                         const std::function<bool(std::size_t, std::vector<RedisReply>&)>& take);

 private:
  absl::Status QueueLocked(const std::vector<RedisCommand>& commands) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::StatusOr<std::vector<RedisReply>> RepliesLocked(std::size_t count)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status AnswersLocked(const std::vector<RedisReply>& replies) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status ConnectLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status StartTlsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::StatusOr<RedisReply> CommandLocked(const RedisCommand& command) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status AuthenticateLocked(RedisCredentials credentials) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status SelectLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status FailLocked(const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status NoteFailureLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const RedisAddress address_;
  Mutex mutex_;
  redisContext* context_ ABSL_GUARDED_BY(mutex_) = nullptr;
  pid_t owner_pid_ ABSL_GUARDED_BY(mutex_);
  int failures_ ABSL_GUARDED_BY(mutex_) = 0;  // in a row
  std::chrono::steady_clock::time_point retry_at_ ABSL_GUARDED_BY(mutex_);
  std::string last_error_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace ncclguard
