// The recovery rendezvous (rendezvous.h): votes, one decision that only its first writer creates,
// and the waiting between them. Every file of the meeting is read as a stranger's.
//
// Old epochs' directories are left where they are: a few hundred bytes per rank, and the record
// of what was decided at each attempt.
#include "watchdog/recover/rendezvous.h"

#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "watchdog/common/bounded_threads.h"
#include "watchdog/common/clock.h"
#include "watchdog/common/files.h"
#include "watchdog/common/log.h"
#include "watchdog/report/dump_reader.h"
#include "watchdog/report/job_board.h"
#include "watchdog/report/job_files.h"

namespace ncclguard {
namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

constexpr char kVoteFormat[] = "ncclguard-recovery-vote";
constexpr char kDecisionFormat[] = "ncclguard-recovery-decision";
constexpr char kVotePrefix[] = "vote-";
// A vote or a decision takes a few hundred bytes and its reason; a larger file is not one.
constexpr std::size_t kMaxFileBytes = 64 << 10;
constexpr std::size_t kMaxReasonBytes = 4000;
// The least time given to one file operation, even at the deadline: a decision that exists must
// still be read.
constexpr std::chrono::milliseconds kMinFileDeadline{1000};
// How many ranks a reason names before it counts the others.
constexpr std::size_t kRanksNamed = 8;

// What identifies one meeting; copied into board operations, which may outlive the call.
struct Place {
  std::shared_ptr<JobBoard> board;
  std::string folder;     // recovery/<comm>/<epoch>
  std::string directory;  // where that folder is, in messages
  std::string comm;
  int epoch = 0;
  int nranks = 0;
};

struct Vote {
  int rank = -1;
  int pid = -1;
  std::string host;
  bool ready = false;
  std::string reason;
};

struct Decision {
  bool recover = false;
  ncclUniqueId unique_id{};
  std::string reason;
};

struct VoteRead {
  int rank = -1;
  absl::StatusOr<Vote> vote;
};

Decision Fallback(std::string reason) {
  return Decision{.recover = false, .unique_id = {}, .reason = std::move(reason)};
}

RendezvousOutcome OutcomeOf(const Decision& decision) {
  return RendezvousOutcome{
      .recover = decision.recover, .unique_id = decision.unique_id, .reason = decision.reason};
}

// Not an answer yet: nothing there, or the file system did not answer in time. Looked at again.
bool IsTransient(const absl::Status& status) {
  return absl::IsNotFound(status) || absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status);
}

std::string VoteName(int rank) { return absl::StrCat(kVotePrefix, rank, kJsonSuffix); }

// The rank a vote's file name stands for; -1 for a name no rank of this meeting writes.
int RankOfVoteName(absl::string_view name, int nranks) {
  if (!absl::ConsumePrefix(&name, kVotePrefix) || !absl::ConsumeSuffix(&name, kJsonSuffix)) return -1;
  if (name.empty() || name.size() > 6 || (name.size() > 1 && name[0] == '0')) return -1;
  if (!std::all_of(name.begin(), name.end(),
                   [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); }))
    return -1;
  int rank = -1;
  if (!absl::SimpleAtoi(name, &rank) || rank >= nranks) return -1;
  return rank;
}

// "rank 3", "ranks 1, 3 and 5", "ranks 0, 1, ... and 120 more".
std::string DescribeRanks(const std::vector<int>& ranks) {
  if (ranks.size() == 1) return absl::StrCat("rank ", ranks[0]);
  const std::size_t named = std::min(ranks.size(), kRanksNamed);
  const std::vector<int> first(ranks.begin(), ranks.begin() + static_cast<std::ptrdiff_t>(named));
  if (named == ranks.size()) {
    const std::vector<int> but_last(first.begin(), first.end() - 1);
    return absl::StrCat("ranks ", absl::StrJoin(but_last, ", "), " and ", first.back());
  }
  return absl::StrCat("ranks ", absl::StrJoin(first, ", "), " and ", ranks.size() - named, " more");
}

