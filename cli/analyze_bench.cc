// analyze_bench [--ranks N] [--scenario rank-not-joined|slow-link] [--keep DIR [--reuse]]: writes a
// synthetic job of N ranks in which one rank never joined the last AllReduce (or, with slow-link,
// that runs with one link 3x slower than the others), then times what `ncclguard analyze` does with
// it (ReadJobDirectory and Classify) and reports the process's peak memory. Exit status 1 when the
// verdict is wrong. Writing 131,072 ranks takes minutes: --reuse analyses the job an earlier run
// left in DIR, as of the time that run wrote it (DIR/now_ns).
#include <stdlib.h>
#include <sys/resource.h>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/synthetic_job.h"
#include "watchdog/common/ranks.h"
#include "watchdog/diagnose/job_view.h"
#include "watchdog/diagnose/known_bad.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/job_board.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/report/job_read.h"

namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string MakeTemporaryDirectory() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern =
      std::string(base != nullptr && base[0] == '/' ? base : "/tmp") + "/analyze_bench-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) return "";
  return pattern;
}

// Writes the job on `board` and its time into root/now_ns, or with `reuse` takes the time an
// earlier run wrote there.
absl::Status WriteOrReuse(const std::shared_ptr<ncclguard::JobBoard>& board, ncclguard::SyntheticJob& job,
                          const std::string& root, bool reuse) {
  const std::string time_file = root + "/now_ns";
  if (reuse) {
    std::ifstream(time_file) >> job.now_ns;
    if (job.now_ns <= 0) {
      return absl::FailedPreconditionError(time_file + " holds no time; run once without --reuse");
    }
    std::cout << "ranks: " << job.ranks << " (reused)\n";
    return absl::OkStatus();
  }
  const auto generation_start = std::chrono::steady_clock::now();
  if (absl::Status written = ncclguard::WriteSyntheticJob(board, job); !written.ok()) return written;
  std::ofstream(time_file) << job.now_ns << '\n';
  std::cout << "ranks: " << job.ranks << "\nboard: " << board->Where()
            << "\ngenerate_seconds: " << SecondsSince(generation_start) << '\n';
  return absl::OkStatus();
}

// On a board that is not the job directory: how long fetching the statuses alone takes, before
// they are parsed (the analysis fetches them again).
void PrintFetchTime(const std::shared_ptr<ncclguard::JobBoard>& board) {
  if (board->StatusesAreFiles()) return;
  const auto fetch_start = std::chrono::steady_clock::now();
  const absl::StatusOr<ncclguard::StatusRecords> fetched =
      board->FetchStatuses(fetch_start + std::chrono::seconds(60), nullptr);
  if (!fetched.ok()) return;
  std::size_t bytes = 0;
  for (const ncclguard::StatusRecord& record : fetched->records) bytes += record.content.size();
  std::cout << "fetch_seconds: " << SecondsSince(fetch_start) << "\nstatus_bytes: " << bytes << '\n';
}

// The job of `ranks` ranks, as of now: rank N/3 late, or its link to the next slow on channel 1.
ncclguard::SyntheticJob BenchJob(int ranks, const std::string& scenario) {
  ncclguard::SyntheticJob job;
  job.ranks = ranks;
  job.scenario = scenario == "slow-link" ? ncclguard::SyntheticJob::Scenario::kSlowLink
                                         : ncclguard::SyntheticJob::Scenario::kRankNotJoined;
  job.late_rank = ranks / 3;
  job.slow_link_rank = ranks / 3;
  job.slow_link_channel = 1;
  job.now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count();
  return job;
}

// The fail-slow rules alone (diagnose/rules_pace.cc), which Classify runs after the stall rules.
void PrintFailSlowTime(const ncclguard::JobView& view) {
  const auto start = std::chrono::steady_clock::now();
  const std::size_t found = ncclguard::ClassifyFailSlow(view).size();
  std::cout << "fail_slow_seconds: " << SecondsSince(start) << " (" << found << " verdicts)\n";
}

// Whether the first verdict is the one the job was written with: rank_not_joined naming the late
// rank alone, or slow_link naming the slow link's two ranks and its channel alone. Else what was expected.
std::string Unexpected(const std::vector<ncclguard::Verdict>& verdicts, const ncclguard::SyntheticJob& job) {
  using Scenario = ncclguard::SyntheticJob::Scenario;
  if (job.scenario == Scenario::kSlowLink) {
    const std::vector<int> ranks{job.slow_link_rank, (job.slow_link_rank + 1) % job.ranks};
    const bool right = !verdicts.empty() && verdicts[0].kind == ncclguard::VerdictKind::kSlowLink &&
                       verdicts[0].ranks == ranks &&
                       verdicts[0].evidence.value("channels", nlohmann::json::array()) ==
                           nlohmann::json::array({job.slow_link_channel});
    if (right) return "";
    return "expected slow_link naming ranks " + std::to_string(ranks[0]) + " and " +
           std::to_string(ranks[1]) + " on channel " + std::to_string(job.slow_link_channel) + " alone";
  }
  if (!verdicts.empty() && verdicts[0].kind == ncclguard::VerdictKind::kRankNotJoined &&
      verdicts[0].ranks == std::vector<int>{job.late_rank})
    return "";
  return "expected rank_not_joined naming only rank " + std::to_string(job.late_rank);
}

