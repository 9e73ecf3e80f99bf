// analyze_bench [--ranks N] [--keep DIR [--reuse]]: writes a synthetic job of N ranks in which one
// rank never joined the last AllReduce, then times what `ncclguard analyze` does with it
// (ReadJobDirectory and Classify) and reports the process's peak memory. Exit status 1 when the
// verdict is wrong. Writing 131,072 ranks takes minutes: --reuse analyses the job an earlier run
// left in DIR, as of the time that run wrote it (DIR/now_ns).
#include <stdlib.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
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

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"Times ncclguard's analysis of a large synthetic job."};
  int ranks = 16384;
  std::string kept_directory;
  bool reuse = false;
  ncclguard::JobReadLimits limits;
  app.add_option("--ranks", ranks, "Ranks in the job")->check(CLI::Range(2, 1 << 20));
  app.add_option("--threads", limits.threads, "Threads reading the files (default: 8)")
      ->check(CLI::Range(0, 64));
  CLI::Option* keep =
      app.add_option("--keep", kept_directory, "Write the job into this directory and leave it there");
  app.add_flag("--reuse", reuse, "Analyse the job an earlier run with the same --keep and --ranks wrote")
      ->needs(keep);
  CLI11_PARSE(app, argc, argv);

  const std::string root = kept_directory.empty() ? MakeTemporaryDirectory() : kept_directory;
  if (root.empty()) {
    std::cerr << "analyze_bench: cannot create a temporary directory\n";
    return 2;
  }
  const std::string job_dir = root + "/job";

  ncclguard::SyntheticJob job;
  job.ranks = ranks;
  job.scenario = ncclguard::SyntheticJob::Scenario::kRankNotJoined;
  job.late_rank = ranks / 3;
  job.now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count();
  // The interval a job of this size runs with (at least 2 s, stretched to 1,000 writes a second).
  const double status_interval = std::max(2.0, ranks / 1000.0);

  const std::string time_file = root + "/now_ns";
  if (reuse) {
    std::ifstream(time_file) >> job.now_ns;
    if (job.now_ns <= 0) {
      std::cerr << "analyze_bench: " << time_file << " holds no time; run once without --reuse\n";
      return 2;
    }
    std::cout << "ranks: " << ranks << " (reused)\n";
  } else {
    const auto generation_start = std::chrono::steady_clock::now();
    if (absl::Status written = ncclguard::WriteSyntheticJob(job_dir, job); !written.ok()) {
      std::cerr << "analyze_bench: " << written << '\n';
      return 2;
    }
    std::ofstream(time_file) << job.now_ns << '\n';
    std::cout << "ranks: " << ranks << "\ngenerate_seconds: " << SecondsSince(generation_start) << '\n';
  }

  // Read as of the moment the job was written, so that a slow disk cannot age the status files.
  const auto analysis_start = std::chrono::steady_clock::now();
  absl::StatusOr<ncclguard::JobView> view = ncclguard::ReadJobDirectory(
      job_dir, job.now_ns, status_interval, ncclguard::JobDirectoryOrigin::kNamedByUser, limits);
  if (!view.ok()) {
    std::cerr << "analyze_bench: " << view.status() << '\n';
    return 2;
  }
  const double read_seconds = SecondsSince(analysis_start);
  const std::vector<ncclguard::Verdict> verdicts =
      ncclguard::Classify(*view, ncclguard::ProcessKnownBad().entries);
  const double analysis_seconds = SecondsSince(analysis_start);

  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::cout << "analyze_seconds: " << analysis_seconds << '\n'
            << "read_seconds: " << read_seconds << '\n'
            << "analyze_peak_rss_mb: " << static_cast<double>(usage.ru_maxrss) / 1024.0 << '\n'
            << "processes_read: " << view->processes.size() << '\n'
            << "files_not_read: " << view->not_read.files << '\n'
            << "processes_not_read: " << view->not_read.processes << '\n'
            << "problems: " << view->problems.size() << '\n';
  if (kept_directory.empty()) std::filesystem::remove_all(root);

  const bool expected = !verdicts.empty() && verdicts[0].kind == ncclguard::VerdictKind::kRankNotJoined &&
                        verdicts[0].ranks == std::vector<int>{job.late_rank} &&
                        view->processes.size() == static_cast<std::size_t>(ranks);
  std::cout << "verdict: " << (verdicts.empty() ? "none" : ncclguard::VerdictKindName(verdicts[0].kind))
            << " ranks [" << (verdicts.empty() ? "" : ncclguard::FormatRanks(verdicts[0].ranks)) << "]"
            << (expected
                    ? ""
                    : " (expected rank_not_joined naming only rank " + std::to_string(job.late_rank) + ")")
            << '\n';
  if (!verdicts.empty()) std::cout << "message: " << verdicts[0].message << '\n';
  return expected ? 0 : 1;
} catch (const std::exception& error) {
  std::cerr << "analyze_bench: " << error.what() << '\n';
  return 1;
} catch (...) {
  std::cerr << "analyze_bench: unexpected error\n";
  return 1;
}
