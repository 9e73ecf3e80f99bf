// NCCLEMU_LINKS and the slow_link fault, on their parsers, and the time a link takes under them.
#include <algorithm>
#include <vector>

#include <catch2/catch.hpp>

#include "emulator/nccl/faults.h"

using ncclemu::FaultKind;
using ncclemu::LinkModel;
using ncclemu::linkTime;
using ncclemu::LinkUse;
using ncclemu::parseFaultSpec;
using ncclemu::parseLinkSpec;

TEST_CASE("emulated NCCL fault spec: slow_link with its keys", "[nccl][faults]") {
  const auto plan = parseFaultSpec(
      "slow_link:rank=2,peer=3,factor=2.5,channel=1,from=10,until=20,comm=2;"
      "slow_link:rank=0,peer=1,factor=3");
  REQUIRE(plan.error.empty());
  REQUIRE(plan.faults.size() == 2);
  const auto& slowed = plan.faults[0];
  CHECK(slowed.kind == FaultKind::SlowLink);
  CHECK(slowed.rank == 2);
  CHECK(slowed.peer == 3);
  CHECK(slowed.factor == 2.5);
  CHECK(slowed.channel == 1);
  CHECK(slowed.from_seq == 10);
  CHECK(slowed.until_seq == 20);
  CHECK(slowed.comm_index == 2);
  CHECK(plan.faults[1].factor == 3);
  CHECK(plan.faults[1].channel == -1);  // every channel
  CHECK(plan.faults[1].from_seq == 0);
  CHECK(plan.faults[1].until_seq == 0);  // to the end
}

TEST_CASE("emulated NCCL fault spec: malformed slow_link parts are named", "[nccl][faults]") {
  auto error = [](const char* spec) { return parseFaultSpec(spec).error; };
  CHECK(error("slow_link:rank=1,factor=3") == "missing key 'peer' in 'slow_link:rank=1,factor=3'");
  CHECK(error("slow_link:rank=1,peer=2") == "missing key 'factor' in 'slow_link:rank=1,peer=2'");
  CHECK(error("slow_link:rank=1,peer=2,factor=0") ==
        "bad value '0' for factor in 'slow_link:rank=1,peer=2,factor=0' (expected a decimal > 0)");
  CHECK(error("slow_link:rank=1,peer=2,factor=-3").find("bad value '-3' for factor") == 0);
  CHECK(error("slow_link:rank=1,peer=2,factor=3x").find("bad value '3x' for factor") == 0);
  CHECK(error("slow_link:rank=1,peer=2,factor=1e3").find("bad value '1e3' for factor") == 0);
  CHECK(error("slow_link:rank=1,peer=1,factor=3") ==
        "peer must differ from rank in 'slow_link:rank=1,peer=1,factor=3'");
  CHECK(error("slow_link:rank=1,peer=2,factor=3,from=0").find("from counts from 1, got 0") == 0);
  CHECK(error("slow_link:rank=1,peer=2,factor=3,from=5,until=4") ==
        "until is before from in 'slow_link:rank=1,peer=2,factor=3,from=5,until=4'");
  CHECK(error("slow_link:rank=1,peer=2,factor=3,seq=4") ==
        "unknown key 'seq' for slow_link in 'slow_link:rank=1,peer=2,factor=3,seq=4'");
  CHECK(error("hang:rank=1,seq=2,factor=3").find("unknown key 'factor' for hang") == 0);
}

