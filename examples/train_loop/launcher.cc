#include "launcher.h"

#include "self_path.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

// A rank stopped after the timeout gets this long to exit on SIGTERM (a tool in the process
// may want to write a report) before SIGKILL.
constexpr std::chrono::seconds kTerminationGrace{5};

// EX_TEMPFAIL from <sysexits.h>: the conventional "temporary failure, try again" exit code.
constexpr int kRetryExitCode = 75;

struct RankProcess {
  pid_t pid = -1;
  bool finished = false;
  int wait_status = 0;
  bool stopped_after_timeout = false;
};

std::string make_private_directory() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/train_loop.XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    std::perror("train_loop: mkdtemp");
    std::exit(EXIT_FAILURE);
  }
  return pattern;
}

std::vector<std::string> rank_arguments(int argc, char** argv, const std::string& rendezvous_file) {
  std::vector<std::string> arguments{executable_path()};
  for (int index = 1; index < argc; ++index) {
    bool takes_value = false;
    if (is_launcher_flag(argv[index], takes_value)) {
      if (takes_value) ++index;
      continue;
    }
    arguments.emplace_back(argv[index]);
  }
  if (!rendezvous_file.empty()) {
    arguments.emplace_back("--rendezvous");
    arguments.push_back(rendezvous_file);
  }
  return arguments;
}

std::vector<std::string> rank_environment(int rank, int world_size) {
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view variable(*entry);
    if (variable.starts_with("RANK=") || variable.starts_with("WORLD_SIZE=") || variable.starts_with("LOCAL_RANK=")) {
      continue;
    }
    environment.emplace_back(variable);
  }
  environment.push_back("RANK=" + std::to_string(rank));
  environment.push_back("WORLD_SIZE=" + std::to_string(world_size));
  environment.push_back("LOCAL_RANK=" + std::to_string(rank));
  return environment;
}

std::vector<char*> as_pointers(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& text : strings) pointers.push_back(text.data());
  pointers.push_back(nullptr);
  return pointers;
}

// Everything the child needs is prepared before fork: between fork and exec only
// async-signal-safe calls are allowed, and the parent may already have threads.
pid_t spawn_rank(const std::vector<char*>& arguments, const std::vector<char*>& environment,
                 const sigset_t& child_signal_mask, pid_t launcher_pid) {
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("train_loop: fork");
    std::exit(EXIT_FAILURE);
  }
  if (pid == 0) {
    sigprocmask(SIG_SETMASK, &child_signal_mask, nullptr);
    // A launcher killed by a test's timeout must not leave hung ranks behind.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher_pid) _exit(127);
    execve(arguments[0], arguments.data(), environment.data());
    constexpr char kMessage[] = "train_loop: execve of a rank failed\n";
    ssize_t ignored = write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
    (void)ignored;
    _exit(127);
  }
  return pid;
}

std::string describe_end(const RankProcess& process) {
  if (WIFEXITED(process.wait_status)) {
    const int code = WEXITSTATUS(process.wait_status);
    return code == 0 ? "exited 0" : "failed: exit code " + std::to_string(code);
  }
  if (WIFSIGNALED(process.wait_status)) {
    const int signal_number = WTERMSIG(process.wait_status);
    return "failed: killed by signal " + std::to_string(signal_number) + " (" + strsignal(signal_number) + ")";
  }
  return "ended with wait status " + std::to_string(process.wait_status);
}

bool succeeded(const RankProcess& process) {
  return process.finished && !process.stopped_after_timeout && WIFEXITED(process.wait_status) &&
         WEXITSTATUS(process.wait_status) == 0;
}

int rank_of(const std::vector<RankProcess>& ranks, pid_t pid) {
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    if (ranks[rank].pid == pid) return static_cast<int>(rank);
  }
  return -1;
}

size_t reap_finished(std::vector<RankProcess>& ranks, bool report) {
  size_t running = 0;
  while (true) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    const int rank = rank_of(ranks, pid);
    if (rank < 0) continue;
    ranks[rank].finished = true;
    ranks[rank].wait_status = status;
    if (report) std::printf("train_loop: rank %d %s\n", rank, describe_end(ranks[rank]).c_str());
  }
  for (const RankProcess& process : ranks) running += process.finished ? 0 : 1;
  return running;
}

