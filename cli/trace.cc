#include "cli/trace.h"

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <ios>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "watchdog/common/clock.h"
#include "watchdog/common/pace.h"
#include "watchdog/common/profile_events.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/job_read.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/report/whereabouts.h"

namespace ncclguard {
namespace {

using Json = nlohmann::json;

// Colour names from the trace viewer's reserved palette (chrome://tracing honours them).
constexpr char kStuckColour[] = "terrible";
constexpr char kWaitingColour[] = "bad";

struct Marking {
  std::string suffix;
  std::string colour;
};

Marking MarkingOf(const OpSnapshot& op) {
  if (op.state == "started") return {" (stuck)", kStuckColour};
  if (op.state == "enqueued") return {" (not started)", kWaitingColour};
  if (op.state == "failed" || op.state == "aborted") return {absl::StrCat(" (", op.state, ")"), kStuckColour};
  return {};
}

// The earliest time anything in the job happened: time zero of the trace.
std::int64_t Origin(const JobView& job) {
  std::int64_t origin = job.now_ns;
  auto consider = [&](std::int64_t ns) {
    if (ns > 0 && ns < origin) origin = ns;
  };
  for (const ProcessView& process : job.processes) {
    for (const CommSnapshot& comm : process.snapshot.comms) {
      consider(comm.init_start_ns);
      for (const OpSnapshot& op : comm.ring) {
        consider(op.enqueue_ns);
        consider(op.start_ns);
      }
    }
    for (const PendingInitSnapshot& init : process.snapshot.pending_inits) consider(init.start_ns);
  }
  return origin;
}

// Jobs of up to this many processes get every rank's pace counters; larger ones only those of the
// ranks a fail-slow verdict names, so that the trace stays the size of its operations.
constexpr std::size_t kMaxPacedProcesses = 64;

bool IsFailSlow(const Verdict& verdict) {
  return verdict.kind == VerdictKind::kSlowLink || verdict.kind == VerdictKind::kSlowRank;
}

// A process's track number: rank + 1, which overflows an int for rank 2147483647.
using TracePid = std::int64_t;

class TraceBuilder {
 public:
  TraceBuilder(const JobView& job, const std::vector<Verdict>& verdicts)
      : job_(job), origin_ns_(Origin(job)) {
    for (const Verdict& verdict : verdicts) {
      if (!verdict.comm.empty() && verdict.seq != 0)
        verdict_of_[{verdict.comm, verdict.seq}] = VerdictKindName(verdict.kind);
      if (verdict.kind == VerdictKind::kLinkStalled) RememberLinks(verdict);
      if (IsFailSlow(verdict)) fail_slow_.push_back(&verdict);
    }
  }

  double Micros(std::int64_t ns) const { return static_cast<double>(ns - origin_ns_) / 1000.0; }

