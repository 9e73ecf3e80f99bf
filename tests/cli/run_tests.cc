// `ncclguard run` end to end: the built command runs small shell scripts that exit with the
// restart code a given number of times, report the environment they were given, trap signals or
// die of one. Each test runs under `env -i`, so that a launcher's job id in the environment of the
// test run cannot change what the command does.
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/support/process.h"

using ncclguard::testing::CountOccurrences;
using ncclguard::testing::ProcessResult;
using ncclguard::testing::ReadFile;
using ncclguard::testing::RunProcess;
using ncclguard::testing::SplitLines;
using ncclguard::testing::TemporaryDirectory;

namespace {

constexpr int kRestartCode = 75;
constexpr int kUsageError = 2;

// Counts its attempts in the file `count` beside itself and logs one line per attempt with the
// variables `run` sets; exits with the restart code for its first $1 attempts, then with $2.
constexpr char kRestartingScript[] = R"(#!/bin/sh
here=$(dirname "$0")
attempt=$(( $(cat "$here/count" 2>/dev/null || echo 0) + 1 ))
echo "$attempt" > "$here/count"
echo "attempt=$attempt LD_PRELOAD=$LD_PRELOAD NCCLGUARD_JOB_ID=$NCCLGUARD_JOB_ID NCCLGUARD_LAUNCH_ID=$NCCLGUARD_LAUNCH_ID" >> "$here/log"
[ "$attempt" -le "$1" ] && exit 75
exit "$2"
)";

// Traps signal $1 and exits with $2 when it arrives; says it is ready (with the pid of `run`, its
// parent) by creating `ready` atomically. The sleeper runs in the background so that `wait`
// returns as soon as the trap fires.
constexpr char kTrappingScript[] = R"(#!/bin/sh
here=$(dirname "$0")
attempt=$(( $(cat "$here/count" 2>/dev/null || echo 0) + 1 ))
echo "$attempt" > "$here/count"
[ "$attempt" -gt 1 ] && exit 0
trap 'kill $sleeper; echo "trapped $1" >> "$here/log"; exit $2' "$1"
sleep 30 & sleeper=$!
echo $PPID > "$here/ready.tmp" && mv "$here/ready.tmp" "$here/ready"
wait $sleeper
exit 1
)";

struct Scripts {
  Scripts() {
    Write("restarting.sh", kRestartingScript);
    Write("trapping.sh", kTrappingScript);
  }
  void Write(const std::string& name, const std::string& text) const {
    const std::string path = directory.path() + "/" + name;
    std::ofstream(path) << text;
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  }
  std::string Path(const std::string& name) const { return directory.path() + "/" + name; }
  int Attempts() const {
    const std::string count = ReadFile(Path("count"));
    return count.empty() ? 0 : std::stoi(count);
  }
  std::vector<std::string> Log() const { return SplitLines(ReadFile(Path("log"))); }
  TemporaryDirectory directory;
};

// ncclguard run ARGUMENTS with only PATH and `variables` in its environment.
ProcessResult NcclguardRun(const std::vector<std::string>& arguments,
                           const std::map<std::string, std::string>& variables = {}) {
  std::vector<std::string> argv{"env", "-i", "PATH=/usr/bin:/bin"};
  for (const auto& [name, value] : variables) argv.push_back(name + "=" + value);
  argv.push_back(NCCLGUARD_COMMAND);
  argv.push_back("run");
  argv.insert(argv.end(), arguments.begin(), arguments.end());
  ncclguard::testing::ProcessOptions options;
  options.timeout_seconds = 30;
  return RunProcess(argv, options);
}

std::string Transcript(const ProcessResult& result) {
  return "exit " + std::to_string(result.exit_code) + "\n--- stdout\n" + result.out + "--- stderr\n" +
         result.err;
}

// The value of `name` in a log line "attempt=N LD_PRELOAD=... NCCLGUARD_JOB_ID=...".
std::string Field(const std::string& line, const std::string& name) {
  const std::size_t start = line.find(name + "=");
  if (start == std::string::npos) return "";
  const std::size_t value = start + name.size() + 1;
  return line.substr(value, line.find(' ', value) - value);
}

