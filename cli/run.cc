// ncclguard run [--max-restarts N] [--library PATH] -- CMD ARGS...
//
// ncclguard run --redis [--redis-server PATH] ... -- CMD ARGS...
//
// Runs CMD with libncclguard.so preloaded and runs it again each time it exits with
// kRestartExitCode, which NCCLGUARD_ACTION=reinit uses after recording a P2P verdict in the job
// directory: the next attempt reads that record before its first communicator and starts with P2P
// disabled. For jobs whose launcher does not restart failed workers itself (docs/recovery.md).
// With --redis, a redis-server started beside the job is its job board (NCCLGUARD_STORE) for every
// attempt, and is stopped when run ends.
//
// Signals: SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are forwarded to CMD's process,
// not to its process group. A launcher such as torchrun or mpirun tells its own workers, and
// signalling them behind its back would race with its shutdown. CMD stays in our process group,
// so a terminal still reaches it directly: a signal the kernel sent (Ctrl-C, Ctrl-\, a hang-up)
// went to the whole foreground group already and is not forwarded a second time.
#include <fcntl.h>
#include <linux/prctl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/poll.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "cli/commands.h"
#include "cli/elf_exports.h"
#include "watchdog/common/config.h"
#include "watchdog/common/escape.h"
#include "watchdog/common/files.h"
#include "watchdog/common/log.h"
#include "watchdog/common/temporaries.h"
#include "watchdog/common/version.h"
#include "watchdog/recover/p2p_policy.h"
#include "watchdog/recover/p2p_verdict.h"
#include "watchdog/report/job_board.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/report/job_id.h"

namespace ncclguard {
namespace {

constexpr int kDefaultMaxRestarts = 3;
constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
// As a shell reports them: a command that cannot be found, or found but not run.
constexpr int kExitCommandNotFound = 127;
constexpr int kExitCannotExecute = 126;
constexpr int kExitSignalBase = 128;

struct RunOptions {
  int max_restarts = kDefaultMaxRestarts;
  std::string library;
  bool redis = false;
  std::string redis_server = "redis-server";
  std::vector<std::string> command;
};

// What the signal handler passes to the waiting loop, through a pipe: the handler itself only
// writes (async-signal-safe), the loop forwards.
struct SignalNote {
  int number;
  int code;  // siginfo's si_code: SI_KERNEL for a terminal's signals
};
int g_signal_pipe_write = -1;

void NoteSignal(int number, siginfo_t* info, void*) {
  const int saved_errno = errno;
  const SignalNote note{number, info != nullptr ? info->si_code : SI_USER};
  // Non-blocking: a full pipe already holds notes that will wake the loop.
  [[maybe_unused]] const ssize_t written = write(g_signal_pipe_write, &note, sizeof note);
  errno = saved_errno;
}

[[noreturn]] void Fail(const std::string& what) {
  throw std::runtime_error(absl::StrCat(what, ": ", std::strerror(errno)));
}

bool StopsRestarts(int number) {
  return number == SIGINT || number == SIGTERM || number == SIGHUP || number == SIGQUIT;
}

std::string SignalName(int number) {
  const char* abbreviation = sigabbrev_np(number);
  return abbreviation != nullptr ? absl::StrCat("SIG", abbreviation) : absl::StrCat("signal ", number);
}

class Supervisor {
 public:
  // Installs the handlers. A signal ignored when we started stays ignored, and is inherited so by
  // the command: a shell starts background jobs ignoring SIGINT, and `run` must not change that.
  Supervisor() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) Fail("pipe");
    read_fd_ = fds[0];
    g_signal_pipe_write = fds[1];
    struct sigaction action = {};
    action.sa_sigaction = NoteSignal;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    for (const int number : kForwardedSignals) {
      struct sigaction previous = {};
      if (sigaction(number, nullptr, &previous) == 0 && previous.sa_handler == SIG_IGN) continue;
      if (sigaction(number, &action, nullptr) != 0) Fail("sigaction");
      handled_.push_back(number);
    }
    action.sa_flags |= SA_NOCLDSTOP;
    if (sigaction(SIGCHLD, &action, nullptr) != 0) Fail("sigaction");
    handled_.push_back(SIGCHLD);
  }

