// The emulated NCCL across processes: one rank per process, ids handed over on the command line
// or derived from NCCL_COMM_ID, every NCCLEMU_FAULTS kind, the P2P settings' caching, and NCCL's
// logging (NCCL_DEBUG, NCCL_DEBUG_FILE, ncclResetDebugInit). NCCL writes its log to stdout.
#include <nccl.h>
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <regex>
#include <string>
#include <vector>

#include "tests/support/process.h"

namespace {

using ncclguard::testing::CountOccurrences;
using ncclguard::testing::ProcessOptions;
using ncclguard::testing::ProcessResult;
using ncclguard::testing::RunProcess;
using Environment = std::map<std::string, std::optional<std::string>>;

ProcessOptions optionsWith(Environment environment) {
  ProcessOptions options;
  options.environment = std::move(environment);
  options.environment["LD_LIBRARY_PATH"] = EMU_LIB_DIR;
  options.environment["NCCLEMU_DEVICES"] = "8";
  for (const char* name : {"NCCL_COMM_ID", "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_DEBUG", "NCCL_DEBUG_FILE",
                           "NCCLEMU_FAULTS", "NCCLEMU_P2P_ACCESS"}) {
    options.environment.emplace(name, std::nullopt);
  }
  options.timeout_seconds = 30;
  return options;
}

std::string newIdHex() {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  std::string hex;
  char digits[3];
  for (char byte : id.internal) {
    snprintf(digits, sizeof(digits), "%02x", static_cast<unsigned char>(byte));
    hex += digits;
  }
  return hex;
}

// The rendezvous segment an id names (its first 8 bytes are the magic, little endian).
std::string rendezvousPath(const std::string& id_hex) {
  std::string magic;
  for (int i = 7; i >= 0; --i) magic += id_hex.substr(2 * i, 2);
  return "/dev/shm/ncclemu-rv-" + magic;
}

// Runs one process per rank, concurrently, with a fresh unique id (or `extra` giving another).
std::vector<ProcessResult> runJob(int nranks, const std::vector<std::string>& extra, const Environment& environment,
                                  bool with_id = true) {
  const std::string id = with_id ? newIdHex() : "";
  std::vector<std::future<ProcessResult>> running;
  for (int r = 0; r < nranks; ++r) {
    std::vector<std::string> argv = {EMU_NCCL_RANK_WORKER, "--rank", std::to_string(r), "--nranks", std::to_string(nranks)};
    if (with_id) argv.insert(argv.end(), {"--id", id});
    argv.insert(argv.end(), extra.begin(), extra.end());
    running.push_back(std::async(std::launch::async, [argv, environment] { return RunProcess(argv, optionsWith(environment)); }));
  }
  std::vector<ProcessResult> results;
  for (auto& result : running) results.push_back(result.get());
  if (with_id) CHECK_FALSE(std::filesystem::exists(rendezvousPath(id)));
  return results;
}

std::string describe(const ProcessResult& result) {
  return "exit " + std::to_string(result.exit_code) + " signal " + std::to_string(result.signal) + "\nstdout:\n" +
         result.out + "stderr:\n" + result.err;
}

ProcessResult runLocal(const std::vector<std::string>& extra, const Environment& environment) {
  std::vector<std::string> argv = {EMU_NCCL_RANK_WORKER};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return RunProcess(argv, optionsWith(environment));
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The "host H pid P" line the worker's --log-action mode starts with.
struct WorkerIdentity {
  std::string host;
  std::string pid;
};

WorkerIdentity identityOf(const ProcessResult& result) {
  std::smatch match;
  REQUIRE(std::regex_search(result.out, match, std::regex(R"(host (\S+) pid (\d+))")));
  return {match[1], match[2]};
}

// A WARN line as NCCL writes it by default: a timestamp, host:pid:tid, [device], file:line.
std::regex warnLine(const WorkerIdentity& who, const std::string& text) {
  return std::regex(R"((^|\n)\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] )" + who.host + ":" + who.pid +
                    R"(:\d+ \[\d+\] init\.cc:\d+ NCCL WARN )" + text + "\n");
}

std::regex infoLine(const WorkerIdentity& who, const std::string& text) {
  return std::regex("(^|\n)" + who.host + ":" + who.pid + R"(:\d+ \[\d+\] NCCL INFO )" + text);
}

std::vector<std::string> filesIn(const std::string& directory) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) names.push_back(entry.path().filename());
  return names;
}

}  // namespace

