// The Redis job board's client (redis_client.h). hiredis is loaded privately (dlopen RTLD_LOCAL) at
// the first use, so that a process that never names a Redis board never loads it, and one whose
// node lacks it keeps running with a clear message.
#include "watchdog/report/redis_client.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <hiredis/read.h>
#if NCCLGUARD_HAVE_HIREDIS_SSL
#include <hiredis/hiredis_ssl.h>
#endif
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "watchdog/common/log.h"
#include "watchdog/common/mutex.h"
#include "watchdog/report/job_board.h"

#define NCCLGUARD_STRINGIFY_INNER(x) #x
#define NCCLGUARD_STRINGIFY(x) NCCLGUARD_STRINGIFY_INNER(x)

namespace ncclguard {
namespace {

constexpr std::chrono::milliseconds kConnectTimeout{1000};
// One command's round trip at most; a Redis slower than that is treated as down.
constexpr std::chrono::milliseconds kCommandTimeout{2000};
// The wait before trying a Redis that failed again doubles from the first to the last.
constexpr std::chrono::milliseconds kFirstRetry{500};
constexpr std::chrono::milliseconds kLastRetry{30'000};
// A user name and a password, with room to spare.
constexpr std::size_t kMostCredentialBytes = 4096;
constexpr char kAuthSetting[] = "NCCLGUARD_STORE_AUTH_FILE";

// What the process has said of its board, whichever of its connections (the watchdog's, the P2P
// policy's, a recovery meeting's) met it first: a server down or refusing is said once per
// process, and its return once. Atomics, not a lock: a forked child inherits them as they are.
std::atomic<bool> g_failure_said{false};
constexpr unsigned kRefusedNoPerm = 1;
constexpr unsigned kRefusedWrongType = 2;
std::atomic<unsigned> g_refusals_said{0};      // each kind said once per process
std::atomic<unsigned> g_refusals_standing{0};  // said, and no clean answer since

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

#if NCCLGUARD_HAVE_HIREDIS_SSL
struct HiredisSsl {
  decltype(&::redisCreateSSLContext) create_context = nullptr;
  decltype(&::redisSSLContextGetError) context_error = nullptr;
  decltype(&::redisFreeSSLContext) free_context = nullptr;
  decltype(&::redisInitiateSSLWithContext) initiate = nullptr;
};

// hiredis's SSL library, loaded once per process at the first rediss:// connection, beside hiredis.
const absl::StatusOr<HiredisSsl>& LoadHiredisSsl() {
  // Deliberately leaked, as hiredis is (LoadHiredis).
  static const auto* loaded = new absl::StatusOr<HiredisSsl>([]() -> absl::StatusOr<HiredisSsl> {
    constexpr char kSoname[] = "libhiredis_ssl.so." NCCLGUARD_STRINGIFY(HIREDIS_SONAME);
    void* library = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* error = dlerror();
      return absl::FailedPreconditionError(
          absl::StrCat("cannot load ", kSoname,
                       " (install hiredis's SSL library: ", error != nullptr ? error : "not found", ")"));
    }
    HiredisSsl ssl;
    bool complete = true;
    auto resolve = [&](auto& function, const char* name) {
      function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(dlsym(library, name));
      complete = complete && function != nullptr;
    };
    resolve(ssl.create_context, "redisCreateSSLContext");
    resolve(ssl.context_error, "redisSSLContextGetError");
    resolve(ssl.free_context, "redisFreeSSLContext");
    resolve(ssl.initiate, "redisInitiateSSLWithContext");
    using InitOpenSsl = int (*)();
    const auto init = reinterpret_cast<InitOpenSsl>(dlsym(library, "redisInitOpenSSL"));
    if (!complete || init == nullptr)
      return absl::FailedPreconditionError(absl::StrCat(kSoname, " lacks a function ncclguard uses"));
    init();
    return ssl;
  }());
  return *loaded;
}
#endif

timeval ToTimeval(std::chrono::milliseconds duration) {
  return timeval{.tv_sec = static_cast<time_t>(duration.count() / 1000),
                 .tv_usec = static_cast<suseconds_t>(duration.count() % 1000 * 1000)};
}

RedisReply CopyRedisReply(const redisReply& reply) {
  RedisReply copy;
  switch (reply.type) {
    case REDIS_REPLY_STRING:
      copy.type = RedisReply::Type::kString;
      copy.text.assign(reply.str, reply.len);
      break;
    case REDIS_REPLY_STATUS:
      copy.type = RedisReply::Type::kStatus;
      copy.text.assign(reply.str, reply.len);
      break;
    case REDIS_REPLY_ERROR:
      copy.type = RedisReply::Type::kError;
      copy.text.assign(reply.str, reply.len);
      break;
    case REDIS_REPLY_INTEGER:
      copy.type = RedisReply::Type::kInteger;
      copy.integer = reply.integer;
      break;
    case REDIS_REPLY_ARRAY:
      copy.type = RedisReply::Type::kArray;
      copy.elements.reserve(reply.elements);
      for (std::size_t i = 0; i < reply.elements; ++i)
        copy.elements.push_back(CopyRedisReply(*reply.element[i]));
      break;
    default:
      copy.type = RedisReply::Type::kNil;
  }
  return copy;
}

// The first word of an error reply: Redis's error code (NOAUTH, WRONGPASS, NOPERM, WRONGTYPE, ERR).
std::string ErrorCode(const RedisReply& reply) { return reply.text.substr(0, reply.text.find(' ')); }

}  // namespace

absl::StatusOr<RedisCredentials> ReadRedisCredentials(const std::string& path) {
  auto refused = [&](const std::string& why) {
    return absl::FailedPreconditionError(absl::StrCat(kAuthSetting, " ", path, ": ", why));
  };
  // O_NONBLOCK: a FIFO put there must not hold the watchdog.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return refused(absl::StrCat("cannot be opened: ", strerror(errno)));
  struct stat status {};
  std::string content;
  const bool stated = fstat(fd, &status) == 0;
  if (stated && S_ISREG(status.st_mode) && status.st_uid == geteuid() && (status.st_mode & 077) == 0 &&
      static_cast<std::size_t>(status.st_size) <= kMostCredentialBytes) {
    content.resize(kMostCredentialBytes + 1);
    std::size_t read_bytes = 0;
    for (ssize_t got = 1; got > 0 && read_bytes < content.size();
         read_bytes += static_cast<std::size_t>(got)) {
      got = read(fd, content.data() + read_bytes, content.size() - read_bytes);
      if (got < 0 && errno == EINTR) got = 0;
      if (got <= 0) break;
    }
    content.resize(read_bytes);
  }
  close(fd);
  if (!stated || !S_ISREG(status.st_mode)) return refused("is not a regular file");
  if (status.st_uid != geteuid()) return refused("belongs to another user");
  if ((status.st_mode & 077) != 0) {
    return refused("may be read or written by other users; make it private (chmod 600)");
  }
  if (content.size() > kMostCredentialBytes) return refused("is larger than a user and a password");
  std::vector<std::string> lines = absl::StrSplit(content, '\n');
  for (std::string& line : lines) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  RedisCredentials credentials;
  if (lines.size() == 1 && !lines[0].empty()) {
    credentials.password = std::move(lines[0]);
  } else if (lines.size() == 2 && !lines[0].empty() && !lines[1].empty()) {
    credentials.user = std::move(lines[0]);
    credentials.password = std::move(lines[1]);
  } else {
    return refused("holds neither one line (the password) nor two (the ACL user, then its password)");
  }
  explicit_bzero(content.data(), content.size());
  return credentials;
}

RedisConnection::RedisConnection(RedisAddress address) : address_(std::move(address)), owner_pid_(getpid()) {}

RedisConnection::~RedisConnection() {
  MutexLock lock(mutex_);
  if (context_ != nullptr && owner_pid_ == getpid()) LoadHiredis()->free_context(context_);
}

absl::StatusOr<std::vector<RedisReply>> RedisConnection::Run(const std::vector<RedisCommand>& commands) {
  MutexLock lock(mutex_);
  if (absl::Status connected = ConnectLocked(); !connected.ok()) return connected;
  if (absl::Status queued = QueueLocked(commands); !queued.ok()) return queued;
  absl::StatusOr<std::vector<RedisReply>> replies = RepliesLocked(commands.size());
  if (!replies.ok()) return replies;
  if (absl::Status answered = AnswersLocked(*replies); !answered.ok()) return answered;
  return replies;
}

absl::Status RedisConnection::RunRounds(
    const std::vector<std::vector<RedisCommand>>& rounds,
    const std::function<bool(std::size_t, std::vector<RedisReply>&)>& take) {
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
    absl::StatusOr<std::vector<RedisReply>> replies = RepliesLocked(rounds[round].size());
    if (!replies.ok()) return replies.status();
    if (absl::Status answered = AnswersLocked(*replies); !answered.ok()) return answered;
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

absl::Status RedisConnection::QueueLocked(const std::vector<RedisCommand>& commands) {
  const Hiredis& hiredis = *LoadHiredis();
  for (const RedisCommand& command : commands) {
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

absl::StatusOr<std::vector<RedisReply>> RedisConnection::RepliesLocked(std::size_t count) {
  const Hiredis& hiredis = *LoadHiredis();
  std::vector<RedisReply> replies;
  replies.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    void* raw = nullptr;
    if (hiredis.get_reply(context_, &raw) != REDIS_OK || raw == nullptr) return FailLocked("no answer");
    replies.push_back(CopyRedisReply(*static_cast<redisReply*>(raw)));
    hiredis.free_reply(raw);
  }
  return replies;
}

// The server answered `replies`: a refusal among them is said (once), and so is the server's
// return to service. NOAUTH and WRONGPASS fail the batch: the connection is made again later, with
// the credentials file read anew.
absl::Status RedisConnection::AnswersLocked(const std::vector<RedisReply>& replies) {
  const RedisReply* refused = nullptr;
  for (const RedisReply& reply : replies) {
    if (reply.type != RedisReply::Type::kError) continue;
    const std::string code = ErrorCode(reply);
    if (code == "NOAUTH" || code == "WRONGPASS") {
      return FailLocked(address_.auth_file.empty()
                            ? absl::StrCat("the server asks for a password (", reply.text,
                                           "): write it to a file of mode 0600 and name the file in ",
                                           kAuthSetting)
                            : absl::StrCat("the server refuses the credentials of ", kAuthSetting, " ",
                                           address_.auth_file, ": ", reply.text));
    }
    if (refused == nullptr && (code == "NOPERM" || code == "WRONGTYPE")) refused = &reply;
  }
  failures_ = 0;
  const bool was_failing = g_failure_said.exchange(false);
  const unsigned was_refused = refused == nullptr ? g_refusals_standing.exchange(0) : 0;
  if (was_failing || was_refused != 0) log::Warn("the Redis job board {} answers again", address_.ToString());
  if (refused == nullptr) return absl::OkStatus();
  // Each kind of refusal said once per process: an ACL that allows some commands and not others
  // would otherwise have it said at every status.
  const bool noperm = ErrorCode(*refused) == "NOPERM";
  const unsigned kind = noperm ? kRefusedNoPerm : kRefusedWrongType;
  if ((g_refusals_said.fetch_or(kind) & kind) == 0) {
    g_refusals_standing.fetch_or(kind);
    log::Warn(
        "the Redis job board {} refuses this job's records: {} ({}); ncclguard keeps watching this "
        "process",
        address_.ToString(), refused->text,
        noperm ? "its ACL user may not use ncclguard's keys or commands: see docs/deploying.md"
               : "something other than ncclguard wrote one of this job's keys");
  }
  return absl::OkStatus();
}

absl::Status RedisConnection::ConnectLocked() {
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
  // Read at each connection: a file corrected while the job runs is used at the next try.
  absl::StatusOr<RedisCredentials> credentials;
  if (!address_.auth_file.empty()) {
    credentials = ReadRedisCredentials(address_.auth_file);
    if (!credentials.ok()) return NoteFailureLocked(std::string(credentials.status().message()));
  }
  redisContext* context = hiredis->connect(address_.host.c_str(), address_.port, ToTimeval(kConnectTimeout));
  if (context == nullptr) return NoteFailureLocked("cannot allocate a connection");
  if (context->err != 0) {
    std::string why = context->errstr;
    hiredis->free_context(context);
    return NoteFailureLocked(why);
  }
  hiredis->set_timeout(context, ToTimeval(kCommandTimeout));
  context_ = context;
  if (address_.tls) {
    if (absl::Status secured = StartTlsLocked(); !secured.ok()) return secured;
  }
  if (!address_.auth_file.empty()) {
    if (absl::Status authenticated = AuthenticateLocked(*std::move(credentials)); !authenticated.ok())
      return authenticated;
  }
  if (address_.database != 0) return SelectLocked();
  return absl::OkStatus();
}

// TLS over the connection just made, before anything is sent on it (the password first of all):
// the system's CA certificates verify the server, which is told the name it was reached by (SNI).
absl::Status RedisConnection::StartTlsLocked() {
#if NCCLGUARD_HAVE_HIREDIS_SSL
  const absl::StatusOr<HiredisSsl>& ssl = LoadHiredisSsl();
  if (!ssl.ok()) return FailLocked(std::string(ssl.status().message()));
  redisSSLContextError error = REDIS_SSL_CTX_NONE;
  redisSSLContext* tls =
      ssl->create_context(nullptr, nullptr, nullptr, nullptr, address_.host.c_str(), &error);
  if (tls == nullptr) return FailLocked(absl::StrCat("cannot set up TLS: ", ssl->context_error(error)));
  // The connection keeps what it needs of the context (OpenSSL counts its references).
  const int started = ssl->initiate(context_, tls);
  ssl->free_context(tls);
  if (started != REDIS_OK) return FailLocked("the TLS handshake failed");
  return absl::OkStatus();
#else
  return FailLocked("TLS (rediss://) is unavailable in this build of ncclguard (built without hiredis_ssl)");
#endif
}

absl::StatusOr<RedisReply> RedisConnection::CommandLocked(const RedisCommand& command) {
  if (absl::Status queued = QueueLocked({command}); !queued.ok()) return queued;
  absl::StatusOr<std::vector<RedisReply>> replies = RepliesLocked(1);
  if (!replies.ok()) return replies.status();
  return std::move(replies->front());
}

absl::Status RedisConnection::AuthenticateLocked(RedisCredentials credentials) {
  RedisCommand command = {"AUTH"};
  if (!credentials.user.empty()) command.push_back(std::move(credentials.user));
  command.push_back(std::move(credentials.password));
  absl::StatusOr<RedisReply> reply = CommandLocked(command);
  // The password lives no longer than it must in this process's memory (core files, dumps).
  explicit_bzero(command.back().data(), command.back().size());
  if (!reply.ok()) return reply.status();
  if (reply->type == RedisReply::Type::kError) {
    return FailLocked(absl::StrCat("the server refuses the credentials of ", kAuthSetting, " ",
                                   address_.auth_file, ": ", reply->text));
  }
  return absl::OkStatus();
}

absl::Status RedisConnection::SelectLocked() {
  absl::StatusOr<RedisReply> reply = CommandLocked({"SELECT", absl::StrCat(address_.database)});
  if (!reply.ok()) return FailLocked("cannot select the database");
  if (reply->type == RedisReply::Type::kError) {
    if (ErrorCode(*reply) == "NOAUTH") return AnswersLocked({*reply});
    return FailLocked(absl::StrCat("SELECT: ", reply->text));
  }
  return absl::OkStatus();
}

// The connection broke (or Redis refused): it is closed and tried again later.
absl::Status RedisConnection::FailLocked(const std::string& what) {
  std::string why = what;
  if (context_ != nullptr) {
    if (context_->err != 0) absl::StrAppend(&why, ": ", context_->errstr);
    LoadHiredis()->free_context(context_);
    context_ = nullptr;
  }
  return NoteFailureLocked(why);
}

absl::Status RedisConnection::NoteFailureLocked(const std::string& why) {
  if (failures_ == 0 && !g_failure_said.exchange(true)) {
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

}  // namespace ncclguard