std::string Truncated(const std::string& reason) {
  return reason.size() <= kMaxReasonBytes ? reason : absl::StrCat(reason.substr(0, kMaxReasonBytes), "...");
}

// Throws unless `hex` is exactly the hexadecimal digits of a unique id.
ncclUniqueId UniqueIdOfHex(const std::string& hex) {
  ncclUniqueId id{};
  const bool digits_only = std::all_of(
      hex.begin(), hex.end(), [](char c) { return absl::ascii_isxdigit(static_cast<unsigned char>(c)); });
  if (hex.size() != 2 * sizeof id.internal || !digits_only) {
    throw std::runtime_error(
        absl::StrCat("\"unique_id\" is not ", 2 * sizeof id.internal, " hexadecimal digits"));
  }
  const std::string bytes = absl::HexStringToBytes(hex);
  std::copy(bytes.begin(), bytes.end(), id.internal);
  return id;
}

Json Header(const char* format, const Place& place) {
  return Json{{"format", format},
              {"format_version", kRendezvousFormatVersion},
              {"comm", place.comm},
              {"epoch", place.epoch}};
}

// Throws unless `document` is a `format` file of this meeting, in this format version.
void CheckHeader(const nlohmann::json& document, const char* format, const Place& place) {
  if (!document.is_object() || document.value("format", "") != format) {
    throw std::runtime_error(absl::StrCat("\"format\" is not \"", format, "\""));
  }
  if (const int version = document.at("format_version").get<int>(); version != kRendezvousFormatVersion) {
    throw std::runtime_error(absl::StrCat("format version ", version, " is not ", kRendezvousFormatVersion));
  }
  if (const std::string comm = document.at("comm").get<std::string>(); comm != place.comm) {
    throw std::runtime_error(absl::StrCat("it is about communicator ", comm, ", not ", place.comm));
  }
  if (const int epoch = document.at("epoch").get<int>(); epoch != place.epoch) {
    throw std::runtime_error(absl::StrCat("it is about epoch ", epoch, ", not ", place.epoch));
  }
}

// Throws (nlohmann::json's exceptions or std::runtime_error) unless `content` is the vote of `rank`.
Vote ParseVote(const std::string& content, const Place& place, int rank) {
  const nlohmann::json document = ParseBoundedJson(content);
  CheckHeader(document, kVoteFormat, place);
  Vote vote{.rank = document.at("rank").get<int>(),
            .pid = document.at("pid").get<int>(),
            .host = document.at("host").get<std::string>(),
            .ready = document.at("ready").get<bool>(),
            .reason = document.at("reason").get<std::string>()};
  if (vote.rank != rank) throw std::runtime_error(absl::StrCat("it says it is the vote of rank ", vote.rank));
  return vote;
}

// Throws (nlohmann::json's exceptions or std::runtime_error) unless `content` is a decision.
Decision ParseDecision(const std::string& content, const Place& place) {
  const nlohmann::json document = ParseBoundedJson(content);
  CheckHeader(document, kDecisionFormat, place);
  const std::string kind = document.at("decision").get<std::string>();
  Decision decision = Fallback(document.at("reason").get<std::string>());
  if (kind == "recover") {
    decision.recover = true;
    decision.unique_id = UniqueIdOfHex(document.at("unique_id").get<std::string>());
  } else if (kind != "fallback") {
    throw std::runtime_error(
        absl::StrCat("its decision is \"", kind, "\", neither \"recover\" nor \"fallback\""));
  }
  return decision;
}

// A file's failure to be read: NotFound and Unavailable stay (look again), anything else (a
// symbolic link, a FIFO, a file too large, another owner's) means that what is there is not ours.
absl::Status Refusal(const absl::Status& status) {
  if (IsTransient(status)) return status;
  return absl::InvalidArgumentError(status.message());
}

absl::StatusOr<Decision> ReadDecisionNow(const Place& place) {
  absl::StatusOr<std::string> content = place.board->Get(place.folder, kRecoveryDecisionFile, kMaxFileBytes);
  if (!content.ok()) return Refusal(content.status());
  try {
    return ParseDecision(*content, place);
  } catch (const std::exception& error) {
    return absl::InvalidArgumentError(error.what());
  }
}