TEST_CASE("emulated NCCL: one rank per process, every step agrees", "[nccl][multiprocess]") {
  // 700k int32 per AllReduce: more than one round through the staging slots.
  const auto results = runJob(3, {"--steps", "8", "--count", "700000"}, {});
  for (int r = 0; r < 3; ++r) {
    INFO(describe(results[r]));
    REQUIRE(results[r].exit_code == 0);
    REQUIRE(contains(results[r].out, "rank " + std::to_string(r) + " step 8 ok"));
    REQUIRE(contains(results[r].out, "rank " + std::to_string(r) + " done"));
  }
}

TEST_CASE("emulated NCCL: NCCL_COMM_ID lets separately started ranks agree and re-init", "[nccl][multiprocess]") {
  const std::string address = "127.0.0.1:" + std::to_string(20000 + getpid() % 20000);
  const auto results = runJob(2, {"--id-from-env", "--reinit", "--steps", "2"}, {{"NCCL_COMM_ID", address}}, false);
  for (const ProcessResult& result : results) {
    INFO(describe(result));
    REQUIRE(result.exit_code == 0);
    REQUIRE(CountOccurrences(result.out, "step 2 ok") == 2);
  }
  const auto malformed = runJob(1, {"--id-from-env"}, {{"NCCL_COMM_ID", "no-port-here"}}, false);
  REQUIRE(malformed[0].exit_code == 10);
}

TEST_CASE("emulated NCCL fault hang: every rank blocks in the N-th collective", "[nccl][multiprocess][faults]") {
  const auto results = runJob(3, {"--steps", "5"}, {{"NCCLEMU_FAULTS", "hang:rank=1,seq=3"}});
  for (int r = 0; r < 3; ++r) {
    INFO(describe(results[r]));
    REQUIRE(results[r].exit_code == 3);
    REQUIRE(contains(results[r].out, "step 2 ok"));
    REQUIRE(contains(results[r].out, "stalled at step 3 async ncclSuccess"));
  }
}

TEST_CASE("emulated NCCL fault crash: the rank is SIGKILLed at its N-th collective", "[nccl][multiprocess][faults]") {
  const auto results = runJob(3, {"--steps", "4"}, {{"NCCLEMU_FAULTS", "crash:rank=1,seq=2"}});
  INFO(describe(results[1]));
  REQUIRE(results[1].signal == SIGKILL);
  REQUIRE(contains(results[1].out, "rank 1 step 1 ok"));
  for (int r : {0, 2}) {
    INFO(describe(results[r]));
    REQUIRE(results[r].exit_code == 3);
    REQUIRE(contains(results[r].out, "stalled at step 2"));
  }
}

TEST_CASE("emulated NCCL fault async_error: GetAsyncError and GetLastError on that rank", "[nccl][multiprocess][faults]") {
  const auto results = runJob(2, {"--steps", "3"},
                              {{"NCCLEMU_FAULTS", "async_error:rank=0,seq=2,code=ncclRemoteError"}, {"NCCL_DEBUG", "WARN"}});
  INFO(describe(results[0]));
  REQUIRE(results[0].exit_code == 3);
  REQUIRE(contains(results[0].out, "stalled at step 2 async ncclRemoteError last [failed to peer with device"));
  // The WARN line in NCCL's format: host:pid:tid [dev] file:line NCCL WARN text.
  REQUIRE(std::regex_search(results[0].out, std::regex(R"(\S+:\d+:\d+ \[0\] transport/p2p\.cc:\d+ NCCL WARN failed to peer with device 1)")));
  INFO(describe(results[1]));
  REQUIRE(results[1].exit_code == 3);
  REQUIRE(contains(results[1].out, "stalled at step 2 async ncclSuccess"));
}

TEST_CASE("emulated NCCL fault slow: the rank's collectives take longer, results stay right", "[nccl][multiprocess][faults]") {
  const auto start = std::chrono::steady_clock::now();
  const auto results = runJob(2, {"--steps", "3"}, {{"NCCLEMU_FAULTS", "slow:rank=1,ms=250"}});
  const auto elapsed = std::chrono::steady_clock::now() - start;
  for (const ProcessResult& result : results) {
    INFO(describe(result));
    REQUIRE(result.exit_code == 0);
  }
  // Rank 0 waits for rank 1 at every step.
  REQUIRE(elapsed >= std::chrono::milliseconds(750));
}

