#include "tests/support/train_loop_output.h"

#include <regex>

#include "tests/support/process.h"

namespace ncclguard::testing {

std::map<std::string, std::optional<std::string>> EmulatorJobEnvironment(const std::string& emulator_library_dir,
                                                                         const std::string& dump_dir,
                                                                         const std::string& job_id) {
  return {{"LD_LIBRARY_PATH", emulator_library_dir},
          {"NCCLEMU_FAULTS", std::nullopt},
          {"NCCLEMU_GPU_NAME", std::nullopt},
          {"NCCLEMU_DRIVER_VERSION", std::nullopt},
          {"NCCLEMU_P2P_ACCESS", std::nullopt},
          {"NCCL_COMM_ID", std::nullopt},
          {"NCCL_P2P_DISABLE", std::nullopt},
          {"NCCL_P2P_LEVEL", std::nullopt},
          {"NCCL_CONF_FILE", std::nullopt},
          {"HOME", dump_dir},
          {"NCCLGUARD_DUMP_DIR", dump_dir},
          {"NCCLGUARD_JOB_ID", job_id}};
}

std::map<int, int> RankPids(const std::string& out) {
  static const std::regex start_line(R"(^rank (\d+)/\d+: device .*, pid (\d+)$)");
  std::map<int, int> pids;
  for (const std::string& line : SplitLines(out)) {
    std::smatch match;
    if (std::regex_match(line, match, start_line)) pids[std::stoi(match[1])] = std::stoi(match[2]);
  }
  return pids;
}

std::map<int, std::string> Checksums(const std::string& out) {
  static const std::regex checksum_line(R"(^rank (\d+) checksum (0x[0-9a-f]{16})$)");
  std::map<int, std::string> by_rank;
  for (const std::string& line : SplitLines(out)) {
    std::smatch match;
    if (std::regex_match(line, match, checksum_line)) by_rank[std::stoi(match[1])] = match[2];
  }
  return by_rank;
}

std::vector<std::string> LogLinesOf(const std::string& err, int pid, const std::string& needle) {
  std::vector<std::string> lines;
  const std::string prefix = ":" + std::to_string(pid) + ":";
  for (const std::string& line : SplitLines(err)) {
    if (line.find(prefix) != std::string::npos && line.find(" ncclguard ") != std::string::npos &&
        line.find(needle) != std::string::npos) {
      lines.push_back(line);
    }
  }
  return lines;
}

}  // namespace ncclguard::testing
