// The statuses a board fetched (Redis), for the job reader (job_reader.cc): parsed while the next
// batch is fetched, and the facts records they name, each parsed once.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "watchdog/common/exit_gate.h"
#include "watchdog/common/mutex.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/job_board.h"
#include "watchdog/report/job_dir.h"

namespace ncclguard::job_reading {

// Parses the statuses a board fetches while the next batch is being fetched: one thread takes each
// batch as the fetch hands it over. The reading threads later take what it parsed and parse what
// it has not reached themselves; a record is parsed once, by whoever claims it first.
class StatusPreParser final : public StatusBatchSink {
 public:
  StatusPreParser() = default;
  StatusPreParser(const StatusPreParser&) = delete;
  StatusPreParser& operator=(const StatusPreParser&) = delete;
  ~StatusPreParser() override { Finish(); }

  void Fetched(StatusRecord* records, std::size_t first, std::size_t count,
               std::size_t expected) noexcept override {
    try {
      MutexLock lock(mutex_);
      if (claims_ == nullptr) {
        claims_ = std::make_unique<std::atomic<std::uint8_t>[]>(expected);
        results_.resize(expected);
        expected_ = expected;
        records_ = records;
        thread_ = std::thread([this] { Run(); });
      }
      batches_.push_back({first, std::min(first + count, expected_)});
      ready_.notify_one();
    } catch (...) {
      // No memory or no thread: the reading threads parse everything themselves.
    }
  }

  // The parsed status of fetched record `index`, `record`: parsed here unless already claimed.
  // Called once the fetch has returned: claims_ and expected_, set at its first batch, stay.
  absl::StatusOr<PeerStatus> Take(std::size_t index, const StatusRecord& record) {
    if (claims_ == nullptr || index >= expected_) return ParseStatusRecord(record.name, record.content);
    std::uint8_t unclaimed = kUnclaimed;
    if (claims_[index].compare_exchange_strong(unclaimed, kClaimed)) return Parse(index);
    // The thread is parsing it: one status, a few microseconds.
    while (claims_[index].load(std::memory_order_acquire) != kParsed) std::this_thread::yield();
    const std::unique_ptr<absl::StatusOr<PeerStatus>> result = std::move(results_[index]);
    if (result == nullptr) return absl::ResourceExhaustedError("cannot be parsed (out of memory)");
    return std::move(*result);
  }