TEST_CASE("emulated NCCL fault init_hang: the others wait for that rank at init", "[nccl][multiprocess][faults]") {
  const auto results = runJob(2, {"--nonblocking", "--stall-ms", "800"}, {{"NCCLEMU_FAULTS", "init_hang:rank=1"}});
  for (int r = 0; r < 2; ++r) {
    INFO(describe(results[r]));
    REQUIRE(results[r].exit_code == 3);
    REQUIRE(contains(results[r].out, "rank " + std::to_string(r) + " init stalled"));
  }
  const auto other_rank = runJob(2, {"--nonblocking", "--steps", "1"}, {{"NCCLEMU_FAULTS", "init_hang:rank=5"}});
  for (const ProcessResult& result : other_rank) REQUIRE(result.exit_code == 0);
}

TEST_CASE("emulated NCCL fault p2p_stall: only while P2P is in use", "[nccl][multiprocess][faults]") {
  const Environment faults = {{"NCCLEMU_FAULTS", "p2p_stall:after=2"}};
  SECTION("P2P enabled: collectives after the second stall") {
    for (const ProcessResult& result : runJob(2, {"--steps", "4"}, faults)) {
      INFO(describe(result));
      REQUIRE(result.exit_code == 3);
      REQUIRE(contains(result.out, "step 2 ok"));
      REQUIRE(contains(result.out, "stalled at step 3"));
    }
  }
  SECTION("NCCL_P2P_DISABLE=1: everything completes") {
    Environment disabled = faults;
    disabled["NCCL_P2P_DISABLE"] = "1";
    for (const ProcessResult& result : runJob(2, {"--steps", "4"}, disabled)) {
      INFO(describe(result));
      REQUIRE(result.exit_code == 0);
    }
  }
  SECTION("no peer access between the GPUs: SHM, everything completes") {
    Environment no_access = faults;
    no_access["NCCLEMU_P2P_ACCESS"] = "0";
    for (const ProcessResult& result : runJob(2, {"--steps", "4"}, no_access)) {
      INFO(describe(result));
      REQUIRE(result.exit_code == 0);
    }
  }
}

TEST_CASE("emulated NCCL: a malformed NCCLEMU_FAULTS fails init and names the bad part", "[nccl][multiprocess][faults]") {
  const auto results = runJob(1, {}, {{"NCCLEMU_FAULTS", "slow:ms=5;hang:rank=1,sq=3"}, {"NCCL_DEBUG", "WARN"}});
  INFO(describe(results[0]));
  REQUIRE(results[0].exit_code == 2);
  REQUIRE(contains(results[0].out, "init failed ncclInvalidArgument [NCCLEMU_FAULTS: unknown key 'sq' for hang in 'hang:rank=1,sq=3']"));
  REQUIRE(contains(results[0].out, "NCCL WARN NCCLEMU_FAULTS: unknown key 'sq'"));
}

