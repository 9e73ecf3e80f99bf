// The job board's Redis backend (job_board.h), over one connection of redis_client.h.
//
// Keys, all under ncclguard:{<uid>:<job id>}: (the braces keep a job's keys on one Redis Cluster
// slot; the user id lets a server's ACL give each user its own keys and no one else's, and keeps
// two users' jobs of one id apart), each expiring kRecordLifetime after its last write:
//   status          hash: status-<host>-<pid>.json -> the status document, written when it changes
//   heartbeat       hash: the same names -> the time of the writer's latest status (epoch ns)
//   facts           hash: digest -> the facts a status names instead of holding them (environment,
//                   system: FormatStatusFacts), one per distinct set, shared by the processes alike
//   dump-requests   list: "<name>\n<document>" per request, oldest first; its length is the
//                   generation a watcher compares, so a quiet job's look is one LLEN
//   records:<folder> hash: name -> a small record (the P2P verdict, a recovery meeting's files)
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
#include "watchdog/common/mutex.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/job_board.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/report/redis_client.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {
namespace {

// Long enough to analyse a job days after it was killed; short enough that a cluster's Redis does
// not fill up with ended jobs.
constexpr int kRecordLifetimeSeconds = 3 * 24 * 3600;
// A status costs one round trip of 2 to 4 commands, and its process's look for dump requests one
// more: at this rate a whole job sends a Redis some 50,000 commands a second, a fraction of what one
// Redis thread serves, leaving room for other jobs on a cluster's shared Redis.
constexpr double kStatusWritesPerSecond = 10'000;
// Statuses published between two renewals of the status keys' lifetime.
constexpr std::uint64_t kRenewEvery = 15;
// Statuses fetched per HMGET, and HMGETs per round trip: a few MB in flight.
constexpr std::size_t kFetchBatch = 1000;
constexpr int kBatchesPerRoundTrip = 8;

using Command = RedisCommand;
using Reply = RedisReply;

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
        prefix_(absl::StrCat("ncclguard:{", getuid(), ":", job_id_, "}:")),
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

  absl::StatusOr<std::string> RequestDumps(const std::string& requester,
                                           const std::vector<std::string>& comms) noexcept override {
    try {
      absl::StatusOr<FormattedDumpRequest> request = FormatDumpRequest(requester, comms);
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