  // Starts the command; a command that cannot be executed exits 127 or 126, as under a shell.
  pid_t Start(std::vector<std::string> command) {
    std::vector<char*> argv;
    argv.reserve(command.size() + 1);
    for (std::string& argument : command) argv.push_back(argument.data());
    argv.push_back(nullptr);
    // Blocked across fork so that no handler of ours runs in the child before it is reset.
    sigset_t all;
    sigset_t previous;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &previous);
    const pid_t pid = fork();
    if (pid == 0) {
      for (const int number : handled_) signal(number, SIG_DFL);
      sigprocmask(SIG_SETMASK, &previous, nullptr);
      execvp(argv[0], argv.data());
      const int error = errno;
      std::fprintf(stderr, "ncclguard run: cannot run %s: %s\n", argv[0], std::strerror(error));
      _exit(error == ENOENT ? kExitCommandNotFound : kExitCannotExecute);
    }
    const int fork_error = errno;
    sigprocmask(SIG_SETMASK, &previous, nullptr);
    errno = fork_error;
    if (pid < 0) Fail("fork");
    return pid;
  }

  // Waits for `child` to end, forwarding the signals that arrive meanwhile; returns its wait status.
  int Wait(pid_t child) {
    for (;;) {
      int status = 0;
      const pid_t ended = waitpid(child, &status, WNOHANG);
      if (ended == child) {
        HandleSignals(-1);  // too late to forward, but a stop request still counts
        return status;
      }
      if (ended < 0 && errno != EINTR) Fail("waitpid");
      // A SIGCHLD after the waitpid above leaves its note in the pipe: poll cannot miss it.
      pollfd readable{read_fd_, POLLIN, 0};
      if (poll(&readable, 1, -1) < 0 && errno != EINTR) Fail("poll");
      HandleSignals(child);
    }
  }

  // The stop signal received since the start, 0 if none.
  int stop_signal() const { return stop_signal_; }

 private:
  void HandleSignals(pid_t child) {
    SignalNote note;
    while (read(read_fd_, &note, sizeof note) == sizeof note) {
      if (note.number == SIGCHLD) continue;
      if (StopsRestarts(note.number)) stop_signal_ = note.number;
      if (child > 0 && note.code != SI_KERNEL) kill(child, note.number);
    }
  }

  int read_fd_ = -1;
  std::vector<int> handled_;
  int stop_signal_ = 0;
};

// As a shell reports it: the exit code, or 128 + the signal that killed the command.
int ExitCode(int wait_status) {
  return WIFSIGNALED(wait_status) ? kExitSignalBase + WTERMSIG(wait_status) : WEXITSTATUS(wait_status);
}