TEST_CASE("emulated NCCL: P2P settings are read once per loaded library", "[nccl][multiprocess]") {
  ncclguard::testing::TemporaryDirectory directory;
  const std::string copy = directory.path() + "/libnccl.so.2";
  std::filesystem::copy_file(std::string(EMU_LIB_DIR) + "/libnccl.so.2", copy);
  // The first communicator (one rank) fixes the linked library's P2P setting; the variable set
  // afterwards reaches only the copy, which reads it at its own first init.
  const std::vector<std::string> flags = {"--local", "2", "--first-ranks", "1", "--steps", "1", "--setenv-between",
                                          "NCCL_P2P_DISABLE=1", "--copy-lib", copy};
  SECTION("the transport report says P2P for the linked library and SHM for the copy") {
    std::vector<std::string> argv = flags;
    argv.insert(argv.end(), {"--then", "linked", "--then", "copy"});
    const ProcessResult result = runLocal(argv, {{"NCCL_DEBUG", "INFO"}});
    INFO(describe(result));
    REQUIRE(result.exit_code == 0);
    REQUIRE(CountOccurrences(result.out, "via P2P/direct pointer") == 2);
    REQUIRE(CountOccurrences(result.out, "via SHM/direct/direct") == 2);
    REQUIRE(CountOccurrences(result.out, "NCCL INFO NCCL_P2P_DISABLE set by environment to 1") == 1);
    REQUIRE(CountOccurrences(result.out, "Init COMPLETE") == 5);
    REQUIRE(std::regex_search(result.out, std::regex(R"(\S+:\d+:\d+ \[1\] NCCL INFO ncclCommInitAll comm 0x[0-9a-f]+ rank 1 nranks 2 cudaDev 1 )")));
  }
  SECTION("p2p_stall still hits the linked library after the variable is set") {
    std::vector<std::string> argv = flags;
    argv.insert(argv.end(), {"--then", "linked"});
    const ProcessResult result = runLocal(argv, {{"NCCLEMU_FAULTS", "p2p_stall:after=0"}});
    INFO(describe(result));
    REQUIRE(result.exit_code == 3);
    REQUIRE(contains(result.out, "communicator 2 (linked, 2 ranks)"));
    REQUIRE(contains(result.out, "stalled at step 1"));
  }
  SECTION("the copy of the library reads the variable and does not stall") {
    std::vector<std::string> argv = flags;
    argv.insert(argv.end(), {"--then", "copy"});
    const ProcessResult result = runLocal(argv, {{"NCCLEMU_FAULTS", "p2p_stall:after=0"}});
    INFO(describe(result));
    REQUIRE(result.exit_code == 0);
  }
  SECTION("NCCL_P2P_LEVEL below the GPUs' path type means SHM") {
    const ProcessResult result = runLocal({"--local", "2", "--steps", "1"}, {{"NCCL_DEBUG", "INFO"}, {"NCCL_P2P_LEVEL", "PIX"}});
    INFO(describe(result));
    REQUIRE(result.exit_code == 0);
    REQUIRE(CountOccurrences(result.out, "via SHM/direct/direct") == 2);
  }
  SECTION("a dlmopen namespace has its own copy: it reads the variable, the linked library still stalls") {
    std::vector<std::string> argv = flags;
    argv.insert(argv.end(), {"--then", "dlmopen", "--then", "linked", "--stall-ms", "500"});
    const ProcessResult result =
        runLocal(argv, {{"NCCL_DEBUG", "INFO"}, {"NCCLEMU_FAULTS", "p2p_stall:after=0"}});
    INFO(describe(result));
    REQUIRE(result.exit_code == 3);
    REQUIRE(contains(result.out, "communicator 2 (dlmopen, 2 ranks)\n"));
    REQUIRE(contains(result.out, "rank 1 step 1 ok\ncommunicator 3 (linked, 2 ranks)"));
    REQUIRE(contains(result.out, "rank 0 stalled at step 1"));
    REQUIRE(CountOccurrences(result.out, "via SHM/direct/direct") == 2);
    REQUIRE(CountOccurrences(result.out, "via P2P/direct pointer") == 2);
    REQUIRE(CountOccurrences(result.out, "NCCL INFO NCCL_P2P_DISABLE set by environment to 1") == 1);
  }
}

TEST_CASE("emulated NCCL: ncclCommInitRankScalable over several unique ids, one rank per process", "[nccl][multiprocess]") {
  const std::string first = newIdHex(), second = newIdHex();
  const auto results = runJob(3, {"--ids", first + "," + second, "--steps", "2"}, {}, false);
  for (int r = 0; r < 3; ++r) {
    INFO(describe(results[r]));
    REQUIRE(results[r].exit_code == 0);
    REQUIRE(contains(results[r].out, "rank " + std::to_string(r) + " step 2 ok"));
  }
  // Every id's bootstrap root is retired, the unused one included.
  CHECK_FALSE(std::filesystem::exists(rendezvousPath(first)));
  CHECK_FALSE(std::filesystem::exists(rendezvousPath(second)));
}