// The votes of ranks not in `already`, as far as they are there; a vote that cannot be read yet is
// left for the next look.
absl::StatusOr<std::vector<VoteRead>> ReadNewVotesNow(const Place& place, const std::vector<bool>& already) {
  absl::StatusOr<std::vector<std::string>> names =
      place.board->ListNames(place.folder, kVotePrefix, kJsonSuffix);
  if (!names.ok()) return absl::UnavailableError(names.status().message());
  std::vector<VoteRead> reads;
  for (const std::string& name : *names) {
    const int rank = RankOfVoteName(name, place.nranks);
    if (rank < 0 || already[static_cast<std::size_t>(rank)]) continue;
    absl::StatusOr<std::string> content = place.board->Get(place.folder, name, kMaxFileBytes);
    if (IsTransient(content.status())) continue;
    if (!content.ok()) {
      reads.push_back(VoteRead{.rank = rank, .vote = Refusal(content.status())});
      continue;
    }
    try {
      reads.push_back(VoteRead{.rank = rank, .vote = ParseVote(*content, place, rank)});
    } catch (const std::exception& error) {
      reads.push_back(VoteRead{.rank = rank, .vote = absl::InvalidArgumentError(error.what())});
    }
  }
  return reads;
}

// The ranks that have not voted (whether their votes can be read or not).
absl::StatusOr<std::vector<int>> RanksNotVotedNow(const Place& place) {
  absl::StatusOr<std::vector<std::string>> names =
      place.board->ListNames(place.folder, kVotePrefix, kJsonSuffix);
  if (!names.ok()) return names.status();
  std::vector<bool> voted(static_cast<std::size_t>(place.nranks), false);
  for (const std::string& name : *names) {
    if (const int rank = RankOfVoteName(name, place.nranks); rank >= 0)
      voted[static_cast<std::size_t>(rank)] = true;
  }
  std::vector<int> missing;
  for (int rank = 0; rank < place.nranks; ++rank) {
    if (!voted[static_cast<std::size_t>(rank)]) missing.push_back(rank);
  }
  return missing;
}

// The ranks this process votes for: its own first.
std::vector<int> LocalRanks(const RendezvousRequest& request) {
  std::vector<int> ranks{request.rank};
  ranks.insert(ranks.end(), request.other_local_ranks.begin(), request.other_local_ranks.end());
  return ranks;
}

absl::Status CheckRequest(const RendezvousRequest& request) {
  if (!request.board) return absl::InvalidArgumentError("no job board to meet on");
  if (const std::string& job_dir = request.board->Directory(); job_dir.empty() || job_dir[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("the job directory '", job_dir, "' is not an absolute path"));
  }
  const bool hex = std::all_of(request.comm_id.begin(), request.comm_id.end(), [](char c) {
    return absl::ascii_isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
  });
  if (request.comm_id.size() != 16 || !hex) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", request.comm_id, "' is not a communicator id (16 hexadecimal digits)"));
  }
  if (request.epoch < 1)
    return absl::InvalidArgumentError(absl::StrCat("epoch ", request.epoch, " is not 1 or more"));
  if (request.nranks < 1 || request.nranks > kMaxRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat(request.nranks, " ranks is not between 1 and ", kMaxRanks));
  }
  std::vector<bool> named(static_cast<std::size_t>(request.nranks), false);
  for (const int rank : LocalRanks(request)) {
    if (rank < 0 || rank >= request.nranks) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " is not one of ", request.nranks, " ranks"));
    }
    if (named[static_cast<std::size_t>(rank)]) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is named twice"));
    }
    named[static_cast<std::size_t>(rank)] = true;
  }
  if (request.timeout.count() < 0) return absl::InvalidArgumentError("the timeout is negative");
  return absl::OkStatus();
}

