// The job board's Redis backend (job_board.h). hiredis is loaded privately (dlopen RTLD_LOCAL) at
// the first use, so that a process that never names a Redis board never loads it, and one whose
// node lacks it keeps running with a clear message.
//
// Keys, all under ncclguard:{<job id>}: (the braces keep a job's keys on one Redis Cluster slot),
// each expiring kRecordLifetime after its last write:
//   status          hash: status-<host>-<pid>.json -> the status document, written when it changes
//   heartbeat       hash: the same names -> the time of the writer's latest status (epoch ns)
//   facts           hash: digest -> the facts a status names instead of holding them (environment,
//                   system: FormatStatusFacts), one per distinct set, shared by the processes alike
//   dump-requests   list: "<name>\n<document>" per request, oldest first; its length is the
//                   generation a watcher compares, so a quiet job's look is one LLEN
//   records:<folder> hash: name -> a small record (the P2P verdict, a recovery meeting's files)
#include <dlfcn.h>
#include <hiredis/hiredis.h>
#include <hiredis/read.h>
#include <sys/time.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "watchdog/common/clock.h"
#include "watchdog/common/log.h"
#include "watchdog/common/mutex.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/job_board.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/report/snapshot.h"

#define NCCLGUARD_STRINGIFY_INNER(x) #x
#define NCCLGUARD_STRINGIFY(x) NCCLGUARD_STRINGIFY_INNER(x)

