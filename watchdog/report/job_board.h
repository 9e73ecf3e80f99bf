// The job board: where the processes of a job find each other. Each process publishes its status
// there, asks the others for dumps and notices their requests, and the recovery meeting and the
// P2P verdict of an earlier attempt are small records on it. One interface, two backends, chosen
// by NCCLGUARD_STORE:
//   - the job directory (default): files in NCCLGUARD_DUMP_DIR/<job id>, nothing to run;
//   - Redis (redis://host:port/db): one hash per kind of record, keys that expire, one round trip
//     per status; for jobs whose metadata load a shared file system would not bear.
// Dumps are files in the job directory on either backend: written once at a stall, they are no
// steady load, and they are too large for a key-value store shared by a whole cluster.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {

// One status as the board holds it, before it is parsed (ParseStatusRecord): read by the same
// rules whichever backend it came from.
struct StatusRecord {
  std::string name;     // status-<host>-<pid>.json
  std::string content;  // the status document
  // The newest heartbeat of its writer (epoch ns), when the board keeps heartbeats apart from the
  // document (which then changes only when the status does); 0 when the document's time is all.
  std::int64_t heartbeat_ns = 0;
};

struct StatusRecords {
  std::vector<StatusRecord> records;
  // The facts records that statuses name instead of holding their facts (PeerStatus::facts_digest),
  // by digest: a board that keeps them apart holds one per distinct set of facts, not one per status.
  absl::flat_hash_map<std::string, std::string> facts;
  std::string why_facts_not_fetched;  // when the board's facts records were not fetched
  // How many statuses the board holds that were not fetched (a deadline stopped the fetch).
  std::size_t not_fetched = 0;
  std::string why_not_fetched;
};

// What a fetch tells of its batches as they come in: the records at positions [first, first + count)
// of the StatusRecords::records it returns, which stay where they are; `expected` is how many the
// fetch can give in all, fixed from the first batch on. Called on the fetching thread; never throws.
// The sink may take a record's content once it has parsed it (its memory goes back sooner).
class StatusBatchSink {
 public:
  virtual ~StatusBatchSink() = default;
  virtual void Fetched(StatusRecord* records, std::size_t first, std::size_t count,
                       std::size_t expected) noexcept = 0;
};

// Who the process is, for the records it writes and the requests it must not report to itself.
struct BoardIdentity {
  std::string host;
  int pid = -1;
  // Requests already on the board when the process first looks are an earlier launch's, unless
  // made at or after this time (epoch ns; see DumpRequestWatcher).
  std::int64_t started_wall_ns = 0;
};

class JobBoard {
 public:
  virtual ~JobBoard() = default;

  // For messages, and what `ncclguard analyze` takes: "/tmp/ncclguard-0/job7", "redis://host:6379/0/job7".
  virtual std::string Where() const = 0;
  // The job's directory, where dumps (and in-process recovery's private copy of NCCL) are files
  // whatever the backend; it need not exist until something is written there.
  virtual const std::string& Directory() const = 0;
  virtual const std::string& JobId() const = 0;
  // How many statuses per second the whole job may write on this board: the status interval
  // stretches for jobs that would write more (StatusIntervalSeconds).
  virtual double StatusWritesPerSecond() const = 0;

  // This process's status, as WriteStatus formats it. A failure is logged once by the board.
  virtual absl::Status PublishStatus(const ProcessSnapshot& snapshot, const ProcessFacts& facts) noexcept = 0;
  // Whether the statuses are files of Directory(): the job reader then reads them there, side by
  // side with the dumps. Otherwise FetchStatuses gives every status on the board, fetched until
  // `deadline`.
  // `batches`, when not null, is told of each batch as soon as it is in, so that it can be parsed
  // while the next one is fetched.
  virtual bool StatusesAreFiles() const = 0;
  virtual absl::StatusOr<StatusRecords> FetchStatuses(std::chrono::steady_clock::time_point deadline,
                                                      StatusBatchSink* batches) noexcept = 0;