TEST_CASE("emulated NCCL logging: NCCL_DEBUG_FILE takes the lines off stdout, %h %p %% expanded", "[nccl][multiprocess][logging]") {
  ncclguard::testing::TemporaryDirectory directory;
  const Environment to_file = {{"NCCL_DEBUG_FILE", directory.path() + "/nccl-%h-%p-100%%.log"}};
  const std::vector<std::string> actions = {"--log-action", "warn", "--log-action", "init"};
  SECTION("WARN: the WARN line in the expanded file, nothing else") {
    Environment environment = to_file;
    environment["NCCL_DEBUG"] = "WARN";
    const ProcessResult result = runLocal(actions, environment);
    INFO(describe(result));
    REQUIRE(result.exit_code == 0);
    const WorkerIdentity who = identityOf(result);
    const std::string expected = "nccl-" + who.host + "-" + who.pid + "-100%.log";
    REQUIRE(filesIn(directory.path()) == std::vector<std::string>{expected});
    const std::string log = ncclguard::testing::ReadFile(directory.path() + "/" + expected);
    INFO(log);
    REQUIRE(std::regex_search(log, warnLine(who, "ncclCommCount : comm argument is NULL")));
    REQUIRE_FALSE(contains(log, "NCCL INFO"));
    REQUIRE_FALSE(contains(result.out, "NCCL "));
    REQUIRE_FALSE(contains(result.err, "NCCL "));
  }
  SECTION("INFO: INFO and WARN lines in the file") {
    Environment environment = to_file;
    environment["NCCL_DEBUG"] = "INFO";
    const ProcessResult result = runLocal(actions, environment);
    INFO(describe(result));
    REQUIRE(result.exit_code == 0);
    const WorkerIdentity who = identityOf(result);
    const std::string log =
        ncclguard::testing::ReadFile(directory.path() + "/nccl-" + who.host + "-" + who.pid + "-100%.log");
    INFO(log);
    REQUIRE(std::regex_search(log, warnLine(who, "ncclCommCount : comm argument is NULL")));
    REQUIRE(std::regex_search(log, infoLine(who, "Channel 00/0 : 0\\[0\\] -> 1\\[1\\] via P2P/direct pointer\n")));
    REQUIRE(std::regex_search(
        log, infoLine(who, "ncclCommInitAll comm 0x[0-9a-f]+ rank 1 nranks 2 cudaDev 1 .* - Init COMPLETE\n")));
    REQUIRE_FALSE(contains(result.out, "NCCL "));
    REQUIRE_FALSE(contains(result.err, "NCCL "));
  }
  SECTION("VERSION: no file is created") {
    Environment environment = to_file;
    environment["NCCL_DEBUG"] = "VERSION";
    const ProcessResult result = runLocal(actions, environment);
    INFO(describe(result));
    REQUIRE(result.exit_code == 0);
    REQUIRE(filesIn(directory.path()).empty());
  }
  SECTION("no NCCL_DEBUG_FILE: NCCL's default is stdout") {
    const ProcessResult result = runLocal(actions, {{"NCCL_DEBUG", "WARN"}});
    INFO(describe(result));
    REQUIRE(result.exit_code == 0);
    REQUIRE(std::regex_search(result.out, warnLine(identityOf(result), "ncclCommCount : comm argument is NULL")));
    REQUIRE_FALSE(contains(result.err, "NCCL "));
  }
}

TEST_CASE("emulated NCCL logging: ncclResetDebugInit makes a changed NCCL_DEBUG take effect", "[nccl][multiprocess][logging]") {
  ncclguard::testing::TemporaryDirectory directory;
  const std::string first_file = directory.path() + "/first-%p.log";
  const std::string second_file = directory.path() + "/second-%p.log";
  // The settings are read at the first log line and kept: setting NCCL_DEBUG later changes
  // nothing until ncclResetDebugInit; each reset closes the file and reads the variables again.
  const ProcessResult result = runLocal({"--log-action", "warn",                                  // silent
                                         "--log-action", "set:NCCL_DEBUG=WARN",
                                         "--log-action", "set:NCCL_DEBUG_FILE=" + first_file,
                                         "--log-action", "warn",                                  // still silent
                                         "--log-action", "reset",
                                         "--log-action", "warn",                                  // first file
                                         "--log-action", "set:NCCL_DEBUG=INFO",
                                         "--log-action", "set:NCCL_DEBUG_FILE=" + second_file,
                                         "--log-action", "reset",
                                         "--log-action", "init",                                  // second file
                                         "--log-action", "unset:NCCL_DEBUG",
                                         "--log-action", "reset",
                                         "--log-action", "warn"},                                 // silent
                                        {});
  INFO(describe(result));
  REQUIRE(result.exit_code == 0);
  const WorkerIdentity who = identityOf(result);
  REQUIRE(filesIn(directory.path()).size() == 2);
  const std::string first = ncclguard::testing::ReadFile(directory.path() + "/first-" + who.pid + ".log");
  const std::string second = ncclguard::testing::ReadFile(directory.path() + "/second-" + who.pid + ".log");
  INFO("first:\n" << first << "second:\n" << second);
  REQUIRE(CountOccurrences(first, "NCCL WARN ncclCommCount : comm argument is NULL") == 1);
  REQUIRE(std::regex_search(first, warnLine(who, "ncclCommCount : comm argument is NULL")));
  REQUIRE_FALSE(contains(first, "NCCL INFO"));
  REQUIRE(CountOccurrences(second, "Init COMPLETE") == 2);
  REQUIRE_FALSE(contains(second, "NCCL WARN"));
  REQUIRE_FALSE(contains(result.out, "NCCL "));
  REQUIRE_FALSE(contains(result.err, "NCCL "));
  // Whatever NCCL_DEBUG says, every WARN is the last error.
  REQUIRE(CountOccurrences(result.out, "last [ncclCommCount : comm argument is NULL]") == 4);
}