namespace ncclguard {
namespace {

// Long enough to analyse a job days after it was killed; short enough that a cluster's Redis does
// not fill up with ended jobs.
constexpr int kRecordLifetimeSeconds = 3 * 24 * 3600;
constexpr std::chrono::milliseconds kConnectTimeout{1000};
// One command's round trip at most; a Redis slower than that is treated as down.
constexpr std::chrono::milliseconds kCommandTimeout{2000};
// A status costs one round trip of 2 to 4 commands, and its process's look for dump requests one
// more: at this rate a whole job sends a Redis some 50,000 commands a second, a fraction of what one
// Redis thread serves, leaving room for other jobs on a cluster's shared Redis.
constexpr double kStatusWritesPerSecond = 10'000;
// Statuses published between two renewals of the status keys' lifetime.
constexpr std::uint64_t kRenewEvery = 15;
// Statuses fetched per HMGET, and HMGETs per round trip: a few MB in flight.
constexpr std::size_t kFetchBatch = 1000;
constexpr int kBatchesPerRoundTrip = 8;
// The wait before trying a Redis that failed again doubles from the first to the last.
constexpr std::chrono::milliseconds kFirstRetry{500};
constexpr std::chrono::milliseconds kLastRetry{30'000};

struct Hiredis {
  decltype(&::redisConnectWithTimeout) connect = nullptr;
  decltype(&::redisSetTimeout) set_timeout = nullptr;
  decltype(&::redisFree) free_context = nullptr;
  decltype(&::redisAppendCommandArgv) append = nullptr;
  decltype(&::redisGetReply) get_reply = nullptr;
  decltype(&::freeReplyObject) free_reply = nullptr;
};

// hiredis, loaded once per process; the reason when it cannot be.
const absl::StatusOr<Hiredis>& LoadHiredis() {
  // Deliberately leaked: made after ncclguard's exit hooks were registered, it would be destroyed
  // at exit before they have stopped the threads that use it.
  static const auto* loaded = new absl::StatusOr<Hiredis>([]() -> absl::StatusOr<Hiredis> {
    // The soname of the hiredis whose header this was built with: its structures' layout.
    constexpr char kSoname[] = "libhiredis.so." NCCLGUARD_STRINGIFY(HIREDIS_SONAME);
    void* library = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* error = dlerror();
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot load ", kSoname, " (install hiredis: ", error != nullptr ? error : "not found", ")"));
    }
    Hiredis hiredis;
    bool complete = true;
    auto resolve = [&](auto& function, const char* name) {
      function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(dlsym(library, name));
      complete = complete && function != nullptr;
    };
    resolve(hiredis.connect, "redisConnectWithTimeout");
    resolve(hiredis.set_timeout, "redisSetTimeout");
    resolve(hiredis.free_context, "redisFree");
    resolve(hiredis.append, "redisAppendCommandArgv");
    resolve(hiredis.get_reply, "redisGetReply");
    resolve(hiredis.free_reply, "freeReplyObject");
    if (!complete)
      return absl::FailedPreconditionError(absl::StrCat(kSoname, " lacks a function ncclguard uses"));
    return hiredis;
  }());
  return *loaded;
}

timeval ToTimeval(std::chrono::milliseconds duration) {
  return timeval{.tv_sec = static_cast<time_t>(duration.count() / 1000),
                 .tv_usec = static_cast<suseconds_t>(duration.count() % 1000 * 1000)};
}

using Command = std::vector<std::string>;

// One reply, copied out of hiredis's (so that nothing of hiredis outlives the lock).
struct Reply {
  enum class Type { kString, kInteger, kArray, kNil, kStatus, kError };
  Type type = Type::kNil;
  std::string text;  // string, status or error
  long long integer = 0;
  std::vector<Reply> elements;
};

Reply CopyReply(const redisReply& reply) {
  Reply copy;
  switch (reply.type) {
    case REDIS_REPLY_STRING:
      copy.type = Reply::Type::kString;
      copy.text.assign(reply.str, reply.len);
      break;
    case REDIS_REPLY_STATUS:
      copy.type = Reply::Type::kStatus;
      copy.text.assign(reply.str, reply.len);
      break;
    case REDIS_REPLY_ERROR:
      copy.type = Reply::Type::kError;
      copy.text.assign(reply.str, reply.len);
      break;
    case REDIS_REPLY_INTEGER:
      copy.type = Reply::Type::kInteger;
      copy.integer = reply.integer;
      break;
    case REDIS_REPLY_ARRAY:
      copy.type = Reply::Type::kArray;
      copy.elements.reserve(reply.elements);
      for (std::size_t i = 0; i < reply.elements; ++i) copy.elements.push_back(CopyReply(*reply.element[i]));
      break;
    default:
      copy.type = Reply::Type::kNil;
  }
  return copy;
}

// One connection to Redis, shared by the process's threads one command batch at a time. A Redis
// that fails is left alone for a while (doubling up to kLastRetry): meanwhile every call answers
// Unavailable at once, so that the watchdog keeps its pace. The first failure is logged, and so is
// the return.
class RedisConnection {
 public:
  explicit RedisConnection(RedisAddress address) : address_(std::move(address)) {}
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;
  ~RedisConnection() {
    MutexLock lock(mutex_);
    if (context_ != nullptr && owner_pid_ == getpid()) LoadHiredis()->free_context(context_);
  }

  // Sends `commands` in one round trip (pipelined) and returns their replies in order. An error
  // reply of one command is its reply, not a failure of the batch.
  absl::StatusOr<std::vector<Reply>> Run(const std::vector<Command>& commands) {
    MutexLock lock(mutex_);
    if (absl::Status connected = ConnectLocked(); !connected.ok()) return connected;
    if (absl::Status queued = QueueLocked(commands); !queued.ok()) return queued;
    absl::StatusOr<std::vector<Reply>> replies = RepliesLocked(commands.size());
    if (replies.ok()) AnswersLocked();
    return replies;
  }

