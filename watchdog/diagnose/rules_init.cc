// Communicator initialisations: stuck_in_init (which ranks arrived and which did not), and
// rank_dead for a process that died inside one while others waited.
#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "watchdog/diagnose/job_view.h"
#include "watchdog/diagnose/rules.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/report/whereabouts.h"

namespace ncclguard::classifier {
namespace {

// Ranks whose process died inside a communicator initialisation (its last status still shows it
// there): dead, whoever else waits for that initialisation.
void AddDeadInInit(Buckets& buckets, const JobView& job, const std::string& comm_id, const std::string& api,
                   int nranks, const std::vector<std::pair<const ProcessView*, int>>& gone,
                   const std::set<int>& arrived) {
  std::vector<int> dead_ranks;
  std::vector<std::string> clauses;
  Json dead = Json::array();
  for (const auto& [process, rank] : gone) {
    dead_ranks.push_back(rank);
    clauses.push_back(
        fmt::format("rank {} (pid {} on host {}) {}: it died in {} for communicator {} ({} ranks)", rank,
                    process->pid, process->host, GoneHow(*process, job), api, comm_id, nranks));
    dead.push_back(Json{{"rank", rank},
                        {"host", process->host},
                        {"pid", process->pid},
                        {"in_init", api},
                        {"where", WhereaboutsName(Whereabouts::kGone)},
                        {"status_age_seconds", StatusAgeSeconds(*process, job)}});
  }
  std::vector<int> waiting;
  for (const int rank : arrived) {
    if (std::find(dead_ranks.begin(), dead_ranks.end(), rank) == dead_ranks.end()) waiting.push_back(rank);
  }
  const std::string others =
      waiting.empty() ? std::string() : fmt::format("; {} wait for it", Ranks(waiting));
  Add(buckets, kRankDead, comm_id, 0, dead_ranks,
      fmt::format("{}{} — {} killed or crashed (e.g. out of memory), not a network fault",
                  JoinClauses(clauses), others, dead_ranks.size() == 1 ? "it was" : "they were"),
      Json{{"api", api}, {"nranks", nranks}, {"dead_ranks", std::move(dead)}, {"waiting_ranks", waiting}});
}

// The processes that died inside an initialisation while another process of it lived on (alive,
// or writing its status for several intervals more). When all of them stopped together, a
// launcher ended the whole job: that is no rank's death.
std::vector<std::pair<const ProcessView*, int>> DiedInInit(
    const JobView& job, const std::vector<std::pair<const ProcessView*, int>>& pending,
    const std::vector<const ProcessView*>& involved) {
  const auto stale_window_ns = static_cast<std::int64_t>(kStaleIntervals * job.status_interval_seconds * 1e9);
  std::vector<std::pair<const ProcessView*, int>> dead;
  for (const auto& [process, rank] : pending) {
    if (process->exited || !IsGone(*process, job)) continue;
    // Named again: clang 14 lambdas cannot capture a structured binding.
    const ProcessView* dying = process;
    const bool outlived = std::any_of(involved.begin(), involved.end(), [&](const ProcessView* other) {
      return other != dying && !other->exited &&
             (!IsGone(*other, job) || other->last_seen_ns > dying->last_seen_ns + stale_window_ns);
    });
    if (outlived) dead.emplace_back(process, rank);
  }
  return dead;
}

// Where a rank that never called the initialisation is: a process of the job known as that rank
// (its other communicators, or its launcher's variables), not in this initialisation, whose stacks
// were taken after the others began it.
std::optional<std::pair<const ProcessView*, ThreadLocation>> WhereIsMissing(
    const JobView& job, const std::vector<std::pair<const ProcessView*, int>>& initialising, int rank,
    std::int64_t started_ns) {
  for (const ProcessView& process : job.processes) {
    const ProcessSnapshot& snapshot = process.snapshot;
    if (snapshot.rank != rank || !snapshot.threads || snapshot.threads->time_ns < started_ns) continue;
    const bool in_it = std::any_of(initialising.begin(), initialising.end(),
                                   [&process](const auto& entry) { return entry.first == &process; });
    if (in_it) continue;
    if (std::optional<ThreadLocation> location =
            LocateProcess(*snapshot.threads, 0, process.pid, job.ended_together_ns.value_or(job.now_ns)))
      return std::pair{&process, std::move(*location)};
  }
  return std::nullopt;
}

// Appends to `message` where each missing rank is, when its dump says ("; rank 3 (pid 1003) is in
// `load_data` ..."); returns that as evidence.
Json DescribeMissing(const JobView& job, const std::vector<std::pair<const ProcessView*, int>>& initialising,
                     const std::vector<int>& missing, std::int64_t started_ns, std::string& message) {
  Json whereabouts = Json::array();
  for (const int rank : missing) {
    if (const auto found = WhereIsMissing(job, initialising, rank, started_ns)) {
      message += fmt::format("; rank {} (pid {}) is {}", rank, found->first->pid, found->second.sentence);
      whereabouts.push_back(
          Json{{"rank", rank}, {"pid", found->first->pid}, {"sentence", found->second.sentence}});
    }
  }
  return whereabouts;
}

// One communicator's initialisation, as the processes in it recorded it.
struct Init {
  std::string api;
  int nranks = 0;
  std::set<int> pending;
  double waited_seconds = 0;
  bool stall_reported = false;
  std::int64_t started_ns = 0;                                // the earliest start of it on any rank
  std::vector<std::pair<const ProcessView*, int>> processes;  // every process in it, and its rank
};

// stuck_in_init: which ranks arrived and which did not, and where those are when their dumps say.
void AddStuckInInit(Buckets& buckets, const JobView& job, const std::string& comm_id, const Init& init,
                    const std::set<int>& arrived, const std::vector<int>& missing) {
  const std::vector<int> arrived_ranks(arrived.begin(), arrived.end());
  const std::string what = fmt::format("the initialisation of communicator {} ({}, {} ranks) has waited {}",
                                       comm_id, init.api, init.nranks, Seconds(init.waited_seconds));
  // The ranks missing may be in the files that were not read: said, never named.
  const bool missing_not_read = !missing.empty() && job.not_read.SomeProcessMissing();
  std::string message =
      missing.empty()
          ? fmt::format(
                "{} although all {} ranks arrived: stuck inside NCCL's bootstrap or transport setup "
                "(network interfaces, firewall, NCCL_SOCKET_IFNAME)",
                what, init.nranks)
      : missing_not_read
          ? fmt::format(
                "{}: {} arrived; {} {} not among the processes read, so whether {} called {} is not known",
                what, Ranks(arrived_ranks), RanksBriefly(missing), missing.size() == 1 ? "is" : "are",
                missing.size() == 1 ? "it" : "they", init.api)
          : fmt::format(
                "{}: {} arrived, {} did not — {} never called {} for it (not started, crashed "
                "before, or given another unique id)",
                what, Ranks(arrived_ranks), Ranks(missing), missing.size() == 1 ? "that rank" : "those ranks",
                init.api);
  Json missing_whereabouts = DescribeMissing(job, init.processes, missing, init.started_ns, message);
  const std::vector<int> named = missing.empty()    ? arrived_ranks
                                 : missing_not_read ? std::vector<int>()
                                                    : missing;
  Add(buckets, kStuckInInit, comm_id, 0, named, std::move(message),
      Json{{"api", init.api},
           {"nranks", init.nranks},
           {"arrived_ranks", arrived_ranks},
           {"pending_ranks", init.pending},
           {"missing_ranks", missing_not_read ? std::vector<int>() : missing},
           {"not_read_ranks", missing_not_read ? missing : std::vector<int>()},
           {"missing_whereabouts", std::move(missing_whereabouts)},
           {"waited_seconds", init.waited_seconds}});
}

}  // namespace

void ClassifyStuckInits(const JobView& job, const std::vector<Communicator>& communicators,
                        Buckets& buckets) {
  std::map<std::string, Init> inits;
  for (const ProcessView& process : job.processes) {
    for (const PendingInitSnapshot& pending : process.snapshot.pending_inits) {
      Init& init = inits[pending.comm_id];
      init.processes.emplace_back(&process, pending.rank);
      init.api = pending.api;
      init.nranks = std::max(init.nranks, pending.nranks);
      if (init.started_ns == 0 || pending.start_ns < init.started_ns) init.started_ns = pending.start_ns;
      const double waited = static_cast<double>(process.snapshot.time_ns - pending.start_ns) / 1e9;
      if (waited <= job.status_interval_seconds) continue;
      init.pending.insert(pending.rank);
      init.waited_seconds = std::max(init.waited_seconds, waited);
      const auto& stall = process.snapshot.stall;
      init.stall_reported =
          init.stall_reported || (stall && stall->kind == "init" && stall->comm_id == pending.comm_id);
    }
  }
  for (const auto& [comm_id, init] : inits) {
    std::set<int> arrived = init.pending;
    std::vector<const ProcessView*> involved;
    involved.reserve(init.processes.size());
    for (const auto& [process, rank] : init.processes) involved.push_back(process);
    const auto communicator =
        std::lower_bound(communicators.begin(), communicators.end(), comm_id,
                         [](const Communicator& c, const std::string& id) { return c.id < id; });
    if (communicator != communicators.end() && communicator->id == comm_id) {
      for (const Member& member : communicator->members) {
        arrived.insert(member.rank);
        involved.push_back(member.process);
      }
    }
    if (const auto dead = DiedInInit(job, init.processes, involved); !dead.empty()) {
      // The communicator's stuck operation may have named these ranks already.
      const std::string& id = comm_id;  // clang 14 lambdas cannot capture a structured binding
      const bool named = std::any_of(buckets[kRankDead].begin(), buckets[kRankDead].end(),
                                     [&](const Verdict& verdict) { return verdict.comm == id; });
      std::set<int> waiting = arrived;
      for (const auto& [process, rank] : init.processes) waiting.insert(rank);
      if (!named) AddDeadInInit(buckets, job, comm_id, init.api, init.nranks, dead, waiting);
      continue;
    }
    if (init.pending.empty()) continue;
    std::vector<int> missing;
    for (int rank = 0; rank < init.nranks; ++rank) {
      if (!arrived.contains(rank)) missing.push_back(rank);
    }
    if (missing.empty() && !init.stall_reported) continue;
    AddStuckInInit(buckets, job, comm_id, init, arrived, missing);
  }
}

}  // namespace ncclguard::classifier
