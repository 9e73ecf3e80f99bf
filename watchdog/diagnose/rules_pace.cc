// slow_rank and slow_link: the job runs, nothing stalls, and one rank or one link sets the pace of
// everyone. Judged from each rank's pace blocks (common/pace.h) over the latest blocks that every
// rank of the communicator completed, with thresholds relative to the communicator's own spread
// (docs/verdicts.md, "Fail-slow").
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "watchdog/common/pace.h"
#include "watchdog/diagnose/rules.h"
#include "watchdog/report/job_read.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/report/whereabouts.h"

namespace ncclguard::classifier {
namespace {

// The latest blocks every rank completed, of which kMinFlaggedBlocks must show the same slowness:
// one slow block (a checkpoint on one rank, a burst on one link) is no verdict.
constexpr std::size_t kJudgedBlocks = 4;
constexpr std::size_t kMinFlaggedBlocks = 3;
// slow_rank: its peers wait for it longer than kSpreadFactor times their usual spread, longer than
// kMinShareOfSpan of the block's time, and longer than kMinWaitMs.
constexpr double kSpreadFactor = 4;
constexpr double kMinShareOfSpan = 0.05;
constexpr double kMinWaitMs = 2;
// slow_link: kMinLinkRatio times slower per byte than the communicator's median link, and at least
// kMinLinkMs on the network in the block.
constexpr double kMinLinkRatio = 2;
constexpr double kMinLinkMs = 1;

// One block as every member has it, by member.
struct CommonBlock {
  std::uint64_t first_seq = 0;  // of the operations its members' blocks hold
  std::uint64_t last_seq = 0;
  std::vector<const PaceBlockSnapshot*> by_member;
};

// The newest kJudgedBlocks blocks that every member completed, oldest first.
std::vector<CommonBlock> LatestCommonBlocks(const Communicator& communicator) {
  std::map<std::uint64_t, CommonBlock> blocks;
  const std::size_t members = communicator.members.size();
  for (std::size_t i = 0; i < members; ++i) {
    for (const PaceBlockSnapshot& block : communicator.members[i].comm->pace) {
      CommonBlock& common = blocks[block.first_seq];
      common.first_seq = block.first_seq;
      common.last_seq = block.first_seq + kPaceBlockOps - 1;
      common.by_member.resize(members, nullptr);
      common.by_member[i] = &block;
    }
  }
  std::vector<CommonBlock> latest;
  for (auto it = blocks.rbegin(); it != blocks.rend() && latest.size() < kJudgedBlocks; ++it) {
    const auto& by_member = it->second.by_member;
    if (std::all_of(by_member.begin(), by_member.end(),
                    [](const PaceBlockSnapshot* b) { return b != nullptr; }))
      latest.push_back(std::move(it->second));
  }
  std::reverse(latest.begin(), latest.end());
  return latest;
}

// Each rank's i-th newest block, side by side, for the newest kJudgedBlocks; fewer when a rank
// has fewer. Ranks write their statuses at different moments: in a job of many operations per
// second their newest blocks may hold no operation in common, yet a slowness that lasts shows in
// the blocks of the same moment all the same.
std::vector<CommonBlock> LatestBlocksByRecency(const Communicator& communicator) {
  std::size_t depth = kJudgedBlocks;
  for (const Member& member : communicator.members) depth = std::min(depth, member.comm->pace.size());
  std::vector<CommonBlock> latest(depth);
  for (std::size_t age = 0; age < depth; ++age) {
    CommonBlock& common = latest[depth - 1 - age];
    for (const Member& member : communicator.members) {
      const PaceBlockSnapshot& block = member.comm->pace[member.comm->pace.size() - 1 - age];
      common.first_seq =
          common.by_member.empty() ? block.first_seq : std::min(common.first_seq, block.first_seq);
      common.last_seq = std::max(common.last_seq, block.first_seq + kPaceBlockOps - 1);
      common.by_member.push_back(&block);
    }
  }
  return latest;
}

// The blocks judged: those every rank completed when there are enough, else those of the same
// recency.
std::vector<CommonBlock> JudgedBlocks(const Communicator& communicator) {
  std::vector<CommonBlock> common = LatestCommonBlocks(communicator);
  if (common.size() >= kMinFlaggedBlocks) return common;
  return LatestBlocksByRecency(communicator);
}

// "#17-#48": the operations the judged blocks hold.
std::string SeqRange(const std::vector<CommonBlock>& blocks) {
  std::uint64_t first = blocks.front().first_seq;
  std::uint64_t last = 0;
  for (const CommonBlock& block : blocks) {
    first = std::min(first, block.first_seq);
    last = std::max(last, block.last_seq);
  }
  return fmt::format("#{}-#{}", first, last);
}

// ---------------------------------------------------------------------------------------------
// slow_rank

struct LateInBlock {
  std::vector<std::size_t> members;  // the late ones
  double others_wait_ms = 0;         // what the others spent in the block's collectives (median)
  std::vector<double> waited_ms;     // how much longer than each late member, by `members`
  double span_ms = 0;                // the block's time (median)
};

// The members whose GPU time in the block's collectives is far below the others': they came last,
// and the others waited for them.
LateInBlock FindLateMembers(const CommonBlock& block) {
  std::vector<double> waits;
  std::vector<double> spans;
  waits.reserve(block.by_member.size());
  spans.reserve(block.by_member.size());
  for (const PaceBlockSnapshot* pace : block.by_member) {
    waits.push_back(pace->wait_ms);
    spans.push_back(pace->span_ms);
  }
  LateInBlock late;
  late.others_wait_ms = Median(waits);
  late.span_ms = Median(spans);
  std::vector<double> deviations;
  deviations.reserve(waits.size());
  for (const double wait : waits) deviations.push_back(std::fabs(wait - late.others_wait_ms));
  const double threshold =
      std::max({kSpreadFactor * Median(deviations), kMinShareOfSpan * late.span_ms, kMinWaitMs});
  for (std::size_t i = 0; i < waits.size(); ++i) {
    if (late.others_wait_ms - waits[i] >= threshold) {
      late.members.push_back(i);
      late.waited_ms.push_back(late.others_wait_ms - waits[i]);
    }
  }
  // More than a few late is the job's own rhythm (or half of it slow), not a rank's.
  if (2 * late.members.size() >= waits.size()) late = LateInBlock{};
  return late;
}

struct LateRecord {
  std::size_t blocks = 0;
  double waited_ms = 0;  // summed over its blocks
  double span_ms = 0;
};

// Where the late rank spends its time, from the stacks of a dump the user asked it for (the dump
// signal: a dump taken for a stall or at exit says nothing of a slowness): " — its stacks at its
// dump show it in `load_batch` (data.py:42), blocked in read()", or "".
std::string WhereItIs(const Member& member, Json& evidence) {
  const ProcessView& process = *member.process;
  if (process.dump_reason != "signal" || !process.snapshot.threads) return "";
  const OpSnapshot* last = FindOp(*member.comm, member.comm->last_enqueued);
  const std::optional<ThreadLocation> location =
      LocateProcess(*process.snapshot.threads, last != nullptr ? last->host_thread : 0, process.pid);
  if (!location || location->sentence.empty()) return "";
  evidence["location"] = Json{{"sentence", location->sentence},
                              {"dump_time_ns", process.snapshot.threads->time_ns},
                              {"tid", location->thread != nullptr ? location->thread->tid : 0}};
  return fmt::format(" — its stacks at its dump show it {}", location->sentence);
}

void AddSlowRank(const Communicator& communicator, const std::vector<CommonBlock>& blocks, std::size_t member,
                 const LateRecord& record, Buckets& buckets) {
  const int rank = communicator.members[member].rank;
  const ProcessView& process = *communicator.members[member].process;
  const double per_block_ms = record.waited_ms / static_cast<double>(record.blocks);
  const double share = record.span_ms > 0 ? record.waited_ms / record.span_ms : 0;
  Json evidence{{"rank", rank},
                {"host", process.host},
                {"pid", process.pid},
                {"waited_ms_per_block", per_block_ms},
                {"block_ops", kPaceBlockOps},
                {"share_of_time", share},
                {"blocks_late", record.blocks},
                {"blocks_judged", blocks.size()},
                {"first_seq", blocks.front().first_seq}};
  const std::string where = WhereItIs(communicator.members[member], evidence);
  Add(buckets, kSlowRank, communicator.id, blocks.back().last_seq, {rank},
      fmt::format("rank {} (pid {} on host {}) is late into the collectives: its peers wait for it {} ms in "
                  "every {} operations, {:.0f} % of the job's time (in {} of the latest {} blocks of "
                  "operations {}); it is slow outside NCCL (compute, data loading, a throttled GPU or "
                  "host){}",
                  rank, process.pid, process.host, fmt::format("{:.0f}", per_block_ms), kPaceBlockOps,
                  100 * share, record.blocks, blocks.size(), SeqRange(blocks), where),
      std::move(evidence));
}

void ClassifySlowRanks(const Communicator& communicator, const std::vector<CommonBlock>& blocks,
                       Buckets& buckets) {
  std::map<std::size_t, LateRecord> late_members;
  for (const CommonBlock& block : blocks) {
    const LateInBlock late = FindLateMembers(block);
    for (std::size_t i = 0; i < late.members.size(); ++i) {
      LateRecord& record = late_members[late.members[i]];
      ++record.blocks;
      record.waited_ms += late.waited_ms[i];
      record.span_ms += late.span_ms;
    }
  }
  for (const auto& [member, record] : late_members) {
    if (record.blocks >= kMinFlaggedBlocks) AddSlowRank(communicator, blocks, member, record, buckets);
  }
}

// ---------------------------------------------------------------------------------------------
// slow_link

struct LinkKey {
  std::size_t member;
  int peer;
  int channel;
  bool operator<(const LinkKey& other) const {
    return std::tie(member, peer, channel) < std::tie(other.member, other.peer, other.channel);
  }
};

struct SlowLinkRecord {
  std::size_t blocks = 0;
  std::vector<double> ratios;
  std::uint64_t bytes = 0;
  double network_ms = 0;
  double median_gbps = 0;  // of the communicator's links, in its latest flagged block
};

// Network time per byte (per step where some link's steps had no size).
double Slowness(const PaceLinkSnapshot& link, bool by_bytes) {
  if (by_bytes) return link.bytes > 0 ? link.network_ms / static_cast<double>(link.bytes) : 0;
  return link.steps > 0 ? link.network_ms / link.steps : 0;
}

double Gbps(std::uint64_t bytes, double ms) {
  return ms > 0 ? static_cast<double>(bytes) * 8 / (ms * 1e6) : 0;
}

void FlagSlowLinks(const CommonBlock& block, std::map<LinkKey, SlowLinkRecord>& records) {
  bool by_bytes = true;
  for (const PaceBlockSnapshot* pace : block.by_member) {
    for (const PaceLinkSnapshot& link : pace->links) by_bytes = by_bytes && link.bytes > 0;
  }
  std::vector<double> slowness;
  std::vector<double> gbps;
  for (const PaceBlockSnapshot* pace : block.by_member) {
    for (const PaceLinkSnapshot& link : pace->links) {
      if (link.steps <= 0) continue;
      slowness.push_back(Slowness(link, by_bytes));
      gbps.push_back(Gbps(link.bytes, link.network_ms));
    }
  }
  // A median needs company: three links at least, or no link is slower than "the others".
  if (slowness.size() < 3) return;
  const double median = Median(slowness);
  if (median <= 0) return;
  for (std::size_t member = 0; member < block.by_member.size(); ++member) {
    for (const PaceLinkSnapshot& link : block.by_member[member]->links) {
      const double ratio = Slowness(link, by_bytes) / median;
      if (link.steps <= 0 || ratio < kMinLinkRatio || link.network_ms < kMinLinkMs) continue;
      SlowLinkRecord& record = records[LinkKey{member, link.peer, link.channel}];
      ++record.blocks;
      record.ratios.push_back(ratio);
      record.bytes += link.bytes;
      record.network_ms += link.network_ms;
      record.median_gbps = Median(gbps);
    }
  }
}

// The ranks' hosts and GPUs, "rank 3 (host-a GPU 3)".
std::string RankAt(const Member& member) {
  const std::string gpu = member.comm->device >= 0 ? fmt::format(" GPU {}", member.comm->device) : "";
  return fmt::format("rank {} ({}{})", member.rank, member.process->host, gpu);
}

const Member* MemberOfRank(const Communicator& communicator, int rank) {
  for (const Member& member : communicator.members) {
    if (member.rank == rank) return &member;
  }
  return nullptr;
}

// `channels`: the link's channels that were slow, each in enough blocks; `record`: theirs together.
void AddSlowLink(const Communicator& communicator, const std::vector<CommonBlock>& blocks, std::size_t member,
                 int peer, const std::vector<int>& channels, const SlowLinkRecord& record, Buckets& buckets) {
  const Member& from = communicator.members[member];
  const Member* to = MemberOfRank(communicator, peer);
  const double ratio = Median(record.ratios);
  const double gbps = Gbps(record.bytes, record.network_ms);
  const std::string bandwidth =
      record.bytes > 0 ? fmt::format(", {:.2f} Gb/s against a median link's {:.2f}", gbps, record.median_gbps)
                       : "";
  Add(buckets, kSlowLink, communicator.id, blocks.back().last_seq, {from.rank, peer},
      fmt::format("the link from {} to {} on channel{} {} is {:.1f}x slower than the communicator's median "
                  "link{} (in {} of the latest {} blocks of operations {}); every collective on it "
                  "runs at its pace: check that link's NIC, cable or switch port",
                  RankAt(from), to != nullptr ? RankAt(*to) : fmt::format("rank {}", peer),
                  channels.size() > 1 ? "s" : "", fmt::join(channels, ","), ratio, bandwidth, record.blocks,
                  blocks.size(), SeqRange(blocks)),
      Json{{"rank", from.rank},
           {"peer", peer},
           {"channels", channels},
           {"host", from.process->host},
           {"peer_host", to != nullptr ? to->process->host : ""},
           {"device", from.comm->device},
           {"peer_device", to != nullptr ? to->comm->device : -1},
           {"ratio_to_median", ratio},
           {"gbps", gbps},
           {"median_gbps", record.median_gbps},
           {"blocks_slow", record.blocks},
           {"blocks_judged", blocks.size()},
           {"first_seq", blocks.front().first_seq}});
}

// One verdict per link between two ranks, with every channel of it that was slow: a NIC or cable
// slows all the channels it carries.
void ClassifySlowLinks(const Communicator& communicator, const std::vector<CommonBlock>& blocks,
                       Buckets& buckets) {
  std::map<LinkKey, SlowLinkRecord> records;
  for (const CommonBlock& block : blocks) FlagSlowLinks(block, records);
  std::map<std::pair<std::size_t, int>, std::pair<std::vector<int>, SlowLinkRecord>> links;
  for (const auto& [key, record] : records) {
    if (record.blocks < kMinFlaggedBlocks) continue;
    auto& [channels, merged] = links[{key.member, key.peer}];
    channels.push_back(key.channel);
    merged.blocks = std::max(merged.blocks, record.blocks);
    merged.ratios.insert(merged.ratios.end(), record.ratios.begin(), record.ratios.end());
    merged.bytes += record.bytes;
    merged.network_ms += record.network_ms;
    merged.median_gbps = record.median_gbps;
  }
  for (const auto& [link, found] : links) {
    AddSlowLink(communicator, blocks, link.first, link.second, found.first, found.second, buckets);
  }
}

}  // namespace

void ClassifyPace(const Communicator& communicator, Buckets& buckets) {
  if (communicator.members.size() < 2 || static_cast<int>(communicator.members.size()) != communicator.nranks)
    return;
  const std::vector<CommonBlock> blocks = JudgedBlocks(communicator);
  if (blocks.size() < kMinFlaggedBlocks) return;
  ClassifySlowLinks(communicator, blocks, buckets);
  // A block is a run of #N, which holds different operations on each rank when their numbers
  // differ: how long one rank's peers waited in it says nothing then. A link's pace is its own.
  if (!communicator.numbers_differ) ClassifySlowRanks(communicator, blocks, buckets);
}

}  // namespace ncclguard::classifier
