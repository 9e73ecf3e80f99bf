// ncclguard analyze DIR [--json] [--trace FILE] [--html FILE] [--flight-recorder DIR]
//                       [--flight-recorder-dumps PATH] [--status-interval SECONDS] [--deadline SECONDS]
//
// Reads what the processes of a job left in their job directory and says which rank is at fault
// and why. Exit status: 0 healthy, 1 something is wrong, 2 usage error or unreadable directory.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/commands.h"
#include "cli/flight_recorder_import.h"
#include "cli/html_report.h"
#include "cli/rank_states.h"
#include "cli/trace.h"
#include "watchdog/common/clock.h"
#include "watchdog/common/config.h"
#include "watchdog/common/escape.h"
#include "watchdog/common/files.h"
#include "watchdog/common/ranks.h"
#include "watchdog/common/temporaries.h"
#include "watchdog/diagnose/job_view.h"
#include "watchdog/diagnose/known_bad.h"
#include "watchdog/diagnose/op_states.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/flight_recorder.h"
#include "watchdog/report/job_board.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/report/job_read.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {
namespace {

// NCCLGUARD_STATUS_INTERVAL's default.
double DefaultStatusIntervalSeconds() { return Config{}.status_interval.value; }
constexpr std::size_t kMaxEvidenceLines = 8;
constexpr std::size_t kMaxEvidenceValueChars = 160;
constexpr std::size_t kMaxRankRanges = 12;
constexpr std::size_t kMaxTableRows = 32;
constexpr std::size_t kMaxProblemLines = 20;

struct AnalyzeOptions {
  std::string directory;  // or redis://host[:port][/db]/<job id>
  std::string dump_directory;
  bool json = false;
  std::string trace_path;
  std::string html_path;
  std::string flight_recorder_dumps;  // a directory or a file name prefix; "" to find them
  std::string flight_recorder_directory;
  bool flight_recorder_timed = false;
  std::optional<double> status_interval_seconds;
  double deadline_seconds = std::chrono::duration<double>(kReadDeadline).count();
};

std::string Upper(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::toupper(c); });
  return text;
}

std::string Shorten(std::string text) {
  if (text.size() > kMaxEvidenceValueChars) text = text.substr(0, kMaxEvidenceValueChars - 3) + "...";
  return text;
}

