// The NCCLEMU_FAULTS grammar, on the parser itself.
#include <catch2/catch.hpp>

#include "emulator/nccl/faults.h"

using ncclemu::FaultKind;
using ncclemu::parseFaultSpec;

TEST_CASE("emulated NCCL fault spec: every kind with its keys", "[nccl][faults]") {
  const auto plan = parseFaultSpec(
      "hang:rank=1,seq=3; p2p_stall:after=10 ;slow:ms=20;slow:rank=2,ms=5,comm=2;"
      "async_error:rank=0,seq=2,code=6;async_error:rank=1,seq=1,code=ncclSystemError;init_hang:rank=3;crash:rank=1,seq=7");
  REQUIRE(plan.error.empty());
  REQUIRE(plan.faults.size() == 8);
  CHECK(plan.faults[0].kind == FaultKind::Hang);
  CHECK(plan.faults[0].rank == 1);
  CHECK(plan.faults[0].seq == 3);
  CHECK(plan.faults[1].kind == FaultKind::P2pStall);
  CHECK(plan.faults[1].after == 10);
  CHECK(plan.faults[2].rank == -1);
  CHECK(plan.faults[2].delay_ms == 20);
  CHECK(plan.faults[3].comm_index == 2);
  CHECK(plan.faults[4].code == ncclRemoteError);
  CHECK(plan.faults[5].code == ncclSystemError);
  CHECK(plan.faults[6].kind == FaultKind::InitHang);
  CHECK(plan.faults[7].kind == FaultKind::Crash);
  CHECK(parseFaultSpec("").faults.empty());
}

TEST_CASE("emulated NCCL fault spec: malformed parts are named", "[nccl][faults]") {
  auto error = [](const char* spec) { return parseFaultSpec(spec).error; };
  CHECK(error("freeze:rank=1") ==
        "unknown fault kind 'freeze' in 'freeze:rank=1' (kinds: hang, p2p_stall, slow, "
        "slow_link, async_error, init_hang, crash)");
  CHECK(error("hang:rank=1") == "missing key 'seq' in 'hang:rank=1'");
  CHECK(error("hang:rank=1,seq=2,depth=3") == "unknown key 'depth' for hang in 'hang:rank=1,seq=2,depth=3'");
  CHECK(error("hang:rank=x,seq=2") == "bad value 'x' for rank in 'hang:rank=x,seq=2' (expected a non-negative integer)");
  CHECK(error("hang:rank=-1,seq=2").find("bad value '-1' for rank") == 0);
  CHECK(error("hang:rank=1,seq=0") == "seq counts from 1, got 0 in 'hang:rank=1,seq=0'");
  CHECK(error("slow:ms=1,ms=2") == "key 'ms' given twice in 'slow:ms=1,ms=2'");
  CHECK(error("slow:ms") == "expected key=value, got 'ms' in 'slow:ms'");
  CHECK(error("async_error:rank=0,seq=1,code=7").find("bad code '7'") == 0);
  // One bad entry spoils the whole spec: nothing is half-applied.
  const auto plan = parseFaultSpec("slow:ms=5;crash:rank=1");
  CHECK(plan.faults.empty());
  CHECK(plan.error == "missing key 'seq' in 'crash:rank=1'");
}
