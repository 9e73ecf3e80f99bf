#include "watchdog/recover/p2p_verdict.h"

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "watchdog/common/clock.h"
#include "watchdog/common/files.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/dump_reader.h"
#include "watchdog/report/job_board.h"

namespace ncclguard {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kFormat[] = "ncclguard-p2p-verdict";
// A record is a few hundred bytes; a bigger file is not one.
constexpr std::size_t kMaxRecordBytes = 64 << 10;

// Throws nlohmann::json's exceptions (or std::runtime_error) on a document that is not a record.
P2pVerdictRecord ParseRecord(const std::string& content) {
  const nlohmann::json document = ParseBoundedJson(content);
  if (!document.is_object() || document.value("format", "") != kFormat) {
    throw std::runtime_error(
        absl::StrCat("not an ncclguard P2P verdict (\"format\" is not \"", kFormat, "\")"));
  }
  if (const int version = document.at("format_version").get<int>(); version != kP2pVerdictFormatVersion) {
    throw std::runtime_error(
        absl::StrCat("P2P verdict format version ", version, " is not ", kP2pVerdictFormatVersion));
  }
  if (ParseVerdictKind(document.at("verdict").get<std::string>()) != VerdictKind::kP2pSuspect) {
    throw std::runtime_error("its verdict is not p2p_suspect");
  }
  return P2pVerdictRecord{.job_id = document.at("job_id").get<std::string>(),
                          .launch = document.value("launch", ""),
                          .message = document.at("message").get<std::string>(),
                          .comm = document.at("comm").get<std::string>(),
                          .seq = document.at("seq").get<std::uint64_t>(),
                          .ranks = document.at("ranks").get<std::vector<int>>(),
                          .host = document.at("host").get<std::string>(),
                          .pid = document.at("pid").get<int>(),
                          .rank = document.at("rank").get<int>(),
                          .time_ns = document.at("time_ns").get<std::int64_t>()};
}

absl::StatusOr<P2pVerdictRecord> ReadNow(const std::shared_ptr<JobBoard>& board, const std::string& job_id) {
  const std::string where = absl::StrCat(board->Where(), "/", kP2pVerdictFile);
  absl::StatusOr<std::string> content = board->Get("", kP2pVerdictFile, kMaxRecordBytes);
  if (absl::IsNotFound(content.status())) return absl::NotFoundError(absl::StrCat(where, " does not exist"));
  if (absl::IsUnavailable(content.status())) return content.status();
  if (!content.ok()) {
    // A symbolic link, a file too large or unreadable: something is there, and it is not a record.
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": cannot be read as a P2P verdict: ", content.status().message()));
  }
  P2pVerdictRecord record;
  try {
    record = ParseRecord(*content);
  } catch (const std::exception& error) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": not a P2P verdict of this ncclguard: ", error.what()));
  }
  if (record.job_id != job_id) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the record of job '", record.job_id, "', not of this job '", job_id, "'"));
  }
  return record;
}

}  // namespace

absl::Status WriteP2pVerdict(const std::shared_ptr<JobBoard>& board,
                             const P2pVerdictRecord& record) noexcept {
  std::string content;
  try {
    content = Json{{"format", kFormat},
                   {"format_version", kP2pVerdictFormatVersion},
                   {"job_id", record.job_id},
                   {"launch", record.launch},
                   {"verdict", VerdictKindName(VerdictKind::kP2pSuspect)},
                   {"message", record.message},
                   {"comm", record.comm},
                   {"seq", record.seq},
                   {"ranks", record.ranks},
                   {"host", record.host},
                   {"pid", record.pid},
                   {"rank", record.rank},
                   {"time", IsoTime(record.time_ns)},
                   {"time_ns", record.time_ns}}
                  .dump(-1, ' ', false, Json::error_handler_t::replace);
  } catch (...) {
    return absl::ResourceExhaustedError("cannot format the P2P verdict");
  }
  // Durable: the next attempt, maybe after a node reboot, decides on it.
  return board->Put("", kP2pVerdictFile, content + "\n", /*durable=*/true);
}

absl::StatusOr<P2pVerdictRecord> ReadP2pVerdict(const std::shared_ptr<JobBoard>& board,
                                                const std::string& job_id) noexcept {
  try {
    absl::StatusOr<P2pVerdictRecord> record =
        RunWithDeadline<P2pVerdictRecord>([board, job_id] { return ReadNow(board, job_id); }, kWriteDeadline);
    if (absl::IsDeadlineExceeded(record.status()) || absl::IsUnavailable(record.status())) {
      return absl::UnavailableError(
          absl::StrCat(board->Where(), "/", kP2pVerdictFile, ": ", record.status().message()));
    }
    return record;
  } catch (...) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot read ", board->Where(), "/", kP2pVerdictFile));
  }
}

absl::StatusOr<P2pVerdictRecord> ReadP2pVerdictUnbounded(const std::shared_ptr<JobBoard>& board,
                                                         const std::string& job_id) noexcept {
  try {
    return ReadNow(board, job_id);
  } catch (...) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot read ", board->Where(), "/", kP2pVerdictFile));
  }
}

}  // namespace ncclguard
