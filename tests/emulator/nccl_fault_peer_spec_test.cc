// The hang fault's optional peer= key (a stopped link), on the NCCLEMU_FAULTS parser itself.
#include <catch2/catch.hpp>

#include "emulator/nccl/faults.h"

using ncclemu::FaultKind;
using ncclemu::parseFaultSpec;

TEST_CASE("emulated NCCL fault spec: hang takes an optional peer", "[nccl][faults]") {
  const auto plan = parseFaultSpec("hang:rank=1,peer=2,seq=3,comm=2;hang:rank=0,seq=1");
  REQUIRE(plan.error.empty());
  REQUIRE(plan.faults.size() == 2);
  CHECK(plan.faults[0].kind == FaultKind::Hang);
  CHECK(plan.faults[0].rank == 1);
  CHECK(plan.faults[0].peer == 2);
  CHECK(plan.faults[0].seq == 3);
  CHECK(plan.faults[0].comm_index == 2);
  CHECK(plan.faults[1].peer == -1);  // without peer=: the whole rank hangs, as before

  CHECK(parseFaultSpec("hang:rank=1,peer=1,seq=3").error ==
        "peer must differ from rank in 'hang:rank=1,peer=1,seq=3'");
  CHECK(parseFaultSpec("hang:rank=1,peer=x,seq=3").error.find("bad value 'x' for peer") == 0);
  CHECK(parseFaultSpec("hang:rank=1,peer=2,peer=3,seq=3").error ==
        "key 'peer' given twice in 'hang:rank=1,peer=2,peer=3,seq=3'");
  CHECK(parseFaultSpec("crash:rank=1,peer=2,seq=3").error ==
        "unknown key 'peer' for crash in 'crash:rank=1,peer=2,seq=3'");
}