// Prints the figures and the verdict; whether the verdict is the one the job was written with.
bool Report(const ncclguard::JobView& view, const std::vector<ncclguard::Verdict>& verdicts,
            const ncclguard::SyntheticJob& job, double analysis_seconds, double read_seconds) {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::cout << "analyze_seconds: " << analysis_seconds << '\n'
            << "read_seconds: " << read_seconds << '\n'
            << "analyze_peak_rss_mb: " << static_cast<double>(usage.ru_maxrss) / 1024.0 << '\n'
            << "processes_read: " << view.processes.size() << '\n'
            << "files_not_read: " << view.not_read.files << '\n'
            << "processes_not_read: " << view.not_read.processes << '\n'
            << "problems: " << view.problems.size() << '\n';
  std::string unexpected = Unexpected(verdicts, job);
  if (unexpected.empty() && view.processes.size() != static_cast<std::size_t>(job.ranks))
    unexpected = "expected every rank read";
  std::cout << "verdict: " << (verdicts.empty() ? "none" : ncclguard::VerdictKindName(verdicts[0].kind))
            << " ranks [" << (verdicts.empty() ? "" : ncclguard::FormatRanks(verdicts[0].ranks)) << "]"
            << (unexpected.empty() ? "" : " (" + unexpected + ")") << '\n';
  if (!verdicts.empty()) std::cout << "message: " << verdicts[0].message << '\n';
  return unexpected.empty();
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"Times ncclguard's analysis of a large synthetic job."};
  int ranks = 16384;
  std::string kept_directory;
  bool reuse = false;
  ncclguard::JobReadLimits limits;
  std::string store;
  std::string scenario = "rank-not-joined";
  app.add_option("--ranks", ranks, "Ranks in the job")->check(CLI::Range(2, 1 << 20));
  app.add_option("--threads", limits.threads, "Threads reading the files (default: 8)")
      ->check(CLI::Range(0, 64));
  CLI::Option* keep =
      app.add_option("--keep", kept_directory, "Write the job into this directory and leave it there");
  app.add_flag("--reuse", reuse, "Analyse the job an earlier run with the same --keep and --ranks wrote")
      ->needs(keep);
  app.add_option("--store", store,
                 "The job board the statuses go on, as NCCLGUARD_STORE names it (default: the job directory; "
                 "redis://host:port/db: Redis, the dumps still files of the job directory)");
  app.add_option("--scenario", scenario,
                 "rank-not-joined: one rank never joined the last AllReduce; slow-link: the job runs, and "
                 "the link from rank N/3 to the next on channel 1 is 3x slower per byte than the others")
      ->check(CLI::IsMember({"rank-not-joined", "slow-link"}));
  CLI11_PARSE(app, argc, argv);

  const std::string root = kept_directory.empty() ? MakeTemporaryDirectory() : kept_directory;
  if (root.empty()) {
    std::cerr << "analyze_bench: cannot create a temporary directory\n";
    return 2;
  }
  const std::string job_dir = root + "/job";
  // One job id per size and scenario: a run with --reuse finds the statuses an earlier one left on Redis.
  absl::StatusOr<std::shared_ptr<ncclguard::JobBoard>> board = ncclguard::OpenJobBoard(
      store, job_dir, "analyze-bench-" + std::to_string(ranks) + "-" + scenario, ncclguard::BoardIdentity{});
  if (!board.ok()) {
    std::cerr << "analyze_bench: " << board.status() << '\n';
    return 2;
  }

  ncclguard::SyntheticJob job = BenchJob(ranks, scenario);
  // The interval a job of this size runs with on this board (at least 2 s, stretched for large jobs).
  const double status_interval =
      ncclguard::StatusIntervalSeconds(2, ranks, (*board)->StatusWritesPerSecond());

  if (absl::Status ready = WriteOrReuse(*board, job, root, reuse); !ready.ok()) {
    std::cerr << "analyze_bench: " << ready.message() << '\n';
    return 2;
  }

  PrintFetchTime(*board);
  // Read as of the moment the job was written, so that a slow disk cannot age the status files.
  const auto analysis_start = std::chrono::steady_clock::now();
  absl::StatusOr<ncclguard::JobView> view = ncclguard::ReadJob(
      *board, job.now_ns, status_interval, ncclguard::JobDirectoryOrigin::kNamedByUser, limits);
  if (!view.ok()) {
    std::cerr << "analyze_bench: " << view.status() << '\n';
    return 2;
  }
  const double read_seconds = SecondsSince(analysis_start);
  const std::vector<ncclguard::Verdict> verdicts =
      ncclguard::Classify(*view, ncclguard::ProcessKnownBad().entries);
  const double analysis_seconds = SecondsSince(analysis_start);

  if (job.scenario == ncclguard::SyntheticJob::Scenario::kSlowLink) PrintFailSlowTime(*view);
  const bool expected = Report(*view, verdicts, job, analysis_seconds, read_seconds);
  if (kept_directory.empty()) std::filesystem::remove_all(root);
  return expected ? 0 : 1;
} catch (const std::exception& error) {
  std::cerr << "analyze_bench: " << error.what() << '\n';
  return 1;
} catch (...) {
  std::cerr << "analyze_bench: unexpected error\n";
  return 1;
}
