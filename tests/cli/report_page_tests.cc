// `ncclguard analyze --html`: the page as a browser shows it. Headless Chromium loads it (its
// scripts run; the page may reach nothing outside itself), the test reads the page's text from the
// DOM it built and takes a screenshot, at 8 ranks through the command and at 100,000 ranks.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/status/status.h"
#include "cli/html_report.h"
#include "cli/synthetic_job.h"
#include "tests/support/process.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/job_read.h"

using ncclguard::SyntheticJob;
using ncclguard::testing::ProcessOptions;
using ncclguard::testing::ProcessResult;
using ncclguard::testing::ReadFile;
using ncclguard::testing::RunProcess;
using ncclguard::testing::TemporaryDirectory;

namespace {

struct Rendered {
  std::string dom;            // the document once its scripts ran
  std::string screenshot;     // the PNG's bytes
  std::string browser_error;  // what went wrong, for the test's message
};

// Loads `page` in headless Chromium twice: once to print the DOM, once to take a screenshot
// (kept beside the page for a person to look at).
Rendered Render(const std::string& page, const std::string& scratch) {
  const std::vector<std::string> common = {CHROMIUM,
                                           "--headless",
                                           "--no-sandbox",
                                           "--disable-gpu",
                                           "--no-first-run",
                                           "--user-data-dir=" + scratch + "/profile",
                                           "--window-size=1100,1400"};
  ProcessOptions options;
  options.timeout_seconds = 90;
  Rendered rendered;
  std::vector<std::string> dump = common;
  dump.insert(dump.end(), {"--dump-dom", "file://" + page});
  const ProcessResult dom = RunProcess(dump, options);
  rendered.dom = dom.out;
  const std::string png = page + ".png";
  std::vector<std::string> shot = common;
  shot.insert(shot.end(), {"--screenshot=" + png, "file://" + page});
  const ProcessResult screenshot = RunProcess(shot, options);
  rendered.screenshot = ReadFile(png);
  rendered.browser_error = "dump-dom exit " + std::to_string(dom.exit_code) + ": " + dom.err +
                           "\nscreenshot exit " + std::to_string(screenshot.exit_code) + ": " +
                           screenshot.err;
  return rendered;
}

// A PNG's width and height from its IHDR chunk; {0, 0} for anything else.
std::pair<std::uint32_t, std::uint32_t> PngSize(const std::string& png) {
  if (png.size() < 24 || png.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0 || png.compare(12, 4, "IHDR") != 0)
    return {};
  auto big_endian = [&png](std::size_t at) {
    std::uint32_t value = 0;
    for (std::size_t i = 0; i < 4; ++i) value = (value << 8) | static_cast<unsigned char>(png[at + i]);
    return value;
  };
  return {big_endian(16), big_endian(20)};
}

// The legend's row for `state`: its count and its ranks.
std::string LegendRow(const std::string& dom, const std::string& state) {
  std::smatch row;
  const std::regex pattern("<tr class=\"state-" + state + "\">.*?</tr>");
  return std::regex_search(dom, row, pattern) ? row.str() : std::string();
}

}  // namespace

