// Fail-slow: slow_rank and slow_link from the ranks' pace blocks, with no false alarm on a job
// whose ranks and links only jitter; and the blocks each rank keeps (state/pace.h).
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "tests/diagnose/alive_rank.h"
#include "watchdog/common/pace.h"
#include "watchdog/diagnose/verdicts.h"
#include "watchdog/report/job_read.h"
#include "watchdog/state/pace.h"

namespace ncclguard {
namespace {

constexpr std::int64_t kSecond = 1'000'000'000;
constexpr std::int64_t kNow = 1'700'000'000 * kSecond;
const std::string kComm = "00000000000000bb";

// How a rank's blocks look: its GPU time in each block's collectives, and its send links' time on
// the network per MB, by (block, channel).
struct RankPace {
  std::vector<double> wait_ms;
  std::vector<std::vector<double>> link_ms_per_mb;  // [block][channel]
};

ProcessView Rank(int rank, int nranks, const RankPace& pace, bool with_bytes = true) {
  ProcessView process =
      testing::AliveRank("node-" + std::to_string(rank / 4), 2000 + rank, rank, kComm, nranks, kNow);
  CommSnapshot& comm = process.snapshot.comms[0];
  comm.device = rank % 4;
  for (std::size_t block = 0; block < pace.wait_ms.size(); ++block) {
    PaceBlockSnapshot& copy = comm.pace.emplace_back();
    copy.first_seq = 1 + block * kPaceBlockOps;
    copy.collectives = kPaceBlockOps;
    copy.wait_ms = pace.wait_ms[block];
    copy.span_ms = 1000;
    if (block >= pace.link_ms_per_mb.size()) continue;
    for (std::size_t channel = 0; channel < pace.link_ms_per_mb[block].size(); ++channel) {
      copy.links.push_back(PaceLinkSnapshot{.peer = (rank + 1) % nranks,
                                            .channel = static_cast<int>(channel),
                                            .bytes = with_bytes ? std::uint64_t{8} << 20 : 0,
                                            .steps = 8,
                                            .network_ms = 8 * pace.link_ms_per_mb[block][channel]});
    }
  }
  comm.last_enqueued = comm.last_completed = pace.wait_ms.size() * kPaceBlockOps;
  return process;
}

// A job of `nranks` whose ranks and links jitter by ±`jitter` around 100 ms per block and 1 ms per
// MB; `change` alters one rank's pace before it is written.
template <typename Change>
JobView Job(int nranks, int blocks, double jitter, std::uint32_t seed, Change change,
            bool with_bytes = true) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<double> factor(1 - jitter, 1 + jitter);
  JobView job;
  job.now_ns = kNow;
  for (int rank = 0; rank < nranks; ++rank) {
    RankPace pace;
    for (int block = 0; block < blocks; ++block) {
      pace.wait_ms.push_back(100 * factor(random));
      pace.link_ms_per_mb.push_back({factor(random), factor(random)});
    }
    change(rank, pace);
    job.processes.push_back(Rank(rank, nranks, pace, with_bytes));
  }
  return job;
}

JobView Job(int nranks, int blocks, double jitter, std::uint32_t seed) {
  return Job(nranks, blocks, jitter, seed, [](int, RankPace&) {});
}

std::vector<Verdict> OfKind(const std::vector<Verdict>& verdicts, VerdictKind kind) {
  std::vector<Verdict> picked;
  for (const Verdict& verdict : verdicts) {
    if (verdict.kind == kind) picked.push_back(verdict);
  }
  return picked;
}

TEST_CASE("a rank that comes late into every block is a slow rank, with what it costs", "[pace]") {
  // Rank 5 arrives 80 ms late in every block: the others wait 80 ms longer than it does.
  const JobView job = Job(8, 6, 0.05, 1, [](int rank, RankPace& pace) {
    if (rank != 5) return;
    for (double& wait : pace.wait_ms) wait -= 80;
  });
  const std::vector<Verdict> verdicts = ClassifyFailSlow(job);
  REQUIRE(verdicts.size() == 1);
  const Verdict& verdict = verdicts[0];
  CHECK(verdict.kind == VerdictKind::kSlowRank);
  CHECK(verdict.ranks == std::vector<int>{5});
  CHECK(verdict.comm == kComm);
  CHECK(absl::StrContains(verdict.message, "rank 5 (pid 2005 on host node-1) is late into the collectives"));
  CHECK(absl::StrContains(verdict.message, "in 4 of the latest 4 blocks of operations #17-#48"));
  const double waited = verdict.evidence.at("waited_ms_per_block").get<double>();
  CHECK(waited > 70);
  CHECK(waited < 90);
  CHECK(verdict.evidence.at("share_of_time").get<double>() == Approx(waited / 1000).epsilon(0.01));
}

TEST_CASE("a slow rank's stacks, from a dump the user asked it for, say where it spends the time", "[pace]") {
  auto late_rank_5 = [](int rank, RankPace& pace) {
    if (rank == 5)
      for (double& wait : pace.wait_ms) wait -= 80;
  };
  JobView job = Job(8, 4, 0.05, 10, late_rank_5);
  ProcessView& slow = job.processes[5];
  ThreadsSnapshot threads;
  threads.time_ns = kNow;
  ThreadSnapshot& main_thread = threads.threads.emplace_back();
  main_thread.tid = slow.pid;
  main_thread.state = "sleeping";
  main_thread.syscall = "read";
  main_thread.fd_target = "/data/shard-17.bin";
  FrameSnapshot& frame = main_thread.python.emplace_back();
  frame.function = "load_batch";
  frame.file = "data.py";
  frame.line = 42;
  slow.snapshot.threads = threads;
  slow.dump_reason = "stall";  // a dump of another moment says nothing of the slowness
  REQUIRE(ClassifyFailSlow(job).size() == 1);
  CHECK_FALSE(absl::StrContains(ClassifyFailSlow(job)[0].message, "its stacks"));
  slow.dump_reason = "signal";  // the dump signal: the user asked
  const std::vector<Verdict> verdicts = ClassifyFailSlow(job);
  REQUIRE(verdicts.size() == 1);
  CHECK(absl::StrContains(verdicts[0].message,
                          " — its stacks at its dump show it in `load_batch` (data.py:42)"));
  CHECK(verdicts[0].evidence.at("location").at("tid") == slow.pid);
}

TEST_CASE("a few late ranks are each named; half the job late is nobody's slowness", "[pace]") {
  const JobView few = Job(8, 4, 0.05, 2, [](int rank, RankPace& pace) {
    if (rank != 1 && rank != 6) return;
    for (double& wait : pace.wait_ms) wait -= 60;
  });
  const std::vector<Verdict> named = OfKind(ClassifyFailSlow(few), VerdictKind::kSlowRank);
  REQUIRE(named.size() == 2);
  CHECK(named[0].ranks == std::vector<int>{1});
  CHECK(named[1].ranks == std::vector<int>{6});

  const JobView half = Job(8, 4, 0.05, 3, [](int rank, RankPace& pace) {
    if (rank % 2 != 0) return;
    for (double& wait : pace.wait_ms) wait -= 60;
  });
  CHECK(OfKind(ClassifyFailSlow(half), VerdictKind::kSlowRank).empty());
}

TEST_CASE("a job that only jitters, or one slow block, is named slow by nothing", "[pace]") {
  for (std::uint32_t seed = 0; seed < 200; ++seed) {
    const std::vector<Verdict> verdicts = ClassifyFailSlow(Job(8, 8, 0.2, seed));
    INFO("seed " << seed << ": " << (verdicts.empty() ? "" : verdicts[0].message));
    CHECK(verdicts.empty());
  }
  // A checkpoint on rank 3, or a burst on one link, in one block of four: no verdict.
  const JobView once = Job(8, 4, 0.05, 4, [](int rank, RankPace& pace) {
    if (rank != 3) return;
    pace.wait_ms[2] -= 90;
    pace.link_ms_per_mb[1][0] *= 5;
  });
  CHECK(ClassifyFailSlow(once).empty());
}

TEST_CASE("a link slower than the others is named: its ranks, hosts, GPUs, channel and bandwidth", "[pace]") {
  // Rank 3's channel 1 to rank 4 takes three times as long per byte in every block.
  const JobView job = Job(8, 5, 0.1, 5, [](int rank, RankPace& pace) {
    if (rank != 3) return;
    for (auto& channels : pace.link_ms_per_mb) channels[1] *= 3;
  });
  const std::vector<Verdict> verdicts = ClassifyFailSlow(job);
  REQUIRE(verdicts.size() == 1);
  const Verdict& verdict = verdicts[0];
  CHECK(verdict.kind == VerdictKind::kSlowLink);
  CHECK(verdict.ranks == std::vector<int>{3, 4});
  CHECK(absl::StrContains(verdict.message,
                          "the link from rank 3 (node-0 GPU 3) to rank 4 (node-1 GPU 0) on channel 1"));
  const double ratio = verdict.evidence.at("ratio_to_median").get<double>();
  CHECK(ratio > 2.4);
  CHECK(ratio < 3.6);
  // 8 MB in 8 × 3 ms: about 2.8 Gb/s, against the median link's 8.4.
  CHECK(verdict.evidence.at("gbps").get<double>() == Approx(8.0 * 8 * 1.048576 / 24).epsilon(0.15));
  CHECK(verdict.evidence.at("median_gbps").get<double>() == Approx(8.0 * 8 * 1.048576 / 8).epsilon(0.15));
  CHECK(verdict.evidence.at("channels") == std::vector<int>{1});
  CHECK(verdict.evidence.at("peer_host") == "node-1");
}

TEST_CASE("a link slow on every channel is one verdict that lists them", "[pace]") {
  const JobView job = Job(8, 4, 0.1, 8, [](int rank, RankPace& pace) {
    if (rank != 6) return;
    for (auto& channels : pace.link_ms_per_mb) {
      for (double& ms : channels) ms *= 4;
    }
  });
  const std::vector<Verdict> verdicts = ClassifyFailSlow(job);
  REQUIRE(verdicts.size() == 1);
  CHECK(verdicts[0].ranks == std::vector<int>{6, 7});
  CHECK(absl::StrContains(verdicts[0].message, "to rank 7 (node-1 GPU 3) on channels 0,1 is "));
  CHECK(verdicts[0].evidence.at("ratio_to_median").get<double>() == Approx(4).epsilon(0.2));
  CHECK(verdicts[0].evidence.at("channels") == std::vector<int>{0, 1});
}

TEST_CASE("links whose steps NCCL gave no size are judged by their time per step", "[pace]") {
  const JobView job = Job(
      4, 4, 0.1, 6,
      [](int rank, RankPace& pace) {
        if (rank != 0) return;
        for (auto& channels : pace.link_ms_per_mb) channels[0] *= 4;
      },
      /*with_bytes=*/false);
  const std::vector<Verdict> links = OfKind(ClassifyFailSlow(job), VerdictKind::kSlowLink);
  REQUIRE(links.size() == 1);
  CHECK(links[0].ranks == std::vector<int>{0, 1});
  CHECK_FALSE(absl::StrContains(links[0].message, "Gb/s"));
}

TEST_CASE("three blocks of every rank at least are judged, and a whole communicator", "[pace]") {
  auto late_rank_2 = [](int rank, RankPace& pace) {
    if (rank == 2)
      for (double& wait : pace.wait_ms) wait -= 80;
  };
  // Rank 3 has completed only the first two blocks: two common blocks are too few.
  JobView job = Job(4, 6, 0.05, 7, late_rank_2);
  job.processes[3].snapshot.comms[0].pace.resize(2);
  CHECK(ClassifyFailSlow(job).empty());
  // A rank missing from the view: its communicator is not whole, and nothing is judged.
  JobView partial = Job(4, 6, 0.05, 7, late_rank_2);
  partial.processes.pop_back();
  CHECK(ClassifyFailSlow(partial).empty());
  // The full classifier says it too, after the other verdicts, and the job is not healthy.
  JobView whole = Job(4, 6, 0.05, 7, late_rank_2);
  const std::vector<Verdict> all = Classify(whole, {});
  REQUIRE_FALSE(all.empty());
  CHECK(all.back().kind == VerdictKind::kSlowRank);
}

TEST_CASE("ranks whose latest blocks hold no operation in common are judged by blocks of the same recency",
          "[pace]") {
  // A fast job: each rank's status was written at another moment, 16 blocks apart at most.
  JobView job = Job(8, 4, 0.1, 9, [](int rank, RankPace& pace) {
    if (rank != 2) return;
    for (auto& channels : pace.link_ms_per_mb) channels[0] *= 3;
  });
  for (ProcessView& process : job.processes) {
    for (PaceBlockSnapshot& block : process.snapshot.comms[0].pace)
      block.first_seq += kPaceBlockOps * 4 * static_cast<std::uint64_t>(process.snapshot.rank % 5);
  }
  const std::vector<Verdict> verdicts = ClassifyFailSlow(job);
  REQUIRE(verdicts.size() == 1);
  CHECK(verdicts[0].kind == VerdictKind::kSlowLink);
  CHECK(verdicts[0].ranks == std::vector<int>{2, 3});
  CHECK(absl::StrContains(verdicts[0].message, "of operations #1-#160)"));
}

TEST_CASE("a rank's pace log keeps its latest complete blocks", "[pace]") {
  PaceLog log;
  const std::int64_t ms = 1'000'000;
  for (std::uint64_t seq = 1; seq <= 20; ++seq) {
    const bool collective = seq % 4 != 0;       // every fourth a Send, which adds no GPU time
    const double gpu_ms = seq == 3 ? -1 : 2.0;  // #3 failed: in its place, untimed
    log.Add(seq, collective, gpu_ms, static_cast<std::int64_t>(seq) * 10 * ms,
            static_cast<std::int64_t>(seq) * 10 * ms + 5 * ms);
    if (seq % kPaceBlockOps != 0) continue;
    // A block's links, as the table gives them: the faster first, so that the log sorts them.
    log.SetLinks(seq,
                 {PaceLinkSnapshot{.peer = 1, .channel = 0, .bytes = 4000, .steps = 8, .network_ms = 6.0},
                  PaceLinkSnapshot{.peer = 1, .channel = 1, .bytes = 4000, .steps = 8, .network_ms = 12.0}});
  }
  const std::vector<PaceBlockSnapshot> blocks = log.Blocks();
  REQUIRE(blocks.size() == 2);  // #17-#20 are not a whole block yet
  CHECK(blocks[0].first_seq == 1);
  CHECK(blocks[0].collectives == 5);  // 8, less two Sends and the failed one
  CHECK(blocks[0].wait_ms == Approx(10.0));
  CHECK(blocks[0].span_ms == Approx(75.0));  // #1's call at 10 ms to #8's end at 85 ms
  REQUIRE(blocks[0].links.size() == 2);
  CHECK(blocks[0].links[0].bytes == 4000);
  CHECK(blocks[0].links[0].steps == 8);
  CHECK(blocks[0].links[0].network_ms == Approx(12.0));
  CHECK(blocks[1].first_seq == 9);

  // Figures are kept to the microsecond: the digits beyond would only lengthen every status.
  PaceLog fine;
  for (std::uint64_t seq = 1; seq <= kPaceBlockOps; ++seq) fine.Add(seq, true, 1.0004, 1, 2);
  CHECK(fine.Blocks().at(0).wait_ms == 8.003);

  // Only the newest kPaceBlocks are kept.
  for (std::uint64_t seq = 21; seq <= 8 * (kPaceBlocks + 3); ++seq) log.Add(seq, true, 1.0, 1, 2);
  const std::vector<PaceBlockSnapshot> newest = log.Blocks();
  REQUIRE(newest.size() == kPaceBlocks);
  CHECK(newest.back().first_seq == 8 * (kPaceBlocks + 2) + 1);
  CHECK(newest.front().first_seq == 8 * 3 + 1);
}

}  // namespace
}  // namespace ncclguard
