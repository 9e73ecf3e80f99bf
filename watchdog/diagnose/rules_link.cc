// link_stalled: inside the collective every rank waits in, which link stopped, from what NCCL's
// profiler told each rank (CommSnapshot::profile, in dumps): a rank whose send to its peer is
// posted and never completes while that peer waits for exactly that data. Transfers inside the
// kernel (P2P, NVLink, shared memory) have no proxy events: then only the kernel channels that
// never stopped are known, and said.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "watchdog/common/profile_events.h"
#include "watchdog/diagnose/job_view.h"
#include "watchdog/diagnose/rules.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard::classifier {
namespace {

// The operation of a rank's profile that has not finished: a kernel channel or a proxy operation
// still running. The newest such one.
const OpProfileSnapshot* Unfinished(const CommSnapshot& comm) {
  for (auto op = comm.profile.rbegin(); op != comm.profile.rend(); ++op) {
    if (StillRunning(*op)) return &*op;
  }
  return nullptr;
}

struct ProfiledMember {
  const Member* member;
  const OpProfileSnapshot* op;
};

// Every member's unfinished operation, when they agree on which (NCCL's name and count for it).
std::vector<ProfiledMember> UnfinishedEverywhere(const Communicator& communicator) {
  std::map<std::pair<std::string, std::uint64_t>, std::vector<ProfiledMember>> by_op;
  for (const Member& member : communicator.members) {
    if (const OpProfileSnapshot* op = Unfinished(*member.comm))
      by_op[{op->func, op->nccl_seq}].push_back({&member, op});
  }
  std::vector<ProfiledMember> most;
  for (auto& [key, members] : by_op) {
    if (members.size() > most.size()) most = std::move(members);
  }
  return most;
}

const ProfiledMember* OfRank(const std::vector<ProfiledMember>& members, int rank) {
  const auto found = std::ranges::find_if(
      members, [rank](const ProfiledMember& member) { return member.member->rank == rank; });
  return found != members.end() ? &*found : nullptr;
}

struct StoppedLink {
  const ProfiledMember* from;
  const ProfiledMember* to;
  const ProxyOpSnapshot* send;
  const ProxyOpSnapshot* receive;
};

// Sends posted to the network (or filled and waiting for the peer's credit) that never completed,
// whose peer waits to receive them: the data left one end and never reached the other. A send
// still waiting for its own GPU is downstream of the stop, not at it.
std::vector<StoppedLink> StoppedLinks(const std::vector<ProfiledMember>& members) {
  std::vector<StoppedLink> links;
  for (const ProfiledMember& from : members) {
    for (const ProxyOpSnapshot& send : from.op->proxy_ops) {
      if (!send.send || send.stopped || send.steps_done >= send.steps) continue;
      if (send.waiting != StepWait::kSendNet && send.waiting != StepWait::kSendPeer) continue;
      const ProfiledMember* to = OfRank(members, send.peer);
      if (to == nullptr) continue;
      for (const ProxyOpSnapshot& receive : to->op->proxy_ops) {
        if (receive.send || receive.stopped || receive.peer != from.member->rank ||
            receive.channel != send.channel)
          continue;
        if (receive.waiting == StepWait::kRecvNet || receive.waiting == StepWait::kNone)
          links.push_back({&from, to, &send, &receive});
      }
    }
  }
  return links;
}

// "host node3, GPU 2 (0000:2A:00.0)".
std::string Where(const Member& member) {
  const ProcessView& process = *member.process;
  std::string where = fmt::format("host {}", process.host);
  const int device = member.comm->device;
  if (device < 0) return where;
  for (const GpuFacts& gpu : process.facts.cuda.gpus) {
    if (gpu.device == device) return fmt::format("{}, GPU {} ({})", where, device, gpu.pci_bus_id);
  }
  return fmt::format("{}, GPU {}", where, device);
}

Json LinkJson(const StoppedLink& link) {
  const Member& from = *link.from->member;
  const Member& to = *link.to->member;
  // Until the sender's dump was taken.
  const std::int64_t since = link.send->waiting_since_ns;
  const double waited = since > 0 ? static_cast<double>(from.process->snapshot.time_ns - since) / 1e9 : 0;
  return Json{{"from_rank", from.rank},
              {"to_rank", to.rank},
              {"channel", link.send->channel},
              {"step", link.send->waiting_step},
              {"steps", link.send->steps},
              {"steps_done", link.send->steps_done},
              {"sender_waits", StepWaitName(link.send->waiting)},
              {"receiver_waits", StepWaitName(link.receive->waiting)},
              {"sender_waited_seconds", waited},
              {"from", Where(from)},
              {"to", Where(to)}};
}

}  // namespace