// One rank's part in one meeting. Not shared between threads.
class Meeting {
 public:
  explicit Meeting(const RendezvousRequest& request)
      : request_(request),
        place_{.board = request.board,
               .folder = RendezvousFolder(request),
               .directory = RendezvousDirectory(request),
               .comm = request.comm_id,
               .epoch = request.epoch,
               .nranks = request.nranks},
        deadline_(Clock::now() + request.timeout),
        host_(log::HostName()),
        pid_(static_cast<int>(getpid())) {}

  RendezvousOutcome Run(const UniqueIdMaker& make_unique_id);

 private:
  std::chrono::milliseconds Remaining() const {
    return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now()),
                    std::chrono::milliseconds(0));
  }
  bool Expired() const { return Clock::now() >= deadline_; }
  // When to stop retrying a file operation begun now: at the deadline, but never before it has
  // had kMinFileDeadline (a busy process may refuse a moment; see RunWithDeadline).
  Clock::time_point RetryUntil() const { return std::max(deadline_, Clock::now() + kMinFileDeadline); }
  // A file operation's deadline: the time left, but never so little that an answer on disk is missed.
  std::chrono::milliseconds FileDeadline() const {
    return std::clamp(Remaining(), kMinFileDeadline, kReadDeadline);
  }
  // Waits for the next look; past the deadline a whole interval, so that no loop spins.
  void Sleep() const {
    const std::chrono::milliseconds left = Remaining();
    std::this_thread::sleep_for(left.count() > 0 ? std::min(left, kRendezvousPollInterval)
                                                 : kRendezvousPollInterval);
  }
  std::string Stamped(Json document, int rank) const;
  absl::Status WriteVote(int rank);
  absl::StatusOr<Decision> ReadDecision() const;
  std::optional<Decision> LookForDecision(bool* surely_none) const;
  Decision HostileDecision(const absl::Status& refusal) const;
  std::optional<std::string> CollectVotes();
  Decision MakeRecoverDecision(const UniqueIdMaker& make_unique_id) const;
  std::string TimeoutReason() const;
  RendezvousOutcome Conclude(const Decision& proposal);
  RendezvousOutcome FollowPublishedDecision() const;

  const RendezvousRequest& request_;
  const Place place_;
  const Clock::time_point deadline_;
  const std::string host_;
  const int pid_;
  // Rank 0: the ranks whose vote said ready, and how many.
  std::vector<bool> ready_;
  int ready_count_ = 0;
};