  void AddProcess(const ProcessView& process, TracePid trace_pid) {
    const ProcessSnapshot& snapshot = process.snapshot;
    Metadata("process_name", trace_pid, 0,
             {{"name", absl::StrCat("rank ", snapshot.rank, " (", process.host, ":", process.pid, ")")}});
    Metadata("process_sort_index", trace_pid, 0, {{"sort_index", trace_pid}});

    // A track per communicator, each followed by its channels' tracks (AddChannelTracks).
    std::map<std::string, int> thread_of_comm;
    int next_tid = 1;
    auto thread_for = [&](const std::string& comm_id, const std::string& label) {
      auto [it, inserted] = thread_of_comm.try_emplace(comm_id, next_tid);
      if (inserted) {
        ++next_tid;
        Metadata("thread_name", trace_pid, it->second, {{"name", label}});
        Metadata("thread_sort_index", trace_pid, it->second,
                 {{"sort_index", SortIndex(thread_of_comm.size())}});
      }
      return it->second;
    };

    for (const CommSnapshot& comm : snapshot.comms) {
      const int tid =
          thread_for(comm.id, absl::StrCat("comm ", comm.id, " (rank ", comm.rank, " of ", comm.nranks, ")"));
      next_tid = AddChannelTracks(trace_pid, next_tid, thread_of_comm.size(), comm);
      if (comm.init_start_ns > 0) {
        const bool finished = comm.init_end_ns > 0;
        Slice(trace_pid, tid,
              absl::StrCat(comm.created_by.empty() ? "init" : comm.created_by, finished ? "" : " (stuck)"),
              comm.init_start_ns, finished ? comm.init_end_ns : job_.now_ns, finished ? "" : kStuckColour,
              {{"state", comm.state}});
      }
      for (const OpSnapshot& op : comm.ring) AddOperation(trace_pid, tid, comm.id, op);
      next_tid = AddPace(trace_pid, next_tid, thread_of_comm.size(), comm,
                         snapshot.time_ns > 0 ? snapshot.time_ns : job_.now_ns);
      if (!comm.async_error.empty()) {
        Instant(trace_pid, tid, "async error", snapshot.time_ns,
                {{"async_error", comm.async_error}, {"last_nccl_warning", snapshot.last_nccl_warning}});
      }
    }
    for (const PendingInitSnapshot& init : snapshot.pending_inits) {
      const int tid = thread_for(init.comm_id, absl::StrCat("comm ", init.comm_id, " (rank ", init.rank,
                                                            " of ", init.nranks, ", initialising)"));
      if (init.start_ns > 0) {
        Slice(trace_pid, tid, absl::StrCat(init.api, " (stuck)"), init.start_ns, job_.now_ns, kStuckColour,
              {{"state", "initializing"}});
      }
    }
    if (snapshot.stall && snapshot.time_ns > 0) {
      const StallSnapshot& stall = *snapshot.stall;
      auto found = thread_of_comm.find(stall.comm_id);
      Instant(trace_pid, found == thread_of_comm.end() ? 0 : found->second,
              absl::StrCat("stall: ", stall.kind, stall.seq != 0 ? absl::StrCat(" #", stall.seq) : ""),
              snapshot.time_ns, {{"seconds", stall.seconds}, {"message", stall.message}});
    }
    if (snapshot.threads) AddWhereabouts(trace_pid, next_tid, process, *snapshot.threads);
    if ((process.exited || process.liveness == ProcessView::Liveness::kGone) && process.last_seen_ns > 0) {
      Instant(trace_pid, 0, process.exited ? "exited" : "last seen (gone)", process.last_seen_ns,
              Json::object());
    }
  }

  void AddVerdict(const Verdict& verdict) {
    events_.push_back({{"ph", "i"},
                       {"s", "g"},
                       {"name", VerdictKindName(verdict.kind)},
                       {"pid", 0},
                       {"tid", 0},
                       {"ts", Micros(job_.now_ns)},
                       {"args",
                        {{"message", verdict.message},
                         {"comm", verdict.comm},
                         {"seq", verdict.seq},
                         {"ranks", verdict.ranks}}}});
  }

  Json Take() {
    return Json{{"traceEvents", std::move(events_)},
                {"displayTimeUnit", "ms"},
                {"otherData", {{"directory", job_.directory}, {"time", IsoTime(job_.now_ns)}}}};
  }

 private:
  void AddOperation(TracePid trace_pid, int tid, const std::string& comm_id, const OpSnapshot& op) {
    const std::int64_t begin_ns = op.start_ns > 0 ? op.start_ns : op.enqueue_ns;
    if (begin_ns <= 0) return;  // never reached the GPU nor was timed: nothing to place
    const bool unfinished = op.state == "started" || op.state == "enqueued";
    const std::int64_t end_ns = op.end_ns > 0 ? op.end_ns : (unfinished ? job_.now_ns : begin_ns);
    Json args{
        {"op", op.op}, {"dtype", op.dtype}, {"count", op.count}, {"bytes", op.bytes}, {"state", op.state}};
    if (op.root >= 0) args["root"] = op.root;
    if (op.peer >= 0) args["peer"] = op.peer;
    if (!op.reduction.empty()) args["reduction"] = op.reduction;
    if (op.gpu_ms >= 0) args["gpu_ms"] = op.gpu_ms;
    if (op.result != 0) args["result"] = op.result;
    if (auto verdict = verdict_of_.find({comm_id, op.seq}); verdict != verdict_of_.end()) {
      args["verdict"] = verdict->second;
    }
    const Marking marking = MarkingOf(op);
    Slice(trace_pid, tid, absl::StrCat(op.op, " #", op.seq, marking.suffix), begin_ns, end_ns, marking.colour,
          std::move(args));
  }

