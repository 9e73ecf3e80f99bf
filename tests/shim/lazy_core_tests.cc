// libncclguard.so is a front end that loads its core at the first NCCL call: a process that never
// calls NCCL maps neither the core nor what the core needs, and a missing core leaves NCCL calls
// passing through, said once.
#include <filesystem>
#include <map>
#include <string>

#include <catch2/catch.hpp>

#include "tests/support/process.h"

using ncclguard::testing::CountOccurrences;
using ncclguard::testing::ProcessOptions;
using ncclguard::testing::ProcessResult;
using ncclguard::testing::RunProcess;
using ncclguard::testing::TemporaryDirectory;

namespace {

ProcessResult RunProbe(const std::string& mode, const std::string& preload,
                       const std::string& library_path = "",
                       const std::map<std::string, std::string>& environment = {}) {
  ProcessOptions options;
  for (const auto& [name, value] : environment) options.environment[name] = value;
  options.environment["LD_LIBRARY_PATH"] =
      library_path.empty() ? REAL_NCCL_DIR : library_path + ":" REAL_NCCL_DIR;
  if (!preload.empty()) options.environment["LD_PRELOAD"] = preload;
  std::vector<std::string> argv = {LAZY_PROBE};
  if (!mode.empty()) argv.push_back(mode);
  ProcessResult result = RunProcess(argv, options);
  INFO("stdout:\n" << result.out << "\nstderr:\n" << result.err);
  REQUIRE(result.exit_code == 0);
  return result;
}

// The line of `out` that starts with `prefix`, "" when none.
std::string Line(const std::string& out, const std::string& prefix) {
  for (const std::string& line : ncclguard::testing::SplitLines(out)) {
    if (line.rfind(prefix, 0) == 0) return line;
  }
  return "";
}

}  // namespace

TEST_CASE("a process that never calls NCCL does not map the core", "[lazy]") {
  const ProcessResult result = RunProbe("", PRELOAD_LIBRARY);
  CHECK(result.out == "start core=0 absl=0 simdjson=0 front_end=1\n");
  CHECK(result.err.empty());
}

TEST_CASE("the first NCCL call loads the core", "[lazy]") {
  const ProcessResult result = RunProbe("call", PRELOAD_LIBRARY);
  const ProcessResult direct = RunProbe("call", "");
  CHECK(result.out.find("start core=0 absl=0 simdjson=0 front_end=1\n") == 0);
  CHECK(result.out.find("after_call core=1 absl=1 simdjson=1 front_end=1\n") != std::string::npos);
  // The same answer as NCCL's own.
  CHECK(Line(result.out, "version ") == Line(direct.out, "version "));
  CHECK(Line(result.out, "version ").find(" result 0") != std::string::npos);
}

TEST_CASE("under NCCLGUARD_DISABLE the first NCCL call loads nothing of ncclguard's core", "[lazy]") {
  for (const char* yes : {"1", "YES", "on"}) {
    const ProcessResult result = RunProbe("call", PRELOAD_LIBRARY, "", {{"NCCLGUARD_DISABLE", yes}});
    const ProcessResult direct = RunProbe("call", "");
    CHECK(result.out.find("after_call core=0 absl=0 simdjson=0 front_end=1\n") != std::string::npos);
    CHECK(Line(result.out, "version ") == Line(direct.out, "version "));
    CHECK(result.err.empty());
  }
  // A value that is no boolean is not "disabled": the core loads, and says what is wrong.
  const ProcessResult odd = RunProbe("call", PRELOAD_LIBRARY, "", {{"NCCLGUARD_DISABLE", "2"}});
  CHECK(odd.out.find("after_call core=1") != std::string::npos);
}

// Runs the probe's NCCL call under a copy of the front end in `directory`, beside `core` ("": none),
// with `library_path` searched first; checks that NCCL answered as it does without ncclguard and
// that stderr is exactly one line. Returns that line.
std::string PassThroughLine(const TemporaryDirectory& directory, const std::string& core,
                            const std::string& library_path = "") {
  const std::string front_end = directory.path() + "/libncclguard.so";
  std::filesystem::copy_file(PRELOAD_LIBRARY, front_end);
  if (!core.empty()) std::filesystem::copy_file(core, directory.path() + "/libncclguard-core.so");
  const ProcessResult result = RunProbe("call", front_end, library_path);
  const ProcessResult direct = RunProbe("call", "");
  INFO(result.err);
  CHECK(CountOccurrences(result.err, "\n") == 1);
  CHECK(result.out.find("after_call core=0 absl=0 simdjson=0 front_end=1\n") != std::string::npos);
  CHECK(Line(result.out, "version ") == Line(direct.out, "version "));
  CHECK(Line(result.out, "version ").find(" result 0") != std::string::npos);
  return result.err;
}

TEST_CASE("a missing core is said once and NCCL calls pass through", "[lazy]") {
  TemporaryDirectory directory;
  // The core is in the library path, yet only looked for beside the front end.
  const std::string core_directory = std::filesystem::path(CORE_LIBRARY).parent_path();
  const std::string said = PassThroughLine(directory, "", core_directory);
  CHECK(CountOccurrences(
            said, "ncclguard: cannot load its core " + directory.path() + "/libncclguard-core.so (") == 1);
  CHECK(CountOccurrences(said, "cannot open shared object file") == 1);  // dlerror()'s words
}

TEST_CASE("a core of another build is refused, said once, and NCCL calls pass through", "[lazy]") {
  TemporaryDirectory directory;
  const std::string said = PassThroughLine(directory, STALE_CORE);
  CHECK(CountOccurrences(said, "ncclguard: cannot use its core " + directory.path() +
                                   "/libncclguard-core.so (it comes from another build") == 1);
}
