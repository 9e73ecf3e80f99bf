#include "tests/support/process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "tests/support/redis_server.h"

extern char** environ;

namespace ncclguard::testing {
namespace {

// Whether a process of the group `group` has yet to end: one not a zombie (a SIGKILL takes effect
// only once the process leaves the kernel, and its memory is released first).
bool GroupHasLiving(pid_t group) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", error)) {
    std::ifstream file(entry.path() / "stat");
    std::string stat;
    if (!std::getline(file, stat)) continue;
    // "pid (comm) S ppid pgrp ...": the command may hold spaces and parentheses.
    const std::size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 1));
    std::string state;
    pid_t parent = 0;
    pid_t process_group = 0;
    if (!(fields >> state >> parent >> process_group)) continue;
    if (process_group == group && state != "Z" && state != "X") return true;
  }
  return false;
}

std::vector<std::string> BuildEnvironment(const ProcessOptions& options) {
  std::map<std::string, std::string> variables;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const size_t equals = text.find('=');
    if (equals == std::string::npos) continue;
    const std::string name = text.substr(0, equals);
    if (name == "LD_PRELOAD" || name.rfind("NCCLGUARD_", 0) == 0) continue;
    variables[name] = text.substr(equals + 1);
  }
  // The end-to-end tests' run on a Redis board: every program they start uses it.
  const auto dump_dir = options.environment.find("NCCLGUARD_DUMP_DIR");
  const std::string store =
      TestStore(dump_dir != options.environment.end() && dump_dir->second ? *dump_dir->second : "");
  if (!store.empty()) variables["NCCLGUARD_STORE"] = store;
  // The end-to-end tests' run on the other timing source (NCCLGUARD_TEST_PROFILER=0: CUDA events),
  // unless a test chooses itself.
  if (const char* profiler = std::getenv("NCCLGUARD_TEST_PROFILER"))
    variables["NCCLGUARD_PROFILER"] = profiler;
  for (const auto& [name, value] : options.environment) {
    if (value) {
      variables[name] = *value;
    } else {
      variables.erase(name);
    }
  }
  std::vector<std::string> result;
  for (const auto& [name, value] : variables) result.push_back(name + "=" + value);
  return result;
}

std::vector<char*> Pointers(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& text : strings) pointers.push_back(text.data());
  pointers.push_back(nullptr);
  return pointers;
}

}  // namespace

ProcessResult RunProcess(const std::vector<std::string>& argv, const ProcessOptions& options) {
  TemporaryDirectory capture;
  const std::string out_path = capture.path() + "/out";
  const std::string err_path = capture.path() + "/err";

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  if (!options.working_directory.empty()) {
    posix_spawn_file_actions_addchdir_np(&actions, options.working_directory.c_str());
  }
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  // Its own process group, so that a timeout kills the program and every child it started.
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);

  std::vector<std::string> arguments = argv;
  std::vector<std::string> environment = BuildEnvironment(options);
  std::vector<char*> argument_pointers = Pointers(arguments);
  std::vector<char*> environment_pointers = Pointers(environment);
  pid_t pid = 0;
  const int spawn_error = posix_spawnp(&pid, arguments[0].c_str(), &actions, &attributes,
                                       argument_pointers.data(), environment_pointers.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (spawn_error != 0) {
    throw std::runtime_error("cannot start " + arguments[0] + ": " + std::strerror(spawn_error));
  }

  ProcessResult result;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(options.timeout_seconds);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      result.timed_out = true;
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      // As a scheduler's kill is seen afterwards: every process of the job has ended, not only the
      // one started here (what reads the job next asks which of its processes are alive).
      const auto ended_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (GroupHasLiving(pid) && std::chrono::steady_clock::now() < ended_by) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  }
  result.out = ReadFile(out_path);
  result.err = ReadFile(err_path);
  return result;
}

TemporaryDirectory::TemporaryDirectory() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/ncclguard-test-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TemporaryDirectory::~TemporaryDirectory() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream content;
  content << file.rdbuf();
  return content.str();
}

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

int CountOccurrences(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

}  // namespace ncclguard::testing
