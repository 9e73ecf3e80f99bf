// Runs a program for a test: a controlled environment, captured output, and a hard time limit so
// that a hang fails the test instead of hanging the suite.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ncclguard::testing {

struct ProcessResult {
  int exit_code = -1;    // exit status, or -1 when killed by a signal
  int signal = 0;        // the signal that ended it, 0 if it exited
  bool timed_out = false;
  std::string out;
  std::string err;
};

struct ProcessOptions {
  // Variables set (a value) or removed (std::nullopt) relative to this process's environment.
  // LD_PRELOAD and every NCCLGUARD_* variable are removed unless set here.
  std::map<std::string, std::optional<std::string>> environment;
  double timeout_seconds = 60;
  std::string working_directory;
};

ProcessResult RunProcess(const std::vector<std::string>& argv, const ProcessOptions& options = {});

// A fresh empty directory under the system's temporary directory, removed by the destructor.
class TemporaryDirectory {
 public:
  TemporaryDirectory();
  ~TemporaryDirectory();
  TemporaryDirectory(const TemporaryDirectory&) = delete;
  TemporaryDirectory& operator=(const TemporaryDirectory&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string ReadFile(const std::string& path);
std::vector<std::string> SplitLines(const std::string& text);
int CountOccurrences(const std::string& text, const std::string& needle);

}  // namespace ncclguard::testing