bool WaitForFile(const std::string& path) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!std::filesystem::exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Runs trapping.sh for `trapped` (exit with `exit_code` when it arrives) under `ncclguard run`,
// sends `sent` to the `run` process once the script is ready, and returns what `run` returned.
ProcessResult SignalRun(const Scripts& scripts, const std::string& trapped, int sent, int exit_code) {
  auto running = std::async(std::launch::async, [&] {
    return NcclguardRun({"--", scripts.Path("trapping.sh"), trapped, std::to_string(exit_code)});
  });
  const bool ready = WaitForFile(scripts.Path("ready"));
  if (ready) kill(std::stoi(ReadFile(scripts.Path("ready"))), sent);
  ProcessResult result = running.get();
  INFO(Transcript(result));
  REQUIRE(ready);
  return result;
}

}  // namespace

TEST_CASE("the command is restarted while it exits with the restart code") {
  Scripts scripts;
  const ProcessResult result = NcclguardRun({"--", scripts.Path("restarting.sh"), "2", "0"});
  INFO(Transcript(result));
  CHECK(result.exit_code == 0);
  CHECK(scripts.Attempts() == 3);
  CHECK(CountOccurrences(result.err, "ncclguard run: attempt 1 of 4: ") == 1);
  CHECK(CountOccurrences(result.err,
                         "ncclguard run: attempt 2 of 4 after exit code 75 (ncclguard restart)") == 1);
  CHECK(CountOccurrences(result.err,
                         "ncclguard run: attempt 3 of 4 after exit code 75 (ncclguard restart)") == 1);
  CHECK(CountOccurrences(result.err, "attempt 4") == 0);
}

TEST_CASE("the restarts are bounded by --max-restarts, and the last restart code is returned") {
  Scripts scripts;
  SECTION("--max-restarts 0 never restarts") {
    const ProcessResult result =
        NcclguardRun({"--max-restarts", "0", "--", scripts.Path("restarting.sh"), "5", "0"});
    INFO(Transcript(result));
    CHECK(result.exit_code == kRestartCode);
    CHECK(scripts.Attempts() == 1);
    CHECK(CountOccurrences(result.err, "giving up") == 1);
  }
  SECTION("--max-restarts 2 runs three attempts") {
    const ProcessResult result =
        NcclguardRun({"--max-restarts", "2", "--", scripts.Path("restarting.sh"), "5", "0"});
    INFO(Transcript(result));
    CHECK(result.exit_code == kRestartCode);
    CHECK(scripts.Attempts() == 3);
    CHECK(CountOccurrences(result.err, "attempt 3 of 3 after exit code 75") == 1);
    CHECK(CountOccurrences(result.err, "giving up: exit code 75 after 2 restarts") == 1);
  }
  SECTION("a negative count is a usage error") {
    const ProcessResult result =
        NcclguardRun({"--max-restarts", "-1", "--", scripts.Path("restarting.sh"), "0", "0"});
    INFO(Transcript(result));
    CHECK(result.exit_code == kUsageError);
    CHECK(scripts.Attempts() == 0);
  }
}

TEST_CASE("any other exit code is returned at once, without a restart") {
  Scripts scripts;
  for (const int code : {0, 1, 3, 74, 76}) {
    std::filesystem::remove(scripts.Path("count"));
    const ProcessResult result =
        NcclguardRun({"--", scripts.Path("restarting.sh"), "0", std::to_string(code)});
    INFO(Transcript(result));
    CHECK(result.exit_code == code);
    CHECK(scripts.Attempts() == 1);
    CHECK(CountOccurrences(result.err, "after exit code") == 0);
  }
}

