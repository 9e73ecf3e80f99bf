// libncclguard.so under LD_PRELOAD, in front of the real libnccl.so.2 (no GPU here: NCCL loads,
// answers ncclGetVersion and ncclGetUniqueId, and fails ncclCommInitRank with
// ncclUnhandledCudaError). Every run is compared with the same run without ncclguard.
#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <regex>

#include <catch2/catch.hpp>

#include "tests/support/process.h"

using ncclguard::testing::CountOccurrences;
using ncclguard::testing::ProcessOptions;
using ncclguard::testing::ProcessResult;
using ncclguard::testing::RunProcess;
using ncclguard::testing::SplitLines;
using ncclguard::testing::TemporaryDirectory;

namespace {

ProcessResult Run(const std::vector<std::string>& argv,
                  std::map<std::string, std::optional<std::string>> environment, bool preload) {
  ProcessOptions options;
  options.environment = std::move(environment);
  if (options.environment.count("LD_LIBRARY_PATH") == 0) {
    options.environment["LD_LIBRARY_PATH"] = REAL_NCCL_DIR;
  }
  if (preload) options.environment["LD_PRELOAD"] = PRELOAD_LIBRARY;
  // A failed ncclCommInitRank is dumped: keep the dumps out of the default directory.
  TemporaryDirectory dumps;
  if (options.environment.count("NCCLGUARD_DUMP_DIR") == 0) {
    options.environment["NCCLGUARD_DUMP_DIR"] = dumps.path();
  }
  ProcessResult result = RunProcess(argv, options);
  INFO("command: " << argv[0] << (preload ? " (preloaded)" : "") << "\nstdout:\n"
                   << result.out << "\nstderr:\n"
                   << result.err);
  REQUIRE_FALSE(result.timed_out);
  return result;
}

// The probe's facts, without the line that says which object served the call.
std::vector<std::string> Facts(const std::string& out) {
  std::vector<std::string> facts;
  for (const std::string& line : SplitLines(out)) {
    if (line.rfind("get_version_from ", 0) != 0 && line.rfind("profiler_lookup ", 0) != 0)
      facts.push_back(line);
  }
  return facts;
}

std::string ServedBy(const std::string& out) {
  for (const std::string& line : SplitLines(out)) {
    if (line.rfind("get_version_from ", 0) == 0) return line.substr(17);
  }
  return "";
}

struct LoadingPath {
  const char* name;
  std::vector<std::string> argv;
};

std::vector<LoadingPath> LoadingPaths() {
  return {{"linked", {PROBE_LINKED}},
          {"dlopen", {PROBE_DLOPEN}},
          {"rtld-local", {PROBE_RTLD_LOCAL, PROBE_BRIDGE}}};
}

const char* kPythonProbe = R"(
import ctypes, sys
nccl = ctypes.CDLL("libnccl.so.2")
class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]
version = ctypes.c_int()
nccl.ncclGetErrorString.restype = ctypes.c_char_p
result = nccl.ncclGetVersion(ctypes.byref(version))
print("version", nccl.ncclGetErrorString(result).decode(), version.value)
uid = UniqueId()
print("unique_id", nccl.ncclGetUniqueId(ctypes.byref(uid)))
comm = ctypes.c_void_p()
print("init", nccl.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0))
nccl.ncclGetLastError.restype = ctypes.c_char_p
print("last_error", nccl.ncclGetLastError(None).decode())
print("bcast", nccl.ncclBcast(None, ctypes.c_size_t(1), 7, 0, None, None))
)";

}  // namespace

