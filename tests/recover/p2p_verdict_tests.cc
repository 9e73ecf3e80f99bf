// The record that an attempt of a job found P2P at fault: written, read back, and refused when it
// is not a record of this job.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/support/board.h"
#include "tests/support/process.h"
#include "watchdog/recover/p2p_verdict.h"

namespace ncclguard {
namespace {

namespace fs = std::filesystem;
using testing::TemporaryDirectory;

P2pVerdictRecord SampleRecord() {
  return P2pVerdictRecord{.job_id = "job-7",
                          .launch = "",
                          .message = "all 2 ranks entered AllReduce #51 ... NCCL_P2P_DISABLE=1 avoids them",
                          .comm = "93996a01f150309a",
                          .seq = 51,
                          .ranks = {0, 1},
                          .host = "node3",
                          .pid = 4211,
                          .rank = 1,
                          .time_ns = 1'700'000'000'123'000'000};
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  REQUIRE(chmod(path.c_str(), 0600) == 0);
}

// The message of a read that must fail with InvalidArgument.
std::string Refusal(const std::string& job_dir, const std::string& job_id = "job-7") {
  const absl::StatusOr<P2pVerdictRecord> read = ReadP2pVerdict(testing::DirectoryBoard(job_dir), job_id);
  REQUIRE_FALSE(read.ok());
  INFO(read.status().ToString());
  CHECK(absl::IsInvalidArgument(read.status()));
  return std::string(read.status().message());
}

TEST_CASE("a P2P verdict is written privately and read back whole", "[p2p_verdict]") {
  TemporaryDirectory base;
  const std::string job_dir = base.path() + "/job-7";
  REQUIRE(WriteP2pVerdict(testing::DirectoryBoard(job_dir), SampleRecord()).ok());

  struct stat file {};
  REQUIRE(stat((job_dir + "/p2p-verdict.json").c_str(), &file) == 0);
  CHECK((file.st_mode & 0777) == 0600);
  const nlohmann::json document = nlohmann::json::parse(testing::ReadFile(job_dir + "/p2p-verdict.json"));
  CHECK(document.at("format") == "ncclguard-p2p-verdict");
  CHECK(document.at("format_version") == kP2pVerdictFormatVersion);
  CHECK(document.at("verdict") == "p2p_suspect");
  CHECK(document.at("time") == "2023-11-14T22:13:20.123Z");

  const absl::StatusOr<P2pVerdictRecord> read = ReadP2pVerdict(testing::DirectoryBoard(job_dir), "job-7");
  REQUIRE(read.ok());
  const P2pVerdictRecord expected = SampleRecord();
  CHECK(read->job_id == expected.job_id);
  CHECK(read->message == expected.message);
  CHECK(read->comm == expected.comm);
  CHECK(read->seq == expected.seq);
  CHECK(read->ranks == expected.ranks);
  CHECK(read->host == expected.host);
  CHECK(read->pid == expected.pid);
  CHECK(read->rank == expected.rank);
  CHECK(read->time_ns == expected.time_ns);

  // A second writer replaces the record.
  P2pVerdictRecord newer = SampleRecord();
  newer.rank = 0;
  REQUIRE(WriteP2pVerdict(testing::DirectoryBoard(job_dir), newer).ok());
  CHECK(ReadP2pVerdict(testing::DirectoryBoard(job_dir), "job-7")->rank == 0);
}

TEST_CASE("no record: NotFound, whether or not the job directory exists", "[p2p_verdict]") {
  TemporaryDirectory base;
  CHECK(absl::IsNotFound(
      ReadP2pVerdict(testing::DirectoryBoard(base.path() + "/never-ran"), "never-ran").status()));
  CHECK(absl::IsNotFound(ReadP2pVerdict(testing::DirectoryBoard(base.path()), "x").status()));
}

TEST_CASE("a file that is not a record of this job is refused, naming the file and why", "[p2p_verdict]") {
  TemporaryDirectory base;
  const std::string job_dir = base.path() + "/job-7";
  REQUIRE(WriteP2pVerdict(testing::DirectoryBoard(job_dir), SampleRecord()).ok());
  const std::string path = job_dir + "/p2p-verdict.json";
  const std::string written = testing::ReadFile(path);

  SECTION("another job's") {
    const std::string message = Refusal(job_dir, "job-8");
    CHECK(message == path + ": the record of job 'job-7', not of this job 'job-8'");
  }
  SECTION("truncated") {
    WriteText(path, written.substr(0, written.size() / 2));
    const std::string message = Refusal(job_dir);
    CHECK(message.starts_with(path + ": not a P2P verdict of this ncclguard: "));
    CHECK(message.find("parse error") != std::string::npos);
  }
  SECTION("another program's JSON") {
    WriteText(path, R"({"format": "ncclguard-status", "format_version": 1})");
    CHECK(Refusal(job_dir) ==
          path +
              ": not a P2P verdict of this ncclguard: not an ncclguard P2P verdict (\"format\" is not "
              "\"ncclguard-p2p-verdict\")");
  }
  SECTION("another format version") {
    nlohmann::json document = nlohmann::json::parse(written);
    document["format_version"] = kP2pVerdictFormatVersion + 1;
    WriteText(path, document.dump());
    CHECK(Refusal(job_dir).ends_with("P2P verdict format version 2 is not 1"));
  }
  SECTION("a field missing") {
    nlohmann::json document = nlohmann::json::parse(written);
    document.erase("job_id");
    WriteText(path, document.dump());
    CHECK(Refusal(job_dir).find("job_id") != std::string::npos);
  }
  SECTION("too large to be one") {
    WriteText(path, std::string(1 << 20, ' '));
    CHECK(Refusal(job_dir) == path + ": cannot be read as a P2P verdict: larger than 65536 bytes");
  }
  SECTION("a symbolic link") {
    fs::remove(path);
    fs::create_symlink(base.path() + "/elsewhere.json", path);
    CHECK(Refusal(job_dir).starts_with(path + ": cannot be read as a P2P verdict: "));
  }
}

}  // namespace
}  // namespace ncclguard