TEST_CASE("the library installed beside the command is preloaded, first and once") {
  Scripts scripts;
  // As the command finds it: through its own path, symbolic links resolved.
  const std::filesystem::path library = std::filesystem::canonical(NCCLGUARD_LIBRARY);
  std::string existing;
  std::string expected;
  SECTION("no LD_PRELOAD before") { expected = library.string(); }
  SECTION("prepended to an existing LD_PRELOAD") {
    existing = "libm.so.6";
    expected = library.string() + ":libm.so.6";
  }
  SECTION("moved to the front, not repeated, when LD_PRELOAD has it already") {
    existing = "libm.so.6 " + library.string();
    expected = library.string() + ":libm.so.6";
  }
  std::map<std::string, std::string> variables;
  if (!existing.empty()) variables["LD_PRELOAD"] = existing;
  const ProcessResult result = NcclguardRun({"--", scripts.Path("restarting.sh"), "1", "0"}, variables);
  INFO(Transcript(result));
  CHECK(result.exit_code == 0);
  const std::vector<std::string> log = scripts.Log();
  REQUIRE(log.size() == 2);
  for (const std::string& line : log) CHECK(Field(line, "LD_PRELOAD") == expected);
}

TEST_CASE("the library can be chosen, and one that does not exist is an error, never a run without it") {
  Scripts scripts;
  SECTION("an existing library") {
    const std::string copy = scripts.Path("libcopy.so");
    std::filesystem::copy_file(NCCLGUARD_LIBRARY, copy);
    const ProcessResult result =
        NcclguardRun({"--library", copy, "--", scripts.Path("restarting.sh"), "0", "0"});
    INFO(Transcript(result));
    CHECK(result.exit_code == 0);
    REQUIRE(scripts.Log().size() == 1);
    CHECK(Field(scripts.Log()[0], "LD_PRELOAD") == copy);
  }
  SECTION("a missing library") {
    const std::string missing = scripts.Path("no-such-libncclguard.so");
    const ProcessResult result =
        NcclguardRun({"--library", missing, "--", scripts.Path("restarting.sh"), "0", "0"});
    INFO(Transcript(result));
    CHECK(result.exit_code == kUsageError);
    CHECK(scripts.Attempts() == 0);
    CHECK(CountOccurrences(result.err, "no ncclguard library at " + missing) == 1);
  }
  SECTION("a file that is not a shared object, or one without NCCL's functions") {
    const std::string not_elf = scripts.Path("passwd");
    std::filesystem::copy_file("/etc/passwd", not_elf);
    for (const auto& [library, why] :
         {std::pair{not_elf, std::string("is not a 64-bit ELF file")},
          std::pair{std::string(NCCLGUARD_COMMAND), std::string("does not export ncclGetVersion")}}) {
      const ProcessResult result =
          NcclguardRun({"--library", library, "--", scripts.Path("restarting.sh"), "0", "0"});
      INFO(Transcript(result));
      CHECK(result.exit_code == kUsageError);
      CHECK(scripts.Attempts() == 0);
      CHECK(CountOccurrences(result.err, library + " " + why + ": it is not an ncclguard library") == 1);
    }
  }
}

TEST_CASE("every attempt belongs to the same job") {
  Scripts scripts;
  SECTION("without a job id, run names one for all its attempts") {
    const ProcessResult result = NcclguardRun({"--", scripts.Path("restarting.sh"), "2", "0"});
    INFO(Transcript(result));
    const std::vector<std::string> log = scripts.Log();
    REQUIRE(log.size() == 3);
    const std::string job_id = Field(log[0], "NCCLGUARD_JOB_ID");
    CHECK(job_id.rfind("run-", 0) == 0);
    for (const std::string& line : log) CHECK(Field(line, "NCCLGUARD_JOB_ID") == job_id);
    // The attempts are one launch: each follows the P2P verdict of the one before.
    for (const std::string& line : log) CHECK(Field(line, "NCCLGUARD_LAUNCH_ID") == job_id);
    CHECK(CountOccurrences(result.err, "(job id " + job_id) == 1);
  }
  SECTION("the user's NCCLGUARD_JOB_ID is kept") {
    NcclguardRun({"--", scripts.Path("restarting.sh"), "1", "0"}, {{"NCCLGUARD_JOB_ID", "nightly-7"}});
    const std::vector<std::string> log = scripts.Log();
    REQUIRE(log.size() == 2);
    for (const std::string& line : log) CHECK(Field(line, "NCCLGUARD_JOB_ID") == "nightly-7");
    // Another run given the same job id is another launch: its own id, the same for its attempts.
    const std::string launch = Field(log[0], "NCCLGUARD_LAUNCH_ID");
    CHECK(launch.rfind("run-", 0) == 0);
    for (const std::string& line : log) CHECK(Field(line, "NCCLGUARD_LAUNCH_ID") == launch);
  }
  SECTION("a launcher's job id, as run sees it, holds for every attempt") {
    const ProcessResult result =
        NcclguardRun({"--", scripts.Path("restarting.sh"), "1", "0"}, {{"SLURM_JOB_ID", "4242"}});
    INFO(Transcript(result));
    const std::vector<std::string> log = scripts.Log();
    REQUIRE(log.size() == 2);
    for (const std::string& line : log) CHECK(Field(line, "NCCLGUARD_JOB_ID") == "slurm-4242");
    // Whatever step srun gives each attempt, they are one launch.
    for (const std::string& line : log) CHECK(Field(line, "NCCLGUARD_LAUNCH_ID") == "slurm-4242");
    CHECK(CountOccurrences(result.err, "(job id slurm-4242,") == 1);
  }
}

