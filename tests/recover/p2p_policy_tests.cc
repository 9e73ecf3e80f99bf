// The P2P decision before the first communicator, as a pure function of its inputs: every branch
// (the user's setting, NCCLGUARD_P2P=off/on/auto, a verdict of an earlier attempt, a `disable`
// entry, NCCL's config files), and the reading of NCCL's config files.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "tests/support/process.h"
#include "watchdog/recover/p2p_policy.h"
#include "watchdog/report/dump.h"

namespace ncclguard {
namespace {

using testing::TemporaryDirectory;

EnvironmentReader Reader(std::map<std::string, std::string> variables) {
  return [variables = std::move(variables)](const char* name, std::string* value) {
    const auto found = variables.find(name);
    if (found == variables.end()) return false;
    *value = found->second;
    return true;
  };
}

KnownBadEntry Entry(const std::string& id, KnownBadAction action, const std::string& gpu_name) {
  KnownBadEntry entry;
  entry.id = id;
  entry.action = action;
  entry.match.gpu_name = gpu_name;
  entry.match.gpu_name_pattern.emplace(gpu_name);
  entry.match.p2p_enabled = true;
  entry.summary = id + " breaks P2P";
  entry.remedy = "set NCCL_P2P_DISABLE=1";
  entry.source = "https://example.org/" + id;
  return entry;
}

P2pVerdictRecord Verdict() {
  P2pVerdictRecord record;
  record.job_id = "slurm-42.0";
  record.message = "stuck inside NCCL with P2P in use on NVIDIA GeForce RTX 4090 GPUs";
  record.comm = "4865c4aaa8a6022e";
  record.seq = 51;
  record.ranks = {0, 1};
  record.host = "node3";
  record.pid = 4211;
  record.rank = 1;
  return record;
}

// A GeForce machine with a `warn` entry for GeForce and a `disable` entry for a name it lacks.
P2pPolicyInputs Inputs(P2pMode mode, std::map<std::string, std::string> environment = {}) {
  P2pPolicyInputs inputs;
  inputs.mode = mode;
  inputs.read_environment = Reader(environment);
  for (const auto& [name, value] : environment) inputs.facts.environment.emplace_back(name, value);
  inputs.facts.cuda.gpus.push_back(GpuFacts{.device = 0, .name = "NVIDIA GeForce RTX 4090"});
  inputs.job_id_known = true;
  inputs.verdict = absl::NotFoundError("no p2p-verdict.json");
  inputs.known_bad = {Entry("geforce", KnownBadAction::kWarn, "GeForce"),
                      Entry("h100", KnownBadAction::kDisable, "H100")};
  return inputs;
}

constexpr char kGeforceReport[] =
    "known-bad configuration: [geforce] GPU NVIDIA GeForce RTX 4090, P2P not disabled: geforce breaks P2P — set "
    "NCCL_P2P_DISABLE=1";
const EnvironmentVariables kDisable = {{"NCCL_P2P_DISABLE", "1"}};

TEST_CASE("auto with nothing against P2P changes nothing, and still reports warn entries", "[p2p_policy]") {
  const P2pDecision decision = DecideP2p(Inputs(P2pMode::kAuto));
  CHECK(decision.set_environment.empty());
  CHECK(decision.known_bad_report == kGeforceReport);
  CHECK(decision.warnings.empty());
  CHECK(decision.infos.empty());
}

TEST_CASE("several matches are one line", "[p2p_policy]") {
  P2pPolicyInputs inputs = Inputs(P2pMode::kOn);
  inputs.known_bad.push_back(Entry("rtx", KnownBadAction::kWarn, "RTX"));
  CHECK(DecideP2p(inputs).known_bad_report ==
        "known-bad configurations: [geforce] GPU NVIDIA GeForce RTX 4090, P2P not disabled: geforce breaks P2P — set "
        "NCCL_P2P_DISABLE=1 | [rtx] GPU NVIDIA GeForce RTX 4090, P2P not disabled: rtx breaks P2P — set "
        "NCCL_P2P_DISABLE=1");
}

TEST_CASE("off disables P2P and says why", "[p2p_policy]") {
  const P2pDecision decision = DecideP2p(Inputs(P2pMode::kOff));
  CHECK(decision.set_environment == kDisable);
  CHECK(decision.warnings ==
        std::vector<std::string>{"NCCL_P2P_DISABLE=1 set before the first communicator: NCCLGUARD_P2P=off"});
  CHECK(decision.known_bad_report == std::string(kGeforceReport) + " (now moot: P2P is turned off, see below)");
}

TEST_CASE("on never disables P2P, not for a verdict nor for a disable entry", "[p2p_policy]") {
  P2pPolicyInputs inputs = Inputs(P2pMode::kOn);
  inputs.verdict = Verdict();
  inputs.facts.cuda.gpus.push_back(GpuFacts{.device = 1, .name = "NVIDIA H100 80GB HBM3"});
  const P2pDecision decision = DecideP2p(inputs);
  CHECK(decision.set_environment.empty());
  CHECK(decision.warnings.empty());
  CHECK(decision.known_bad_report.find("[h100]") != std::string::npos);
}

TEST_CASE("auto disables P2P for a verdict of an earlier attempt", "[p2p_policy]") {
  P2pPolicyInputs inputs = Inputs(P2pMode::kAuto);
  inputs.verdict = Verdict();
  const P2pDecision decision = DecideP2p(inputs);
  CHECK(decision.set_environment == kDisable);
  CHECK(decision.warnings ==
        std::vector<std::string>{
            "NCCL_P2P_DISABLE=1 set before the first communicator: an earlier attempt of job slurm-42.0 found P2P at "
            "fault (4865c4aaa8a6022e: stuck inside NCCL with P2P in use on NVIDIA GeForce RTX 4090 GPUs, recorded by "
            "rank 1 on node3, pid 4211)"});
}

TEST_CASE("a verdict of another launch under the same job id is another job's: reported, never followed",
          "[p2p_policy]") {
  P2pPolicyInputs inputs = Inputs(P2pMode::kAuto);
  P2pVerdictRecord record = Verdict();
  record.launch = "slurm-42_torchelastic-a";
  inputs.verdict = record;
  inputs.launch_id = "slurm-42_torchelastic-b";
  const P2pDecision decision = DecideP2p(inputs);
  CHECK(decision.set_environment.empty());
  CHECK(decision.warnings ==
        std::vector<std::string>{
            "P2P verdict of another job ignored: job id slurm-42.0 holds a record of launch "
            "'slurm-42_torchelastic-a' (4865c4aaa8a6022e: stuck inside NCCL with P2P in use on NVIDIA GeForce RTX "
            "4090 GPUs, recorded by rank 1 on node3, pid 4211), and this process is of launch "
            "'slurm-42_torchelastic-b' (NCCLGUARD_LAUNCH_ID, else the launchers' job ids); P2P is left as it is"});
  // The restarted attempt of the recording launch follows it.
  inputs.launch_id = "slurm-42_torchelastic-a";
  CHECK(DecideP2p(inputs).set_environment == kDisable);
}

TEST_CASE("auto disables P2P for the verdict `ncclguard run` handed over, without the board's record",
          "[p2p_policy]") {
  P2pPolicyInputs inputs = Inputs(P2pMode::kAuto);
  inputs.job_id = "slurm-42.0";
  inputs.handed_over_verdict = DescribeP2pVerdictRecord(Verdict());
  const P2pDecision decision = DecideP2p(inputs);
  CHECK(decision.set_environment == kDisable);
  CHECK(decision.warnings ==
        std::vector<std::string>{
            "NCCL_P2P_DISABLE=1 set before the first communicator: an earlier attempt of job slurm-42.0 found P2P at "
            "fault (4865c4aaa8a6022e: stuck inside NCCL with P2P in use on NVIDIA GeForce RTX 4090 GPUs, recorded by "
            "rank 1 on node3, pid 4211; NCCLGUARD_P2P_VERDICT)"});
  // Not under `on`, like any verdict.
  inputs.mode = P2pMode::kOn;
  CHECK(DecideP2p(inputs).set_environment.empty());
}

TEST_CASE("auto disables P2P for a matching disable entry", "[p2p_policy]") {
  P2pPolicyInputs inputs = Inputs(P2pMode::kAuto);
  inputs.facts.cuda.gpus = {GpuFacts{.device = 0, .name = "NVIDIA H100 80GB HBM3"}};
  const P2pDecision decision = DecideP2p(inputs);
  CHECK(decision.set_environment == kDisable);
  CHECK(decision.known_bad_report ==
        "known-bad configuration: [h100] GPU NVIDIA H100 80GB HBM3, P2P not disabled: h100 breaks P2P — set "
        "NCCL_P2P_DISABLE=1 (now moot: P2P is turned off, see below)");
  CHECK(decision.warnings ==
        std::vector<std::string>{"NCCL_P2P_DISABLE=1 set before the first communicator: known-bad configuration h100"});
}

TEST_CASE("a corrupt or foreign verdict file changes nothing and is named in a warning", "[p2p_policy]") {
  P2pPolicyInputs inputs = Inputs(P2pMode::kAuto);
  inputs.verdict = absl::InvalidArgumentError("/tmp/job/p2p-verdict.json: is the record of job slurm-41.0, not slurm-42.0");
  const P2pDecision decision = DecideP2p(inputs);
  CHECK(decision.set_environment.empty());
  CHECK(decision.warnings ==
        std::vector<std::string>{"P2P verdict of an earlier attempt not used: /tmp/job/p2p-verdict.json: is the "
                                 "record of job slurm-41.0, not slurm-42.0"});
}

TEST_CASE("without a job id no verdict can be looked for, said at info level", "[p2p_policy]") {
  P2pPolicyInputs inputs = Inputs(P2pMode::kAuto);
  inputs.job_id_known = false;
  inputs.verdict.reset();
  const P2pDecision decision = DecideP2p(inputs);
  CHECK(decision.set_environment.empty());
  CHECK(decision.warnings.empty());
  CHECK(decision.infos ==
        std::vector<std::string>{"no job id before the first communicator (neither NCCLGUARD_JOB_ID nor a launcher's "
                                 "job id is set): no P2P verdict of an earlier attempt can be found"});
}

TEST_CASE("the user's NCCL_P2P_DISABLE or NCCL_P2P_LEVEL wins", "[p2p_policy]") {
  SECTION("in the environment, against NCCLGUARD_P2P=off") {
    const P2pDecision decision = DecideP2p(Inputs(P2pMode::kOff, {{"NCCL_P2P_DISABLE", "0"}}));
    CHECK(decision.set_environment.empty());
    CHECK(decision.warnings == std::vector<std::string>{"P2P left as the user set it (NCCL_P2P_DISABLE=0 in the "
                                                        "environment) although NCCLGUARD_P2P=off"});
  }
  SECTION("in the environment, against a verdict") {
    P2pPolicyInputs inputs = Inputs(P2pMode::kAuto, {{"NCCL_P2P_LEVEL", "SYS"}});
    inputs.verdict = Verdict();
    const P2pDecision decision = DecideP2p(inputs);
    CHECK(decision.set_environment.empty());
    REQUIRE(decision.warnings.size() == 1);
    CHECK(decision.warnings[0].starts_with("P2P left as the user set it (NCCL_P2P_LEVEL=SYS in the environment) "
                                           "although an earlier attempt of job slurm-42.0 found P2P at fault"));
  }
  SECTION("with nothing against P2P: only said at info level") {
    const P2pDecision decision = DecideP2p(Inputs(P2pMode::kAuto, {{"NCCL_P2P_LEVEL", "NVL"}}));
    CHECK(decision.warnings.empty());
    CHECK(decision.infos == std::vector<std::string>{"P2P left as the user set it: NCCL_P2P_LEVEL=NVL in the environment"});
  }
  SECTION("in a config file, which NCCL would load after our setenv and lose to it") {
    P2pPolicyInputs inputs = Inputs(P2pMode::kOff);
    inputs.config_files = {{"/home/u/.nccl.conf", "# mine\nNCCL_DEBUG=INFO\n"},
                           {"/etc/nccl.conf", "NCCL_P2P_DISABLE=0\nNCCL_P2P_LEVEL=PIX\n"}};
    const P2pDecision decision = DecideP2p(inputs);
    CHECK(decision.set_environment.empty());
    CHECK(decision.warnings ==
          std::vector<std::string>{"P2P left as the user set it (NCCL_P2P_DISABLE=0 in /etc/nccl.conf, "
                                   "NCCL_P2P_LEVEL=PIX in /etc/nccl.conf) although NCCLGUARD_P2P=off"});
  }
  SECTION("a config file that disables P2P: warn entries that need P2P enabled do not match") {
    P2pPolicyInputs inputs = Inputs(P2pMode::kAuto);
    inputs.config_files = {{"/etc/nccl.conf", "NCCL_P2P_DISABLE=1\n"}};
    const P2pDecision decision = DecideP2p(inputs);
    CHECK(decision.known_bad_report.empty());
    CHECK(decision.set_environment.empty());
  }
  SECTION("the environment beats a config file, as in NCCL") {
    P2pPolicyInputs inputs = Inputs(P2pMode::kOff, {{"NCCL_P2P_DISABLE", "1"}});
    inputs.config_files = {{"/etc/nccl.conf", "NCCL_P2P_DISABLE=0\n"}};
    const P2pDecision decision = DecideP2p(inputs);
    CHECK(decision.warnings == std::vector<std::string>{"P2P left as the user set it (NCCL_P2P_DISABLE=1 in the "
                                                        "environment) although NCCLGUARD_P2P=off"});
  }
}

TEST_CASE("NCCL config files are read as NCCL reads them", "[p2p_policy]") {
  CHECK(ParseNcclConfigFile("# comment\nNCCL_DEBUG=INFO  \n\nnot a setting\n=x\nNCCL_P2P_LEVEL=NVL\r\nNCCL_ALGO=Ring") ==
        EnvironmentVariables{{"NCCL_DEBUG", "INFO"}, {"NCCL_P2P_LEVEL", "NVL"}, {"NCCL_ALGO", "Ring"}});

  TemporaryDirectory home;
  REQUIRE(WriteFileAtomically(home.path(), ".nccl.conf", "NCCL_P2P_DISABLE=0\n", false).ok());
  REQUIRE(WriteFileAtomically(home.path(), "site.conf", "NCCL_P2P_LEVEL=SYS\n", false).ok());
  std::vector<NcclConfigFile> files = ReadNcclConfigFiles(Reader({{"HOME", home.path()}}));
  REQUIRE_FALSE(files.empty());
  CHECK(files[0].path == home.path() + "/.nccl.conf");
  CHECK(files[0].content == "NCCL_P2P_DISABLE=0\n");
  // NCCL_CONF_FILE replaces ~/.nccl.conf.
  files = ReadNcclConfigFiles(Reader({{"HOME", home.path()}, {"NCCL_CONF_FILE", home.path() + "/site.conf"}}));
  REQUIRE_FALSE(files.empty());
  CHECK(files[0].path == home.path() + "/site.conf");
  for (const NcclConfigFile& file : files) CHECK(file.path != home.path() + "/.nccl.conf");
}

}  // namespace
}  // namespace ncclguard