  // Track order inside a process: communicator k (from 1) at k * kSortStride, its channels just
  // below it, where the process is last.
  static constexpr std::int64_t kSortStride = 1000;
  static constexpr std::int64_t kWhereaboutsSortIndex = std::int64_t{1} << 40;
  static std::int64_t SortIndex(std::size_t comm_track, int channel = -1) {
    return static_cast<std::int64_t>(comm_track) * kSortStride + 1 +
           std::clamp<std::int64_t>(channel, -1, kSortStride - 2);
  }

  void RememberLinks(const Verdict& verdict) {
    const auto links = verdict.evidence.find("links");
    if (links == verdict.evidence.end() || !links->is_array()) return;
    for (const Json& link : *links) {
      const int channel = link.value("channel", -1);
      for (const char* end : {"from_rank", "to_rank"}) {
        stalled_link_of_[{verdict.comm, link.value(end, -1), channel}] =
            absl::StrCat("rank ", link.value("from_rank", -1), " to rank ", link.value("to_rank", -1));
      }
    }
  }

  // NCCL's profiler (the communicator's `profile`): a track for each channel its operations used,
  // just below the communicator's. On it, each operation's work on that channel, from its kernel's
  // start to its stop, and nested in it each proxy operation's step still in flight, from when it
  // began to wait. Returns the next free track number.
  int AddChannelTracks(TracePid trace_pid, int next_tid, std::size_t comm_track, const CommSnapshot& comm) {
    std::map<int, int> thread_of_channel;
    for (const OpProfileSnapshot& op : comm.profile) {
      std::set<int> channels;
      for (const ChannelSnapshot& kernel : op.kernel_channels) channels.insert(kernel.channel);
      for (const ProxyOpSnapshot& proxy : op.proxy_ops) channels.insert(proxy.channel);
      for (const int channel : channels) {
        auto [it, inserted] = thread_of_channel.try_emplace(channel, next_tid);
        if (inserted) {
          ++next_tid;
          Metadata("thread_name", trace_pid, it->second,
                   {{"name", absl::StrCat("comm ", comm.id, " channel ", channel)}});
          Metadata("thread_sort_index", trace_pid, it->second,
                   {{"sort_index", SortIndex(comm_track, channel)}});
        }
        AddChannelWork(trace_pid, it->second, comm, op, channel);
      }
    }
    return next_tid;
  }

  void AddChannelWork(TracePid trace_pid, int tid, const CommSnapshot& comm, const OpProfileSnapshot& op,
                      int channel) {
    const ChannelSnapshot* kernel = nullptr;
    std::int64_t first_gpu_ns = 0;  // the GPU's timer when the operation's first kernel channel started
    for (const ChannelSnapshot& candidate : op.kernel_channels) {
      if (candidate.channel == channel) kernel = &candidate;
      if (candidate.gpu_start_ns > 0 && (first_gpu_ns == 0 || candidate.gpu_start_ns < first_gpu_ns))
        first_gpu_ns = candidate.gpu_start_ns;
    }
    bool running = kernel != nullptr && !kernel->stopped;
    Json proxies = Json::array();
    for (const ProxyOpSnapshot& proxy : op.proxy_ops) {
      if (proxy.channel != channel) continue;
      running = running || !proxy.stopped;
      proxies.push_back(ProxyJson(proxy));
    }
    // The GPU's timer has its own origin: the channel is placed by its offset from the first.
    std::int64_t begin_ns = op.start_ns;
    const bool gpu_timed = kernel != nullptr && kernel->gpu_start_ns > 0 && first_gpu_ns > 0;
    if (gpu_timed) begin_ns += kernel->gpu_start_ns - first_gpu_ns;
    if (begin_ns <= 0) return;
    std::int64_t end_ns = begin_ns;
    if (running) {
      end_ns = std::max(job_.now_ns, begin_ns);
    } else if (gpu_timed && kernel->gpu_stop_ns > kernel->gpu_start_ns) {
      end_ns = begin_ns + (kernel->gpu_stop_ns - kernel->gpu_start_ns);
    }
    Json args{{"func", op.func},
              {"nccl_seq", op.nccl_seq},
              {"algo", op.algo},
              {"proto", op.proto},
              {"channel", channel},
              {"kernel", kernel == nullptr ? "not started" : (kernel->stopped ? "stopped" : "running")},
              {"proxy_ops", std::move(proxies)}};
    const auto link = stalled_link_of_.find({comm.id, comm.rank, channel});
    const bool on_stalled_link = link != stalled_link_of_.end() && running;
    if (on_stalled_link) args["verdict"] = absl::StrCat("link_stalled: ", link->second);
    Slice(trace_pid, tid, absl::StrCat(op.func, " (NCCL's #", op.nccl_seq, ")", running ? " (stuck)" : ""),
          begin_ns, end_ns, running ? kStuckColour : "", std::move(args));
    if (!running) return;
    for (const ProxyOpSnapshot& proxy : op.proxy_ops) {
      if (proxy.channel != channel || proxy.stopped || proxy.waiting_step < 0 || proxy.waiting_since_ns <= 0)
        continue;
      const bool stalled_peer = on_stalled_link && proxy.peer >= 0;
      Slice(trace_pid, tid,
            absl::StrCat(proxy.send ? "send to rank " : "receive from rank ", proxy.peer, ": step ",
                         proxy.waiting_step, " ", StepWaitName(proxy.waiting)),
            std::clamp(proxy.waiting_since_ns, begin_ns, end_ns), end_ns,
            stalled_peer ? kStuckColour : kWaitingColour, ProxyJson(proxy));
    }
  }