  // No more batches: the thread ends once it has gone through what it was given.
  void Finish() noexcept {
    {
      MutexLock lock(mutex_);
      finished_ = true;
    }
    ready_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  static constexpr std::uint8_t kUnclaimed = 0;
  static constexpr std::uint8_t kClaimed = 1;
  static constexpr std::uint8_t kParsed = 2;
  struct Batch {
    std::size_t first;
    std::size_t end;
  };

  // The next batch; nothing once finished and every batch taken.
  std::optional<Batch> NextBatch() {
    MutexLock lock(mutex_);
    // wait_for: the plain wait of std::condition_variable is a symbol of GCC 12's libstdc++
    // (GLIBCXX_3.4.30), newer than the library needs elsewhere (scripts/glibc-requirement.sh).
    while (!ready_.wait_for(mutex_, std::chrono::seconds(1), [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
      return finished_ || !batches_.empty();
    })) {
    }
    if (batches_.empty()) return std::nullopt;
    const Batch batch = batches_.front();
    batches_.pop_front();
    return batch;
  }

  void Run() noexcept {
    MarkOwnThread();  // its parses park once the application's exit has begun
    try {
      while (const std::optional<Batch> batch = NextBatch()) {
        for (std::size_t index = batch->first; index < batch->end; ++index) {
          std::uint8_t unclaimed = kUnclaimed;
          if (!claims_[index].compare_exchange_strong(unclaimed, kClaimed)) continue;
          try {
            results_[index] = std::make_unique<absl::StatusOr<PeerStatus>>(Parse(index));
          } catch (...) {
            // No result: Take says it could not be parsed.
          }
          claims_[index].store(kParsed, std::memory_order_release);
        }
      }
    } catch (...) {
      // No memory to wait with: the reading threads parse what is left.
    }
  }

  // Record `index`, claimed by the caller; its content is given back once parsed, so that the
  // statuses parsed next take that memory rather than new pages.
  absl::StatusOr<PeerStatus> Parse(std::size_t index) {
    StatusRecord& record = records_[index];
    absl::StatusOr<PeerStatus> status = ParseStatusRecord(record.name, record.content);
    std::string().swap(record.content);
    return status;
  }

  Mutex mutex_;
  std::condition_variable_any ready_;  // waits on mutex_ itself
  std::deque<Batch> batches_ ABSL_GUARDED_BY(mutex_);
  bool finished_ ABSL_GUARDED_BY(mutex_) = false;
  // Set once, at the first batch, and read without the mutex after the fetch: its thread, which
  // set them, started the thread that reads them, and returned before the reading threads began.
  std::size_t expected_ = 0;
  StatusRecord* records_ = nullptr;  // the fetch's, which stay where they are
  // Per record: who parses it, and the result the thread left.
  std::unique_ptr<std::atomic<std::uint8_t>[]> claims_;
  std::vector<std::unique_ptr<absl::StatusOr<PeerStatus>>> results_;
  std::thread thread_;
};

// The facts records a board fetched (StatusRecords::facts), each parsed once, by the first status
// that names it; the statuses that name one get a copy.
class FactsRecords {
 public:
  explicit FactsRecords(const StatusRecords* fetched) {
    if (fetched == nullptr) return;
    why_not_fetched_ = fetched->why_facts_not_fetched;
    records_.reserve(fetched->facts.size());
    for (const auto& [digest, content] : fetched->facts) records_.try_emplace(digest, &content);
  }
  FactsRecords(const FactsRecords&) = delete;
  FactsRecords& operator=(const FactsRecords&) = delete;

  // `status`'s facts from the record it names, when it names one; a status whose record is not
  // there, or cannot be read, keeps its facts unknown, and is counted.
  void Fill(PeerStatus& status) {
    if (status.facts_digest.empty()) return;
    const auto record = records_.find(status.facts_digest);
    if (record == records_.end()) {
      Missed(why_not_fetched_.empty() ? "not on the board" : why_not_fetched_);
      return;
    }
    Record& facts = record->second;
    std::call_once(facts.parsed,
                   [&] { facts.read = ParseStatusFacts(record->first, *facts.content, facts.facts); });
    if (!facts.read.ok()) {
      Missed(std::string(facts.read.message()));
      return;
    }
    status.facts = facts.facts;
    status.facts.host = status.host;
    status.facts.pid = status.pid;
  }

  // One line for every status whose facts stayed unknown; none when there is none.
  std::optional<std::string> Problem() const {
    const MutexLock lock(mutex_);
    if (missed_ == 0) return std::nullopt;
    return absl::StrCat(missed_,
                        " statuses name facts records that could not be read (the first: ", first_why_,
                        "): their processes' environment and system are not known");
  }

 private:
  struct Record {
    explicit Record(const std::string* document) : content(document) {}
    const std::string* content;  // the fetch's
    std::once_flag parsed;       // std's: ThreadSanitizer sees pthread_once, not Abseil's own waiting
    absl::Status read;
    ProcessFacts facts;
  };

  void Missed(std::string why) {
    const MutexLock lock(mutex_);
    if (missed_++ == 0) first_why_ = std::move(why);
  }

  absl::node_hash_map<std::string, Record> records_;  // by digest; a Record does not move
  std::string why_not_fetched_;
  mutable Mutex mutex_;
  std::size_t missed_ ABSL_GUARDED_BY(mutex_) = 0;
  std::string first_why_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace ncclguard::job_reading