// The job's processes never list the job directory: run, after each attempt, removes the
// temporaries its processes of this host left when killed in a write (temporaries.h).
TEST_CASE("after an attempt, run removes the temporaries its gone processes left") {
  Scripts scripts;
  // A temporary of the script's own shell (gone when run looks) and one of run itself (alive).
  scripts.Write("leaving.sh",
                "#!/bin/sh\n"
                "mkdir -p -m 700 \"$1\"\n"
                ": > \"$1/.tmp-status-a.json~$2~$$~0\"\n"
                ": > \"$1/.tmp-status-b.json~$2~$PPID~0\"\n"
                "echo $PPID > \"$1/run-pid\"\n");
  char host[256] = {};
  REQUIRE(gethostname(host, sizeof(host) - 1) == 0);
  const std::string job_dir = scripts.directory.path() + "/dumps/cleanup-job";
  const ProcessResult result = NcclguardRun(
      {"--", scripts.Path("leaving.sh"), job_dir, host},
      {{"NCCLGUARD_DUMP_DIR", scripts.directory.path() + "/dumps"}, {"NCCLGUARD_JOB_ID", "cleanup-job"}});
  INFO(Transcript(result));
  REQUIRE(result.exit_code == 0);
  const std::string run_pid =
      ReadFile(job_dir + "/run-pid").substr(0, ReadFile(job_dir + "/run-pid").find('\n'));
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(job_dir)) {
    if (entry.path().filename().string().rfind(".tmp-", 0) == 0) left.push_back(entry.path().filename());
  }
  REQUIRE(left.size() == 1);
  CHECK(left[0] == ".tmp-status-b.json~" + std::string(host) + "~" + run_pid + "~0");
}

