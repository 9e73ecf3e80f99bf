// Whether NCCL's P2P transport is turned off in this process, decided once at its first
// intercepted NCCL call, before any communicator exists: NCCL reads NCCL_P2P_DISABLE and
// NCCL_P2P_LEVEL at its first communicator initialisation and caches them, so a variable set any
// later changes nothing (docs/known-bad.md, NCCLGUARD_P2P in docs/settings.md).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "watchdog/common/config.h"
#include "watchdog/common/files.h"
#include "watchdog/diagnose/known_bad.h"
#include "watchdog/recover/p2p_verdict.h"
#include "watchdog/report/facts.h"

namespace ncclguard {

struct NcclConfigFile {
  std::string path;
  std::string content;
};

// The variables of an NCCL config file as NCCL reads them: NAME=VALUE lines (the value up to the
// end of the line, trailing blanks dropped); lines starting with '#' and lines without '=' skipped.
EnvironmentVariables ParseNcclConfigFile(const std::string& content);

// The NCCL config files that exist, in the order NCCL loads them: $NCCL_CONF_FILE, else
// $HOME/.nccl.conf; then /etc/nccl.conf. NCCL puts their variables into the environment without
// overriding what is set, so the first file that sets a variable wins.
std::vector<NcclConfigFile> ReadNcclConfigFiles(const EnvironmentReader& read_environment);

struct P2pPolicyInputs {
  P2pMode mode = P2pMode::kAuto;
  EnvironmentReader read_environment;
  std::vector<NcclConfigFile> config_files;
  ProcessFacts facts;  // what known-bad matching needs (CollectMatchingFacts)
  // Whether the job has an id before its first communicator (NCCLGUARD_JOB_ID or a launcher's):
  // without one no verdict of an earlier attempt can be found.
  bool job_id_known = false;
  // This process's LaunchId: a record of another launch under the same job id is another job's.
  std::string launch_id;
  std::string job_id;
  // What `ncclguard run` handed over of the record of an earlier attempt (NCCLGUARD_P2P_VERDICT,
  // DescribeP2pVerdictRecord); "" when it did not. The board is then not asked.
  std::string handed_over_verdict;
  // ReadP2pVerdict's answer; std::nullopt when it was not asked (not auto, or no job id).
  std::optional<absl::StatusOr<P2pVerdictRecord>> verdict;
  std::vector<KnownBadEntry> known_bad;
};

struct P2pDecision {
  EnvironmentVariables set_environment;  // what to set: NCCL_P2P_DISABLE=1, or nothing
  std::string known_bad_report;          // one log line (WARN) of every known-bad match; "" if none
  std::vector<std::string> warnings;     // log lines (WARN): what was changed or not, and why
  std::vector<std::string> infos;        // log lines (INFO)
};

// "<comm>: <message>, recorded by rank R on HOST, pid P": the record, for a log line.
std::string DescribeP2pVerdictRecord(const P2pVerdictRecord& record);

// Reads what the job board says for the decision: whether the job is named before its first
// communicator and, under NCCLGUARD_P2P=auto, the record of an earlier attempt (handed over by
// `ncclguard run`, NCCLGUARD_P2P_VERDICT, or else read on the board), waiting for a board that is
// not the job directory at most `deadline` (then the verdict is Unavailable, saying so; the read
// goes on, unwaited for, on a thread of its own).
void ReadEarlierVerdict(const Config& config, P2pPolicyInputs& inputs,
                        std::chrono::milliseconds deadline = kWriteDeadline);

// The decision, from its inputs alone. The user's NCCL_P2P_DISABLE or NCCL_P2P_LEVEL (environment
// or config file) always wins; else NCCLGUARD_P2P=off disables P2P, `auto` disables it for a
// verdict of an earlier attempt (of the same launch: another job's is reported and ignored) or a
// matching known-bad entry whose action is `disable`, `on` never does. Known-bad matches are reported in one
// line whatever is decided.
P2pDecision DecideP2p(const P2pPolicyInputs& inputs);

// Gathers this process's inputs (facts within a deadline, so that a wedged driver cannot hang the
// application's first NCCL call; `nccl_config_files` as ReadNcclConfigFiles read them), decides,
// sets the variables and logs. Never throws.
void ApplyP2pPolicy(const Config& config, const std::vector<NcclConfigFile>& nccl_config_files) noexcept;

}  // namespace ncclguard
