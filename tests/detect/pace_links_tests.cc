// Send links' network figures by pace block (state/pace_links.h): every proxy operation counts in
// its own operation's block, and what has no place is dropped and counted, never added elsewhere.
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "watchdog/common/pace.h"
#include "watchdog/state/pace_links.h"

namespace ncclguard {
namespace {

ProxyNetworkFigures Send(int peer, int channel, std::int64_t network_ns = 2'000'000) {
  return ProxyNetworkFigures{
      .peer = peer, .channel = channel, .network_ns = network_ns, .network_bytes = 1000, .network_steps = 2};
}

void Sent(PaceLinkTable& table, std::uint64_t seq, const ProxyNetworkFigures& figures) {
  table.Open(seq);
  table.Close(seq, &figures);
}

TEST_CASE("a block's send links add up the figures of each of its operations' proxy operations",
          "[pace_links]") {
  PaceLinkTable table;
  for (std::uint64_t seq = 1; seq <= 3 * kPaceBlockOps; ++seq) {
    Sent(table, seq, Send(1, 0));
    Sent(table, seq, Send(1, 1, 3'000'000));
    Sent(table, seq, ProxyNetworkFigures{.peer = 1, .channel = 2});  // no step on the network: no link
  }
  for (std::uint64_t number = 0; number < 3; ++number) {
    CHECK(table.Running(number) == 0);
    const std::vector<PaceLinkSnapshot> links = table.Take(number);
    REQUIRE(links.size() == 2);
    CHECK(links[0].peer == 1);
    CHECK(links[0].channel == 0);
    CHECK(links[0].steps == 16);
    CHECK(links[0].bytes == 8000);
    CHECK(links[0].network_ms == Approx(16.0));
    CHECK(links[1].channel == 1);
    CHECK(links[1].network_ms == Approx(24.0));
  }
  CHECK(table.dropped() == 0);
  CHECK(table.Take(0).empty());  // taken already
}

TEST_CASE("proxy operations still running hold their block", "[pace_links]") {
  PaceLinkTable table;
  table.Open(3);
  table.Open(5);
  CHECK(table.Running(0) == 2);
  const ProxyNetworkFigures figures = Send(2, 0);
  table.Close(3, &figures);
  CHECK(table.Running(0) == 1);
  CHECK(table.Running(1) == 0);
  table.Close(5, nullptr);
  CHECK(table.Running(0) == 0);
}

TEST_CASE("figures with no place in the table are dropped, never counted in another block", "[pace_links]") {
  PaceLinkTable table;
  const std::uint64_t next_turn = kPaceLinkBlocks * kPaceBlockOps + 1;  // block 0's place, one turn on
  Sent(table, next_turn, Send(1, 0));
  CHECK(table.dropped() == 2);  // its start and its stop: block 0 is not taken yet
  Sent(table, 1, Send(1, 0));
  table.Open(2);
  CHECK(table.Take(0).size() == 1);  // with #2's proxy operation still open: its grace ran out
  const ProxyNetworkFigures late = Send(3, 0);
  table.Close(2, &late);  // stopped after its block was taken
  CHECK(table.dropped() == 3);
  Sent(table, next_turn, Send(1, 5));
  const std::vector<PaceLinkSnapshot> links = table.Take(kPaceLinkBlocks);
  REQUIRE(links.size() == 1);
  CHECK(links[0].channel == 5);
  CHECK(links[0].steps == 2);

  // Links past a block's slots.
  for (int channel = 0; channel < static_cast<int>(kPaceLinkSlots) + 2; ++channel)
    Sent(table, 9, Send(1, channel));
  CHECK(table.Take(1).size() == kPaceLinkSlots);
  CHECK(table.dropped() == 5);
}

TEST_CASE("a proxy thread's figures all count while the watchdog takes blocks", "[pace_links]") {
  PaceLinkTable table;
  constexpr std::uint64_t kOps = 4000;
  std::atomic<std::uint64_t> taken{0};  // blocks
  std::atomic<std::uint64_t> stopped{0};
  std::thread proxy([&] {
    for (std::uint64_t seq = 1; seq <= kOps; ++seq) {
      // As a job that keeps within the table's blocks.
      while ((seq - 1) / kPaceBlockOps >= taken.load() + kPaceLinkBlocks) std::this_thread::yield();
      for (int channel = 0; channel < 4; ++channel)
        Sent(table, seq, Send(static_cast<int>(seq % 2), channel, 1));
      stopped.store(seq, std::memory_order_release);
    }
  });
  std::uint64_t steps = 0;
  for (std::uint64_t number = 0; number < kOps / kPaceBlockOps; ++number) {
    while (stopped.load(std::memory_order_acquire) < (number + 1) * kPaceBlockOps) std::this_thread::yield();
    const std::vector<PaceLinkSnapshot> links = table.Take(number);
    CHECK(links.size() == 8);  // 2 peers × 4 channels
    for (const PaceLinkSnapshot& link : links) steps += static_cast<std::uint64_t>(link.steps);
    taken.store(number + 1);
  }
  proxy.join();
  CHECK(steps == kOps * 4 * 2);
  CHECK(table.dropped() == 0);
}

}  // namespace
}  // namespace ncclguard
