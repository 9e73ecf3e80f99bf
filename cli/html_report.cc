#include "cli/html_report.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <ios>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/rank_states.h"
#include "watchdog/common/clock.h"
#include "watchdog/common/escape.h"
#include "watchdog/common/ranks.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/job_read.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {
namespace {

// Bounds that keep the page light at 100,000 ranks: the picture carries every rank, the tables
// only the ranks the verdicts name and the first others.
constexpr std::size_t kMaxRanksListed = 64;
constexpr std::size_t kMaxOpsPerComm = 8;
constexpr std::size_t kMaxRankParts = 16;

// The letter of each state in the picture's data, and its colour (chosen apart for the common
// forms of colour blindness: blue, orange, red, green, grey, purple, light grey).
struct StateStyle {
  RankState state;
  char letter;
  const char* colour;
  const char* meaning;
};
constexpr std::array<StateStyle, kRankStates> kStyles = {{
    {RankState::kWaiting, 'W', "#3b78c3", "entered the operation and waits in it"},
    {RankState::kLate, 'L', "#f08c00", "alive and has not entered it"},
    {RankState::kDead, 'D', "#d62728", "its process is gone without exiting"},
    {RankState::kFinished, 'F', "#2ca02c", "completed it"},
    {RankState::kExited, 'X', "#7f7f7f", "exited before it (or closed its communicators and ended)"},
    {RankState::kStopped, 'S', "#9467bd", "its process is stopped"},
    {RankState::kUnknown, 'U', "#d9d9d9", "nothing of it was read"},
}};

const StateStyle& StyleOf(RankState state) {
  return *std::find_if(kStyles.begin(), kStyles.end(),
                       [state](const StateStyle& s) { return s.state == state; });
}

// Text from the job (written by anyone) as HTML text or attribute content.
std::string Html(std::string_view text) {
  std::string escaped;
  for (const char c : EscapeControlCharacters(std::string(text))) {
    switch (c) {
      case '&':
        escaped += "&amp;";
        break;
      case '<':
        escaped += "&lt;";
        break;
      case '>':
        escaped += "&gt;";
        break;
      case '"':
        escaped += "&quot;";
        break;
      case '\'':
        escaped += "&#39;";
        break;
      default:
        escaped += c;
    }
  }
  return escaped;
}

constexpr char kHead[] = R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>)";

constexpr char kStyle[] = R"(</title>
<style>
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1000px;padding:0 16px;color:#1a1a1a}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.verdict{font-size:17px;padding:12px 14px;border-left:6px solid #d62728;background:#fdf2f2;margin:12px 0}
.verdict.healthy{border-color:#2ca02c;background:#f2fbf2}.kind{font-weight:600;font-family:monospace}
.meta{color:#555}table{border-collapse:collapse;margin:6px 0}td,th{padding:2px 8px;text-align:left;
vertical-align:top;border-bottom:1px solid #eee}pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:12px}
.swatch{display:inline-block;width:12px;height:12px;margin-right:6px;vertical-align:-1px}
#grid{border:1px solid #ccc;image-rendering:pixelated;display:block;margin:8px 0}
#hover{min-height:1.4em;font-family:monospace}
</style></head><body>
)";

// Draws one square per rank from the letters of #states, as large as the page allows: 24 px
// squares for a few ranks, 2 px for a hundred thousand. Hovering names the rank.
constexpr char kScript[] = R"(<script>
(function(){
const letters=document.getElementById('states').textContent.trim();
const colours=JSON.parse(document.getElementById('colours').textContent);
const names=JSON.parse(document.getElementById('names').textContent);
const named=new Set(JSON.parse(document.getElementById('named').textContent));
const canvas=document.getElementById('grid');
const n=letters.length;if(n===0){canvas.remove();return;}
const width=Math.max(200,Math.min(968,canvas.parentElement.clientWidth||968));
const cell=Math.max(2,Math.min(24,Math.floor(Math.sqrt(width*360/n))));
const cols=Math.max(1,Math.min(n,Math.floor(width/cell)));const rows=Math.ceil(n/cols);
canvas.width=cols*cell;canvas.height=rows*cell;
const g=canvas.getContext('2d');const gap=cell>=6?1:0;
for(let r=0;r<n;r++){const x=(r%cols)*cell,y=Math.floor(r/cols)*cell;
g.fillStyle=colours[letters[r]]||'#000';g.fillRect(x,y,cell-gap,cell-gap);
if(named.has(r)&&cell>=6){g.strokeStyle='#000';g.lineWidth=2;g.strokeRect(x+1,y+1,cell-gap-2,cell-gap-2);}}
canvas.dataset.drawn=String(n);
const hover=document.getElementById('hover');
canvas.addEventListener('mousemove',e=>{const b=canvas.getBoundingClientRect();
const r=Math.floor((e.clientY-b.top)/cell)*cols+Math.floor((e.clientX-b.left)/cell);
hover.textContent=r<n?('rank '+r+': '+names[letters[r]]+(named.has(r)?' (named by the verdict)':'')):'';});
})();
</script>
)";