TEST_CASE("every loading path reaches the real NCCL through ncclguard", "[preload]") {
  for (const LoadingPath& path : LoadingPaths()) {
    SECTION(path.name) {
      const ProcessResult plain = Run(path.argv, {}, false);
      const ProcessResult guarded = Run(path.argv, {{"NCCLGUARD_LOG_LEVEL", "debug"}}, true);
      REQUIRE(plain.exit_code == 0);
      REQUIRE(guarded.exit_code == 0);
      CHECK(Facts(guarded.out) == Facts(plain.out));
      // What real NCCL 2.28.9 answers without a GPU.
      CHECK(plain.out.find("version no error 22809\n") != std::string::npos);
      CHECK(plain.out.find("unique_id 0\n") != std::string::npos);
      CHECK(plain.out.find("init 1\n") != std::string::npos);  // ncclUnhandledCudaError
      CHECK(plain.out.find("last_error Cuda failure") != std::string::npos);
      // The application called ncclguard's wrapper, which called the real library.
      CHECK(ServedBy(plain.out).find("libnccl.so") != std::string::npos);
      CHECK(ServedBy(guarded.out).find("libncclguard.so") != std::string::npos);
      CHECK(guarded.err.find("ncclguard DEBUG ncclGetVersion -> ncclSuccess") != std::string::npos);
      CHECK(guarded.err.find("ncclguard DEBUG ncclGetUniqueId -> ncclSuccess") != std::string::npos);
      CHECK(guarded.err.find("ncclguard DEBUG ncclCommInitRank -> ncclUnhandledCudaError") !=
            std::string::npos);
      CHECK(guarded.err.find("ncclguard DEBUG ncclGetLastError -> \"Cuda failure") != std::string::npos);
    }
  }
  SECTION("python ctypes") {
    const std::vector<std::string> argv = {PYTHON_EXECUTABLE, "-c", kPythonProbe};
    const ProcessResult plain = Run(argv, {}, false);
    const ProcessResult guarded = Run(argv, {{"NCCLGUARD_LOG_LEVEL", "debug"}}, true);
    REQUIRE(plain.exit_code == 0);
    REQUIRE(guarded.exit_code == 0);
    CHECK(guarded.out == plain.out);
    CHECK(plain.out.find("init 1\n") != std::string::npos);
    CHECK(guarded.err.find("ncclguard DEBUG ncclGetVersion -> ncclSuccess") != std::string::npos);
    CHECK(guarded.err.find("ncclguard DEBUG ncclCommInitRank -> ncclUnhandledCudaError") !=
          std::string::npos);
  }
}

std::string ProfilerLookup(const std::string& out) {
  for (const std::string& line : SplitLines(out)) {
    if (line.rfind("profiler_lookup ", 0) == 0) return line.substr(16);
  }
  return "";
}

TEST_CASE("on every loading path NCCL is pointed at ncclguard's profiler plugin, and finds it there",
          "[preload][profiler]") {
  for (const LoadingPath& path : LoadingPaths()) {
    SECTION(path.name) {
      CHECK(ProfilerLookup(Run(path.argv, {}, false).out) == "unset");
      const ProcessResult guarded = Run(path.argv, {{"NCCLGUARD_LOG_LEVEL", "info"}}, true);
      CHECK(ProfilerLookup(guarded.out) == std::string(PRELOAD_LIBRARY) + " ncclguard ncclguard ncclguard");
      CHECK(CountOccurrences(guarded.err, "NCCL's profiler plugin is ncclguard's (NCCL_PROFILER_PLUGIN=") ==
            1);
      // The user's own plugin is kept behind ncclguard's.
      const ProcessResult theirs =
          Run(path.argv, {{"NCCLGUARD_LOG_LEVEL", "info"}, {"NCCL_PROFILER_PLUGIN", "inspector"}}, true);
      CHECK(ProfilerLookup(theirs.out) == std::string(PRELOAD_LIBRARY) + " ncclguard ncclguard ncclguard");
      CHECK(CountOccurrences(theirs.err, "which forwards every event to the user's inspector") == 1);
    }
  }
  SECTION("STATIC_PLUGIN finds ncclguard's structures in the process") {
    const ProcessResult result =
        Run({PROBE_LINKED}, {{"NCCLGUARD_PROFILER", "0"}, {"NCCL_PROFILER_PLUGIN", "STATIC_PLUGIN"}}, true);
    CHECK(ProfilerLookup(result.out) == "STATIC_PLUGIN ncclguard ncclguard ncclguard");
  }
  SECTION("NCCLGUARD_PROFILER=0 and NCCL_PROFILER_PLUGIN=none leave NCCL's setting alone") {
    CHECK(ProfilerLookup(Run({PROBE_LINKED}, {{"NCCLGUARD_PROFILER", "0"}}, true).out) == "unset");
    CHECK(ProfilerLookup(Run({PROBE_LINKED}, {{"NCCL_PROFILER_PLUGIN", "none"}}, true).out) == "none - - -");
  }
}