  // Sends `rounds` of pipelined commands, each round before the replies of the one before are taken
  // in, so that Redis answers one round while this process handles the last. `take(round, replies)`
  // gets each round's replies in order, and returns false to stop there (the round already sent is
  // read and dropped). A failure is returned after `take` had the rounds before it. The connection
  // is held throughout (a round is always in flight): the process's other calls wait, within the
  // caller's deadline and each round's command timeout.
  absl::Status RunRounds(const std::vector<std::vector<Command>>& rounds,
                         const std::function<bool(std::size_t, std::vector<Reply>&)>& take) {
    MutexLock lock(mutex_);
    if (absl::Status connected = ConnectLocked(); !connected.ok()) return connected;
    for (std::size_t round = 0; round < rounds.size(); ++round) {
      if (round == 0) {
        if (absl::Status queued = QueueLocked(rounds[0]); !queued.ok()) return queued;
      }
      const bool another = round + 1 < rounds.size();
      if (another) {
        if (absl::Status queued = QueueLocked(rounds[round + 1]); !queued.ok()) return queued;
      }
      absl::StatusOr<std::vector<Reply>> replies = RepliesLocked(rounds[round].size());
      if (!replies.ok()) return replies.status();
      AnswersLocked();
      if (!take(round, *replies)) {
        if (another) {
          if (absl::Status dropped = RepliesLocked(rounds[round + 1].size()).status(); !dropped.ok())
            return dropped;
        }
        return absl::OkStatus();
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::Status QueueLocked(const std::vector<Command>& commands) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    const Hiredis& hiredis = *LoadHiredis();
    for (const Command& command : commands) {
      std::vector<const char*> argv;
      std::vector<std::size_t> lengths;
      for (const std::string& argument : command) {
        argv.push_back(argument.data());
        lengths.push_back(argument.size());
      }
      if (hiredis.append(context_, static_cast<int>(argv.size()), argv.data(), lengths.data()) != REDIS_OK) {
        return FailLocked("cannot queue a command");
      }
    }
    return absl::OkStatus();
  }

  // The replies of `count` commands queued before.
  absl::StatusOr<std::vector<Reply>> RepliesLocked(std::size_t count) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    const Hiredis& hiredis = *LoadHiredis();
    std::vector<Reply> replies;
    replies.reserve(count);
    for (std::size_t i = 0; i < count; ++i) {
      void* raw = nullptr;
      if (hiredis.get_reply(context_, &raw) != REDIS_OK || raw == nullptr) return FailLocked("no answer");
      replies.push_back(CopyReply(*static_cast<redisReply*>(raw)));
      hiredis.free_reply(raw);
    }
    return replies;
  }

  void AnswersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    if (failures_ > 0) log::Info("the Redis job board {} answers again", address_.ToString());
    failures_ = 0;
  }

  absl::Status ConnectLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    if (owner_pid_ != getpid()) {
      context_ = nullptr;  // a forked child's: the parent's socket and memory are left alone
      owner_pid_ = getpid();
    }
    if (context_ != nullptr) return absl::OkStatus();
    if (failures_ > 0 && std::chrono::steady_clock::now() < retry_at_) {
      return absl::UnavailableError(absl::StrCat("the Redis job board ", address_.ToString(),
                                                 " failed; it is tried again shortly: ", last_error_));
    }
    const absl::StatusOr<Hiredis>& hiredis = LoadHiredis();
    if (!hiredis.ok()) return NoteFailureLocked(std::string(hiredis.status().message()));
    redisContext* context =
        hiredis->connect(address_.host.c_str(), address_.port, ToTimeval(kConnectTimeout));
    if (context == nullptr) return NoteFailureLocked("cannot allocate a connection");
    if (context->err != 0) {
      std::string why = context->errstr;
      hiredis->free_context(context);
      return NoteFailureLocked(why);
    }
    hiredis->set_timeout(context, ToTimeval(kCommandTimeout));
    context_ = context;
    if (address_.database != 0) {
      absl::Status selected = SelectLocked();
      if (!selected.ok()) return selected;
    }
    return absl::OkStatus();
  }

  absl::Status SelectLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    const std::string database = absl::StrCat(address_.database);
    const char* argv[] = {"SELECT", database.c_str()};
    const std::size_t lengths[] = {6, database.size()};
    const Hiredis& hiredis = *LoadHiredis();
    void* raw = nullptr;
    if (hiredis.append(context_, 2, argv, lengths) != REDIS_OK ||
        hiredis.get_reply(context_, &raw) != REDIS_OK || raw == nullptr) {
      return FailLocked("cannot select the database");
    }
    const Reply reply = CopyReply(*static_cast<redisReply*>(raw));
    hiredis.free_reply(raw);
    if (reply.type == Reply::Type::kError) return FailLocked(absl::StrCat("SELECT: ", reply.text));
    return absl::OkStatus();
  }