void AppendPicture(std::string& page, const RankStates& states, const std::set<int>& named) {
  absl::StrAppend(
      &page, "<h2>Every rank",
      states.seq != 0 ? absl::StrCat(" at comm ", Html(states.comm), " #", states.seq) : std::string(),
      "</h2>\n<table id=\"legend\">\n");
  std::array<std::vector<int>, kRankStates> ranks_by_state;
  std::string letters;
  letters.reserve(states.by_rank.size());
  for (std::size_t rank = 0; rank < states.by_rank.size(); ++rank) {
    letters += StyleOf(states.by_rank[rank]).letter;
    ranks_by_state[static_cast<std::size_t>(states.by_rank[rank])].push_back(static_cast<int>(rank));
  }
  nlohmann::json colours = nlohmann::json::object();
  nlohmann::json names = nlohmann::json::object();
  for (const StateStyle& style : kStyles) {
    colours[std::string(1, style.letter)] = style.colour;
    names[std::string(1, style.letter)] = RankStateName(style.state);
    const std::vector<int>& ranks = ranks_by_state[static_cast<std::size_t>(style.state)];
    if (ranks.empty()) continue;
    absl::StrAppend(&page, "<tr class=\"state-", RankStateName(style.state),
                    "\"><td><span class=\"swatch\" style=\"background:", style.colour, "\"></span>",
                    RankStateName(style.state), "</td><td>", ranks.size(), "</td><td class=\"meta\">",
                    style.meaning, "</td><td>ranks ", Html(FormatRanks(ranks, {.max_parts = kMaxRankParts})),
                    "</td></tr>\n");
  }
  absl::StrAppend(
      &page, "</table>\n<canvas id=\"grid\" width=\"0\" height=\"0\"></canvas><div id=\"hover\"></div>\n",
      "<script type=\"application/json\" id=\"colours\">", colours.dump(), "</script>\n",
      "<script type=\"application/json\" id=\"names\">", names.dump(), "</script>\n",
      "<script type=\"application/json\" id=\"named\">", nlohmann::json(named).dump(), "</script>\n",
      "<script type=\"text/plain\" id=\"states\">", letters, "</script>\n");
}

// The late and dead ranks' stacks that the verdicts' evidence carries.
void AppendStacks(std::string& page, const std::vector<Verdict>& verdicts) {
  std::string stacks;
  for (const Verdict& verdict : verdicts) {
    for (const LateRankStack& stack : LateRankStacks(verdict.evidence)) {
      absl::StrAppend(&stacks, "<h3>rank ", stack.rank, " (pid ", stack.pid, ", thread ", stack.tid,
                      " &quot;", Html(stack.thread_name), "&quot;)</h3>\n<p>", Html(stack.sentence),
                      "</p>\n<pre>");
      for (const std::string& frame : stack.frames) absl::StrAppend(&stacks, Html(frame), "\n");
      absl::StrAppend(&stacks, "</pre>\n");
    }
  }
  if (!stacks.empty()) absl::StrAppend(&page, "<h2>Where the late ranks are</h2>\n", stacks);
}

void AppendVerdicts(std::string& page, const nlohmann::json& verdicts) {
  absl::StrAppend(&page, "<h2>Verdicts and their evidence</h2>\n");
  for (const nlohmann::json& verdict : verdicts) {
    absl::StrAppend(
        &page, "<p><span class=\"kind\">", Html(verdict.value("kind", "")), "</span>",
        verdict.value("comm", "").empty() ? "" : absl::StrCat(" comm ", Html(verdict.value("comm", ""))),
        verdict.value("seq", 0) != 0 ? absl::StrCat(" #", verdict.value("seq", 0)) : "", ": ",
        Html(verdict.value("message", "")), "</p>\n");
    if (verdict.contains("evidence") && !verdict["evidence"].is_null()) {
      absl::StrAppend(&page, "<details><summary>evidence</summary><pre>",
                      Html(verdict["evidence"].dump(2, ' ', false, nlohmann::json::error_handler_t::replace)),
                      "</pre></details>\n");
    }
  }
}