TEST_CASE("NCCL's calls to its own exported functions are passed through, not counted", "[preload]") {
  for (const LoadingPath& path : LoadingPaths()) {
    SECTION(path.name) {
      const ProcessResult guarded = Run(path.argv, {{"NCCLGUARD_LOG_LEVEL", "trace"}}, true);
      REQUIRE(guarded.exit_code == 0);
      CHECK(guarded.out.find("bcast 4\n") != std::string::npos);  // ncclInvalidArgument
      // ncclBcast is reported once; the ncclBroadcast it makes inside NCCL only as nested.
      CHECK(CountOccurrences(guarded.err, " ncclBcast(") == 1);
      CHECK(CountOccurrences(guarded.err, "ncclBroadcast nested in ncclBcast: passed through") == 1);
      CHECK(CountOccurrences(guarded.err, " ncclBroadcast(") == 0);
    }
  }
}

TEST_CASE("NCCLGUARD_DISABLE=1 makes ncclguard a pure pass-through", "[preload]") {
  TemporaryDirectory directory;
  const std::string log_file = directory.path() + "/guard-%p.log";
  for (const LoadingPath& path : LoadingPaths()) {
    SECTION(path.name) {
      const ProcessResult plain = Run(path.argv, {}, false);
      const ProcessResult disabled = Run(
          path.argv,
          {{"NCCLGUARD_DISABLE", "1"}, {"NCCLGUARD_LOG_LEVEL", "trace"}, {"NCCLGUARD_LOG_FILE", log_file}},
          true);
      CHECK(disabled.exit_code == plain.exit_code);
      CHECK(disabled.err == plain.err);
      CHECK(Facts(disabled.out) == Facts(plain.out));
      // dlsym hands out the real function: nothing of ncclguard is left on the call path.
      if (std::string(path.name) == "dlopen") CHECK(ServedBy(disabled.out) == ServedBy(plain.out));
      DIR* dir = opendir(directory.path().c_str());
      int entries = 0;
      while (dirent* entry = readdir(dir)) entries += entry->d_name[0] != '.';
      closedir(dir);
      CHECK(entries == 0);
    }
  }
}

TEST_CASE("programs that make no NCCL call behave exactly as without ncclguard", "[preload]") {
  TemporaryDirectory directory;
  const std::map<std::string, std::optional<std::string>> loud = {
      {"NCCLGUARD_LOG_LEVEL", "trace"}, {"NCCLGUARD_LOG_FILE", directory.path() + "/log-%p"}};
  const std::vector<std::vector<std::string>> programs = {
      {"bash", "-c", "true"},
      {"bash", "-c", "echo hello; echo oops >&2; exit 3"},
      {PYTHON_EXECUTABLE, "-c", "print(1)"},
      // A directory of the test's own: listing / would show /tmp's time, which parallel tests change.
      {"ls", "-l", directory.path()},
      // Threads and open files of the process: ncclguard starts none before an NCCL call.
      {PYTHON_EXECUTABLE, "-c",
       "import os, ctypes; ctypes.CDLL('libc.so.6').getpid();"
       "print(len(os.listdir('/proc/self/task')), len(os.listdir('/proc/self/fd')))"},
  };
  for (const auto& argv : programs) {
    const ProcessResult plain = Run(argv, {}, false);
    const ProcessResult guarded = Run(argv, loud, true);
    CHECK(guarded.exit_code == plain.exit_code);
    CHECK(guarded.out == plain.out);
    CHECK(guarded.err == plain.err);
  }
  DIR* dir = opendir(directory.path().c_str());
  int entries = 0;
  while (dirent* entry = readdir(dir)) entries += entry->d_name[0] != '.';
  closedir(dir);
  CHECK(entries == 0);  // not even the log file was created
}

TEST_CASE("dlsym(RTLD_NEXT) keeps meaning the next definition after the caller", "[preload]") {
  const ProcessResult plain = Run({NEXT_PROBE}, {}, false);
  const ProcessResult guarded = Run({NEXT_PROBE}, {{"NCCLGUARD_LOG_LEVEL", "trace"}}, true);
  CHECK(plain.out == "next second\n");
  CHECK(guarded.out == "next second\n");
  CHECK(guarded.err.empty());
}