  // The connection broke (or Redis refused): it is closed and tried again later.
  absl::Status FailLocked(const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    std::string why = what;
    if (context_ != nullptr) {
      if (context_->err != 0) absl::StrAppend(&why, ": ", context_->errstr);
      LoadHiredis()->free_context(context_);
      context_ = nullptr;
    }
    return NoteFailureLocked(why);
  }

  absl::Status NoteFailureLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    if (failures_ == 0) {
      log::Warn(
          "the Redis job board {} cannot be used: {}; ncclguard keeps watching this process and tries "
          "again with backoff",
          address_.ToString(), why);
    }
    const std::chrono::milliseconds wait =
        std::min<std::chrono::milliseconds>(kLastRetry, kFirstRetry * (1 << std::min(failures_, 6)));
    ++failures_;
    retry_at_ = std::chrono::steady_clock::now() + wait;
    last_error_ = why;
    return absl::UnavailableError(absl::StrCat("Redis ", address_.ToString(), ": ", why));
  }

  const RedisAddress address_;
  Mutex mutex_;
  redisContext* context_ ABSL_GUARDED_BY(mutex_) = nullptr;
  pid_t owner_pid_ ABSL_GUARDED_BY(mutex_) = getpid();
  int failures_ ABSL_GUARDED_BY(mutex_) = 0;  // in a row
  std::chrono::steady_clock::time_point retry_at_ ABSL_GUARDED_BY(mutex_);
  std::string last_error_ ABSL_GUARDED_BY(mutex_);
};

ProcessSnapshot WithTime(const ProcessSnapshot& snapshot, std::int64_t time_ns) {
  ProcessSnapshot timed = snapshot;
  timed.time_ns = time_ns;
  return timed;
}

// A reply that must not be an error.
absl::Status Checked(const Reply& reply, const char* what) {
  if (reply.type == Reply::Type::kError) return absl::UnavailableError(absl::StrCat(what, ": ", reply.text));
  return absl::OkStatus();
}

class RedisBoard final : public JobBoard {
 public:
  RedisBoard(const RedisAddress& address, std::string job_dir, std::string job_id,
             const BoardIdentity& identity)
      : connection_(address),
        where_(absl::StrCat(address.ToString(), "/", job_id)),
        job_dir_(std::move(job_dir)),
        job_id_(std::move(job_id)),
        prefix_(absl::StrCat("ncclguard:{", job_id_, "}:")),
        identity_(identity),
        sieve_(identity.host, identity.pid, identity.started_wall_ns) {}

  std::string Where() const override { return where_; }
  const std::string& Directory() const override { return job_dir_; }
  const std::string& JobId() const override { return job_id_; }
  double StatusWritesPerSecond() const override { return kStatusWritesPerSecond; }