  static Json ProxyJson(const ProxyOpSnapshot& proxy) {
    Json json{{"peer", proxy.peer},
              {"direction", proxy.send ? "send" : "receive"},
              {"steps", proxy.steps},
              {"steps_done", proxy.steps_done},
              {"stopped", proxy.stopped}};
    if (!proxy.stopped && proxy.waiting_step >= 0) {
      json["waiting_step"] = proxy.waiting_step;
      json["waiting"] = StepWaitName(proxy.waiting);
    }
    return json;
  }

  // Where the process was when its stacks were taken: a track of its own with the thread that
  // issued its NCCL operations, as a slice over the time it had been blocked, and its stack.
  void AddWhereabouts(TracePid trace_pid, int tid, const ProcessView& process,
                      const ThreadsSnapshot& threads) {
    std::int64_t nccl_thread = 0;
    for (const CommSnapshot& comm : process.snapshot.comms) {
      for (const OpSnapshot& op : comm.ring) nccl_thread = op.host_thread != 0 ? op.host_thread : nccl_thread;
    }
    const std::optional<ThreadLocation> location = LocateProcess(threads, nccl_thread, process.pid);
    if (!location || threads.time_ns <= 0) return;
    Metadata("thread_name", trace_pid, tid,
             {{"name", absl::StrCat("where it is (thread ", location->thread->tid, ")")}});
    Metadata("thread_sort_index", trace_pid, tid, {{"sort_index", kWhereaboutsSortIndex}});
    Json stack = Json::array();
    for (const FrameSnapshot& frame : location->thread->python)
      stack.push_back("py " + FrameText(frame, true));
    for (const FrameSnapshot& frame : location->thread->native) stack.push_back(FrameText(frame, false));
    const double blocked = location->thread->blocked_seconds;
    const std::int64_t since_ns =
        blocked > 0 ? threads.time_ns - static_cast<std::int64_t>(blocked * 1e9) : threads.time_ns;
    Slice(trace_pid, tid, location->sentence, since_ns, threads.time_ns, kWaitingColour,
          {{"thread", location->thread->name}, {"stack", std::move(stack)}});
  }

  void Metadata(const char* name, TracePid trace_pid, int tid, Json args) {
    events_.push_back(
        {{"ph", "M"}, {"name", name}, {"pid", trace_pid}, {"tid", tid}, {"args", std::move(args)}});
  }

  void Slice(TracePid trace_pid, int tid, std::string name, std::int64_t begin_ns, std::int64_t end_ns,
             const std::string& colour, Json args) {
    Json event{{"ph", "X"},
               {"cat", "nccl"},
               {"name", std::move(name)},
               {"pid", trace_pid},
               {"tid", tid},
               {"ts", Micros(begin_ns)},
               {"dur", static_cast<double>(std::max<std::int64_t>(end_ns - begin_ns, 0)) / 1000.0},
               {"args", std::move(args)}};
    if (!colour.empty()) event["cname"] = colour;
    events_.push_back(std::move(event));
  }

