// Pipeline stages on one communicator, as a Python program reaching NCCL through ctypes issues
// them (tests/flight_recorder/fr_job.py): each stage receives from the stage before and sends to
// the stage after, then every stage joins an AllReduce. The stages issue different numbers of
// sends and receives, so each rank's #N names a different operation; one stage stops coming back
// from loading its batch, and every stage's stall line and `ncclguard analyze` must name it. The
// same program also runs JAX's way, one process driving two GPUs.
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/support/process.h"
#include "tests/verdicts_e2e/analysis.h"

namespace ncclguard {
namespace {

using testing::Analysis;
using testing::ProcessOptions;
using testing::ProcessResult;
using testing::TemporaryDirectory;

constexpr int kStages = 4;

struct PipelineJob {
  ProcessResult result;  // the launcher's: every stage's standard error, rank by rank
  std::string job_dir;
};

// Four processes of SCENE (fr_job.py); process `late` loads its batch for ever after step 5.
// The launcher ends them all 10 s later, as a scheduler's time limit would.
PipelineJob RunPipeline(const TemporaryDirectory& dump_dir, const std::string& scene, int late,
                        int processes = kStages) {
  const std::string log = "\"" + dump_dir.path() + "/stage-$rank.log\"";
  const std::string ranks = processes == 2 ? "0 1" : "0 1 2 3";
  const std::string launch = "port=$((20000 + $$ % 20000)); for rank in " + ranks + "; do " +
                             "RANK=$rank NCCL_COMM_ID=127.0.0.1:$port timeout -s KILL 10 " + PYTHON + " " +
                             FR_JOB + " 2>" + log + " & done; wait; for rank in " + ranks + "; do cat " +
                             log + "; done";
  ProcessOptions options;
  options.timeout_seconds = 40;
  options.environment = {{"LD_PRELOAD", PRELOAD_LIBRARY},
                         {"LD_LIBRARY_PATH", EMULATOR_LIBRARY_DIR},
                         {"NCCLGUARD_DUMP_DIR", dump_dir.path()},
                         {"NCCLGUARD_JOB_ID", "pipeline"},
                         {"NCCLGUARD_TIMEOUT", "2"},
                         {"NCCLGUARD_STATUS_INTERVAL", "0.2"},
                         {"WORLD_SIZE", std::to_string(processes)},
                         {"SCENE", scene},
                         {"STEPS", "20"},
                         {"LATE_RANK", std::to_string(late)},
                         {"LATE_STEP", "5"}};
  PipelineJob job;
  job.result = testing::RunProcess({"/bin/sh", "-c", launch}, options);
  job.job_dir = dump_dir.path() + "/pipeline";
  return job;
}

bool Contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// The verdict each waiting stage's watchdog gave in its stall line.
std::vector<std::string> OnlineVerdicts(const std::string& err) {
  std::vector<std::string> verdicts;
  for (const std::string& line : testing::SplitLines(err)) {
    const std::size_t start = line.find(" — verdict: ");
    if (start != std::string::npos)
      verdicts.push_back(line.substr(start + std::string(" — verdict: ").size()));
  }
  return verdicts;
}

void CheckNamed(const PipelineJob& job, int late, const std::vector<std::string>& waits) {
  INFO(job.result.out << job.result.err);
  REQUIRE_FALSE(job.result.timed_out);
  const std::vector<std::string> online = OnlineVerdicts(job.result.out);
  // Every stage but the late one stalls: its stall line names the late stage.
  CHECK(online.size() >= kStages - 1);
  for (const std::string& verdict : online) {
    CHECK(verdict.starts_with("rank_not_joined: rank " + std::to_string(late) + " completed"));
  }
  const Analysis analysis = testing::Analyze(job.job_dir);
  INFO(analysis.result.out);
  const nlohmann::json& verdict = analysis.document.at("verdicts").at(0);
  CHECK(verdict.at("kind") == "rank_not_joined");
  CHECK(verdict.at("ranks") == nlohmann::json({late}));
  const std::string message = verdict.at("message");
  CHECK(Contains(message, "it is alive and busy outside NCCL: in `load_batch`"));
  for (const std::string& wait : waits) CHECK(Contains(message, wait));
}

TEST_CASE("a pipeline stage that stops sending is named, not the transport", "[rank_not_joined][pipeline]") {
  TemporaryDirectory dump_dir;
  // In step 6, stage 1 waits in its send to stage 2, stage 3 in its receive from it, and stage 0,
  // whose send stage 1 received, in the AllReduce.
  const PipelineJob job = RunPipeline(dump_dir, "stages", 2);
  CheckNamed(job, 2,
             {"rank 0 waits in AllReduce #12 (collective 6)", "rank 1 waits in Send #17 to rank 2",
              "rank 3 waits in Recv #11 from rank 2"});
}

TEST_CASE("a pipeline stage that stops receiving is named, with sends and receives not grouped",
          "[rank_not_joined][pipeline]") {
  TemporaryDirectory dump_dir;
  const PipelineJob job = RunPipeline(dump_dir, "pipeline", 1);
  CheckNamed(job, 1, {"rank 0 waits in Send #11 to rank 1", "rank 2 waits in Recv #16 from rank 1"});
}

// JAX's way: each of two processes drives two GPUs, one rank each, in one group per step.
TEST_CASE("analyze's rank table has a row per rank of a process that drives several GPUs",
          "[rank_not_joined]") {
  TemporaryDirectory dump_dir;
  const PipelineJob job = RunPipeline(dump_dir, "devices", 1, /*processes=*/2);
  INFO(job.result.out << job.result.err);
  REQUIRE_FALSE(job.result.timed_out);
  const ProcessResult analysis = testing::RunProcess({NCCLGUARD_CLI, "analyze", job.job_dir});
  INFO(analysis.out << analysis.err);
  CHECK(Contains(analysis.out, "RANK_NOT_JOINED"));
  CHECK(Contains(analysis.out, "ranks: 2-3\n"));
  std::vector<std::string> rows;  // the first column of the rank table
  bool in_table = false;
  for (const std::string& line : testing::SplitLines(analysis.out)) {
    if (line.starts_with("RANK ")) {
      in_table = true;
    } else if (in_table && !line.empty()) {
      rows.push_back(line.substr(0, line.find(' ')));
    } else {
      in_table = false;
    }
  }
  CHECK(rows == std::vector<std::string>{"0", "1", "2", "3"});
}

}  // namespace
}  // namespace ncclguard