TEST_CASE("NCCLEMU_LINKS: keys, defaults and malformed parts", "[nccl][links]") {
  CHECK_FALSE(parseLinkSpec("").enabled);
  const LinkModel defaults = parseLinkSpec("on");
  CHECK(defaults.enabled);
  CHECK(defaults.gbps == 10);
  CHECK(defaults.latency_us == 50);
  CHECK(defaults.jitter == 0);
  const LinkModel given = parseLinkSpec("gbps=25.5, latency_us=0,jitter=0.2,seed=7");
  REQUIRE(given.error.empty());
  CHECK(given.enabled);
  CHECK(given.gbps == 25.5);
  CHECK(given.latency_us == 0);
  CHECK(given.jitter == 0.2);
  CHECK(given.seed == 7);
  CHECK(parseLinkSpec("jitter=0.1").gbps == 10);  // the keys not given keep their defaults

  auto error = [](const char* spec) { return parseLinkSpec(spec).error; };
  CHECK(error("gbps=fast") == "bad value 'fast' for gbps in 'gbps=fast' (expected a decimal > 0)");
  CHECK(error("gbps=0").find("bad value '0' for gbps") == 0);
  CHECK(error("jitter=0.95") ==
        "bad value '0.95' for jitter in 'jitter=0.95' (expected a decimal from 0 to 0.9)");
  CHECK(error("latency_us=-1").find("bad value '-1' for latency_us") == 0);
  CHECK(error("seed=1.5").find("bad value '1.5' for seed") == 0);
  CHECK(error("gbps=1,bw=2") == "unknown key 'bw' in 'gbps=1,bw=2' (keys: gbps, latency_us, jitter, seed)");
  CHECK(error("gbps=1,gbps=2") == "key 'gbps' given twice in 'gbps=1,gbps=2'");
  CHECK(error("off") == "expected key=value, got 'off' in 'off'");
  CHECK_FALSE(parseLinkSpec("gbps=x").enabled);  // nothing of a malformed spec applies
}

TEST_CASE("a link takes latency + bytes / bandwidth, times its slow_link factor", "[nccl][links]") {
  LinkModel model = parseLinkSpec("gbps=8,latency_us=100");
  const LinkUse use{1, 2, 0, 5, 1000000, 1};           // 1 MB from rank 1 to rank 2, channel 0, seq 5
  CHECK(linkTime(model, {}, use).count() == 1100000);  // 100 us + 1 ms
  const auto faults = parseFaultSpec("slow_link:rank=1,peer=2,factor=3,channel=0,from=5,until=6").faults;
  CHECK(linkTime(model, faults, use).count() == 3300000);
  LinkUse other = use;
  other.channel = 1;
  CHECK(linkTime(model, faults, other).count() == 1100000);
  other = use;
  other.seq = 7;
  CHECK(linkTime(model, faults, other).count() == 1100000);
  other = use;
  other.from = 2;  // the link the other way
  other.to = 1;
  CHECK(linkTime(model, faults, other).count() == 1100000);
  other = use;
  other.comm_index = 2;
  CHECK(linkTime(model, parseFaultSpec("slow_link:rank=1,peer=2,factor=3,comm=1").faults, other).count() ==
        1100000);
}

TEST_CASE("jitter: each use of a link draws its factor, alike on every rank, bounded", "[nccl][links]") {
  const LinkModel model = parseLinkSpec("gbps=10,latency_us=50,jitter=0.2,seed=3");
  std::vector<double> times;
  for (uint64_t seq = 1; seq <= 50; ++seq) {
    for (int from = 0; from < 8; ++from) {
      const LinkUse use{from, (from + 1) % 8, static_cast<int>(seq % 2), seq, 1 << 20, 1};
      const double time = static_cast<double>(linkTime(model, {}, use).count());
      CHECK(time == static_cast<double>(linkTime(model, {}, use).count()));  // deterministic
      times.push_back(time);
    }
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  const double nominal = static_cast<double>(
      linkTime(parseLinkSpec("gbps=10,latency_us=50"), {}, LinkUse{0, 1, 0, 1, 1 << 20, 1}).count());
  CHECK(sorted.front() >= nominal * 0.8 - 1);
  CHECK(sorted.back() <= nominal * 1.2 + 1);
  CHECK(sorted.back() / median < 1.5);
  CHECK(sorted.front() / median > 1 / 1.5);
  CHECK(sorted.back() - sorted.front() > nominal * 0.3);  // it does vary, across most of the range
  // Another seed draws other factors.
  const LinkModel reseeded = parseLinkSpec("gbps=10,latency_us=50,jitter=0.2,seed=4");
  CHECK(linkTime(reseeded, {}, LinkUse{0, 1, 0, 1, 1 << 20, 1}) !=
        linkTime(model, {}, LinkUse{0, 1, 0, 1, 1 << 20, 1}));
}
