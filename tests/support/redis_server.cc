#include "tests/support/redis_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
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

std::string Request(const std::vector<std::string>& command) {
  std::string request = "*" + std::to_string(command.size()) + "\r\n";
  for (const std::string& argument : command)
    request += "$" + std::to_string(argument.size()) + "\r\n" + argument + "\r\n";
  return request;
}

// Sends `request` (RESP) to the server on `port` and returns line `line` of its answer (counted
// from 0: 1 is the first line of the second reply when the first is one line, as AUTH's is), at
// most 63 bytes; "" when it does not answer.
std::string Ask(int port, const std::string& request, int line = 0) {
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
    char reply[4096];
    // Until the line asked for is complete.
    for (ssize_t got = 0; (got = read(fd, reply, sizeof reply)) > 0;) {
      answer.append(reply, static_cast<std::size_t>(got));
      std::size_t lines = 0;
      for (std::size_t at = answer.find("\r\n"); at != std::string::npos; at = answer.find("\r\n", at + 2))
        ++lines;
      if (lines > static_cast<std::size_t>(line)) break;
    }
  }
  close(fd);
  std::size_t start = 0;
  for (int skipped = 0; skipped < line && start != std::string::npos; ++skipped) {
    start = answer.find("\r\n", start);
    if (start != std::string::npos) start += 2;
  }
  if (start == std::string::npos) return "";
  return answer.substr(start, std::min<std::size_t>(63, answer.find('\r', start) - start));
}

// A server with a password answers NOAUTH to the unauthenticated: it answers all the same.
bool AnswersPing(int port) {
  const std::string answer = Ask(port, "PING\r\n");
  return answer == "+PONG" || answer.starts_with("-NOAUTH");
}

}  // namespace

RedisServer::RedisServer(RedisServerOptions options) : options_(std::move(options)), port_(FreePort()) {
  if (port_ == 0) {
    why_ = "no free loopback port";
    return;
  }
  Start();
}

RedisServer::~RedisServer() { Kill(); }

void RedisServer::Stop() {
  if (pid_ > 0) kill(pid_, SIGSTOP);
}

void RedisServer::Continue() {
  if (pid_ > 0) kill(pid_, SIGCONT);
}

std::string RedisServer::Url(int database) const {
  return "redis://127.0.0.1:" + std::to_string(port_) + "/" + std::to_string(database);
}

std::string RedisServer::Ipv6Url(int database) const {
  return "redis://[::1]:" + std::to_string(port_) + "/" + std::to_string(database);
}

bool RedisServer::HasIpv6Loopback() {
  const int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_loopback;
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  close(fd);
  return bound;
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
  // Each address a word of its own: redis-server quotes every word it is given.
  if (options_.ipv6) argv.insert(argv.begin() + 5, "::1");
  if (!options_.requirepass.empty()) {
    argv.push_back("--requirepass");
    argv.push_back(options_.requirepass);
  }
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
  if (options_.requirepass.empty()) return Ask(port_, Request(command));
  return RunAs("default", options_.requirepass, command);
}

std::string RedisServer::RunAs(const std::string& user, const std::string& password,
                               const std::vector<std::string>& command) const {
  return Ask(port_, Request({"AUTH", user, password}) + Request(command), 1);
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

std::vector<std::string> BoardAclUser(const std::string& name, const std::string& password,
                                      const std::string& owner) {
  return {"ACL",
          "SETUSER",
          name,
          "reset",
          "on",
          ">" + password,
          "~ncclguard:{" + owner + ":*",
          "resetchannels",
          "+@connection",
          "+select",
          "+hset",
          "+hsetnx",
          "+hget",
          "+hmget",
          "+hkeys",
          "+hlen",
          "+hgetall",
          "+rpush",
          "+llen",
          "+lrange",
          "+expire"};
}

}  // namespace ncclguard::testing