  absl::Status PublishStatus(const ProcessSnapshot& snapshot, const ProcessFacts& facts) noexcept override {
    try {
      // The facts that do not change are a record of their own, shared by the processes whose facts
      // are alike and written when this process's change (or Redis lost them); the status names it.
      absl::StatusOr<StatusFactsRecord> facts_record = FormatStatusFacts(facts);
      if (!facts_record.ok()) return facts_record.status();
      // The document without its time says whether anything changed since the last one written.
      absl::StatusOr<std::string> shape = FormatStatus(WithTime(snapshot, 1), facts, facts_record->digest);
      if (!shape.ok()) return shape.status();
      const std::int64_t now = snapshot.time_ns != 0 ? snapshot.time_ns : WallNowNs();
      const std::string name = StatusName(facts);
      MutexLock lock(status_mutex_);
      const bool changed = *shape != last_shape_;
      std::optional<std::string> content;
      if (changed) {
        absl::StatusOr<std::string> formatted =
            FormatStatus(WithTime(snapshot, now), facts, facts_record->digest);
        if (!formatted.ok()) return formatted.status();
        content = *std::move(formatted);
      }
      const bool renew = statuses_published_++ % kRenewEvery == 0;
      const StatusRound round = StatusCommands(name, *facts_record, content, now, renew);
      absl::StatusOr<std::vector<Reply>> replies = connection_.Run(round.commands);
      if (!replies.ok()) {
        // Redis may come back without the status (restarted, or failed over): written whole, and
        // the keys' lifetime set, at the first status after.
        ForgetWrittenLocked();
        return replies.status();
      }
      for (const Reply& reply : *replies) {
        if (absl::Status checked = Checked(reply, "HSET status"); !checked.ok()) return checked;
      }
      last_shape_ = *std::move(shape);
      facts_written_ = facts_record->digest;
      // A heartbeat that was not there says the status is not either (Redis lost its data, or the
      // keys expired): written again at once, with its facts.
      const Reply& heartbeat = (*replies)[round.heartbeat];
      if (!changed && heartbeat.integer == 1) {
        absl::StatusOr<std::string> whole =
            FormatStatus(WithTime(snapshot, now), facts, facts_record->digest);
        if (!whole.ok()) return whole.status();
        facts_written_.clear();
        // The keys were made anew: their lifetime too.
        absl::StatusOr<std::vector<Reply>> rewritten = connection_.Run(
            StatusCommands(name, *facts_record, *std::move(whole), now, /*renew=*/true).commands);
        if (!rewritten.ok()) {
          ForgetWrittenLocked();
          return rewritten.status();
        }
        facts_written_ = facts_record->digest;
        statuses_published_ = 1;
      }
      return absl::OkStatus();
    } catch (...) {
      return absl::ResourceExhaustedError("cannot publish the status (out of memory)");
    }
  }

  bool StatusesAreFiles() const override { return false; }
  absl::StatusOr<StatusRecords> FetchStatuses(std::chrono::steady_clock::time_point deadline,
                                              StatusBatchSink* batches) noexcept override {
    try {
      return FetchStatusesNow(deadline, batches);
    } catch (...) {
      return absl::ResourceExhaustedError("cannot fetch the statuses (out of memory)");
    }
  }

  absl::StatusOr<std::string> RequestDumps(const std::string& requester) noexcept override {
    try {
      absl::StatusOr<FormattedDumpRequest> request = FormatDumpRequest(requester);
      if (!request.ok()) return request.status();
      absl::StatusOr<std::vector<Reply>> replies = connection_.Run(
          {{"RPUSH", Key("dump-requests"), absl::StrCat(request->name, "\n", request->content)},
           {"EXPIRE", Key("dump-requests"), absl::StrCat(kRecordLifetimeSeconds)}});
      if (!replies.ok()) return replies.status();
      if (absl::Status checked = Checked(replies->front(), "RPUSH dump-requests"); !checked.ok())
        return checked;
      return request->name;
    } catch (...) {
      return absl::ResourceExhaustedError("cannot request dumps (out of memory)");
    }
  }

  absl::StatusOr<std::vector<DumpRequest>> PollDumpRequests() noexcept override {
    try {
      MutexLock lock(requests_mutex_);
      absl::StatusOr<std::vector<Reply>> length = connection_.Run({{"LLEN", Key("dump-requests")}});
      if (!length.ok()) return length.status();
      const long long requests = length->front().integer;
      if (requests <= requests_seen_ && listed_once_) return std::vector<DumpRequest>();
      // Only the requests not seen yet (a list shorter than seen was expired and begun again).
      const long long first = requests < requests_seen_ ? 0 : requests_seen_;
      absl::StatusOr<std::vector<Reply>> listed =
          connection_.Run({{"LRANGE", Key("dump-requests"), absl::StrCat(first), "-1"}});
      if (!listed.ok()) return listed.status();
      std::vector<DumpRequest> fresh;
      std::string newest;
      for (const Reply& element : listed->front().elements) {
        const std::size_t newline = element.text.find('\n');
        newest = element.text.substr(0, newline);
        fresh.push_back(ParseDumpRequest(
            newest, newline == std::string::npos ? std::string() : element.text.substr(newline + 1)));
      }
      requests_seen_ = first + static_cast<long long>(listed->front().elements.size());
      listed_once_ = true;
      return sieve_.Sift(std::move(fresh), newest);
    } catch (...) {
      return absl::ResourceExhaustedError("cannot look for dump requests (out of memory)");
    }
  }

