#include "watchdog/recover/p2p_policy.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "watchdog/common/config.h"
#include "watchdog/common/exit_gate.h"
#include "watchdog/common/files.h"
#include "watchdog/common/log.h"
#include "watchdog/diagnose/known_bad.h"
#include "watchdog/recover/p2p_verdict.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/job_board.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/report/job_id.h"

namespace ncclguard {
namespace {

// Collecting facts normally takes milliseconds; a driver that does not answer in this long is
// wedged, and the application's first NCCL call must not wait on it.
constexpr std::chrono::milliseconds kFactsDeadline{3000};
// How long the application's first NCCL call waits for a Redis board's P2P record of an earlier
// attempt: two round trips to a Redis take well under a millisecond on a cluster's network. A
// board that takes longer is left behind (the read finishes on a thread of its own, unwaited for)
// rather than holding the application; the log says so.
constexpr std::chrono::milliseconds kEarlierVerdictDeadline{25};
// An nccl.conf is a few lines.
constexpr std::size_t kMaxNcclConfigBytes = 1 << 20;

// "NCCL_P2P_DISABLE=0 in the environment, NCCL_P2P_LEVEL=NVL in /etc/nccl.conf": the user's own
// P2P settings, where NCCL will take them from; "" when there are none.
std::string UserP2pSettings(const P2pPolicyInputs& inputs, EnvironmentVariables* from_files) {
  std::vector<std::string> settings;
  for (const char* name : kNcclP2pVariables) {
    std::string value;
    if (inputs.read_environment && inputs.read_environment(name, &value) && !value.empty()) {
      settings.push_back(fmt::format("{}={} in the environment", name, value));
      continue;
    }
    for (const NcclConfigFile& file : inputs.config_files) {
      const EnvironmentVariables variables = ParseNcclConfigFile(file.content);
      const auto found = std::find_if(variables.begin(), variables.end(),
                                      [&](const auto& variable) { return variable.first == name; });
      if (found != variables.end() && !found->second.empty()) {
        settings.push_back(fmt::format("{}={} in {}", name, found->second, file.path));
        from_files->push_back(*found);
        break;
      }
    }
  }
  return absl::StrJoin(settings, ", ");
}

// A Redis board's record, read on a thread of its own and waited for at most `deadline`
// (DeadlineExceeded after). Unlike RunWithDeadline's work, the read holds no ExitPass while the
// server keeps it waiting (its parse takes one): a server that does not answer must hold neither
// the first NCCL call nor the application's exit.
absl::StatusOr<P2pVerdictRecord> ReadFromServer(std::shared_ptr<JobBoard> board, std::string job_id,
                                                std::chrono::milliseconds deadline) {
  struct Shared {
    std::mutex mutex;
    std::condition_variable done;
    std::optional<absl::StatusOr<P2pVerdictRecord>> result;
  };
  auto shared = std::make_shared<Shared>();
  // With every signal blocked, so the application's signals go to its own threads.
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  try {
    std::thread([shared, board = std::move(board), job_id = std::move(job_id)] {
      MarkOwnThread();
      absl::StatusOr<P2pVerdictRecord> result = ReadP2pVerdictUnbounded(board, job_id);
      const std::lock_guard<std::mutex> lock(shared->mutex);
      shared->result = std::move(result);
      shared->done.notify_all();
    }).detach();
  } catch (const std::exception& error) {
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    return absl::UnavailableError(fmt::format("cannot start a thread to read it: {}", error.what()));
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  std::unique_lock<std::mutex> lock(shared->mutex);
  if (!shared->done.wait_for(lock, deadline, [&] { return shared->result.has_value(); })) {
    return absl::DeadlineExceededError("no answer in time");
  }
  // NOLINTNEXTLINE(bugprone-unchecked-optional-access): the wait returned with a result
  return std::move(*shared->result);
}

}  // namespace

EnvironmentVariables ParseNcclConfigFile(const std::string& content) {
  EnvironmentVariables variables;
  size_t start = 0;
  while (start < content.size()) {
    size_t end = content.find('\n', start);
    if (end == std::string::npos) end = content.size();
    const std::string line = content.substr(start, end - start);
    start = end + 1;
    const size_t equals = line.find('=');
    if (line.empty() || line[0] == '#' || equals == std::string::npos || equals == 0) continue;
    std::string value = line.substr(equals + 1);
    absl::StripTrailingAsciiWhitespace(&value);
    variables.emplace_back(line.substr(0, equals), std::move(value));
  }
  return variables;
}

std::vector<NcclConfigFile> ReadNcclConfigFiles(const EnvironmentReader& read_environment) {
  std::vector<std::string> paths;
  std::string value;
  if (read_environment("NCCL_CONF_FILE", &value) && !value.empty()) {
    paths.push_back(value);
  } else if (read_environment("HOME", &value) && !value.empty()) {
    paths.push_back(value + "/.nccl.conf");
  }
  paths.push_back("/etc/nccl.conf");
  std::vector<NcclConfigFile> files;
  for (const std::string& path : paths) {
    // Never blocks on a FIFO or reads a device without end at the first NCCL call.
    if (absl::StatusOr<std::string> content = ReadRegularFile(path, kMaxNcclConfigBytes); content.ok()) {
      files.push_back({path, *std::move(content)});
    }
  }
  return files;
}

void ReadEarlierVerdict(const Config& config, P2pPolicyInputs& inputs, std::chrono::milliseconds deadline) {
  const std::optional<std::string> job_id = NamedJobId(inputs.read_environment);
  inputs.job_id_known = job_id.has_value();
  inputs.launch_id = LaunchId(inputs.read_environment);
  if (inputs.mode != P2pMode::kAuto || !job_id) return;
  inputs.job_id = *job_id;
  // The launcher read the record already, waiting as long as the board needed: nothing to ask.
  if (!config.p2p_verdict.empty()) {
    inputs.handed_over_verdict = config.p2p_verdict;
    return;
  }
  absl::StatusOr<std::shared_ptr<JobBoard>> board =
      OpenJobBoard(config.store, JobDirectory(config, *job_id), *job_id,
                   BoardIdentity{.host = log::HostName(), .pid = static_cast<int>(getpid())});
  if (!board.ok()) {
    inputs.verdict = board.status();
    return;
  }
  // The job directory's record is a file, read as NCCL's config files are at the same moment (within
  // the file system's deadline); a server is waited for only `deadline`.
  if ((*board)->StatusesAreFiles()) {
    inputs.verdict = ReadP2pVerdict(*board, *job_id);
    return;
  }
  absl::StatusOr<P2pVerdictRecord> verdict = ReadFromServer(*board, *job_id, deadline);
  if (absl::IsDeadlineExceeded(verdict.status())) {
    verdict = absl::UnavailableError(
        fmt::format("the job board {} did not answer within {} ms", (*board)->Where(), deadline.count()));
  }
  inputs.verdict = std::move(verdict);
}

std::string DescribeP2pVerdictRecord(const P2pVerdictRecord& record) {
  return fmt::format("{}: {}, recorded by rank {} on {}, pid {}", record.comm, record.message, record.rank,
                     record.host, record.pid);
}

P2pDecision DecideP2p(const P2pPolicyInputs& inputs) {
  P2pDecision decision;
  EnvironmentVariables from_files;
  const std::string user_settings = UserP2pSettings(inputs, &from_files);

  // Matched as NCCL will see the process: with the config files' P2P variables loaded.
  ProcessFacts facts = inputs.facts;
  facts.environment.insert(facts.environment.end(), from_files.begin(), from_files.end());
  const std::vector<KnownBadMatch> matches = MatchKnownBad(inputs.known_bad, facts);
  if (!matches.empty()) {
    std::vector<std::string> described;
    described.reserve(matches.size());
    for (const KnownBadMatch& match : matches) {
      described.push_back(fmt::format("{} — {}", DescribeMatch(match), match.entry->remedy));
    }
    decision.known_bad_report = fmt::format("known-bad configuration{}: {}", matches.size() > 1 ? "s" : "",
                                            absl::StrJoin(described, " | "));
  }

  std::vector<std::string> reasons;
  if (inputs.mode == P2pMode::kOff) reasons.push_back("NCCLGUARD_P2P=off");
  if (inputs.mode == P2pMode::kAuto) {
    if (!inputs.job_id_known) {
      decision.infos.push_back(
          "no job id before the first communicator (neither NCCLGUARD_JOB_ID nor a launcher's job id is "
          "set): no "
          "P2P verdict of an earlier attempt can be found");
    } else if (inputs.verdict && inputs.verdict->ok() && (*inputs.verdict)->launch != inputs.launch_id) {
      // Jobs that share a job id (one NCCLGUARD_JOB_ID given to several) share its board: the
      // record is another job's, whose P2P fault says nothing about this one.
      const P2pVerdictRecord& record = **inputs.verdict;
      decision.warnings.push_back(
          fmt::format("P2P verdict of another job ignored: job id {} holds a record of launch '{}' ({}: {}, "
                      "recorded by rank {} on {}, pid {}), and this process is of launch '{}' "
                      "(NCCLGUARD_LAUNCH_ID, else the launchers' job ids); P2P is left as it is",
                      record.job_id, record.launch, record.comm, record.message, record.rank, record.host,
                      record.pid, inputs.launch_id));
    } else if (inputs.verdict && inputs.verdict->ok()) {
      const P2pVerdictRecord& record = **inputs.verdict;
      reasons.push_back(fmt::format("an earlier attempt of job {} found P2P at fault ({})", record.job_id,
                                    DescribeP2pVerdictRecord(record)));
    } else if (!inputs.handed_over_verdict.empty()) {
      reasons.push_back(
          fmt::format("an earlier attempt of job {} found P2P at fault ({}; NCCLGUARD_P2P_VERDICT)",
                      inputs.job_id, inputs.handed_over_verdict));
    } else if (inputs.verdict && !absl::IsNotFound(inputs.verdict->status())) {
      decision.warnings.push_back(fmt::format("P2P verdict of an earlier attempt not used: {}",
                                              std::string(inputs.verdict->status().message())));
    }
    for (const KnownBadMatch& match : matches) {
      if (match.entry->action == KnownBadAction::kDisable) {
        reasons.push_back(fmt::format("known-bad configuration {}", match.entry->id));
      }
    }
  }

  if (!user_settings.empty()) {
    if (reasons.empty()) {
      decision.infos.push_back(fmt::format("P2P left as the user set it: {}", user_settings));
    } else {
      decision.warnings.push_back(fmt::format("P2P left as the user set it ({}) although {}", user_settings,
                                              absl::StrJoin(reasons, "; ")));
    }
  } else if (!reasons.empty()) {
    decision.set_environment.emplace_back("NCCL_P2P_DISABLE", "1");
    // The matches describe the process as it was: say that it no longer is.
    if (!decision.known_bad_report.empty())
      decision.known_bad_report += " (now moot: P2P is turned off, see below)";
    decision.warnings.push_back(fmt::format("NCCL_P2P_DISABLE=1 set before the first communicator: {}",
                                            absl::StrJoin(reasons, "; ")));
  }
  return decision;
}

void ApplyP2pPolicy(const Config& config, const std::vector<NcclConfigFile>& nccl_config_files) noexcept {
  try {
    P2pPolicyInputs inputs;
    inputs.mode = config.p2p;
    inputs.read_environment = ReadProcessEnvironment;
    inputs.config_files = nccl_config_files;
    absl::StatusOr<ProcessFacts> facts = RunWithDeadline<ProcessFacts>(
        [] { return absl::StatusOr<ProcessFacts>(CollectMatchingFacts(RealFactSources())); }, kFactsDeadline);
    if (facts.ok()) {
      inputs.facts = std::move(*facts);
    } else {
      log::Warn("known-bad configurations not checked: the facts they need were not collected ({})",
                std::string(facts.status().message()));
    }
    ReadEarlierVerdict(config, inputs, kEarlierVerdictDeadline);
    inputs.known_bad = ProcessKnownBad().entries;

    const P2pDecision decision = DecideP2p(inputs);
    for (const auto& [name, value] : decision.set_environment) setenv(name.c_str(), value.c_str(), 1);
    if (!decision.known_bad_report.empty()) log::Warn("{}", decision.known_bad_report);
    for (const std::string& line : decision.warnings) log::Warn("{}", line);
    for (const std::string& line : decision.infos) log::Info("{}", line);
  } catch (const std::exception& error) {
    log::Warn("no P2P decision made: {}", error.what());
  } catch (...) {
    log::Warn("no P2P decision made");
  }
}

}  // namespace ncclguard
