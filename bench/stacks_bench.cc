// What taking every thread's stack costs a dump: the time to capture all stacks of a process with
// 8, 64 and 512 threads parked the way a training process's threads are (a third blocked in a
// read() on a pipe, a third waiting on a condition variable, a third asleep in nanosleep, which is
// only described from /proc), with and without naming the frames. Prints figures; no pass/fail.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "watchdog/report/snapshot.h"
#include "watchdog/report/thread_stacks.h"

namespace {

using Clock = std::chrono::steady_clock;

class ParkedThreads {
 public:
  explicit ParkedThreads(int count) {
    if (pipe(fds_) != 0) std::abort();
    for (int i = 0; i < count; ++i) {
      threads_.emplace_back([this, i] {
        if (i % 3 == 0) {
          char byte = 0;
          while (read(fds_[0], &byte, 1) < 0) {
          }
        } else if (i % 3 == 1) {
          std::unique_lock<std::mutex> lock(mutex_);
          released_.wait(lock, [this] { return done_; });
        } else {
          while (!stop_sleeping_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // every thread parked
  }
  ~ParkedThreads() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    released_.notify_all();
    stop_sleeping_ = true;
    const std::vector<char> bytes(threads_.size(), 'x');
    if (write(fds_[1], bytes.data(), bytes.size()) < 0) std::abort();
    for (std::thread& thread : threads_) thread.join();
    close(fds_[0]);
    close(fds_[1]);
  }

 private:
  int fds_[2] = {-1, -1};
  std::mutex mutex_;
  std::condition_variable released_;
  bool done_ = false;
  std::atomic<bool> stop_sleeping_{false};
  std::vector<std::thread> threads_;
};

double MedianMs(int runs, const ncclguard::StackCaptureLimits& limits, int* answered) {
  std::vector<double> times;
  for (int run = 0; run < runs; ++run) {
    const auto start = Clock::now();
    const ncclguard::ThreadsSnapshot snapshot = ncclguard::CaptureThreadStacks(limits);
    times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    *answered =
        static_cast<int>(std::count_if(snapshot.threads.begin(), snapshot.threads.end(),
                                       [](const ncclguard::ThreadSnapshot& t) { return !t.native.empty(); }));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const bool smoke = argc > 1 && std::string_view(argv[1]) == "--smoke";
  ncclguard::InstallStackSignal(SIGRTMAX - 3);
  std::printf("%-8s %-20s %-22s %s\n", "threads", "with native frames", "capture, unnamed (ms)",
              "capture, named (ms)");
  for (const int count : smoke ? std::vector<int>{8} : std::vector<int>{8, 64, 512}) {
    ParkedThreads threads(count);
    ncclguard::StackCaptureLimits unnamed;
    unnamed.symbolize = false;
    unnamed.python = false;
    int answered = 0;
    const double raw_ms = MedianMs(smoke ? 1 : 9, unnamed, &answered);
    const double named_ms = MedianMs(smoke ? 1 : 5, ncclguard::StackCaptureLimits{}, &answered);
    std::printf("%-8d %-20d %-22.2f %.2f\n", count, answered, raw_ms, named_ms);
  }
  return 0;
}