bool ClassifyStoppedLink(Buckets& buckets, const Communicator& communicator, std::uint64_t stuck_seq,
                         const OpSnapshot* stuck_op, const std::vector<int>& waiting_ranks, Json evidence) {
  const std::vector<ProfiledMember> members = UnfinishedEverywhere(communicator);
  const std::vector<StoppedLink> links = StoppedLinks(members);
  if (links.empty()) return false;
  const StoppedLink& first = links.front();
  const OpProfileSnapshot& op = *first.from->op;
  std::vector<int> ranks;
  Json link_evidence = Json::array();
  std::vector<std::string> clauses;
  for (const StoppedLink& link : links) {
    ranks.push_back(link.from->member->rank);
    ranks.push_back(link.to->member->rank);
    link_evidence.push_back(LinkJson(link));
    clauses.push_back(fmt::format(
        "rank {} ({}) to rank {} ({}) on channel {}: rank {} sent step {} of {} and it was never received",
        link.from->member->rank, Where(*link.from->member), link.to->member->rank, Where(*link.to->member),
        link.send->channel, link.from->member->rank, link.send->waiting_step, link.send->steps));
  }
  std::ranges::sort(ranks);
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  evidence["links"] = std::move(link_evidence);
  evidence["nccl_op"] =
      Json{{"func", op.func}, {"nccl_seq", op.nccl_seq}, {"algo", op.algo}, {"proto", op.proto}};
  Add(buckets, kLinkStalled, communicator.id, stuck_seq, std::move(ranks),
      fmt::format(
          "{} stopped on the link{} from {}; {} wait behind it ({}/{}, from NCCL's profiler) — a fault of "
          "that link (network, NIC, cable or switch), not the application",
          DescribeOp(stuck_op, stuck_seq), links.size() == 1 ? "" : "s", JoinClauses(clauses),
          Ranks(waiting_ranks), op.algo, op.proto),
      std::move(evidence));
  return true;
}

std::string KernelChannelsNote(const Communicator& communicator) {
  const std::vector<ProfiledMember> members = UnfinishedEverywhere(communicator);
  if (members.empty()) return "";
  std::map<int, std::vector<int>> stopped_nowhere;  // channel: the ranks where it never stopped
  for (const ProfiledMember& member : members) {
    for (const ChannelSnapshot& channel : member.op->kernel_channels) {
      if (!channel.stopped) stopped_nowhere[channel.channel].push_back(member.member->rank);
    }
  }
  if (stopped_nowhere.empty()) return "";
  std::vector<std::string> clauses;
  for (auto& [channel, ranks] : stopped_nowhere) {
    std::ranges::sort(ranks);
    clauses.push_back(fmt::format("channel {} never stopped on {}", channel, RanksBriefly(ranks)));
  }
  return fmt::format(
      "; NCCL's profiler: {} (no proxy operation is waiting on the network: a transfer inside the "
      "kernel, P2P, NVLink or shared memory, which NCCL does not report step by step, so which "
      "link is not known)",
      JoinClauses(clauses));
}

}  // namespace ncclguard::classifier
