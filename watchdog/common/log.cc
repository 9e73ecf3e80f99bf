#include "watchdog/common/log.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "watchdog/common/config.h"
#include "watchdog/common/escape.h"
#include "watchdog/common/files.h"

namespace ncclguard::log {
namespace {

std::atomic<spdlog::logger*> g_logger{nullptr};
std::atomic<int> g_rank{-1};

std::string HostOrUnknown() {
  const std::string host = HostName();
  return host.empty() ? "unknown-host" : host;
}

spdlog::level::level_enum ToSpdlog(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return spdlog::level::trace;
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarn:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
    case LogLevel::kOff:
      return spdlog::level::off;
  }
  return spdlog::level::warn;
}

// Writes the NCCL-style prefix; the host name and pid are fixed when the logger is made (a
// forked child makes its own logger).
class NcclStyleFormatter final : public spdlog::formatter {
 public:
  NcclStyleFormatter()
      : prefix_(absl::StrCat(EscapeControlCharacters(HostOrUnknown()), ":", getpid(), ":")) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    dest.append(prefix_.data(), prefix_.data() + prefix_.size());
    fmt::format_to(std::back_inserter(dest), "{}", msg.thread_id);
    if (const int rank = g_rank.load(std::memory_order_relaxed); rank >= 0) {
      fmt::format_to(std::back_inserter(dest), " [{}]", rank);
    }
    fmt::format_to(std::back_inserter(dest), " ncclguard {} ", LevelName(msg.level));
    // Messages carry outside text (setting values, host names, NCCL's warnings): one line each,
    // with no terminal control sequences, whatever that text holds.
    escaped_.clear();
    AppendEscaped(std::string_view(msg.payload.data(), msg.payload.size()), escaped_);
    dest.append(escaped_.data(), escaped_.data() + escaped_.size());
    dest.push_back('\n');
  }

  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<NcclStyleFormatter>(); }

 private:
  static std::string_view LevelName(spdlog::level::level_enum level) {
    switch (level) {
      case spdlog::level::trace:
        return "TRACE";
      case spdlog::level::debug:
        return "DEBUG";
      case spdlog::level::info:
        return "INFO";
      case spdlog::level::warn:
        return "WARN";
      case spdlog::level::err:
        return "ERROR";
      default:
        return "CRIT";
    }
  }

  std::string prefix_;
  std::string escaped_;  // reused: the logger calls format() under its lock
};

// Appends each line to a file descriptor opened by OpenFileForAppending (spdlog's file sink opens
// by name: through symbolic links, blocking on a FIFO, 0644).
class FileDescriptorSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit FileDescriptorSink(int fd) : fd_(fd) {}
  ~FileDescriptorSink() override { close(fd_); }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    for (size_t written = 0; written < line.size();) {
      const ssize_t n = write(fd_, line.data() + written, line.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // a full disk loses the line, never the application's time
      written += static_cast<size_t>(n);
    }
  }
  void flush_() override {}

 private:
  int fd_;
};

}  // namespace

std::string HostName() {
  char host[256] = {};
  return gethostname(host, sizeof(host) - 1) == 0 ? std::string(host) : std::string();
}

std::string ExpandPathPattern(const std::string& pattern) {
  std::string path;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      if (pattern[i + 1] == 'h') {
        path += HostOrUnknown();
        ++i;
        continue;
      }
      if (pattern[i + 1] == 'p') {
        absl::StrAppend(&path, getpid());
        ++i;
        continue;
      }
    }
    path += pattern[i];
  }
  return path;
}

void Start(const Config& config) {
  spdlog::sink_ptr sink;
  std::string file_problem;
  if (!config.log_file.empty()) {
    const std::string path = ExpandPathPattern(config.log_file);
    if (const absl::StatusOr<int> fd = OpenFileForAppending(path); fd.ok()) {
      sink = std::make_shared<FileDescriptorSink>(*fd);
    } else {
      file_problem = "cannot write the log file NCCLGUARD_LOG_FILE='" + config.log_file + "' (" + path +
                     "): " + std::string(fd.status().message()) + "; logging to stderr instead";
    }
  }
  if (sink == nullptr) sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  // Not registered with spdlog's registry: this logger is private to ncclguard.
  auto* logger = new spdlog::logger("ncclguard", std::move(sink));
  logger->set_formatter(std::make_unique<NcclStyleFormatter>());
  logger->set_level(ToSpdlog(config.log_level));
  logger->flush_on(spdlog::level::trace);             // every line reaches the file: a hang never flushes
  g_logger.store(logger, std::memory_order_release);  // once per process (and per forked child)
  if (!file_problem.empty()) Warn("{}", file_problem);
}

void ForgetAfterFork() noexcept { g_logger.store(nullptr, std::memory_order_release); }

void SetRank(int rank) noexcept { g_rank.store(rank, std::memory_order_relaxed); }

spdlog::logger* Get() noexcept { return g_logger.load(std::memory_order_acquire); }

}  // namespace ncclguard::log
