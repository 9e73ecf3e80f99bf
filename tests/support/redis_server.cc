#include "tests/support/redis_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace ncclguard::testing {
namespace {

// A loopback port nobody listens on now (the kernel's choice for a socket bound to port 0).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  close(fd);
  return port;
}

// Sends `request` (RESP) to the server on `port` and returns the first line of its answer, "" when
// it does not answer.
std::string Ask(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{.tv_sec = 1, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  std::string answer;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
    char reply[64] = {};
    if (read(fd, reply, sizeof reply - 1) > 0) answer = reply;
  }
  close(fd);
  return answer.substr(0, answer.find('\r'));
}

bool AnswersPing(int port) { return Ask(port, "PING\r\n") == "+PONG"; }

}  // namespace

RedisServer::RedisServer() : port_(FreePort()) {
  if (port_ == 0) {
    why_ = "no free loopback port";
    return;
  }
  Start();
}

RedisServer::~RedisServer() { Kill(); }

std::string RedisServer::Url(int database) const {
  return "redis://127.0.0.1:" + std::to_string(port_) + "/" + std::to_string(database);
}

bool RedisServer::Start() {
  if (pid_ > 0) return true;
  const std::string port = std::to_string(port_);
  const std::string log = directory_.path() + "/redis.log";
  std::vector<std::string> argv = {"redis-server",
                                   "--port",
                                   port,
                                   "--bind",
                                   "127.0.0.1",
                                   "--save",
                                   "",
                                   "--appendonly",
                                   "no",
                                   "--dir",
                                   directory_.path(),
                                   "--logfile",
                                   log,
                                   "--daemonize",
                                   "no",
                                   "--databases",
                                   std::to_string(kDatabases)};
  std::vector<char*> pointers;
  for (std::string& argument : argv) pointers.push_back(argument.data());
  pointers.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    why_ = "fork failed";
    return false;
  }
  if (pid == 0) {
    // A test killed at its time limit must not leave its server running.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    execvp("redis-server", pointers.data());
    _exit(127);
  }
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < give_up) {
    if (AnswersPing(port_)) {
      pid_ = pid;
      return true;
    }
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      why_ = WIFEXITED(status) && WEXITSTATUS(status) == 127
                 ? "redis-server is not installed (scripts/install-deps.sh installs it)"
                 : "redis-server exited at once: " + ReadFile(log);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  why_ = "redis-server did not answer within 10 s";
  return false;
}

std::string RedisServer::Run(const std::vector<std::string>& command) const {
  std::string request = "*" + std::to_string(command.size()) + "\r\n";
  for (const std::string& argument : command)
    request += "$" + std::to_string(argument.size()) + "\r\n" + argument + "\r\n";
  return Ask(port_, request);
}

long long RedisServer::HashLength(const std::string& key) const {
  const std::string answer = Run({"HLEN", key});
  return answer.size() > 1 && answer[0] == ':' ? std::stoll(answer.substr(1)) : -1;
}

void RedisServer::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

std::string TestStore(const std::string& dump_dir) {
  const char* board = std::getenv("NCCLGUARD_TEST_BOARD");
  if (board == nullptr || std::strcmp(board, "redis") != 0) return "";
  // Destroyed at the test program's exit, once the programs it served have ended.
  static RedisServer* const server = [] {
    auto* started = new RedisServer;
    std::atexit([] { delete server; });
    return started;
  }();
  if (!server->started())
    throw std::runtime_error("NCCLGUARD_TEST_BOARD=redis: " + server->why_not_started());
  static std::mutex mutex;
  static std::map<std::string, int> databases;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto [entry, added] =
      databases.try_emplace(dump_dir, static_cast<int>(databases.size()) % RedisServer::kDatabases);
  return server->Url(entry->second);
}

std::vector<std::string> AnalyzeTarget(const std::string& job_dir) {
  const std::size_t slash = job_dir.find_last_of('/');
  const std::string store = TestStore(job_dir.substr(0, slash));
  if (store.empty()) return {job_dir};
  const std::string job_id = job_dir.substr(slash + 1);
  return {store + "/" + job_id, "--dump-dir", job_dir};
}

}  // namespace ncclguard::testing