// Waits, asleep, for SIGCHLD until every rank has ended or `deadline` passes. Returns the number
// of ranks still running.
size_t wait_for_ranks(std::vector<RankProcess>& ranks, const sigset_t& child_signal, std::optional<Clock::time_point> deadline,
                      bool report) {
  while (true) {
    const size_t running = reap_finished(ranks, report);
    if (running == 0) return 0;
    if (!deadline) {
      siginfo_t info;
      sigwaitinfo(&child_signal, &info);
      continue;
    }
    const auto left = *deadline - Clock::now();
    if (left <= Clock::duration::zero()) return running;
    const auto nanoseconds = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    const timespec wait_time{static_cast<time_t>(nanoseconds / 1'000'000'000), static_cast<long>(nanoseconds % 1'000'000'000)};
    siginfo_t info;
    sigtimedwait(&child_signal, &info, &wait_time);
  }
}

void signal_running(const std::vector<RankProcess>& ranks, int signal_number) {
  for (const RankProcess& process : ranks) {
    if (!process.finished) kill(process.pid, signal_number);
  }
}

}  // namespace

int run_launcher(const Options& options, int argc, char** argv) {
  const int world_size = options.launch_ranks;
  // With NCCL_COMM_ID every rank derives the unique id from the variable (NCCL semantics), so
  // no file is exchanged.
  const bool uses_comm_id = std::getenv("NCCL_COMM_ID") != nullptr;
  const std::string directory = uses_comm_id ? std::string() : make_private_directory();
  const std::string rendezvous_file = uses_comm_id ? std::string() : directory + "/unique_id";

  std::vector<std::string> argument_strings = rank_arguments(argc, argv, rendezvous_file);
  std::vector<char*> arguments = as_pointers(argument_strings);
  std::vector<std::vector<std::string>> environment_strings;
  std::vector<std::vector<char*>> environments;
  for (int rank = 0; rank < world_size; ++rank) environment_strings.push_back(rank_environment(rank, world_size));
  for (auto& strings : environment_strings) environments.push_back(as_pointers(strings));

  // SIGCHLD stays blocked so that sigtimedwait can sleep until a rank ends, with no race between
  // checking the ranks and starting to wait.
  sigset_t child_signal;
  sigemptyset(&child_signal);
  sigaddset(&child_signal, SIGCHLD);
  sigset_t original_mask;
  sigprocmask(SIG_BLOCK, &child_signal, &original_mask);

  std::fflush(nullptr);
  std::vector<RankProcess> ranks(static_cast<size_t>(world_size));
  for (int rank = 0; rank < world_size; ++rank) {
    ranks[rank].pid = spawn_rank(arguments, environments[rank], original_mask, getpid());
  }

  std::optional<Clock::time_point> deadline;
  if (options.launch_timeout_s > 0) {
    deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.launch_timeout_s));
  }
  if (wait_for_ranks(ranks, child_signal, deadline, true) > 0) {
    for (size_t rank = 0; rank < ranks.size(); ++rank) {
      if (ranks[rank].finished) continue;
      ranks[rank].stopped_after_timeout = true;
      std::printf("train_loop: rank %zu did not finish within %g s; stopping it\n", rank, options.launch_timeout_s);
    }
    signal_running(ranks, SIGTERM);
    if (wait_for_ranks(ranks, child_signal, Clock::now() + kTerminationGrace, false) > 0) {
      signal_running(ranks, SIGKILL);
      wait_for_ranks(ranks, child_signal, std::nullopt, false);
    }
  }

  if (!directory.empty()) std::filesystem::remove_all(directory);

  std::vector<int> unfinished;
  std::vector<int> failed;
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    if (ranks[rank].stopped_after_timeout) {
      unfinished.push_back(static_cast<int>(rank));
    } else if (!succeeded(ranks[rank])) {
      failed.push_back(static_cast<int>(rank));
    }
  }
  if (unfinished.empty() && failed.empty()) {
    std::printf("train_loop: all %d ranks finished\n", world_size);
    return EXIT_SUCCESS;
  }
  auto list = [](const std::vector<int>& ranks_in_list) {
    std::string text;
    for (int rank : ranks_in_list) text += (text.empty() ? "" : ",") + std::to_string(rank);
    return text.empty() ? std::string("none") : text;
  };
  std::printf("train_loop: job failed: ranks failed: %s; ranks not finished: %s\n", list(failed).c_str(),
              list(unfinished).c_str());
  // Like a launcher that passes its workers' exit code on: when every failed rank asked to be
  // restarted with the same code, the job asks for it too (75, EX_TEMPFAIL, "try again").
  const auto asked_for_restart = [&](int rank) {
    return WIFEXITED(ranks[rank].wait_status) && WEXITSTATUS(ranks[rank].wait_status) == kRetryExitCode;
  };
  const bool all_asked_for_restart =
      unfinished.empty() && std::all_of(failed.begin(), failed.end(), asked_for_restart);
  return all_asked_for_restart ? kRetryExitCode : EXIT_FAILURE;
}