  void Instant(TracePid trace_pid, int tid, std::string name, std::int64_t ns, Json args) {
    events_.push_back({{"ph", "i"},
                       {"s", tid == 0 ? "p" : "t"},
                       {"name", std::move(name)},
                       {"pid", trace_pid},
                       {"tid", tid},
                       {"ts", Micros(ns)},
                       {"args", std::move(args)}});
  }

  // Where operation #seq of a communicator ends on the trace, for its pace blocks (which have no
  // time of their own): from the operations its ring still holds, spaced as they were (or as the
  // blocks' spans say when it holds one), else at the status time.
  struct SeqClock {
    std::uint64_t seq = 0;
    std::int64_t ns = 0;
    double ns_per_op = 0;
  };

  SeqClock ClockOf(const CommSnapshot& comm) const {
    SeqClock clock;
    const OpSnapshot* oldest = nullptr;
    const OpSnapshot* newest = nullptr;
    for (const OpSnapshot& op : comm.ring) {
      if (op.end_ns <= 0) continue;
      if (oldest == nullptr || op.seq < oldest->seq) oldest = &op;
      if (newest == nullptr || op.seq > newest->seq) newest = &op;
    }
    if (newest != nullptr) {
      clock.seq = newest->seq;
      clock.ns = newest->end_ns;
    }
    if (newest != nullptr && newest->seq > oldest->seq) {
      clock.ns_per_op = static_cast<double>(newest->end_ns - oldest->end_ns) /
                        static_cast<double>(newest->seq - oldest->seq);
    } else if (newest != nullptr && !comm.pace.empty()) {
      clock.ns_per_op = comm.pace.back().span_ms * 1e6 / static_cast<double>(kPaceBlockOps);
    }
    return clock;  // ns 0 when no operation has a time: TimeOfSeq takes the status time
  }

  std::int64_t TimeOfSeq(const SeqClock& clock, std::uint64_t seq, std::int64_t status_ns) const {
    if (clock.ns <= 0) return std::max(status_ns, origin_ns_);
    const double offset = (static_cast<double>(seq) - static_cast<double>(clock.seq)) * clock.ns_per_op;
    return std::clamp(clock.ns + static_cast<std::int64_t>(offset), origin_ns_,
                      std::max(job_.now_ns, clock.ns));
  }

  bool ShowsPace(const CommSnapshot& comm) const {
    if (job_.processes.size() <= kMaxPacedProcesses) return true;
    return std::any_of(fail_slow_.begin(), fail_slow_.end(), [&](const Verdict* verdict) {
      return verdict->comm == comm.id &&
             std::find(verdict->ranks.begin(), verdict->ranks.end(), comm.rank) != verdict->ranks.end();
    });
  }