TEST_CASE("an older libnccl that lacks newer functions is tolerated", "[preload]") {
  const std::map<std::string, std::optional<std::string>> old_library = {{"LD_LIBRARY_PATH", OLD_NCCL_DIR},
                                                                         {"NCCLGUARD_LOG_LEVEL", "debug"}};
  const ProcessResult plain = Run({PROBE_DLOPEN}, old_library, false);
  const ProcessResult guarded = Run({PROBE_DLOPEN}, old_library, true);
  REQUIRE(plain.exit_code == 0);
  REQUIRE(guarded.exit_code == 0);
  CHECK(Facts(guarded.out) == Facts(plain.out));
  CHECK(plain.out.find("version no error 21805\n") != std::string::npos);
  CHECK(plain.out.find("has_comm_shrink 0\n") != std::string::npos);
  CHECK(ServedBy(guarded.out).find("libncclguard.so") != std::string::npos);

  SECTION("an exported wrapper whose function the library lacks fails cleanly") {
    const std::string script =
        "import ctypes\n"
        "ctypes.CDLL('libnccl.so.2', mode=ctypes.RTLD_GLOBAL)\n"
        "process = ctypes.CDLL(None)\n"
        "print('shrink', process.ncclCommShrink(None, None, 0, None, None, 0))\n"
        "print('shrink', process.ncclCommShrink(None, None, 0, None, None, 0))\n";
    const ProcessResult missing = Run({PYTHON_EXECUTABLE, "-c", script}, old_library, true);
    CHECK(missing.exit_code == 0);
    CHECK(missing.out == "shrink 3\nshrink 3\n");  // ncclInternalError, never a crash
    CHECK(CountOccurrences(missing.err, "ncclCommShrink called but the NCCL library") == 1);
  }
}

TEST_CASE("NCCLGUARD_NCCL_LIBRARY names the NCCL to use when the process has none", "[preload]") {
  const std::string script =
      "import ctypes\n"
      "version = ctypes.c_int()\n"
      "print(ctypes.CDLL(None).ncclGetVersion(ctypes.byref(version)), version.value)\n";
  const ProcessResult none = Run({PYTHON_EXECUTABLE, "-c", script}, {}, true);
  CHECK(none.out == "3 0\n");
  CHECK(none.err.find("ncclGetVersion called but no NCCL library was found") != std::string::npos);

  const ProcessResult named = Run({PYTHON_EXECUTABLE, "-c", script},
                                  {{"NCCLGUARD_NCCL_LIBRARY", REAL_NCCL_DIR "/libnccl.so.2"}}, true);
  CHECK(named.out == "0 22809\n");
  CHECK(named.err.empty());

  const ProcessResult wrong =
      Run({PYTHON_EXECUTABLE, "-c", script}, {{"NCCLGUARD_NCCL_LIBRARY", "/nonexistent/libnccl.so.2"}}, true);
  CHECK(wrong.out == "3 0\n");
  CHECK(wrong.err.find("NCCLGUARD_NCCL_LIBRARY='/nonexistent/libnccl.so.2' cannot be loaded") !=
        std::string::npos);
}

TEST_CASE("NCCLGUARD_NCCL_LIBRARY naming a library that is not NCCL falls back to the process's NCCL",
          "[preload]") {
  const ProcessResult plain = Run({PROBE_LINKED}, {}, false);
  for (const std::string& not_nccl : {std::string("libm.so.6"), std::string(PRELOAD_LIBRARY)}) {
    const ProcessResult guarded = Run({PROBE_LINKED}, {{"NCCLGUARD_NCCL_LIBRARY", not_nccl}}, true);
    INFO(not_nccl);
    CHECK(guarded.exit_code == 0);
    CHECK(Facts(guarded.out) == Facts(plain.out));
    CHECK(CountOccurrences(guarded.err, "NCCLGUARD_NCCL_LIBRARY='" + not_nccl +
                                            "' is not an NCCL library (it does not define ncclGetVersion); "
                                            "looking for the process's own NCCL") == 1);
  }
}