// A port of this host that nothing listens on now, 0 if none could be had. Another process may take
// it before the server does: the server then fails to start, and run says so.
int FreePort() {
  const int probe = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe < 0) return 0;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  socklen_t length = sizeof address;
  int port = 0;
  if (bind(probe, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      getsockname(probe, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  close(probe);
  return port;
}

bool Answers(int port) {
  const int connection = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (connection < 0) return false;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool connected = connect(connection, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  close(connection);
  return connected;
}

// The name the other nodes of the job reach this host by: its host name when it resolves, else
// the loopback address (a job on this host only).
std::string ReachableHostName() {
  std::string host = log::HostName();
  addrinfo* found = nullptr;
  if (host.empty() || getaddrinfo(host.c_str(), nullptr, nullptr, &found) != 0) return "127.0.0.1";
  freeaddrinfo(found);
  return host;
}

// A password of 192 random bits, in hex.
std::string RandomPassword() {
  unsigned char bytes[24];
  std::size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t read = getrandom(bytes + got, sizeof bytes - got, 0);
    if (read < 0 && errno == EINTR) continue;
    if (read <= 0) throw std::runtime_error("no random bytes for the board's password");
    got += static_cast<std::size_t>(read);
  }
  std::string password;
  for (const unsigned char byte : bytes) absl::StrAppend(&password, absl::Hex(byte, absl::kZeroPad2));
  return password;
}

// Writes `password` as a credentials file (NCCLGUARD_STORE_AUTH_FILE) of mode 0600 in the job's
// directory, 0700, where every node of the job reads its files; returns its path.
std::string WriteCredentials(const std::string& job_dir, const std::string& password) {
  absl::StatusOr<int> directory = OpenPrivateDirectory(job_dir, /*create=*/true);
  if (!directory.ok()) throw std::runtime_error(std::string(directory.status().message()));
  constexpr char kName[] = ".redis-auth";  // hidden: never taken for a record of the job
  unlinkat(*directory, kName, 0);          // an earlier run's, or a link someone put there
  const int fd = openat(*directory, kName, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  close(*directory);
  if (fd < 0)
    throw std::runtime_error(absl::StrCat("cannot write ", job_dir, "/", kName, ": ", strerror(errno)));
  const std::string line = password + "\n";
  const bool written = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  close(fd);
  if (!written) throw std::runtime_error(absl::StrCat("cannot write ", job_dir, "/", kName));
  return absl::StrCat(job_dir, "/", kName);
}

// A redis-server beside the job (--redis), in a process group of its own: a Ctrl-C meant for the
// job does not take the job board away while the job still reports its end. It listens on every
// interface (the job's other nodes reach it), so it takes a password of its own, random, given to
// the server on its standard input (a command line is visible to every user of the node) and to
// the job in a private credentials file. No persistence: the board of one job, for as long as run
// runs.
class BesideRedis {
 public:
  static std::unique_ptr<BesideRedis> Start(const std::string& server, const std::string& job_dir) {
    const int port = FreePort();
    if (port == 0) Fail("no free port for redis-server");
    const std::string password = RandomPassword();
    const std::string auth_file = WriteCredentials(job_dir, password);
    // Owns the credentials file from here: every failure below removes it.
    auto redis = std::unique_ptr<BesideRedis>(new BesideRedis(-1, port, auth_file));
    const std::string port_text = std::to_string(port);
    std::vector<std::string> command = {server,         "-",       "--port",           port_text,
                                        "--bind",       "0.0.0.0", "--save",           "",
                                        "--appendonly", "no",      "--protected-mode", "yes",
                                        "--daemonize",  "no",      "--loglevel",       "warning"};
    std::vector<char*> argv;
    argv.reserve(command.size() + 1);
    for (std::string& argument : command) argv.push_back(argument.data());
    argv.push_back(nullptr);
    // The configuration is in the pipe before the server exists: a server that exits at once
    // (not found, refused) can never leave run writing into a closed pipe, and killed by SIGPIPE.
    int config[2];
    if (pipe2(config, O_CLOEXEC) != 0) Fail("pipe");
    const std::string lines = absl::StrCat("requirepass ", password, "\n");
    const bool configured =
        write(config[1], lines.data(), lines.size()) == static_cast<ssize_t>(lines.size());
    close(config[1]);
    if (!configured) {
      close(config[0]);
      throw std::runtime_error(absl::StrCat("cannot give ", server, " its password"));
    }
    const pid_t pid = fork();
    if (pid < 0) {
      close(config[0]);
      Fail("fork");
    }
    if (pid == 0) {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGTERM);  // run killed outright: the board goes with it
      dup2(config[0], STDIN_FILENO);     // "-": the configuration is read from there
      const int null = open("/dev/null", O_RDWR);
      if (null >= 0) dup2(null, STDOUT_FILENO);
      execvp(argv[0], argv.data());
      std::fprintf(stderr, "ncclguard run: cannot run %s: %s\n", argv[0], std::strerror(errno));
      _exit(kExitCommandNotFound);
    }
    close(config[0]);
    redis->pid_ = pid;
    constexpr auto kStartLimit = std::chrono::seconds(10);
    const auto give_up = std::chrono::steady_clock::now() + kStartLimit;
    while (!Answers(port)) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        redis->pid_ = -1;
        throw std::runtime_error(
            absl::StrCat(server, " exited with code ", ExitCode(status), " before answering"));
      }
      if (std::chrono::steady_clock::now() > give_up)
        throw std::runtime_error(absl::StrCat(server, " did not answer within 10 s"));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return redis;
  }

  BesideRedis(const BesideRedis&) = delete;
  BesideRedis& operator=(const BesideRedis&) = delete;
  ~BesideRedis() {
    unlink(auth_file_.c_str());  // the password of a server that is gone
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }

  std::string Url() const { return absl::StrCat("redis://", ReachableHostName(), ":", port_, "/0"); }
  const std::string& AuthFile() const { return auth_file_; }

 private:
  BesideRedis(pid_t pid, int port, std::string auth_file)
      : pid_(pid), port_(port), auth_file_(std::move(auth_file)) {}
  pid_t pid_;
  int port_;
  std::string auth_file_;
};

std::filesystem::path DefaultLibrary() {
  // The real location of this program, symbolic links resolved: the library is installed
  // relative to it (and the build tree has the same layout).
  const std::filesystem::path program = std::filesystem::read_symlink("/proc/self/exe");
  return (program.parent_path() / kLibDirFromBinDir / "libncclguard.so").lexically_normal();
}

// `library` first, then what LD_PRELOAD held already (separated by colons or spaces, as ld.so
// reads it), without a second copy of `library`.
std::string PreloadList(const std::filesystem::path& library, const char* existing) {
  std::vector<std::string> entries{library.string()};
  if (existing != nullptr) {
    for (const absl::string_view entry : absl::StrSplit(existing, absl::ByAnyChar(": "), absl::SkipEmpty())) {
      std::error_code not_a_file;
      if (!std::filesystem::equivalent(std::string(entry), library, not_a_file)) entries.emplace_back(entry);
    }
  }
  return absl::StrJoin(entries, ":");
}

// The job directory holds the P2P verdict that the next attempt reads, so every attempt must use
// the same job id. The user's NCCLGUARD_JOB_ID or the launcher's id as seen here is kept; without
// either, ncclguard would name the job after its first communicator, which is new at every attempt.
// Pinned in NCCLGUARD_JOB_ID in every case: a launcher's own id may change between attempts, as
// Slurm's step id does for each srun.
// Pinned in NCCLGUARD_LAUNCH_ID likewise: a P2P verdict is followed only by a process of the
// launch that recorded it, and this run's attempts are one launch, whatever ids srun or torchrun
// give each of them; another job given the same NCCLGUARD_JOB_ID is another launch.
std::string PinJobId() {
  std::string host = log::HostName();
  if (host.empty()) host = "unknown-host";
  const std::string own_id = absl::StrCat("run-", host, "-", getpid(), "-", std::time(nullptr));
  std::string job_id = NamedJobId(ReadProcessEnvironment).value_or(own_id);
  std::string launch_id = LaunchId(ReadProcessEnvironment);
  if (launch_id.empty()) launch_id = own_id;
  if (setenv("NCCLGUARD_JOB_ID", job_id.c_str(), 1) != 0) Fail("setenv");
  if (setenv("NCCLGUARD_LAUNCH_ID", launch_id.c_str(), 1) != 0) Fail("setenv");
  return job_id;
}

// After an attempt that exited with kRestartExitCode: a P2P verdict that it recorded is handed to
// the next attempt in its environment (NCCLGUARD_P2P_VERDICT), so that the next attempt starts with P2P
// off whether or not its job board answers at its first NCCL call, where the application waits for
// the board only briefly. The launcher may wait for the board: no attempt runs meanwhile.
void HandOverP2pVerdict(const std::string& job_id) {
  const Config config = ParseConfig(ReadProcessEnvironment);
  if (config.p2p != P2pMode::kAuto) return;
  absl::StatusOr<std::shared_ptr<JobBoard>> board =
      OpenJobBoard(config.store, JobDirectory(config, job_id), job_id,
                   BoardIdentity{.host = log::HostName(), .pid = static_cast<int>(getpid())});
  if (!board.ok()) return;  // the attempts said so themselves
  const absl::StatusOr<P2pVerdictRecord> verdict = ReadP2pVerdict(*board, job_id);
  if (!verdict.ok()) {
    if (!absl::IsNotFound(verdict.status())) {
      std::cerr << "ncclguard run: no P2P verdict handed to the next attempt: "
                << EscapeControlCharacters(std::string(verdict.status().message())) << '\n';
    }
    return;
  }
  const std::string described = DescribeP2pVerdictRecord(*verdict);
  if (setenv("NCCLGUARD_P2P_VERDICT", described.c_str(), 1) != 0) Fail("setenv");
  std::cerr << "ncclguard run: P2P verdict handed to the next attempt (NCCLGUARD_P2P_VERDICT): "
            << EscapeControlCharacters(described) << '\n';
}

// After an attempt: the temporary files its processes of this host left when killed in a write,
// which the processes themselves never look for (temporaries.h).
void RemoveAttemptTemporaries(const std::string& job_id) {
  (void)RemoveAbandonedTemporaries(JobDirectory(ParseConfig(ReadProcessEnvironment), job_id), kReadDeadline);
}

int Run(const RunOptions& options) {
  std::error_code error;
  const std::filesystem::path library =
      options.library.empty() ? DefaultLibrary() : std::filesystem::absolute(options.library);
  if (!std::filesystem::is_regular_file(library, error)) {
    std::cerr << "ncclguard run: no ncclguard library at " << EscapeControlCharacters(library.string())
              << (options.library.empty() ? " (where this ncclguard command expects it; use --library PATH)"
                                          : " (--library)")
              << "; not running the command without it\n";
    return kExitUsage;
  }
  // Anything else in LD_PRELOAD would run the command without ncclguard (ld.so only warns).
  if (const absl::Status usable = CheckExportsSymbol(library.string(), "ncclGetVersion"); !usable.ok()) {
    std::cerr << "ncclguard run: " << EscapeControlCharacters(library.string()) << " "
              << EscapeControlCharacters(std::string(usable.message()))
              << ": it is not an ncclguard library; not running the command without it\n";
    return kExitUsage;
  }
  const std::string preload = PreloadList(library, std::getenv("LD_PRELOAD"));
  if (setenv("LD_PRELOAD", preload.c_str(), 1) != 0) Fail("setenv");
  const std::string job_id = PinJobId();
  std::unique_ptr<BesideRedis> redis;
  if (options.redis) {
    if (const char* store = std::getenv("NCCLGUARD_STORE"); store != nullptr && *store != '\0') {
      std::cerr << "ncclguard run: --redis and NCCLGUARD_STORE="
                << EscapeControlCharacters(RemoveUrlCredentials(store)) << " name two job boards; keep one\n";
      return kExitUsage;
    }
    try {
      redis = BesideRedis::Start(options.redis_server, JobDirectory(GetConfig(), job_id));
    } catch (const std::exception& error) {
      std::cerr << "ncclguard run: cannot start the job board (--redis): "
                << EscapeControlCharacters(error.what()) << "; not running the command without it\n";
      return kExitUsage;
    }
    if (setenv("NCCLGUARD_STORE", redis->Url().c_str(), 1) != 0 ||
        setenv("NCCLGUARD_STORE_AUTH_FILE", redis->AuthFile().c_str(), 1) != 0) {
      Fail("setenv");
    }
  }

  Supervisor supervisor;
  const long attempts = long{options.max_restarts} + 1;  // --max-restarts may be INT_MAX
  int exit_code = 0;
  for (long attempt = 1; attempt <= attempts; ++attempt) {
    if (attempt == 1) {
      std::cerr << "ncclguard run: attempt 1 of " << attempts << ": "
                << EscapeControlCharacters(absl::StrJoin(options.command, " ")) << " (job id "
                << EscapeControlCharacters(job_id) << ", LD_PRELOAD=" << EscapeControlCharacters(preload)
                << (redis ? absl::StrCat(", NCCLGUARD_STORE=", redis->Url()) : "") << ")\n";
    } else {
      std::cerr << "ncclguard run: attempt " << attempt << " of " << attempts << " after exit code "
                << kRestartExitCode << " (ncclguard restart)\n";
    }
    exit_code = ExitCode(supervisor.Wait(supervisor.Start(options.command)));
    RemoveAttemptTemporaries(job_id);
    if (exit_code != kRestartExitCode) return exit_code;
    if (supervisor.stop_signal() != 0) {
      std::cerr << "ncclguard run: exit code " << kRestartExitCode << ", not restarting after "
                << SignalName(supervisor.stop_signal()) << '\n';
      return exit_code;
    }
    if (attempt < attempts) HandOverP2pVerdict(job_id);
  }
  std::cerr << "ncclguard run: giving up: exit code " << kRestartExitCode << " after " << options.max_restarts
            << " restarts (--max-restarts " << options.max_restarts << ")\n";
  return exit_code;
}

}  // namespace

void AddRunCommand(CLI::App& app, std::function<int()>& run) {
  auto options = std::make_shared<RunOptions>();
  CLI::App* command = app.add_subcommand(
      "run",
      absl::StrCat("Run a command with ncclguard preloaded, and again when it exits with ", kRestartExitCode,
                   " (NCCLGUARD_ACTION=reinit). Exit status: the command's "
                   "(128+N if signal N killed it, 127 if it cannot be found), 2 usage error."));
  command->add_option("--max-restarts", options->max_restarts, "How often to restart (0: never)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  command
      ->add_option("--library", options->library,
                   "libncclguard.so to preload (default: the one installed with this command)")
      ->type_name("PATH");
  command->add_flag(
      "--redis", options->redis,
      "Start a redis-server beside the job as its job board (NCCLGUARD_STORE) for every attempt, "
      "stopped when run ends");
  command
      ->add_option("--redis-server", options->redis_server, "The redis-server to start (default: from PATH)")
      ->type_name("PATH");
  command->add_option("COMMAND", options->command, "The command and its arguments, after --")->required();
  command->callback([options, &run] { run = [options] { return Run(*options); }; });
}

}  // namespace ncclguard