  absl::Status Put(const std::string& folder, const std::string& name, const std::string& content,
                   bool /*durable: Redis's own persistence decides*/) noexcept override {
    try {
      absl::StatusOr<std::vector<Reply>> replies = connection_.Run(
          {{"HSET", RecordsKey(folder), name, content}, {"EXPIRE", RecordsKey(folder), Lifetime()}});
      if (!replies.ok()) return replies.status();
      return Checked(replies->front(), "HSET");
    } catch (...) {
      return absl::ResourceExhaustedError("cannot write a record (out of memory)");
    }
  }

  absl::Status PutOnce(
      const std::string& folder, const std::string& name, const std::string& content,
      std::chrono::milliseconds /*deadline: the command timeout bounds it*/) noexcept override {
    try {
      absl::StatusOr<std::vector<Reply>> replies = connection_.Run(
          {{"HSETNX", RecordsKey(folder), name, content}, {"EXPIRE", RecordsKey(folder), Lifetime()}});
      if (!replies.ok()) return replies.status();
      if (absl::Status checked = Checked(replies->front(), "HSETNX"); !checked.ok()) return checked;
      if (replies->front().integer == 0) return absl::AlreadyExistsError(absl::StrCat(name, " is taken"));
      return absl::OkStatus();
    } catch (...) {
      return absl::ResourceExhaustedError("cannot write a record (out of memory)");
    }
  }

  absl::StatusOr<std::string> Get(const std::string& folder, const std::string& name,
                                  std::size_t max_bytes) noexcept override {
    try {
      absl::StatusOr<std::vector<Reply>> replies = connection_.Run({{"HGET", RecordsKey(folder), name}});
      if (!replies.ok()) return replies.status();
      const Reply& reply = replies->front();
      if (absl::Status checked = Checked(reply, "HGET"); !checked.ok()) return checked;
      if (reply.type == Reply::Type::kNil)
        return absl::NotFoundError(absl::StrCat(name, " is not on ", where_));
      if (reply.type != Reply::Type::kString)
        return absl::InvalidArgumentError(absl::StrCat(name, " is not a record"));
      if (reply.text.size() > max_bytes) {
        return absl::OutOfRangeError(absl::StrCat(name, " is larger than ", max_bytes, " bytes"));
      }
      return reply.text;
    } catch (...) {
      return absl::ResourceExhaustedError("cannot read a record (out of memory)");
    }
  }

  absl::StatusOr<std::vector<std::string>> ListNames(const std::string& folder, const std::string& prefix,
                                                     const std::string& suffix) noexcept override {
    try {
      absl::StatusOr<std::vector<Reply>> replies = connection_.Run({{"HKEYS", RecordsKey(folder)}});
      if (!replies.ok()) return replies.status();
      if (absl::Status checked = Checked(replies->front(), "HKEYS"); !checked.ok()) return checked;
      std::vector<std::string> names;
      for (const Reply& element : replies->front().elements) {
        if (absl::StartsWith(element.text, prefix) && absl::EndsWith(element.text, suffix) &&
            element.text.size() >= prefix.size() + suffix.size()) {
          names.push_back(element.text);
        }
      }
      std::sort(names.begin(), names.end());
      return names;
    } catch (...) {
      return absl::ResourceExhaustedError("cannot list records (out of memory)");
    }
  }

 private:
  std::string Key(const char* kind) const { return absl::StrCat(prefix_, kind); }

