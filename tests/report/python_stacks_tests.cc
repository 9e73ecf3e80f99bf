// Python stacks: the parser of CPython's traceback text on hand-written samples ([parser], in the
// sanitizer builds too), and the capture in every CPython interpreter found on this machine
// ([interpreters]): a thread sleeping in save_checkpoint() while the main thread calls a probe
// library through ctypes.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/support/process.h"
#include "watchdog/report/python_stacks.h"

namespace ncclguard {
namespace {

TEST_CASE("the parser reads CPython's traceback text", "[parser]") {
  const PythonStacks stacks = ParsePythonTracebacks(
      "Thread 0x00007f3a2b7fe640 (most recent call first):\n"
      "  File \"/job/train.py\", line 88 in save_checkpoint\n"
      "  File \"/usr/lib/python3.12/threading.py\", line 1010 in run\n"
      "  File \"/usr/lib/python3.12/threading.py\", line 1073 in _bootstrap_inner\n"
      "\n"
      "Current thread 0x00007f3a3c1e9740 (most recent call first):\n"
      "  Garbage-collecting\n"
      "  File \"/job/train.py\", line 120 in <module>\n"
      "\n"
      "Thread 0x00007f3a2affd640 (most recent call first):\n"
      "  <no Python frame>\n",
      false);
  CHECK_FALSE(stacks.threads_truncated);
  REQUIRE(stacks.threads.size() == 3);

  const PythonThread& saver = stacks.threads[0];
  CHECK(saver.thread_id == 0x00007f3a2b7fe640);
  CHECK_FALSE(saver.current);
  CHECK_FALSE(saver.truncated);
  CHECK(saver.name == "");
  REQUIRE(saver.frames.size() == 3);
  CHECK(saver.frames[0].file == "/job/train.py");
  CHECK(saver.frames[0].line == 88);
  CHECK(saver.frames[0].function == "save_checkpoint");
  CHECK(saver.frames[2].function == "_bootstrap_inner");
  CHECK(saver.frames[2].line == 1073);

  const PythonThread& main = stacks.threads[1];
  CHECK(main.thread_id == 0x00007f3a3c1e9740);
  CHECK(main.current);
  REQUIRE(main.frames.size() == 1);
  CHECK(main.frames[0].function == "<module>");

  CHECK(stacks.threads[2].frames.empty());
  CHECK_FALSE(stacks.threads[2].current);
}

TEST_CASE("the parser reads the thread names of CPython 3.14", "[parser]") {
  const PythonStacks stacks = ParsePythonTracebacks(
      "Thread 0x00007f3a2b7fe640 [checkpointer] (most recent call first):\n"
      "  File \"a.py\", line 3 in f\n"
      "Current thread 0x00000000000004d2 [MainThread] (most recent call first):\n"
      "  File \"a.py\", line 9 in <module>\n",
      false);
  REQUIRE(stacks.threads.size() == 2);
  CHECK(stacks.threads[0].name == "checkpointer");
  CHECK(stacks.threads[1].name == "MainThread");
  CHECK(stacks.threads[1].thread_id == 1234);
  CHECK(stacks.threads[1].current);
  CHECK(stacks.threads[1].frames.size() == 1);
}

TEST_CASE("the parser takes unknown files, lines and functions, and quotes in file names", "[parser]") {
  const PythonStacks stacks = ParsePythonTracebacks(
      "Thread 0x1 (most recent call first):\n"
      "  File ???, line ??? in ???\n"
      "  File \"odd\", line 5 in x\", line 7 in g\n"
      "  File \"caf\\xe9\\u20ac.py\", line 2147483647 in \\U0001f600\n"
      "  File \"big.py\", line 99999999999 in too_big\n"
      "  File \"no-line.py\", line  in f\n",
      false);
  REQUIRE(stacks.threads.size() == 1);
  const std::vector<PythonFrame>& frames = stacks.threads[0].frames;
  REQUIRE(frames.size() == 3);
  CHECK(frames[0].file == "???");
  CHECK(frames[0].line == 0);
  CHECK(frames[0].function == "???");
  CHECK(frames[1].file == "odd\", line 5 in x");
  CHECK(frames[1].line == 7);
  CHECK(frames[1].function == "g");
  CHECK(frames[2].file == "caf\\xe9\\u20ac.py");
  CHECK(frames[2].line == 2147483647);
  CHECK(frames[2].function == "\\U0001f600");
}

TEST_CASE("the parser marks CPython's limits and a cut text as truncated", "[parser]") {
  SECTION("frames and threads beyond CPython's limits") {
    const PythonStacks stacks = ParsePythonTracebacks(
        "Thread 0x1 (most recent call first):\n"
        "  File \"a.py\", line 1 in f\n"
        "  ...\n"
        "\n"
        "Thread 0x2 (most recent call first):\n"
        "  File \"a.py\", line 1 in f\n"
        "plus 12 frames\n"
        "\n"
        "Thread 0x3 (most recent call first):\n"
        "  File \"a.py\", line 1 in f\n"
        "\n"
        "...\n",
        false);
    CHECK(stacks.threads_truncated);
    REQUIRE(stacks.threads.size() == 3);
    CHECK(stacks.threads[0].truncated);
    CHECK(stacks.threads[1].truncated);
    CHECK_FALSE(stacks.threads[2].truncated);
  }
  SECTION("a text cut in the middle of a line") {
    const PythonStacks stacks = ParsePythonTracebacks(
        "Thread 0x1 (most recent call first):\n"
        "  File \"a.py\", line 1 in f\n"
        "\n"
        "Thread 0x2 (most recent call first):\n"
        "  File \"a.py\", line 1 in g\n"
        "  File \"b.py\", li",
        true);
    CHECK(stacks.threads_truncated);
    REQUIRE(stacks.threads.size() == 2);
    CHECK_FALSE(stacks.threads[0].truncated);
    CHECK(stacks.threads[1].truncated);
    CHECK(stacks.threads[1].frames.size() == 1);
  }
  SECTION("a header cut in the middle") {
    const PythonStacks stacks =
        ParsePythonTracebacks("Thread 0x1 (most recent call first):\nThread 0x2 (most", true);
    REQUIRE(stacks.threads.size() == 1);
    CHECK(stacks.threads[0].truncated);
  }
}

TEST_CASE("the parser skips garbage", "[parser]") {
  SECTION("empty") {
    const PythonStacks stacks = ParsePythonTracebacks("", false);
    CHECK(stacks.threads.empty());
    CHECK_FALSE(stacks.threads_truncated);
  }
  SECTION("frames before any thread, bad headers and their frames, odd lines") {
    const PythonStacks stacks = ParsePythonTracebacks(
        "  File \"orphan.py\", line 1 in f\n"
        "Thread 0x (most recent call first):\n"
        "  File \"a.py\", line 1 in lost\n"
        "Thread 0x00000000000000001 (most recent call first):\n"
        "  File \"a.py\", line 1 in lost\n"
        "Thread 0xzz (most recent call first):\n"
        "Thread 0x10 [unclosed (most recent call first):\n"
        "Thread 0x10 (most recent call first)\n"
        "Fatal Python error: Segmentation fault\n"
        "Thread 0x20 (most recent call first):\r\n"
        "  File \"a.py\", line 4 in kept\r\n"
        "  File \"a.py\"\n"
        "  File a.py, line 4 in unquoted\n"
        "  File \"a.py\", line -4 in negative\n"
        "  File \"a.py\", line 4x in bad\n"
        "  <tstate is freed>\n"
        "\tFile \"a.py\", line 4 in tab\n",
        false);
    REQUIRE(stacks.threads.size() == 1);
    CHECK(stacks.threads[0].thread_id == 0x20);
    REQUIRE(stacks.threads[0].frames.size() == 1);
    CHECK(stacks.threads[0].frames[0].function == "kept");
  }
  SECTION("random bytes, NULs included") {
    std::string text;
    std::uint32_t state = 12345;
    for (int i = 0; i < 200000; ++i) {
      state = state * 1103515245 + 12345;
      text.push_back(static_cast<char>(state >> 24));
      if (i % 997 == 0) text += "\nThread 0x1 (most recent call first):\n  File \"x\", line 1 in y\n";
    }
    const PythonStacks stacks = ParsePythonTracebacks(text, true);
    CHECK(stacks.threads.size() <= 1000);
  }
}

TEST_CASE("the parser bounds what it keeps of a huge text", "[parser]") {
  SECTION("threads") {
    std::string text;
    for (int thread = 0; thread < 3000; ++thread)
      text += "Thread 0x1 (most recent call first):\n  File \"a\", line 1 in f\n";
    const PythonStacks stacks = ParsePythonTracebacks(text, false);
    CHECK(stacks.threads.size() == 1000);
    CHECK(stacks.threads_truncated);
  }
  SECTION("frames") {
    std::string text = "Thread 0x1 (most recent call first):\n";
    for (int frame = 0; frame < 5000; ++frame) text += "  File \"a\", line 1 in f\n";
    const PythonStacks stacks = ParsePythonTracebacks(text, false);
    REQUIRE(stacks.threads.size() == 1);
    CHECK(stacks.threads[0].frames.size() == 1000);
    CHECK(stacks.threads[0].truncated);
  }
  SECTION("names") {
    const std::string long_name(100000, 'n');
    const PythonStacks stacks = ParsePythonTracebacks(
        "Thread 0x1 [" + long_name + "] (most recent call first):\n  File \"" + long_name + "\", line 1 in " +
            long_name + "\n" + std::string(10 << 20, 'x'),
        false);
    REQUIRE(stacks.threads.size() == 1);
    CHECK(stacks.threads[0].name.size() == 8192);
    REQUIRE(stacks.threads[0].frames.size() == 1);
    CHECK(stacks.threads[0].frames[0].file.size() == 8192);
    CHECK(stacks.threads[0].frames[0].function.size() == 8192);
  }
}

TEST_CASE("a process without Python has no Python stacks", "[no-python]") {
  CHECK(CapturePythonStacks() == std::nullopt);
}

// Every CPython 3 interpreter on this machine: pyenv's (python3.N, N >= 9), Debian's
// /usr/bin/python3, and python3 on PATH; one per executable they resolve to.
std::vector<std::string> Interpreters() {
  std::vector<std::string> candidates;
  namespace fs = std::filesystem;
  std::error_code error;
  const char* home = getenv("HOME");
  const std::string pyenv = getenv("PYENV_ROOT") != nullptr ? std::string(getenv("PYENV_ROOT"))
                            : home != nullptr               ? std::string(home) + "/.pyenv"
                                                            : std::string();
  const std::regex versioned("python3\\.([0-9]+)");
  if (!pyenv.empty() && fs::is_directory(pyenv + "/versions", error)) {
    for (const auto& version : fs::directory_iterator(pyenv + "/versions", error)) {
      for (const auto& entry : fs::directory_iterator(version.path() / "bin", error)) {
        std::smatch match;
        const std::string name = entry.path().filename().string();
        if (std::regex_match(name, match, versioned) && std::stoi(match[1]) >= 9) {
          candidates.push_back(entry.path().string());
        }
      }
    }
  }
  candidates.push_back("/usr/bin/python3");
  if (const char* path = getenv("PATH")) {
    std::string directories = path;
    for (std::size_t start = 0; start <= directories.size();) {
      const std::size_t end = std::min(directories.find(':', start), directories.size());
      const std::string candidate = directories.substr(start, end - start) + "/python3";
      if (access(candidate.c_str(), X_OK) == 0) {
        candidates.push_back(candidate);
        break;
      }
      start = end + 1;
    }
  }
  // A pyenv shim or a symbolic link runs an interpreter of the list already: asked which.
  std::vector<std::string> interpreters;
  std::set<std::string> executables;
  for (const std::string& candidate : candidates) {
    if (access(candidate.c_str(), X_OK) != 0) continue;
    const testing::ProcessResult which =
        testing::RunProcess({candidate, "-c", "import os, sys; print(os.path.realpath(sys.executable))"},
                            {.environment = {}, .timeout_seconds = 30, .working_directory = ""});
    if (which.exit_code != 0) continue;
    const std::string executable = which.out.substr(0, which.out.find('\n'));
    if (executables.insert(executable).second) interpreters.push_back(candidate);
  }
  return interpreters;
}

const nlohmann::json* FindThread(const nlohmann::json& stacks, std::uint64_t id) {
  for (const nlohmann::json& thread : stacks["threads"]) {
    if (thread["thread_id"].get<std::uint64_t>() == id) return &thread;
  }
  return nullptr;
}

void CheckFrame(const nlohmann::json& frame, const std::string& file, int line, const std::string& function) {
  INFO(frame.dump());
  CHECK(frame["file"] == file);
  CHECK(frame["line"] == line);
  CHECK(frame["function"] == function);
}

// What the probe took, on its own thread (no thread current) or on the calling Python thread.
void CheckStacks(const nlohmann::json& run, const nlohmann::json& stacks, bool from_caller) {
  INFO((from_caller ? "from the calling thread: " : "from a thread of its own: ") << stacks.dump());
  CHECK(stacks["python"] == true);
  if (stacks["python"] != true) return;
  CHECK(stacks["unavailable"] == "");
  CHECK(stacks["version"] == run["version"]);
  CHECK(stacks["threads_truncated"] == false);
  CHECK(stacks["seconds"].get<double>() < 1.0);
  const std::string script = run["script"];
  const nlohmann::json& lines = run["lines"];

  const nlohmann::json* saver = FindThread(stacks, run["saver_thread"]);
  CHECK(saver != nullptr);
  if (saver != nullptr) {
    CHECK((*saver)["current"] == false);
    const nlohmann::json& frames = (*saver)["frames"];
    CHECK(frames.size() >= 2);
    if (frames.size() >= 2) {
      CheckFrame(frames[0], script, lines["SLEEP"], "save_checkpoint");
      CHECK(frames[1]["function"] == "run");
      CHECK_THAT(frames[1]["file"].get<std::string>(), Catch::EndsWith("/threading.py"));
    }
  }

  const nlohmann::json* main = FindThread(stacks, run["main_thread"]);
  CHECK(main != nullptr);
  if (main != nullptr) {
    CHECK((*main)["current"] == from_caller);
    const nlohmann::json& frames = (*main)["frames"];
    CHECK(frames.size() == 3);
    if (frames.size() == 3) {
      CheckFrame(frames[0], script, lines["PROBE"], "call_probe");
      CheckFrame(frames[1], script, from_caller ? lines["MAIN_CALLER"] : lines["MAIN"], "main");
      CheckFrame(frames[2], script, lines["ENTRY"], "<module>");
    }
  }

  for (const nlohmann::json& thread : stacks["threads"]) {
    if (thread["thread_id"] != run["main_thread"]) CHECK(thread["current"] == false);
  }
}

TEST_CASE("the stacks of every Python thread, in every CPython interpreter found", "[interpreters]") {
  const std::vector<std::string> interpreters = Interpreters();
  REQUIRE_FALSE(interpreters.empty());
  std::string covered;
  for (const std::string& interpreter : interpreters) {
    INFO(interpreter);
    const testing::ProcessResult result = testing::RunProcess(
        {interpreter, NCCLGUARD_PYTHON_STACKS_SCRIPT, NCCLGUARD_PYTHON_STACKS_PROBE},
        {.environment = {{"PYTHONDONTWRITEBYTECODE", "1"}}, .timeout_seconds = 60, .working_directory = ""});
    INFO(result.out << result.err);
    CHECK(result.exit_code == 0);
    if (result.exit_code != 0) continue;
    const nlohmann::json run = nlohmann::json::parse(result.out);
    const std::string version = run["version"];
    const std::string executable = run["executable"];
    INFO("Python " << version << " at " << executable);
    if (std::stoi(version.substr(version.find('.') + 1)) < 9) {
      // Older than the versions the reader is known in: refused with a reason.
      CHECK_THAT(run["from_watchdog"]["unavailable"].get<std::string>(), Catch::Contains("not supported"));
      CHECK(run["from_watchdog"]["threads"].empty());
      std::printf("Python %s (%s): refused as unsupported\n", version.c_str(), executable.c_str());
      continue;
    }
    CheckStacks(run, run["from_watchdog"], false);
    CheckStacks(run, run["from_caller"], true);
    std::printf("Python %s (%s): stacks taken in %.2f ms from a thread of the probe, %.2f ms from Python's\n",
                version.c_str(), executable.c_str(), run["from_watchdog"]["seconds"].get<double>() * 1000,
                run["from_caller"]["seconds"].get<double>() * 1000);
    covered += " " + version;
  }
  std::printf("Python interpreters covered:%s\n", covered.c_str());
  CHECK_FALSE(covered.empty());
}

}  // namespace
}  // namespace ncclguard