std::string OperationRow(const OpSnapshot& op) {
  return absl::StrCat("<tr><td>#", op.seq, "</td><td>", Html(op.op), "</td><td>", Html(op.dtype), " × ",
                      op.count, "</td><td>", Html(op.state), "</td><td>",
                      op.gpu_ms >= 0 ? absl::StrFormat("%.3f ms", op.gpu_ms) : std::string("-"),
                      "</td></tr>\n");
}

void AppendLastOperations(std::string& page, const JobView& job, const std::set<int>& named) {
  std::vector<const ProcessView*> listed;
  for (const ProcessView& process : job.processes) {
    if (named.count(process.snapshot.rank) != 0) listed.push_back(&process);
  }
  for (const ProcessView& process : job.processes) {
    if (listed.size() >= kMaxRanksListed) break;
    if (named.count(process.snapshot.rank) == 0) listed.push_back(&process);
  }
  absl::StrAppend(&page, "<h2>Last operations</h2>\n");
  for (const ProcessView* process : listed) {
    absl::StrAppend(&page, "<details", named.count(process->snapshot.rank) != 0 ? " open" : "",
                    "><summary>rank ", process->snapshot.rank, " — ", Html(process->host), ":", process->pid,
                    " (", ProcessState(job, *process), ")</summary>\n");
    for (const CommSnapshot& comm : process->snapshot.comms) {
      absl::StrAppend(&page, "<p class=\"meta\">comm ", Html(comm.id), ": last enqueued #",
                      comm.last_enqueued, ", started #", comm.last_started, ", completed #",
                      comm.last_completed, "</p>\n");
      if (comm.ring.empty()) continue;
      absl::StrAppend(
          &page, "<table><tr><th>#</th><th>operation</th><th>data</th><th>state</th><th>GPU</th></tr>\n");
      const std::size_t first = comm.ring.size() > kMaxOpsPerComm ? comm.ring.size() - kMaxOpsPerComm : 0;
      for (std::size_t i = first; i < comm.ring.size(); ++i)
        absl::StrAppend(&page, OperationRow(comm.ring[i]));
      absl::StrAppend(&page, "</table>\n");
    }
    absl::StrAppend(&page, "</details>\n");
  }
  if (job.processes.size() > listed.size()) {
    absl::StrAppend(&page, "<p class=\"meta\">", job.processes.size() - listed.size(),
                    " other processes not listed (ncclguard analyze --json lists them all)</p>\n");
  }
}

}  // namespace

std::string HtmlReport(const JobView& job, const std::vector<Verdict>& verdicts) {
  const nlohmann::json document = VerdictsToJson(job, verdicts);
  const nlohmann::json& verdict_list = document.at("verdicts");
  std::set<int> named;
  for (const Verdict& verdict : verdicts) named.insert(verdict.ranks.begin(), verdict.ranks.end());
  const bool healthy = verdicts.size() == 1 && verdicts[0].kind == VerdictKind::kHealthy;
  std::string page = kHead;
  absl::StrAppend(&page, "ncclguard: ", Html(job.directory), kStyle,
                  "<h1>ncclguard analyze</h1>\n<p class=\"meta\">", Html(job.directory), " — ",
                  job.processes.size(), job.processes.size() == 1 ? " process" : " processes", ", read at ",
                  IsoTime(job.now_ns), "</p>\n");
  if (!verdicts.empty()) {
    absl::StrAppend(&page, "<p class=\"verdict", healthy ? " healthy" : "",
                    "\" id=\"verdict\"><span class=\"kind\">", Html(VerdictKindName(verdicts[0].kind)),
                    "</span>: ", Html(verdicts[0].message), "</p>\n");
  }
  if (job.not_read.files > 0 || job.not_read.listing_cut_short) {
    absl::StrAppend(&page, "<p class=\"meta\">Read in part: ", job.not_read.files, " files not read (",
                    Html(job.not_read.why), ").</p>\n");
  }
  AppendPicture(page, RankStatesAt(job, verdicts), named);
  AppendStacks(page, verdicts);
  AppendVerdicts(page, verdict_list);
  AppendLastOperations(page, job, named);
  absl::StrAppend(&page, kScript, "</body></html>\n");
  return page;
}

absl::Status WriteHtmlReport(const std::string& path, const JobView& job,
                             const std::vector<Verdict>& verdicts) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  out << HtmlReport(job, verdicts);
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  return absl::OkStatus();
}

}  // namespace ncclguard