TEST_CASE("control characters in settings never reach the log raw", "[preload]") {
  const ProcessResult guarded =
      Run({PROBE_LINKED}, {{"NCCLGUARD_LOG_LEVEL", "loud\n0:0:0 ncclguard ERROR forged\x1b[2J"}}, true);
  CHECK(guarded.exit_code == 0);
  CHECK(guarded.err.find('\x1b') == std::string::npos);
  CHECK(guarded.err.find("\n0:0:0 ncclguard") == std::string::npos);
  CHECK(CountOccurrences(guarded.err,
                         "NCCLGUARD_LOG_LEVEL='loud\\n0:0:0 ncclguard ERROR forged\\x1b[2J' is not one") ==
        1);
}

TEST_CASE("bad settings are reported once and the defaults used", "[preload]") {
  const ProcessResult plain = Run({PROBE_LINKED}, {}, false);
  const ProcessResult guarded =
      Run({PROBE_LINKED}, {{"NCCLGUARD_LOG_LEVEL", "loud"}, {"NCCLGUARD_DISABLE", "maybe"}}, true);
  CHECK(guarded.exit_code == 0);
  CHECK(Facts(guarded.out) == Facts(plain.out));
  CHECK(CountOccurrences(guarded.err,
                         "NCCLGUARD_LOG_LEVEL='loud' is not one of "
                         "trace|debug|info|warn|error|off; using the default 'warn'") == 1);
  CHECK(CountOccurrences(guarded.err, "NCCLGUARD_DISABLE='maybe' is not a boolean") == 1);
}

TEST_CASE("the log goes to NCCLGUARD_LOG_FILE with %h and %p expanded", "[preload]") {
  TemporaryDirectory directory;
  const ProcessResult guarded =
      Run({PROBE_LINKED},
          {{"NCCLGUARD_LOG_LEVEL", "debug"}, {"NCCLGUARD_LOG_FILE", directory.path() + "/guard-%h-%p.log"}},
          true);
  REQUIRE(guarded.exit_code == 0);
  CHECK(guarded.err.empty());
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::vector<std::string> files;
  DIR* dir = opendir(directory.path().c_str());
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') files.emplace_back(entry->d_name);
  }
  closedir(dir);
  REQUIRE(files.size() == 1);
  CHECK(std::regex_match(files[0], std::regex("guard-" + std::string(host) + "-[0-9]+\\.log")));
  const std::string log = ncclguard::testing::ReadFile(directory.path() + "/" + files[0]);
  CHECK(log.find("ncclguard DEBUG ncclGetVersion -> ncclSuccess") != std::string::npos);
  // NCCL-style prefix: host:pid:tid
  CHECK(std::regex_search(log, std::regex("^" + std::string(host) + ":[0-9]+:[0-9]+ ncclguard ")));

  SECTION("an unusable log file falls back to stderr and changes nothing else") {
    // A path below a regular file can be neither created nor opened.
    const std::string blocker = directory.path() + "/not-a-directory";
    { std::ofstream(blocker) << "x"; }
    const ProcessResult fallback = Run(
        {PROBE_LINKED}, {{"NCCLGUARD_LOG_LEVEL", "debug"}, {"NCCLGUARD_LOG_FILE", blocker + "/x.log"}}, true);
    CHECK(fallback.exit_code == 0);
    CHECK(fallback.err.find("cannot write the log file") != std::string::npos);
    CHECK(fallback.err.find("ncclGetVersion -> ncclSuccess") != std::string::npos);
  }
}

TEST_CASE("failed calls are logged with NCCL's own text, a bounded number of times", "[preload]") {
  const std::string script =
      "import ctypes\n"
      "nccl = ctypes.CDLL('libnccl.so.2')\n"
      "print(sorted({nccl.ncclGetUniqueId(None) for _ in range(50)}))\n";
  const ProcessResult guarded = Run({PYTHON_EXECUTABLE, "-c", script}, {}, true);
  CHECK(guarded.out == "[4]\n");  // ncclInvalidArgument, every time, as NCCL answers
  CHECK(CountOccurrences(guarded.err, "ncclGetUniqueId returned ncclInvalidArgument: ") == 20);
  CHECK(CountOccurrences(guarded.err, "(further failed calls are not logged)") == 1);
}
