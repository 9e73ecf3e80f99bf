// What preloading libncclguard.so costs a process that never calls NCCL: the time to start and
// finish /bin/true and a small C++ program, without and with LD_PRELOAD, in alternating rounds so
// that a busy machine slows both alike. Prints milliseconds per start and the difference, the
// median over rounds, of wall time and of the CPU time the process itself used (user + system,
// from wait4()): the loader's work, which other processes on a busy machine do not inflate.
//
//   start_bench [--smoke] [--rounds R] [--starts N] [--preload LIBRARY]
//
// --preload measures another build's library (an older layout) in place of this build's.
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace {

struct Options {
  int rounds = 15;
  int starts = 20;  // per round and per side: 300 of each in all by default
  std::string preload = PRELOAD_LIBRARY;
};

// The environment with LD_PRELOAD set to `preload`, or removed when it is empty.
std::vector<std::string> EnvironmentWith(const std::string& preload) {
  std::vector<std::string> variables;
  for (char** variable = environ; *variable != nullptr; ++variable) {
    if (std::strncmp(*variable, "LD_PRELOAD=", 11) != 0) variables.emplace_back(*variable);
  }
  if (!preload.empty()) variables.push_back("LD_PRELOAD=" + preload);
  return variables;
}

struct PerStart {
  double wall_ms = 0;
  double cpu_ms = 0;
};

double Ms(const timeval& time) { return time.tv_sec * 1e3 + time.tv_usec / 1e3; }

// Milliseconds per start of `program`, over `starts` starts one after the other.
PerStart MsPerStart(const char* program, const std::vector<std::string>& environment, int starts) {
  std::vector<char*> envp;
  for (const std::string& variable : environment) envp.push_back(const_cast<char*>(variable.c_str()));
  envp.push_back(nullptr);
  char* argv[] = {const_cast<char*>(program), nullptr};
  double cpu_ms = 0;
  const auto begin = std::chrono::steady_clock::now();
  for (int i = 0; i < starts; ++i) {
    pid_t pid = 0;
    if (posix_spawn(&pid, program, nullptr, nullptr, argv, envp.data()) != 0) {
      std::fprintf(stderr, "start_bench: cannot start %s\n", program);
      std::exit(1);
    }
    int status = 0;
    rusage usage{};
    wait4(pid, &status, 0, &usage);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "start_bench: %s failed (status %d)\n", program, status);
      std::exit(1);
    }
    cpu_ms += Ms(usage.ru_utime) + Ms(usage.ru_stime);
  }
  const std::chrono::duration<double, std::milli> elapsed = std::chrono::steady_clock::now() - begin;
  return {elapsed.count() / starts, cpu_ms / starts};
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : (values[middle - 1] + values[middle]) / 2;
}

void Measure(const char* label, const char* program, const Options& options) {
  const std::vector<std::string> plain = EnvironmentWith("");
  const std::vector<std::string> preloaded = EnvironmentWith(options.preload);
  std::vector<double> wall[2];
  std::vector<double> cpu[2];
  for (int round = 0; round < options.rounds; ++round) {
    for (int side = 0; side < 2; ++side) {
      const PerStart per_start = MsPerStart(program, side == 0 ? plain : preloaded, options.starts);
      wall[side].push_back(per_start.wall_ms);
      cpu[side].push_back(per_start.cpu_ms);
    }
  }
  std::printf(
      "%-12s %5d starts each, ms per start: wall %.3f without, %.3f with, added_ms_per_start %.3f;"
      " cpu %.3f without, %.3f with, added_cpu_ms_per_start %.3f\n",
      label, options.rounds * options.starts, Median(wall[0]), Median(wall[1]),
      Median(wall[1]) - Median(wall[0]), Median(cpu[0]), Median(cpu[1]), Median(cpu[1]) - Median(cpu[0]));
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    if (argument == "--smoke") {
      options.rounds = 1;
      options.starts = 3;
    } else if (argument == "--rounds" && i + 1 < argc) {
      options.rounds = std::max(1, std::atoi(argv[++i]));
    } else if (argument == "--starts" && i + 1 < argc) {
      options.starts = std::max(1, std::atoi(argv[++i]));
    } else if (argument == "--preload" && i + 1 < argc) {
      options.preload = argv[++i];
    } else {
      std::fprintf(stderr, "usage: start_bench [--smoke] [--rounds R] [--starts N] [--preload LIBRARY]\n");
      return 2;
    }
  }
  std::printf("LD_PRELOAD=%s\n", options.preload.c_str());
  Measure("/bin/true", "/bin/true", options);
  Measure("start_target", START_TARGET, options);
  return 0;
}