TEST_CASE("the report page of a late rank, as a browser shows it: the verdict first, every rank drawn",
          "[html]") {
  TemporaryDirectory scratch;
  // A directory name that is HTML: it must stay text.
  const std::string job_dir = scratch.path() + "/job<img src=x onerror=alert(1)>";
  SyntheticJob options;
  options.ranks = 8;
  options.scenario = SyntheticJob::Scenario::kRankNotJoined;
  options.late_rank = 5;
  REQUIRE(ncclguard::WriteSyntheticJob(job_dir, options).ok());
  const std::string page = scratch.path() + "/report.html";
  const ProcessResult analyzed = RunProcess({NCCLGUARD_COMMAND, "analyze", job_dir, "--html", page}, {});
  INFO(analyzed.out << analyzed.err);
  REQUIRE(analyzed.exit_code == 1);
  CHECK(analyzed.out.find("Report page written to " + page) != std::string::npos);
  const std::string html = ReadFile(page);
  // Self-contained: nothing to fetch, and the directory's name escaped.
  CHECK_FALSE(std::regex_search(html, std::regex(R"re(<[a-zA-Z][^>]*\s(src|href|srcset|action)\s*=)re")));
  CHECK(html.find("<img") == std::string::npos);
  CHECK(html.find("url(") == std::string::npos);
  CHECK(html.find("job&lt;img src=x onerror=alert(1)&gt;") != std::string::npos);

  const Rendered rendered = Render(page, scratch.path());
  INFO(rendered.browser_error);
  const std::string& dom = rendered.dom;
  // The verdict comes first, in one sentence, before the picture.
  const std::size_t verdict = dom.find("id=\"verdict\"");
  REQUIRE(verdict != std::string::npos);
  CHECK(dom.find("rank_not_joined", verdict) < dom.find("id=\"grid\""));
  CHECK(dom.find("rank 5") != std::string::npos);
  CHECK(dom.find("data-drawn=\"8\"") != std::string::npos);  // the script drew every rank
  CHECK(LegendRow(dom, "late").find("<td>1</td>") != std::string::npos);
  CHECK(LegendRow(dom, "late").find("ranks 5") != std::string::npos);
  CHECK(LegendRow(dom, "waiting").find("<td>7</td>") != std::string::npos);
  CHECK(LegendRow(dom, "waiting").find("ranks 0-4, 6-7") != std::string::npos);
  CHECK(dom.find("Last operations") != std::string::npos);
  CHECK(PngSize(rendered.screenshot) == std::pair<std::uint32_t, std::uint32_t>{1100, 1400});
}

TEST_CASE("at 100,000 ranks the page stays small and the picture holds every rank", "[html]") {
  constexpr int kRanks = 100'000;
  constexpr int kLate = 77'777;
  constexpr std::uint64_t kStuck = 8;
  ncclguard::JobView job;
  job.directory = "/jobs/big";
  job.now_ns = 1'800'000'000'000'000'000;
  job.processes.resize(kRanks);
  for (int rank = 0; rank < kRanks; ++rank) {
    ncclguard::ProcessView& process = job.processes[static_cast<std::size_t>(rank)];
    process.host = "node" + std::to_string(rank / 8);
    process.pid = 1000 + rank % 8;
    process.last_seen_ns = job.now_ns;
    process.snapshot.rank = rank;
    ncclguard::CommSnapshot& comm = process.snapshot.comms.emplace_back();
    comm.id = "5eed0c0ffee0cafe";
    comm.rank = rank;
    comm.nranks = kRanks;
    comm.last_completed = kStuck - 1;
    comm.last_enqueued = rank == kLate ? kStuck - 1 : kStuck;
  }
  const ncclguard::Verdict verdict{.kind = ncclguard::VerdictKind::kRankNotJoined,
                                   .comm = "5eed0c0ffee0cafe",
                                   .seq = kStuck,
                                   .ranks = {kLate},
                                   .message = "rank 77777 has not entered AllReduce #8",
                                   .evidence = {}};
  const std::string html = ncclguard::HtmlReport(job, {verdict});
  CHECK(html.size() < 1'000'000);  // a letter per rank, and the tables only for the named and the first
  TemporaryDirectory scratch;
  const std::string page = scratch.path() + "/big.html";
  std::ofstream(page) << html;
  const Rendered rendered = Render(page, scratch.path());
  INFO(rendered.browser_error);
  CHECK(rendered.dom.find("data-drawn=\"100000\"") != std::string::npos);
  CHECK(LegendRow(rendered.dom, "late").find("ranks 77777") != std::string::npos);
  CHECK(LegendRow(rendered.dom, "waiting").find("<td>99999</td>") != std::string::npos);
  std::smatch size;
  REQUIRE(std::regex_search(rendered.dom, size, std::regex(R"re(id="grid" width="(\d+)" height="(\d+)")re")));
  CHECK(std::stoi(size[1]) <= 968);   // within the page's width
  CHECK(std::stoi(size[2]) <= 1200);  // and a screen or two high
  CHECK(PngSize(rendered.screenshot).first == 1100);
}