  // One status's round trip: its facts record when not written yet, its document when it changed,
  // its heartbeat (`heartbeat`: the place of its reply), and the keys' lifetime when `renew`.
  struct StatusRound {
    std::vector<Command> commands;
    std::size_t heartbeat = 0;
  };
  StatusRound StatusCommands(const std::string& name, const StatusFactsRecord& facts,
                             const std::optional<std::string>& content, std::int64_t now, bool renew) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(status_mutex_) {
    StatusRound round;
    std::vector<Command>& commands = round.commands;
    if (facts.digest != facts_written_)
      commands.push_back({"HSET", Key("facts"), facts.digest, facts.content});
    if (content) commands.push_back({"HSET", Key("status"), name, *content});
    round.heartbeat = commands.size();
    commands.push_back({"HSET", Key("heartbeat"), name, absl::StrCat(now)});
    if (renew) {
      for (const char* kind : {"facts", "status", "heartbeat"})
        commands.push_back({"EXPIRE", Key(kind), Lifetime()});
    }
    return round;
  }

  void ForgetWrittenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(status_mutex_) {
    last_shape_.clear();
    facts_written_.clear();
    statuses_published_ = 0;
  }
  std::string RecordsKey(const std::string& folder) const {
    return absl::StrCat(prefix_, "records:", folder);
  }
  static std::string Lifetime() { return absl::StrCat(kRecordLifetimeSeconds); }

  // The facts records, in one HGETALL: a few per node type at most, unless something else wrote
  // there (`listed`, the reply of HLEN). Then they are not fetched; statuses that name one lack facts.
  absl::Status FetchFacts(std::size_t statuses, const Reply& listed, StatusRecords& fetched) {
    // Each process writes a record when its facts change (P2P disabled by recovery: one more).
    const std::size_t most = 2 * statuses + kFetchBatch;
    if (listed.type == Reply::Type::kError) {
      fetched.why_facts_not_fetched = absl::StrCat("HLEN facts: ", listed.text);
      return absl::OkStatus();
    }
    if (listed.type != Reply::Type::kInteger || listed.integer <= 0) return absl::OkStatus();
    if (static_cast<std::size_t>(listed.integer) > most) {
      fetched.why_facts_not_fetched =
          absl::StrCat("the board holds ", listed.integer, " facts records, more than the ", most,
                       " its statuses could have written");
      return absl::OkStatus();
    }
    absl::StatusOr<std::vector<Reply>> all = connection_.Run({{"HGETALL", Key("facts")}});
    if (!all.ok()) return all.status();
    if (absl::Status checked = Checked(all->front(), "HGETALL facts"); !checked.ok()) {
      fetched.why_facts_not_fetched = std::string(checked.message());
      return absl::OkStatus();
    }
    std::vector<Reply>& pairs = all->front().elements;
    fetched.facts.reserve(pairs.size() / 2);
    for (std::size_t i = 0; i + 1 < pairs.size(); i += 2)
      fetched.facts.try_emplace(std::move(pairs[i].text), std::move(pairs[i + 1].text));
    return absl::OkStatus();
  }