  // Asks every process of the job to dump; returns the request's name. `comms`: the requester's
  // communicators, by which a process tells a request of its own job (DumpRequest::comms).
  virtual absl::StatusOr<std::string> RequestDumps(const std::string& requester,
                                                   const std::vector<std::string>& comms = {}) noexcept = 0;
  // The requests of other processes that appeared since the previous call (DumpRequestWatcher's
  // rules). Cheap when nothing changed: one read of one small record.
  virtual absl::StatusOr<std::vector<DumpRequest>> PollDumpRequests() noexcept = 0;

  // Small records under a folder ("" for the job's own, "recovery/<comm>/<epoch>" for a meeting).
  // Put replaces; PutOnce creates and answers AlreadyExists when the name is taken (exactly one
  // of several writers wins); Get answers NotFound for a record that is not there and Unavailable
  // when the board did not answer (try again); any other error means that what holds the name is
  // not a record of ours. Bounded in time (the directory: kWriteDeadline; Redis: its timeouts).
  virtual absl::Status Put(const std::string& folder, const std::string& name, const std::string& content,
                           bool durable) noexcept = 0;
  virtual absl::Status PutOnce(const std::string& folder, const std::string& name, const std::string& content,
                               std::chrono::milliseconds deadline) noexcept = 0;
  virtual absl::StatusOr<std::string> Get(const std::string& folder, const std::string& name,
                                          std::size_t max_bytes) noexcept = 0;
  // The names in `folder` that begin with `prefix` and end with `suffix`, sorted; none when the
  // folder has no record yet. Get and ListNames block as long as the backend does (a file system
  // that hangs, a Redis within its timeouts): callers bound them with RunWithDeadline, holding the
  // board by its shared_ptr.
  virtual absl::StatusOr<std::vector<std::string>> ListNames(const std::string& folder,
                                                             const std::string& prefix,
                                                             const std::string& suffix) noexcept = 0;
};

// NCCLGUARD_STORE_AUTH_FILE: the file of the Redis board's credentials ("" for none).
const std::string& DefaultStoreAuthFile() noexcept;

// The board NCCLGUARD_STORE names (`store`: "" or "dir" for the job directory, redis://host[:port][/db]
// for Redis, whose credentials are read from `auth_file`) for the job `job_id` whose directory is
// `job_dir`. InvalidArgument for a store that is neither, or a URL that carries a password. A
// Redis board connects at its first use, not here.
absl::StatusOr<std::shared_ptr<JobBoard>> OpenJobBoard(const std::string& store, const std::string& job_dir,
                                                       const std::string& job_id, BoardIdentity identity,
                                                       const std::string& auth_file = DefaultStoreAuthFile());

// Whether `text` names a Redis board (redis:// or rediss://, TLS), and the parts of such a name.
// The host may be an IPv6 literal in brackets (redis://[::1]:6379/0). A user or password in the URL
// is refused: the URL is logged, stored in dumps and seen in /proc; credentials live in a file.
struct RedisAddress {
  std::string host;  // an IPv6 literal without its brackets
  int port = 6379;
  int database = 0;
  bool tls = false;
  // The file of the credentials (NCCLGUARD_STORE_AUTH_FILE): not part of the address's text.
  std::string auth_file;
  // What logs, dumps and `ncclguard analyze` show: never a credential.
  std::string ToString() const;
};
bool IsRedisName(const std::string& text);
absl::StatusOr<RedisAddress> ParseRedisAddress(const std::string& text);
// Whether this build can speak TLS to Redis (hiredis_ssl found at configure time).
bool RedisTlsAvailable();
// A job on a Redis board, as `ncclguard analyze` names it: redis://host[:port][/db]/<job id>.
struct RedisJob {
  RedisAddress address;
  std::string job_id;
};
absl::StatusOr<RedisJob> ParseRedisJob(const std::string& text);

// A Redis board (job_board_redis.cc).
std::shared_ptr<JobBoard> MakeRedisBoard(const RedisAddress& address, const std::string& job_dir,
                                         const std::string& job_id, const BoardIdentity& identity);

}  // namespace ncclguard
