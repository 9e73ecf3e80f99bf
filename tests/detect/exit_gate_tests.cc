// The exit gate (common/exit_gate.h). Closing it is for good, so each case runs in a forked child
// and reports through its exit status.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "watchdog/common/exit_gate.h"
#include "watchdog/common/files.h"

namespace ncclguard {
namespace {

// The exit status of `body` run in a child process: 0 when it returned true.
int InChild(const std::function<bool()>& body) {
  const pid_t child = fork();
  if (child == 0) _exit(body() ? 0 : 1);
  int status = 0;
  waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

using Clock = std::chrono::steady_clock;

TEST_CASE("a thread of ncclguard that reaches the closed gate parks there") {
  CHECK(InChild([] {
          std::atomic<bool> go{false};
          std::atomic<bool> passed{false};
          std::thread([&] {
            MarkOwnThread();
            while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
            const ExitPass pass;
            passed.store(true);
          }).detach();
          if (!CloseExitGate(std::chrono::seconds(5))) return false;
          go.store(true);
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          return !passed.load();
        }) == 0);
}

TEST_CASE("closing the gate waits for the passes held, and no longer than its deadline") {
  CHECK(InChild([] {
          std::atomic<bool> holding{false};
          std::thread([&] {
            MarkOwnThread();
            const ExitPass pass;
            holding.store(true);
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
          }).detach();
          while (!holding.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          const auto start = Clock::now();
          const bool closed = CloseExitGate(std::chrono::seconds(30));
          const auto waited = Clock::now() - start;
          return closed && waited >= std::chrono::milliseconds(200) && waited < std::chrono::seconds(20);
        }) == 0);
  CHECK(InChild([] {
          std::atomic<bool> holding{false};
          std::thread([&] {
            MarkOwnThread();
            const ExitPass pass;
            holding.store(true);
            for (;;) pause();  // stuck in a file system, say
          }).detach();
          while (!holding.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          const auto start = Clock::now();
          const bool closed = CloseExitGate(std::chrono::milliseconds(200));
          return !closed && Clock::now() - start < std::chrono::seconds(20);
        }) == 0);
}

TEST_CASE("the application's thread is refused a pass once the gate is closed, and keeps one it holds") {
  CHECK(InChild([] {
          const ExitPass held;
          if (!held.open() || !CloseExitGate(std::chrono::seconds(5))) return false;  // its own pass
          const ExitPass nested;
          return nested.open();
        }) == 0);
  CHECK(InChild([] {
          if (!ExitPass().open() || !CloseExitGate(std::chrono::seconds(5))) return false;
          return !ExitPass().open();
        }) == 0);
}

TEST_CASE("work with a deadline is not started once the gate is closed") {
  CHECK(InChild([] {
          std::atomic<bool> ran{false};
          if (!CloseExitGate(std::chrono::seconds(5))) return false;
          const absl::StatusOr<bool> result = RunWithDeadline<bool>(
              [&]() -> absl::StatusOr<bool> {
                ran.store(true);
                return true;
              },
              std::chrono::seconds(5));
          return absl::IsCancelled(result.status()) && !ran.load();
        }) == 0);
}

TEST_CASE("work with a deadline that parks at the closed gate is not waited for") {
  CHECK(InChild([] {
          std::atomic<bool> started{false};
          std::atomic<bool> go{false};
          std::atomic<bool> closed{false};
          std::thread closer([&] {
            while (!started.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
            closed.store(CloseExitGate(std::chrono::milliseconds(300)));
            go.store(true);
          });
          const auto start = Clock::now();
          const absl::StatusOr<bool> result = RunWithDeadline<bool>(
              [&]() -> absl::StatusOr<bool> {
                started.store(true);
                // Holds its pass past the closer's deadline, as a read from a hung file system does,
                // then asks for one, as the parse of what it read does.
                while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
                const ExitPass pass;
                return true;
              },
              std::chrono::seconds(60));
          closer.join();
          return !closed.load() && absl::IsCancelled(result.status()) &&
                 Clock::now() - start < std::chrono::seconds(30);
        }) == 0);
}

}  // namespace
}  // namespace ncclguard
