// A redis-server of a test's own: on a free loopback port, persisting nothing, in a directory of
// its own; killed by the destructor. Tests of the Redis job board start one; so does RunProcess
// for every program it starts when NCCLGUARD_TEST_BOARD=redis (the end-to-end tests' second run).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "tests/support/process.h"

namespace ncclguard::testing {

// How a test's server is set up beyond the defaults: a password for the `default` user
// (requirepass), and a listener on IPv6's loopback too.
struct RedisServerOptions {
  std::string requirepass;
  bool ipv6 = false;
};

class RedisServer {
 public:
  // Starts the server and waits until it answers PING; started() says whether it does.
  explicit RedisServer(RedisServerOptions options = {});
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  bool started() const { return pid_ > 0; }
  const std::string& why_not_started() const { return why_; }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  static constexpr int kDatabases = 256;
  std::string Url(int database = 0) const;      // redis://127.0.0.1:<port>/<database>
  std::string Ipv6Url(int database = 0) const;  // redis://[::1]:<port>/<database>
  // Whether this machine has IPv6's loopback (containers often lack it).
  static bool HasIpv6Loopback();

  // `command` sent to database 0 (as the `default` user, with its password when it has one); the
  // first line of the answer, at most 63 bytes ("" when none).
  std::string Run(const std::vector<std::string>& command) const;
  // The same as the ACL user `user` (AUTH user password first).
  std::string RunAs(const std::string& user, const std::string& password,
                    const std::vector<std::string>& command) const;
  // How many fields the hash `key` of database 0 has (HLEN); -1 when the server does not answer.
  long long HashLength(const std::string& key) const;

  // Kills the server (SIGKILL: what a crash or an OOM kill does) and waits for it to end.
  void Kill();
  // Stops the server (SIGSTOP: a frozen host, a debugger): the kernel still accepts connections and
  // takes in commands, and nothing answers until Continue() (SIGCONT).
  void Stop();
  void Continue();
  // Starts it again on the same port, empty; true once it answers.
  bool Start();

 private:
  RedisServerOptions options_;
  TemporaryDirectory directory_;
  int port_ = 0;
  pid_t pid_ = -1;
  std::string why_;
};

// NCCLGUARD_STORE for the programs a test starts with NCCLGUARD_DUMP_DIR=`dump_dir`: "" (the job
// directory), or, when this test program runs with NCCLGUARD_TEST_BOARD=redis, a database of a
// redis-server it started at the first call and kills at exit. Each dump directory gets a
// database of its own, as each gets job directories of its own: jobs of one test that reuse a job
// id in fresh directories must not meet on the board either.
std::string TestStore(const std::string& dump_dir = "");

// The arguments that name a job for `ncclguard analyze`: its job directory, or on a Redis board
// redis://.../<job id> with --dump-dir set to that directory.
std::vector<std::string> AnalyzeTarget(const std::string& job_dir);

// The ACL SETUSER command that docs/deploying.md gives for one cluster user: `name`, with
// `password`, may touch only the board's keys of uid `owner`, with only the commands the board uses.
std::vector<std::string> BoardAclUser(const std::string& name, const std::string& password,
                                      const std::string& owner);

}  // namespace ncclguard::testing