std::string EvidenceValue(const nlohmann::json& value) {
  return Shorten(value.is_string() ? value.get<std::string>()
                                   : value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void PrintEvidence(const nlohmann::json& evidence) {
  if (evidence.is_null() || (evidence.is_structured() && evidence.empty())) return;
  std::vector<std::string> lines;
  if (evidence.is_object()) {
    for (const auto& [key, value] : evidence.items())
      lines.push_back(absl::StrCat(key, ": ", EvidenceValue(value)));
  } else if (evidence.is_array()) {
    for (const nlohmann::json& value : evidence) lines.push_back(EvidenceValue(value));
  } else {
    lines.push_back(EvidenceValue(evidence));
  }
  std::cout << "  evidence:\n";
  for (std::size_t i = 0; i < lines.size() && i < kMaxEvidenceLines; ++i) {
    std::cout << "    " << EscapeControlCharacters(lines[i]) << '\n';
  }
  if (lines.size() > kMaxEvidenceLines) {
    std::cout << "    ... " << lines.size() - kMaxEvidenceLines << " more (--json shows everything)\n";
  }
}

// Where each late or dead rank was, from the stacks of its dump: the thread that issued its NCCL
// operations, its Python frames, then its native ones.
void PrintLateRanksStacks(const nlohmann::json& evidence) {
  for (const LateRankStack& stack : LateRankStacks(evidence)) {
    std::cout << "  stack of rank " << stack.rank << " (pid " << stack.pid << ", thread " << stack.tid
              << " \"" << EscapeControlCharacters(stack.thread_name)
              << "\"): " << EscapeControlCharacters(stack.sentence) << '\n';
    for (const std::string& frame : stack.frames)
      std::cout << "    " << EscapeControlCharacters(frame) << '\n';
  }
}

void PrintVerdict(const Verdict& verdict) {
  std::cout << Upper(std::string(VerdictKindName(verdict.kind)));
  if (!verdict.comm.empty()) std::cout << "  comm " << EscapeControlCharacters(verdict.comm);
  if (verdict.seq != 0) std::cout << " #" << verdict.seq;
  std::cout << "\n  " << EscapeControlCharacters(verdict.message) << '\n';
  if (!verdict.ranks.empty()) {
    std::cout << "  ranks: " << FormatRanks(verdict.ranks, {.max_parts = kMaxRankRanges}) << '\n';
  }
  PrintEvidence(verdict.evidence);
  PrintLateRanksStacks(verdict.evidence);
  std::cout << '\n';
}

// One row of the rank table: a process and its communicators, or, for a process that drives
// several GPUs (JAX's way), one of its devices: its rank on that device's widest communicator.
struct TableRow {
  const ProcessView* process;
  int rank;
  std::vector<const CommSnapshot*> comms;
};

void AddRows(const ProcessView& process, std::vector<TableRow>& rows) {
  std::map<int, TableRow> by_device;
  std::map<int, int> widest;  // by device
  for (const CommSnapshot& comm : process.snapshot.comms) {
    TableRow& row = by_device.try_emplace(comm.device, TableRow{&process, comm.rank, {}}).first->second;
    row.comms.push_back(&comm);
    if (comm.nranks > widest[comm.device]) {
      widest[comm.device] = comm.nranks;
      row.rank = comm.rank;
    }
  }
  if (by_device.size() <= 1) {
    TableRow row{&process, process.snapshot.rank, {}};
    for (const CommSnapshot& comm : process.snapshot.comms) row.comms.push_back(&comm);
    rows.push_back(std::move(row));
    return;
  }
  for (auto& [device, row] : by_device) rows.push_back(std::move(row));
}

std::string LastCompleted(const std::vector<const CommSnapshot*>& comms) {
  if (comms.size() == 1) return absl::StrCat("#", comms[0]->last_completed);
  std::vector<std::string> parts;
  parts.reserve(comms.size());
  for (const CommSnapshot* comm : comms)
    parts.push_back(absl::StrCat(comm->id.substr(0, 6), ":#", comm->last_completed));
  return parts.empty() ? "-" : absl::StrJoin(parts, " ");
}

// Inside an NCCL call, or with an operation of its own launched and not completed on the GPU.
std::string InNccl(const TableRow& row) {
  if (!row.process->snapshot.in_nccl_call.empty()) return row.process->snapshot.in_nccl_call;
  for (const CommSnapshot* comm : row.comms) {
    for (const OpSnapshot& op : comm->ring) {
      if (Unfinished(op)) return absl::StrCat(op.op, " #", op.seq, " (", op.state, ")");
    }
  }
  return "no";
}

// Every rank of a small job; for a large one, only those the verdicts name.
void PrintRankTable(const JobView& job, const std::vector<Verdict>& verdicts) {
  std::set<int> named;
  for (const Verdict& verdict : verdicts) named.insert(verdict.ranks.begin(), verdict.ranks.end());
  std::vector<TableRow> all;
  for (const ProcessView& process : job.processes) AddRows(process, all);
  std::vector<TableRow> rows;
  for (TableRow& row : all) {
    if (all.size() <= kMaxTableRows || named.count(row.rank) != 0) rows.push_back(std::move(row));
  }
  std::stable_sort(rows.begin(), rows.end(), [](const TableRow& a, const TableRow& b) {
    return static_cast<unsigned>(a.rank) < static_cast<unsigned>(b.rank);  // -1 last
  });
  const std::size_t shown = std::min(rows.size(), kMaxTableRows);
  std::cout << absl::StrFormat("%-6s %-28s %-7s %-12s %-15s %s\n", "RANK", "PROCESS", "STATE", "LAST SEEN",
                               "LAST COMPLETED", "IN NCCL");
  for (std::size_t i = 0; i < shown; ++i) {
    const ProcessView& process = *rows[i].process;
    const int rank = rows[i].rank;
    const std::string seen =
        process.last_seen_ns > 0
            ? absl::StrFormat("%.1f s ago", static_cast<double>(job.now_ns - process.last_seen_ns) / 1e9)
            : "never";
    std::cout << absl::StrFormat("%-6s %-28s %-7s %-12s %-15s %s\n", rank >= 0 ? absl::StrCat(rank) : "?",
                                 EscapeControlCharacters(absl::StrCat(process.host, ":", process.pid)),
                                 ProcessState(job, process), seen,
                                 EscapeControlCharacters(LastCompleted(rows[i].comms)),
                                 EscapeControlCharacters(InNccl(rows[i])));
  }
  if (all.size() > shown)
    std::cout << "... " << all.size() - shown << " other ranks not shown (--json lists them all)\n";
  std::cout << '\n';
}

void PrintForHumans(const JobView& job, const std::vector<Verdict>& verdicts) {
  const std::size_t processes = job.processes.size();
  std::cout << "ncclguard analyze " << EscapeControlCharacters(job.directory) << ": " << processes
            << (processes == 1 ? " process" : " processes") << ", read at " << IsoTime(job.now_ns) << "\n\n";
  if (const NotRead& not_read = job.not_read; not_read.files > 0 || not_read.listing_cut_short) {
    std::cout << "Read in part: " << not_read.files << (not_read.files == 1 ? " file" : " files")
              << " not read (" << EscapeControlCharacters(not_read.why) << "); ";
    if (not_read.SomeProcessMissing()) {
      std::cout << not_read.processes << (not_read.processes == 1 ? " process" : " processes")
                << " left no file that was read. The verdicts rest on the processes read and name no rank "
                   "as missing; --deadline SECONDS gives the reading more time.\n\n";
    } else {
      std::cout << "every process was read. --deadline SECONDS gives the reading more time.\n\n";
    }
  }
  if (const std::optional<JobEnd> end = EndedTogether(job)) {
    std::cout << "Job end: " << EscapeControlCharacters(end->message) << "\n\n";
  }
  for (const Verdict& verdict : verdicts) PrintVerdict(verdict);
  const bool healthy = verdicts.size() == 1 && verdicts[0].kind == VerdictKind::kHealthy;
  if (!healthy) PrintRankTable(job, verdicts);
  if (!job.problems.empty()) {
    std::cout << "Problems (" << job.problems.size() << "):\n";
    for (std::size_t i = 0; i < job.problems.size() && i < kMaxProblemLines; ++i) {
      std::cout << "  " << EscapeControlCharacters(job.problems[i]) << '\n';
    }
    if (job.problems.size() > kMaxProblemLines)
      std::cout << "  ... " << job.problems.size() - kMaxProblemLines << " more\n";
  }
}

// The board `options.directory` names: a job directory, or a job on a Redis board (whose dumps
// are files of --dump-dir, by default the job's directory as NCCLGUARD_DUMP_DIR names it here).
absl::StatusOr<std::shared_ptr<JobBoard>> NamedBoard(const AnalyzeOptions& options) {
  if (!IsRedisName(options.directory)) {
    std::error_code error;
    if (!std::filesystem::is_directory(options.directory, error)) {
      return absl::InvalidArgumentError(absl::StrCat(options.directory, " is not a directory",
                                                     error ? absl::StrCat(" (", error.message(), ")") : ""));
    }
    return OpenJobBoard("", options.directory, "", BoardIdentity{});
  }
  absl::StatusOr<RedisJob> job = ParseRedisJob(options.directory);
  if (!job.ok()) return job.status();
  const std::string dumps =
      options.dump_directory.empty() ? JobDirectory(GetConfig(), job->job_id) : options.dump_directory;
  job->address.auth_file = GetConfig().store_auth_file;  // as the job's processes authenticate
  return MakeRedisBoard(job->address, dumps, job->job_id, BoardIdentity{});
}

// Freeing the view of a large job takes longer than describing it (a tenth of a second per 100,000
// processes), and the command ends right after: the view read is left to the process's exit.
absl::StatusOr<JobView>* g_view_left_to_exit = nullptr;

// One PyTorch Flight Recorder file per rank in `directory` (created if missing), named as
// ProcessGroupNCCL names its own, for PyTorch's analyzer: how many were written.
absl::StatusOr<std::size_t> WriteFlightRecorder(const std::string& directory, const JobView& job,
                                                FlightRecorderStates states) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) return absl::UnavailableError(absl::StrCat("cannot create ", directory, ": ", error.message()));
  const std::vector<FlightRecorderFile> files = FlightRecorderFiles(job, states);
  for (const FlightRecorderFile& file : files) {
    const std::string path = absl::StrCat(directory, "/", std::string(kFlightRecorderFilePrefix), file.rank);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << file.contents;
    out.close();
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  return files.size();
}

// What PyTorch's Flight Recorder dumps of the job say of the verdicts' operations, added to them;
// the dumps that could not be read become problems.
void AddFlightRecorderDumps(const AnalyzeOptions& options, JobView& job, std::vector<Verdict>& verdicts,
                            std::chrono::milliseconds deadline) {
  const std::string prefix = FlightRecorderPrefix(job, options.flight_recorder_dumps);
  if (prefix.empty()) return;
  constexpr std::size_t kMaxFlightRecorderDumps = 64;
  const FlightRecorderDumps dumps =
      ReadFlightRecorderDumps(prefix, RanksToRead(job, verdicts, kMaxFlightRecorderDumps), deadline);
  AddFlightRecorderContext(job, dumps, verdicts);
  job.problems.insert(job.problems.end(), dumps.problems.begin(), dumps.problems.end());
}

// The files the options ask for beside the verdicts (--trace, --html, --flight-recorder): what to
// tell a person of each, or why one could not be written.
absl::StatusOr<std::vector<std::string>> WriteRequestedFiles(const AnalyzeOptions& options,
                                                             const JobView& job,
                                                             const std::vector<Verdict>& verdicts) {
  std::vector<std::string> written;
  if (!options.trace_path.empty()) {
    if (absl::Status status = WriteChromeTrace(options.trace_path, job, verdicts); !status.ok())
      return status;
    written.push_back(absl::StrCat("Trace written to ", options.trace_path, " (open it in ui.perfetto.dev)"));
  }
  if (!options.html_path.empty()) {
    if (absl::Status status = WriteHtmlReport(options.html_path, job, verdicts); !status.ok()) return status;
    written.push_back(absl::StrCat("Report page written to ", options.html_path, " (open it in a browser)"));
  }
  if (!options.flight_recorder_directory.empty()) {
    const absl::StatusOr<std::size_t> files = WriteFlightRecorder(
        options.flight_recorder_directory, job,
        options.flight_recorder_timed ? FlightRecorderStates::kTimed : FlightRecorderStates::kUntimed);
    if (!files.ok()) return files.status();
    written.push_back(absl::StrCat("Flight Recorder files of ", *files, " ranks written to ",
                                   options.flight_recorder_directory, " (read them with: torchfrtrace ",
                                   options.flight_recorder_directory, ")"));
  }
  return written;
}

int Analyze(const AnalyzeOptions& options) {
  absl::StatusOr<std::shared_ptr<JobBoard>> board = NamedBoard(options);
  if (!board.ok()) {
    std::cerr << "ncclguard analyze: " << board.status().message() << '\n';
    return kExitUsage;
  }
  const double given_interval = options.status_interval_seconds.value_or(DefaultStatusIntervalSeconds());
  JobReadLimits limits;
  limits.deadline = std::chrono::milliseconds(static_cast<std::int64_t>(options.deadline_seconds * 1000));
  g_view_left_to_exit = new absl::StatusOr<JobView>(
      ReadJob(*board, WallNowNs(), given_interval, JobDirectoryOrigin::kNamedByUser, limits));
  absl::StatusOr<JobView>& job = *g_view_left_to_exit;
  // The job's processes never list the directory; this command just did (temporaries.h).
  (void)RemoveAbandonedTemporaries((*board)->Directory(), kReadDeadline);
  if (!job.ok()) {
    std::cerr << "ncclguard analyze: cannot read " << options.directory << ": " << job.status().message()
              << '\n';
    return kExitUsage;
  }
  // A directory whose files were there but not read in time is judged (unknown), not refused.
  if (job->processes.empty() && job->not_read.files == 0 && !job->not_read.listing_cut_short) {
    std::cerr
        << "ncclguard analyze: no status file or dump in " << options.directory
        << "; a job directory is NCCLGUARD_DUMP_DIR/<job id>, a job on Redis redis://host:port/db/<job id>\n";
    for (const std::string& problem : job->problems)
      std::cerr << "  " << EscapeControlCharacters(problem) << '\n';
    return kExitUsage;
  }
  if (!options.status_interval_seconds) {
    // Large jobs stretch their interval (see StatusIntervalSeconds); judging their status files
    // by the 2 s default would call every rank stale. The processes not read count: the job ran
    // with them.
    const std::size_t processes = job->processes.size() + job->not_read.processes;
    job->status_interval_seconds = StatusIntervalSeconds(
        DefaultStatusIntervalSeconds(), static_cast<int>(processes), (*board)->StatusWritesPerSecond());
  }

  // The command's log is not started: say here that P2P verdicts lack part of their evidence.
  const KnownBadList& known_bad = ProcessKnownBad();
  if (!known_bad.status.ok()) {
    std::cerr << "ncclguard analyze: known-bad configurations not used as P2P evidence: "
              << known_bad.status.message() << " (set NCCLGUARD_KNOWN_BAD_FILE)\n";
  }
  std::vector<Verdict> verdicts = Classify(*job, known_bad.entries);
  AddFlightRecorderDumps(options, *job, verdicts, limits.deadline);
  const absl::StatusOr<std::vector<std::string>> written = WriteRequestedFiles(options, *job, verdicts);
  if (!written.ok()) {
    std::cerr << "ncclguard analyze: " << written.status().message() << '\n';
    return kExitUsage;
  }
  if (options.json) {
    std::cout << VerdictsToJson(*job, verdicts).dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
              << '\n';
  } else {
    PrintForHumans(*job, verdicts);
    for (const std::string& line : *written) std::cout << line << '\n';
  }
  const bool healthy = verdicts.size() == 1 && verdicts[0].kind == VerdictKind::kHealthy;
  return healthy ? kExitHealthy : kExitProblemFound;
}

// Seconds within `range`, for `option`; NaN and infinities fail it too (CLI::PositiveNumber and
// CLI::Range let NaN through).
CLI::Validator SecondsValidator(const std::string& option, SettingRange range) {
  const std::string description = absl::StrCat("seconds between ", range.least, " and ", range.greatest);
  return CLI::Validator(
      [option, range, description](std::string& text) -> std::string {
        double seconds = 0;
        if (!CLI::detail::lexical_cast(text, seconds) ||
            !(seconds >= range.least && seconds <= range.greatest)) {
          return absl::StrCat(option, " ", text, " is not a number of ", description);
        }
        return {};
      },
      description);
}

// The setting's own range.
CLI::Validator StatusIntervalValidator() {
  const std::optional<SettingRange> known = RangeOf("NCCLGUARD_STATUS_INTERVAL");
  if (!known) throw std::logic_error("NCCLGUARD_STATUS_INTERVAL has no range in the settings table");
  return SecondsValidator("--status-interval", *known);
}

}  // namespace