std::string Meeting::Stamped(Json document, int rank) const {
  const std::int64_t now = WallNowNs();
  document["rank"] = rank;
  document["pid"] = pid_;
  document["host"] = host_;
  document["time"] = IsoTime(now);
  document["time_ns"] = now;
  // A reason may quote NCCL's or the application's bytes, which need not be UTF-8.
  return document.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

absl::Status Meeting::WriteVote(int rank) {
  Json vote = Header(kVoteFormat, place_);
  vote["ready"] = request_.ready;
  vote["reason"] = request_.ready ? "" : Truncated(request_.not_ready_reason);
  const std::string content = Stamped(std::move(vote), rank);
  const Clock::time_point give_up = RetryUntil();
  for (;;) {
    // Not durable: the meeting matters only while the job runs.
    const absl::Status written = place_.board->Put(place_.folder, VoteName(rank), content, /*durable=*/false);
    if (written.ok() || !IsTransient(written) || Clock::now() >= give_up) return written;
    Sleep();
  }
}

absl::StatusOr<Decision> Meeting::ReadDecision() const {
  return RunWithDeadline<Decision>([place = place_] { return ReadDecisionNow(place); }, FileDeadline());
}

// The decision, if one is there. `*surely_none` says whether the look found the name free, rather
// than failing to look (the file layer busy, a file system slow to answer).
std::optional<Decision> Meeting::LookForDecision(bool* surely_none) const {
  absl::StatusOr<Decision> decision = ReadDecision();
  *surely_none = absl::IsNotFound(decision.status());
  if (decision.ok()) return *decision;
  if (IsTransient(decision.status())) return std::nullopt;
  return HostileDecision(decision.status());
}

// Something that is not a decision holds the decision's name, so that no decision can be made:
// every rank that looks finds the same thing there and falls back.
Decision Meeting::HostileDecision(const absl::Status& refusal) const {
  return Fallback(
      absl::StrCat(place_.directory, "/", kRecoveryDecisionFile, " is not a decision: ", refusal.message()));
}

// Rank 0: reads the votes not read yet. Returns why to fall back when a rank cannot recover or its
// vote is not one.
std::optional<std::string> Meeting::CollectVotes() {
  if (ready_.empty()) ready_.assign(static_cast<std::size_t>(place_.nranks), false);
  absl::StatusOr<std::vector<VoteRead>> reads = RunWithDeadline<std::vector<VoteRead>>(
      [place = place_, already = ready_] { return ReadNewVotesNow(place, already); }, FileDeadline());
  if (!reads.ok()) return std::nullopt;  // looked at again next time
  std::vector<std::string> problems;
  for (const VoteRead& read : *reads) {
    if (!read.vote.ok()) {
      problems.push_back(absl::StrCat("the vote of rank ", read.rank, " (", place_.directory, "/",
                                      VoteName(read.rank), ") is not one: ", read.vote.status().message()));
    } else if (!read.vote->ready) {
      problems.push_back(absl::StrCat("rank ", read.rank, " (pid ", read.vote->pid, " on ", read.vote->host,
                                      ") cannot recover: ", read.vote->reason));
    } else {
      ready_[static_cast<std::size_t>(read.rank)] = true;
      ++ready_count_;
    }
  }
  if (problems.empty()) return std::nullopt;
  return Truncated(absl::StrJoin(problems, "; "));
}

Decision Meeting::MakeRecoverDecision(const UniqueIdMaker& make_unique_id) const {
  absl::StatusOr<ncclUniqueId> unique_id = absl::InvalidArgumentError("it was given no way to make one");
  if (make_unique_id) {
    try {
      unique_id = make_unique_id();
    } catch (...) {
      unique_id = absl::InternalError("making it threw an exception");
    }
  }
  if (!unique_id.ok()) {
    return Fallback(absl::StrCat("rank 0 could not make the new communicator's unique id: ",
                                 unique_id.status().message()));
  }
  return Decision{.recover = true,
                  .unique_id = *unique_id,
                  .reason = absl::StrCat("all ", place_.nranks, " ranks are ready")};
}

std::string Meeting::TimeoutReason() const {
  const std::string waited = absl::StrCat("no decision within ", request_.timeout.count(), " ms");
  const Clock::time_point give_up = Clock::now() + kMinFileDeadline;
  absl::StatusOr<std::vector<int>> missing = absl::UnavailableError("not listed");
  for (;;) {
    missing = RunWithDeadline<std::vector<int>>([place = place_] { return RanksNotVotedNow(place); },
                                                FileDeadline());
    if (missing.ok() || !IsTransient(missing.status()) || Clock::now() >= give_up) break;
    Sleep();
  }
  if (!missing.ok())
    return absl::StrCat(waited, " (the votes could not be listed: ", missing.status().message(), ")");
  if (missing->empty()) return absl::StrCat(waited, ": every rank voted, but rank 0 published no decision");
  return absl::StrCat(waited, ": ", DescribeRanks(*missing), " did not vote");
}

// Publishes `proposal` as the decision unless another rank published one first; returns the decision.
RendezvousOutcome Meeting::Conclude(const Decision& proposal) {
  Json document = Header(kDecisionFormat, place_);
  document["decision"] = proposal.recover ? "recover" : "fallback";
  if (proposal.recover) {
    document["unique_id"] = absl::BytesToHexString(
        absl::string_view(proposal.unique_id.internal, sizeof proposal.unique_id.internal));
  }
  document["reason"] = Truncated(proposal.reason);
  const std::string content = Stamped(std::move(document), request_.rank);
  const Clock::time_point give_up = RetryUntil();
  for (;;) {
    const absl::Status published =
        place_.board->PutOnce(place_.folder, kRecoveryDecisionFile, content, FileDeadline());
    if (published.ok()) return OutcomeOf(proposal);
    if (absl::IsAlreadyExists(published)) return FollowPublishedDecision();
    if (!IsTransient(published) || Clock::now() >= give_up) {
      // The others cannot learn this from the directory; they fall back when their deadline passes.
      return OutcomeOf(
          Fallback(absl::StrCat(proposal.recover ? "all ranks are ready" : proposal.reason, "; rank ",
                                request_.rank, " could not publish the decision: ", published.message())));
    }
    Sleep();
  }
}

// The decision exists: every rank that reads it follows it, so it is read even past the deadline,
// for the least time a file operation is given.
RendezvousOutcome Meeting::FollowPublishedDecision() const {
  const Clock::time_point give_up = RetryUntil();
  for (;;) {
    absl::StatusOr<Decision> decision = ReadDecision();
    if (decision.ok()) return OutcomeOf(*decision);
    if (!IsTransient(decision.status())) return OutcomeOf(HostileDecision(decision.status()));
    if (Clock::now() >= give_up) {
      return OutcomeOf(Fallback(
          absl::StrCat("rank ", request_.rank, " cannot read the decision another rank published (",
                       place_.directory, "/", kRecoveryDecisionFile, "): ", decision.status().message())));
    }
    Sleep();
  }
}

RendezvousOutcome Meeting::Run(const UniqueIdMaker& make_unique_id) {
  const int rank = request_.rank;
  const std::vector<int> local_ranks = LocalRanks(request_);
  for (const int local_rank : local_ranks) {
    if (absl::Status voted = WriteVote(local_rank); !voted.ok()) {
      return Conclude(
          Fallback(absl::StrCat("rank ", local_rank, " could not write its vote: ", voted.message())));
    }
  }
  const bool leads = std::ranges::find(local_ranks, 0) != local_ranks.end();
  if (!request_.ready) {
    // Said at once in the decision: nobody waits for the deadline.
    RendezvousOutcome outcome =
        Conclude(Fallback(absl::StrCat("rank ", rank, " cannot recover: ", request_.not_ready_reason)));
    if (outcome.recover) {
      // Only a decision that was not rank 0's says so; this rank cannot follow it anyway.
      outcome = OutcomeOf(Fallback(absl::StrCat("rank ", rank, " cannot recover (", request_.not_ready_reason,
                                                "), yet the decision says to recover")));
    }
    return outcome;
  }
  for (;;) {
    bool surely_none = false;
    if (std::optional<Decision> decision = LookForDecision(&surely_none)) return OutcomeOf(*decision);
    // Rank 0 makes a unique id only once it has seen that no decision exists: an id made in vain
    // leaves the private instance's bootstrap thread waiting for ranks that never come.
    if (leads && surely_none) {
      if (std::optional<std::string> problem = CollectVotes()) return Conclude(Fallback(*problem));
      if (ready_count_ == place_.nranks) return Conclude(MakeRecoverDecision(make_unique_id));
    }
    if (Expired()) return Conclude(Fallback(TimeoutReason()));
    Sleep();
  }
}

}  // namespace

std::string RendezvousFolder(const RendezvousRequest& request) {
  return absl::StrCat(kRecoveryDirectory, "/", request.comm_id, "/", request.epoch);
}

std::string RendezvousDirectory(const RendezvousRequest& request) {
  return absl::StrCat(request.board ? request.board->Where() : std::string("?"), "/",
                      RendezvousFolder(request));
}

absl::StatusOr<RendezvousOutcome> MeetToRecover(const RendezvousRequest& request,
                                                const UniqueIdMaker& make_unique_id) noexcept {
  try {
    if (absl::Status valid = CheckRequest(request); !valid.ok()) return valid;
    Meeting meeting(request);
    return meeting.Run(make_unique_id);
  } catch (const std::exception& error) {
    return absl::ResourceExhaustedError(absl::StrCat("the recovery rendezvous failed: ", error.what()));
  } catch (...) {
    return absl::InternalError("the recovery rendezvous failed");
  }
}

}  // namespace ncclguard