TEST_CASE("with --redis, every attempt has the same Redis job board, and it ends with run") {
  Scripts scripts;
  // Each attempt counts itself on the board it was given, with the password it was given; and
  // notes what the board answers to one who lacks it, and the mode of the password's file.
  scripts.Write("counting.sh", R"sh(#!/bin/sh
port=${NCCLGUARD_STORE##*:}; port=${port%/0}
password=$(cat "$NCCLGUARD_STORE_AUTH_FILE")
count=$(redis-cli --no-auth-warning -a "$password" -p "$port" INCR attempts)
stranger=$(redis-cli -p "$port" GET attempts 2>&1 | cut -d' ' -f1)
echo "$NCCLGUARD_STORE $count $stranger $(stat -c %a "$NCCLGUARD_STORE_AUTH_FILE")" >> "$(dirname "$0")/log"
echo "$NCCLGUARD_STORE_AUTH_FILE" > "$(dirname "$0")/auth-file"
[ "$(redis-cli --no-auth-warning -a "$password" -p "$port" GET attempts)" -lt 3 ] && exit 75
exit 0
)sh");
  const ProcessResult result = NcclguardRun({"--redis", "--", scripts.Path("counting.sh")});
  INFO(Transcript(result));
  CHECK(result.exit_code == 0);
  const std::vector<std::string> log = scripts.Log();
  REQUIRE(log.size() == 3);
  const std::string store = log[0].substr(0, log[0].find(' '));
  CHECK(store.rfind("redis://", 0) == 0);
  // The board answers only the job: one without the password is refused.
  for (int attempt = 1; attempt <= 3; ++attempt)
    CHECK(log[attempt - 1] == store + " " + std::to_string(attempt) + " NOAUTH 600");
  CHECK(CountOccurrences(result.err, ", NCCLGUARD_STORE=" + store + ")") == 1);
  // Stopped with run: nothing answers on its port any more.
  const std::string port = store.substr(store.rfind(':') + 1, store.size() - store.rfind(':') - 3);
  const ProcessResult ping = RunProcess({"redis-cli", "-p", port, "PING"}, {});
  CHECK(ping.out.find("PONG") == std::string::npos);
  // And the password of a server that is gone is gone too.
  const std::string auth_file = ReadFile(scripts.Path("auth-file"));
  REQUIRE_FALSE(auth_file.empty());
  CHECK_FALSE(std::filesystem::exists(auth_file.substr(0, auth_file.find('\n'))));
}

TEST_CASE(
    "run refuses --redis beside a second board, or a server that cannot start, before running anything") {
  Scripts scripts;
  const ProcessResult both = NcclguardRun({"--redis", "--", scripts.Path("restarting.sh"), "0", "0"},
                                          {{"NCCLGUARD_STORE", "redis://elsewhere:6379/0"}});
  CHECK(both.exit_code == kUsageError);
  CHECK(both.err.find("name two job boards") != std::string::npos);
  const ProcessResult missing = NcclguardRun({"--redis", "--redis-server", "/nonexistent/redis-server", "--",
                                              scripts.Path("restarting.sh"), "0", "0"});
  CHECK(missing.exit_code == kUsageError);
  CHECK(missing.err.find("cannot start the job board (--redis)") != std::string::npos);
  // A server that exits at once, its password unread, fails the same way: run is never killed by
  // the pipe it gave the password through.
  const ProcessResult exits = NcclguardRun(
      {"--redis", "--redis-server", "/bin/false", "--", scripts.Path("restarting.sh"), "0", "0"});
  CHECK(exits.exit_code == kUsageError);
  CHECK(exits.err.find("exited with code 1 before answering") != std::string::npos);
  CHECK(scripts.Attempts() == 0);
}

TEST_CASE("SIGTERM sent to run reaches the command, whose status run returns") {
  Scripts scripts;
  const ProcessResult result = SignalRun(scripts, "TERM", SIGTERM, 42);
  CHECK(result.exit_code == 42);
  CHECK(scripts.Log() == std::vector<std::string>{"trapped TERM"});
}

TEST_CASE("after a SIGTERM, a restart code ends the run instead of restarting") {
  Scripts scripts;
  const ProcessResult result = SignalRun(scripts, "TERM", SIGTERM, kRestartCode);
  CHECK(result.exit_code == kRestartCode);
  CHECK(scripts.Attempts() == 1);
  CHECK(CountOccurrences(result.err, "not restarting after SIGTERM") == 1);
}

TEST_CASE("SIGUSR1 is forwarded and does not stop restarts") {
  Scripts scripts;
  const ProcessResult result = SignalRun(scripts, "USR1", SIGUSR1, kRestartCode);
  CHECK(result.exit_code == 0);
  CHECK(scripts.Attempts() == 2);
  CHECK(scripts.Log() == std::vector<std::string>{"trapped USR1"});
}

TEST_CASE("a command killed by signal S makes run exit with 128+S") {
  Scripts scripts;
  scripts.Write("killed.sh", "#!/bin/sh\nkill -KILL $$\n");
  const ProcessResult result = NcclguardRun({"--", scripts.Path("killed.sh")});
  INFO(Transcript(result));
  CHECK(result.signal == 0);
  CHECK(result.exit_code == 128 + SIGKILL);
}

TEST_CASE("a command that cannot be found exits 127 with a message") {
  for (const std::string command : {"no-such-command-for-ncclguard", "/no/such/directory/command"}) {
    const ProcessResult result = NcclguardRun({"--", command, "argument"});
    INFO(Transcript(result));
    CHECK(result.exit_code == 127);
    CHECK(CountOccurrences(result.err,
                           "ncclguard run: cannot run " + command + ": No such file or directory") == 1);
  }
}