void AddAnalyzeCommand(CLI::App& app, std::function<int()>& run) {
  auto options = std::make_shared<AnalyzeOptions>();
  CLI::App* analyze =
      app.add_subcommand("analyze",
                         "Name the rank at fault and the cause from a job directory. Exit status: 0 healthy, "
                         "1 something is wrong, 2 usage error or unreadable directory.");
  analyze
      ->add_option("DIR", options->directory,
                   "The job directory, NCCLGUARD_DUMP_DIR/<job id>; or a job on a Redis board, "
                   "redis://host[:port][/db]/<job id>")
      ->required();
  analyze
      ->add_option("--dump-dir", options->dump_directory,
                   "For a job on Redis: the directory of its dumps (default: NCCLGUARD_DUMP_DIR/<job id>)")
      ->type_name("DIR");
  analyze->add_flag("--json", options->json, "Print the verdicts as JSON (schema: docs/verdicts.md)");
  analyze
      ->add_option("--trace", options->trace_path,
                   "Also write the timeline to FILE as a Chrome trace (ui.perfetto.dev, chrome://tracing)")
      ->type_name("FILE");
  analyze
      ->add_option("--html", options->html_path,
                   "Also write a report page to FILE: one self-contained HTML file, the verdict first and "
                   "every rank's state as a picture")
      ->type_name("FILE");
  analyze
      ->add_option(
          "--flight-recorder-dumps", options->flight_recorder_dumps,
          "Where PyTorch's Flight Recorder dumps of the job are: a directory, or their names' prefix "
          "(TORCH_NCCL_DEBUG_INFO_TEMP_FILE; default: as the job's processes recorded it). Their process "
          "group names and Python call sites are added to the verdicts")
      ->type_name("PATH");
  analyze
      ->add_option("--flight-recorder", options->flight_recorder_directory,
                   "Also write each rank's operations into DIR as PyTorch's Flight Recorder writes them "
                   "(nccl_trace_rank_<rank>, format 2.10), for torchfrtrace")
      ->type_name("DIR");
  analyze->add_flag("--flight-recorder-timed", options->flight_recorder_timed,
                    "In the Flight Recorder files, call the operations seen running \"started\", as PyTorch "
                    "does with TORCH_NCCL_ENABLE_TIMING=1 (default: \"scheduled\", as without it)");
  analyze
      ->add_option("--deadline", options->deadline_seconds,
                   absl::StrCat("How long reading the directory may take (default: ",
                                std::chrono::duration<double>(kReadDeadline).count(),
                                "); what is not read by then is left out, and the verdicts say so"))
      ->type_name("SECONDS")
      ->check(SecondsValidator("--deadline", SettingRange{.least = 0.001, .greatest = 3600}));
  analyze
      ->add_option(
          "--status-interval", options->status_interval_seconds,
          absl::StrCat("The job's NCCLGUARD_STATUS_INTERVAL (default: ", DefaultStatusIntervalSeconds(),
                       ", stretched as the job did for its size); a status file older than ", kStaleIntervals,
                       " intervals is stale"))
      ->type_name("SECONDS")
      ->check(StatusIntervalValidator());
  analyze->callback([options, &run] { run = [options] { return Analyze(*options); }; });
}

}  // namespace ncclguard
