// The dynamic symbols of libncclguard.so are exactly the table's NCCL functions plus dlsym and
// NCCL's profiler structures, those of its core the door's table alone; the front end needs the C
// runtime and libgcc_s only and runs nothing of its own at load; every row of the table is a function the
// real NCCL of this machine exports.
#include <set>
#include <sstream>

#include <catch2/catch.hpp>

#include "tests/support/process.h"
#include "watchdog/common/nccl_api.h"

namespace {

std::set<std::string> DefinedDynamicSymbols(const std::string& library) {
  const auto result = ncclguard::testing::RunProcess({NM_EXECUTABLE, "-D", "--defined-only", library});
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  std::set<std::string> names;
  for (const std::string& line : ncclguard::testing::SplitLines(result.out)) {
    std::istringstream fields(line);
    std::string address, type, name;
    if (fields >> address >> type >> name) names.insert(name.substr(0, name.find('@')));
  }
  return names;
}

std::vector<std::string> Needed(const std::string& library) {
  const auto result = ncclguard::testing::RunProcess({READELF_EXECUTABLE, "-d", library});
  REQUIRE(result.exit_code == 0);
  std::vector<std::string> needed;
  for (const std::string& line : ncclguard::testing::SplitLines(result.out)) {
    const size_t open = line.find("(NEEDED)");
    if (open == std::string::npos) continue;
    const size_t from = line.find('[');
    const size_t to = line.find(']');
    if (from != std::string::npos && to > from) needed.push_back(line.substr(from + 1, to - from - 1));
  }
  return needed;
}

}  // namespace

TEST_CASE("libncclguard.so needs the C runtime and libgcc_s only", "[exports]") {
  // Preloaded into every program of a shell: anything more is loaded and relocated at every start,
  // libstdc++ included (C programs do not load it otherwise): libstdc++ is linked in, hidden, where
  // the toolchain has a libstdc++.a (shim/CMakeLists.txt).
  std::set<std::string> runtimes = {"libc.so.6", "libm.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2",
                                    "ld-linux-aarch64.so.1"};
  if (!FRONT_END_OWN_LIBSTDCXX) runtimes.insert("libstdc++.so.6");
  for (const std::string& library : Needed(PRELOAD_LIBRARY)) {
    INFO(library);
    CHECK(runtimes.count(library) == 1);
  }
}

TEST_CASE("libncclguard.so runs nothing of its own when it is loaded", "[exports]") {
  // The initialisers at load are the toolchain's frame_dummy and those of the libstdc++ linked in
  // (GCC 12's: its emergency exception pool, its error categories), none of ncclguard's: no global
  // with a constructor or a destructor, no iostream, no locale (fmt's is left out).
  const std::set<std::string> runtime_sources = {"eh_alloc.cc", "system_error.cc"};
  const auto symbols = ncclguard::testing::RunProcess({NM_EXECUTABLE, PRELOAD_LIBRARY});
  REQUIRE(symbols.exit_code == 0);
  std::size_t initialisers = 0;
  for (const std::string& line : ncclguard::testing::SplitLines(symbols.out)) {
    const size_t at = line.find("_GLOBAL__sub_I_");
    if (at == std::string::npos) continue;
    INFO(line);
    CHECK(runtime_sources.count(line.substr(at + 15)) == 1);
    ++initialisers;
  }
  const auto sections = ncclguard::testing::RunProcess({READELF_EXECUTABLE, "-W", "-S", PRELOAD_LIBRARY});
  REQUIRE(sections.exit_code == 0);
  for (const std::string& line : ncclguard::testing::SplitLines(sections.out)) {
    INFO(line);
    CHECK(line.find(" .ctors ") == std::string::npos);
    const size_t at = line.find(" .init_array ");
    if (at == std::string::npos) continue;
    std::istringstream fields(line.substr(at));
    std::string name, type, address, offset, size;
    fields >> name >> type >> address >> offset >> size;
    CHECK(std::stoul(size, nullptr, 16) == 8 * (1 + initialisers));  // frame_dummy and the above
  }
}

TEST_CASE("libncclguard-core.so exports the door's table, nothing else", "[exports]") {
  CHECK(DefinedDynamicSymbols(CORE_LIBRARY) == std::set<std::string>{"ncclguard_core_entries"});
}

TEST_CASE(
    "libncclguard.so exports the table's NCCL functions, NCCL's profiler plugin and dlsym, nothing else",
    "[exports]") {
  std::set<std::string> expected = {"dlsym", "ncclProfiler_v4", "ncclProfiler_v5", "ncclProfiler_v6"};
  for (const ncclguard::ApiInfo& api : ncclguard::kApis) expected.insert(std::string(api.name));
  CHECK(DefinedDynamicSymbols(PRELOAD_LIBRARY) == expected);
}

TEST_CASE("every table row is a function of nccl.h and of the real libnccl", "[exports]") {
  const std::set<std::string> real = DefinedDynamicSymbols(REAL_NCCL_DIR "/libnccl.so.2");
  for (const ncclguard::ApiInfo& api : ncclguard::kApis) {
    INFO(api.name);
    CHECK(real.count(std::string(api.name)) == 1);
    CHECK(api.since <= NCCL_VERSION_CODE);
    CHECK(api.since >= NCCL_VERSION(2, 3, 0));
  }
  // And the other way round: every public nccl* function of the real library is in the table
  // (NCCL also exports its device-API helpers from nccl_device.h, which are not host calls).
  for (const std::string& name : real) {
    if (name.rfind("nccl", 0) != 0 || name.rfind("ncclDev", 0) == 0 || name.rfind("ncclTeam", 0) == 0 ||
        name.find("Requirement") != std::string::npos || name == "ncclLLA2ACalcSlots" ||
        name == "ncclResetDebugInitInternal") {
      continue;
    }
    INFO(name);
    CHECK(ncclguard::FindApi(name).has_value());
  }
}

TEST_CASE("ncclguard's libraries need neither libnccl nor the CUDA libraries", "[exports]") {
  // They are the application's, found at run time: NEEDED entries would load them into every
  // preloaded process, or the wrong copies.
  for (const std::string& object : {std::string(PRELOAD_LIBRARY), std::string(CORE_LIBRARY)}) {
    const std::vector<std::string> needed = Needed(object);
    CHECK_FALSE(needed.empty());
    for (const std::string& library : needed) {
      INFO(object << ": " << library);
      CHECK(library.find("libnccl") == std::string::npos);
      CHECK(library.find("libcuda") == std::string::npos);
      CHECK(library.find("libnvidia-ml") == std::string::npos);
      CHECK(library.find("fmt") == std::string::npos);     // compiled in, hidden
      CHECK(library.find("spdlog") == std::string::npos);  // likewise
    }
  }
}