  // The communicator's pace blocks as counters at each block's end: the GPU's wait in its
  // collectives, and each send link's network time per MB by channel; and, on a track of their
  // own, the fail-slow verdicts naming this rank over the blocks they were judged on. Returns the
  // next free track number.
  int AddPace(TracePid trace_pid, int next_tid, std::size_t comm_track, const CommSnapshot& comm,
              std::int64_t status_ns) {
    if (comm.pace.empty() || !ShowsPace(comm)) return next_tid;
    const SeqClock clock = ClockOf(comm);
    for (const PaceBlockSnapshot& block : comm.pace) {
      const std::int64_t ns = TimeOfSeq(clock, block.first_seq + kPaceBlockOps - 1, status_ns);
      Counter(trace_pid, absl::StrCat("comm ", comm.id, " GPU wait per ", kPaceBlockOps, " ops (ms)"), ns,
              {{"wait_ms", block.wait_ms}});
      std::map<int, Json> by_peer;
      for (const PaceLinkSnapshot& link : block.links) {
        if (link.bytes == 0) continue;
        by_peer[link.peer][absl::StrCat("channel ", link.channel)] =
            link.network_ms / (static_cast<double>(link.bytes) / 1e6);
      }
      for (auto& [peer, channels] : by_peer) {
        Counter(trace_pid, absl::StrCat("comm ", comm.id, " network to rank ", peer, " (ms per MB)"), ns,
                std::move(channels));
      }
    }
    for (const Verdict* verdict : fail_slow_) {
      if (verdict->comm != comm.id ||
          std::find(verdict->ranks.begin(), verdict->ranks.end(), comm.rank) == verdict->ranks.end())
        continue;
      const int tid = next_tid++;
      Metadata("thread_name", trace_pid, tid, {{"name", absl::StrCat("comm ", comm.id, " fail-slow")}});
      Metadata("thread_sort_index", trace_pid, tid, {{"sort_index", SortIndex(comm_track, kSortStride - 2)}});
      const std::uint64_t first_seq = verdict->evidence.value("first_seq", std::uint64_t{0});
      const std::int64_t begin_ns = TimeOfSeq(clock, first_seq > 0 ? first_seq - 1 : verdict->seq, status_ns);
      Slice(trace_pid, tid, VerdictName(*verdict), begin_ns, TimeOfSeq(clock, verdict->seq, status_ns),
            kWaitingColour,
            {{"verdict", VerdictKindName(verdict->kind)},
             {"message", verdict->message},
             {"first_seq", first_seq},
             {"last_seq", verdict->seq},
             {"evidence", verdict->evidence}});
    }
    return next_tid;
  }

  static std::string VerdictName(const Verdict& verdict) {
    if (verdict.kind == VerdictKind::kSlowLink && verdict.ranks.size() == 2) {
      return absl::StrCat("slow_link: rank ", verdict.ranks[0], " to rank ", verdict.ranks[1]);
    }
    std::string name(VerdictKindName(verdict.kind));
    for (const int rank : verdict.ranks) absl::StrAppend(&name, " rank ", rank);
    return name;
  }

  void Counter(TracePid trace_pid, std::string name, std::int64_t ns, Json args) {
    events_.push_back({{"ph", "C"},
                       {"name", std::move(name)},
                       {"pid", trace_pid},
                       {"ts", Micros(ns)},
                       {"args", std::move(args)}});
  }

  const JobView& job_;
  std::int64_t origin_ns_;
  std::vector<const Verdict*> fail_slow_;
  std::map<std::pair<std::string, std::uint64_t>, std::string> verdict_of_;
  // link_stalled: (communicator, rank at either end, channel) -> "rank F to rank T"
  std::map<std::tuple<std::string, int, int>, std::string> stalled_link_of_;
  Json events_ = Json::array();
};

}  // namespace

Json ChromeTrace(const JobView& job, const std::vector<Verdict>& verdicts) {
  std::vector<const ProcessView*> processes;
  processes.reserve(job.processes.size());
  for (const ProcessView& process : job.processes) processes.push_back(&process);
  // Ranks in order, processes of unknown rank last.
  std::stable_sort(processes.begin(), processes.end(), [](const ProcessView* a, const ProcessView* b) {
    return static_cast<unsigned>(a->snapshot.rank) <
           static_cast<unsigned>(b->snapshot.rank);  // -1 sorts last
  });

  // Rank R's track is number R + 1 (0 is left to the job-wide verdicts); a process whose rank is
  // unknown or shared with another (a restarted rank) gets a number past every rank's.
  TracePid next_spare = 1;
  for (const ProcessView* process : processes)
    next_spare = std::max(next_spare, TracePid{process->snapshot.rank} + 2);
  std::set<TracePid> used;
  TraceBuilder builder(job, verdicts);
  for (const ProcessView* process : processes) {
    const TracePid rank = process->snapshot.rank;
    const TracePid trace_pid = rank >= 0 && used.insert(rank + 1).second ? rank + 1 : next_spare++;
    builder.AddProcess(*process, trace_pid);
  }
  for (const Verdict& verdict : verdicts) builder.AddVerdict(verdict);
  return builder.Take();
}

absl::Status WriteChromeTrace(const std::string& path, const JobView& job,
                              const std::vector<Verdict>& verdicts) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  out << ChromeTrace(job, verdicts).dump(-1, ' ', false, Json::error_handler_t::replace) << '\n';
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  return absl::OkStatus();
}

}  // namespace ncclguard