  // The statuses' names in one HKEYS, then their documents and heartbeats by HMGET, a batch of
  // names at a time and several batches per round trip: Redis answers the next batch while this
  // process copies the one before.
  absl::StatusOr<StatusRecords> FetchStatusesNow(std::chrono::steady_clock::time_point deadline,
                                                 StatusBatchSink* batches) {
    absl::StatusOr<std::vector<Reply>> listed =
        connection_.Run({{"HKEYS", Key("status")}, {"HLEN", Key("facts")}});
    if (!listed.ok()) return listed.status();
    if (absl::Status checked = Checked(listed->front(), "HKEYS status"); !checked.ok()) return checked;
    std::vector<Reply>& names = listed->front().elements;
    StatusRecords fetched;
    if (absl::Status facts = FetchFacts(names.size(), (*listed)[1], fetched); !facts.ok()) return facts;
    fetched.records.reserve(names.size());
    // Round r asks for names [r * kNamesPerRound, (r + 1) * kNamesPerRound).
    constexpr std::size_t kNamesPerRound = kFetchBatch * kBatchesPerRoundTrip;
    std::vector<std::vector<Command>> rounds;
    for (std::size_t first = 0; first < names.size(); first += kNamesPerRound) {
      std::vector<Command>& commands = rounds.emplace_back();
      for (std::size_t batch = first; batch < std::min(names.size(), first + kNamesPerRound);
           batch += kFetchBatch) {
        Command statuses{"HMGET", Key("status")};
        Command heartbeats{"HMGET", Key("heartbeat")};
        for (std::size_t name = batch; name < std::min(names.size(), batch + kFetchBatch); ++name) {
          statuses.push_back(names[name].text);
          heartbeats.push_back(names[name].text);
        }
        commands.push_back(std::move(statuses));
        commands.push_back(std::move(heartbeats));
      }
    }
    std::size_t taken = 0;  // names whose replies were taken in
    absl::Status run = connection_.RunRounds(rounds, [&](std::size_t round, std::vector<Reply>& replies) {
      const std::size_t batch_start = fetched.records.size();
      for (std::size_t reply = 0; reply + 1 < replies.size(); reply += 2) {
        // The names this HMGET asked for, whatever came back: a reply short of them (an error,
        // a server not quite Redis) must not shift the names of the batches after it.
        const std::size_t first = round * kNamesPerRound + reply / 2 * kFetchBatch;
        std::vector<Reply>& documents = replies[reply].elements;
        const std::vector<Reply>& times = replies[reply + 1].elements;
        const std::size_t asked = std::min(names.size() - first, kFetchBatch);
        for (std::size_t i = 0, name = first; i < std::min(documents.size(), asked); ++i, ++name) {
          // Removed since HKEYS (a process's status is deleted when it ends well): not a status.
          if (documents[i].type != Reply::Type::kString) continue;
          StatusRecord& record = fetched.records.emplace_back(
              StatusRecord{.name = std::move(names[name].text), .content = std::move(documents[i].text)});
          if (i < times.size() && !absl::SimpleAtoi(times[i].text, &record.heartbeat_ns))
            record.heartbeat_ns = 0;
        }
      }
      taken = std::min(names.size(), (round + 1) * kNamesPerRound);
      // Reserved for every name: the records never move.
      if (batches != nullptr) {
        batches->Fetched(fetched.records.data(), batch_start, fetched.records.size() - batch_start,
                         names.size());
      }
      if (taken < names.size() && std::chrono::steady_clock::now() > deadline) {
        fetched.why_not_fetched = "the deadline passed";
        return false;
      }
      return true;
    });
    if (!run.ok()) {
      if (fetched.records.empty()) return run;
      fetched.why_not_fetched = std::string(run.message());
    }
    fetched.not_fetched = names.size() - taken;
    return fetched;
  }

  RedisConnection connection_;
  const std::string where_;
  const std::string job_dir_;
  const std::string job_id_;
  const std::string prefix_;
  const BoardIdentity identity_;
  Mutex status_mutex_;
  std::string last_shape_ ABSL_GUARDED_BY(status_mutex_);     // the last status written, its time left out
  std::string facts_written_ ABSL_GUARDED_BY(status_mutex_);  // the digest of the last facts record written
  std::uint64_t statuses_published_ ABSL_GUARDED_BY(status_mutex_) = 0;
  Mutex requests_mutex_;
  RequestSieve sieve_ ABSL_GUARDED_BY(requests_mutex_);
  long long requests_seen_ ABSL_GUARDED_BY(requests_mutex_) = 0;
  bool listed_once_ ABSL_GUARDED_BY(requests_mutex_) = false;
};

}  // namespace

std::shared_ptr<JobBoard> MakeRedisBoard(const RedisAddress& address, const std::string& job_dir,
                                         const std::string& job_id, const BoardIdentity& identity) {
  return std::make_shared<RedisBoard>(address, job_dir, job_id, identity);
}

}  // namespace ncclguard
