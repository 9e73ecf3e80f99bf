// analyze with PyTorch's Flight Recorder dumps beside the job: the verdict names the process group
// and the Python line of the stuck operation; a dump that cannot be read is a problem, never a verdict.
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "cli/synthetic_job.h"
#include "tests/support/process.h"

using ncclguard::SyntheticJob;
using ncclguard::testing::ProcessResult;
using ncclguard::testing::RunProcess;
using ncclguard::testing::TemporaryDirectory;

TEST_CASE("the verdict names the process group and the line that called the stuck operation",
          "[flight_recorder]") {
  TemporaryDirectory scratch;
  const std::string job_dir = scratch.path() + "/job";
  SyntheticJob job;
  job.ranks = 4;
  job.scenario = SyntheticJob::Scenario::kRankNotJoined;
  job.late_rank = 1;
  REQUIRE(ncclguard::WriteSyntheticJob(job_dir, job).ok());
  const std::string prefix = scratch.path() + "/nccl_trace_rank_";
  const ProcessResult written = RunProcess(
      {"/usr/bin/python3", WRITE_FLIGHT_RECORDER_DUMPS, prefix, "4", std::to_string(job.operations), "1"},
      {});
  INFO(written.err);
  REQUIRE(written.exit_code == 0);

  const ProcessResult named =
      RunProcess({NCCLGUARD_COMMAND, "analyze", job_dir, "--flight-recorder-dumps", prefix}, {});
  INFO(named.out << named.err);
  CHECK(named.exit_code == 1);
  CHECK(named.out.find(
            "PyTorch's Flight Recorder: nccl:all_reduce #8 of pg 0 (default_pg) called at train.py:88 in "
            "train_step on ranks 0,2,3") != std::string::npos);
  // A directory holding them under PyTorch's default names does as well.
  const ProcessResult by_directory = RunProcess(
      {NCCLGUARD_COMMAND, "analyze", job_dir, "--json", "--flight-recorder-dumps", scratch.path()}, {});
  CHECK(by_directory.out.find("\"call_site\": \"train.py:88 in train_step\"") != std::string::npos);
  CHECK(by_directory.out.find("\"pg_desc\": \"default_pg\"") != std::string::npos);

  // Rank 2's file cut off by a crash: a problem, and the verdict rests on the other two.
  std::ofstream(prefix + "2", std::ios::trunc) << "\x80\x02}q";
  const ProcessResult cut =
      RunProcess({NCCLGUARD_COMMAND, "analyze", job_dir, "--flight-recorder-dumps", prefix}, {});
  CHECK(cut.exit_code == 1);
  CHECK(cut.out.find("on ranks 0,3") != std::string::npos);
  CHECK(cut.out.find(prefix + "2: pickle: cut off") != std::string::npos);
  CHECK(cut.out.find("RANK_NOT_JOINED") != std::string::npos);
}
