// Every thread's stack (report/thread_stacks.h) against threads of this test in the states a late
// rank's threads are in: blocked in read() on a pipe, waiting on a condition variable, blocking
// every signal, asleep, and many of them; and where a process is (report/whereabouts.h).
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

// Which sanitizer this program runs under: GCC says it with __SANITIZE_*__, clang with
// __has_feature.
#if defined(__SANITIZE_THREAD__)
#define UNDER_THREAD_SANITIZER 1
#elif defined(__SANITIZE_ADDRESS__)
#define UNDER_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_THREAD_SANITIZER 1
#elif __has_feature(address_sanitizer)
#define UNDER_ADDRESS_SANITIZER 1
#endif
#endif

#if defined(UNDER_ADDRESS_SANITIZER) || defined(UNDER_THREAD_SANITIZER)
// The sanitizers' runtimes export it; GCC ships no header that declares it.
extern "C" std::size_t __sanitizer_get_current_allocated_bytes();
#endif

#include "watchdog/report/snapshot.h"
#include "watchdog/report/thread_stacks.h"
#include "watchdog/report/whereabouts.h"

namespace ncclguard {
namespace {

constexpr int kStackSignal = 61;  // SIGRTMAX-3 with glibc

pid_t Tid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

// A thread parked in a given state until the test ends it; its tid once it is there.
class Parked {
 public:
  virtual ~Parked() = default;
  pid_t tid() const { return tid_.load(); }

 protected:
  std::atomic<pid_t> tid_{0};
};

// Blocked in read() on an empty pipe, inside a function of its own name.
class ReadingPipe final : public Parked {
 public:
  ReadingPipe() {
    REQUIRE(pipe(fds_) == 0);
    thread_ = std::thread([this] { BlockInPipeRead(); });
    while (tid() == 0) std::this_thread::yield();
  }
  ~ReadingPipe() override {
    const char byte = 'x';
    REQUIRE(write(fds_[1], &byte, 1) == 1);
    thread_.join();
    close(fds_[0]);
    close(fds_[1]);
  }

 private:
  __attribute__((noinline)) void BlockInPipeRead() {
    tid_ = Tid();
    char byte = 0;
    while (read(fds_[0], &byte, 1) < 0) {
    }
  }
  int fds_[2] = {-1, -1};
  std::thread thread_;
};

// Waiting on a condition variable, inside a function of its own name.
class WaitingOnCondition final : public Parked {
 public:
  WaitingOnCondition() {
    thread_ = std::thread([this] { WaitOnCondition(); });
    while (tid() == 0) std::this_thread::yield();
  }
  ~WaitingOnCondition() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    condition_.notify_all();
    thread_.join();
  }

 private:
  __attribute__((noinline)) void WaitOnCondition() {
    std::unique_lock<std::mutex> lock(mutex_);
    tid_ = Tid();
    condition_.wait(lock, [this] { return done_; });
  }
  std::mutex mutex_;
  std::condition_variable condition_;
  bool done_ = false;
  std::thread thread_;
};

// Every signal blocked, waiting on a condition variable.
class BlockingSignals final : public Parked {
 public:
  BlockingSignals() {
    thread_ = std::thread([this] {
      sigset_t all;
      sigfillset(&all);
      pthread_sigmask(SIG_SETMASK, &all, nullptr);
      std::unique_lock<std::mutex> lock(mutex_);
      tid_ = Tid();
      condition_.wait(lock, [this] { return done_; });
    });
    while (tid() == 0) std::this_thread::yield();
  }
  ~BlockingSignals() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    condition_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable condition_;
  bool done_ = false;
  std::thread thread_;
};

// In nanosleep(), which a signal would cut short: it must not be sent one.
class Sleeping final : public Parked {
 public:
  Sleeping() {
    thread_ = std::thread([this] {
      tid_ = Tid();
      while (!done_.load()) {
        timespec pause{0, 20'000'000};
        if (nanosleep(&pause, nullptr) != 0) interrupted_ = true;
      }
    });
    while (tid() == 0) std::this_thread::yield();
  }
  ~Sleeping() override {
    done_ = true;
    thread_.join();
  }
  bool interrupted() const { return interrupted_.load(); }

 private:
  std::atomic<bool> done_{false};
  std::atomic<bool> interrupted_{false};
  std::thread thread_;
};

const ThreadSnapshot* FindThread(const ThreadsSnapshot& snapshot, pid_t tid) {
  const auto found = std::find_if(snapshot.threads.begin(), snapshot.threads.end(),
                                  [tid](const ThreadSnapshot& thread) { return thread.tid == tid; });
  return found == snapshot.threads.end() ? nullptr : &*found;
}

bool HasFunction(const ThreadSnapshot& thread, const std::string& part) {
  return std::any_of(thread.native.begin(), thread.native.end(), [&part](const FrameSnapshot& frame) {
    return frame.function.find(part) != std::string::npos;
  });
}

// Waits until the kernel reports `tid` asleep (it may still be on its way into the call).
void AwaitSleeping(pid_t tid) {
  for (int i = 0; i < 2000; ++i) {
    std::ifstream stat("/proc/self/task/" + std::to_string(tid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const std::size_t paren = text.rfind(')');
    if (paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'S') return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// The heap in use: what a leak grows. (Not the resident size: AddressSanitizer's quarantine keeps
// freed memory resident, up to 256 MiB, by design.)
std::size_t HeapInUseBytes() {
#if defined(UNDER_ADDRESS_SANITIZER) || defined(UNDER_THREAD_SANITIZER)
  return __sanitizer_get_current_allocated_bytes();
#else
  return mallinfo2().uordblks;
#endif
}

}  // namespace

TEST_CASE("each thread is accounted for: its native stack, or why not, and what it waits on") {
  InstallStackSignal(kStackSignal);
  ReadingPipe reading;
  WaitingOnCondition waiting;
  BlockingSignals blocking;
  Sleeping sleeping;
  for (const Parked* parked : std::vector<const Parked*>{&reading, &waiting, &blocking, &sleeping})
    AwaitSleeping(parked->tid());

  const ThreadsSnapshot snapshot = CaptureThreadStacks();
  INFO("native note: " << snapshot.native_note << "; symbols note: " << snapshot.symbols_note);
  REQUIRE(snapshot.native_note.empty());
  CHECK(snapshot.total == static_cast<int>(snapshot.threads.size()));
  CHECK(snapshot.python_version.empty());  // no Python in this process

  const ThreadSnapshot* reader = FindThread(snapshot, reading.tid());
  REQUIRE(reader != nullptr);
#if defined(UNDER_THREAD_SANITIZER)
  // ThreadSanitizer holds a signal back from a thread in a read() it does not treat as blocking
  // until the call returns: the thread is then accounted for without frames.
  const bool reader_answers = false;
  CHECK(reader->native_missing == "it did not answer the stack signal in time");
#else
  const bool reader_answers = true;
  CHECK(reader->native_missing.empty());
  CHECK(HasFunction(*reader, "BlockInPipeRead"));
#endif
  CHECK(reader->syscall == "read");
  CHECK(reader->fd_target.rfind("pipe:[", 0) == 0);
  CHECK(reader->state == "sleeping");

  const ThreadSnapshot* waiter = FindThread(snapshot, waiting.tid());
  REQUIRE(waiter != nullptr);
  CHECK(waiter->native_missing.empty());
  CHECK(HasFunction(*waiter, "WaitOnCondition"));
  CHECK(waiter->syscall == "futex");

  const ThreadSnapshot* blocker = FindThread(snapshot, blocking.tid());
  REQUIRE(blocker != nullptr);
  CHECK(blocker->native.empty());
  CHECK(blocker->native_missing == "it blocks the stack signal");
  CHECK(blocker->syscall == "futex");

  const ThreadSnapshot* sleeper = FindThread(snapshot, sleeping.tid());
  REQUIRE(sleeper != nullptr);
  CHECK(sleeper->native.empty());
  CHECK(sleeper->syscall == "clock_nanosleep");  // glibc's nanosleep()
  CHECK(sleeper->native_missing.find("cut its clock_nanosleep() short") != std::string::npos);
  CHECK_FALSE(sleeping.interrupted());

  const ThreadSnapshot* self = FindThread(snapshot, Tid());
  REQUIRE(self != nullptr);
  CHECK(self->native_missing == "the thread taking the stacks");

  // Where the process is, seen from the thread that reads the pipe.
  const auto location = LocateProcess(snapshot, reading.tid(), getpid());
  REQUIRE(location);
  CHECK(location->thread == reader);
  CHECK(location->sentence.find("blocked in read() on pipe:[") != std::string::npos);
  if (reader_answers) {
    REQUIRE(location->frame != nullptr);
    CHECK(location->frame->function.find("BlockInPipeRead") != std::string::npos);
  }
}

TEST_CASE("200 threads: no hang, every one listed") {
  InstallStackSignal(kStackSignal);
  std::vector<std::unique_ptr<Parked>> threads;
  for (int i = 0; i < 200; ++i) {
    if (i % 3 == 0) {
      threads.push_back(std::make_unique<ReadingPipe>());
    } else if (i % 3 == 1) {
      threads.push_back(std::make_unique<WaitingOnCondition>());
    } else {
      threads.push_back(std::make_unique<BlockingSignals>());
    }
  }
  for (const auto& parked : threads) AwaitSleeping(parked->tid());
  const ThreadsSnapshot snapshot = CaptureThreadStacks();
  CHECK(snapshot.total >= 201);
  for (const auto& parked : threads) {
    const ThreadSnapshot* thread = FindThread(snapshot, parked->tid());
    REQUIRE(thread != nullptr);
    // Either frames or the reason for none: never a thread left silent.
    CHECK((!thread->native.empty() || !thread->native_missing.empty()));
  }
}

// The signal path, many times over: under the sanitizers, no report; memory flat. Symbols and
// Python are left out of the loop (they have their own tests).
TEST_CASE("10,000 captures in a loop") {
  InstallStackSignal(kStackSignal);
  WaitingOnCondition waiting;
  WaitingOnCondition other;
  AwaitSleeping(waiting.tid());
  AwaitSleeping(other.tid());
  StackCaptureLimits limits;
  limits.symbolize = false;
  limits.python = false;
  std::size_t heap_after_warmup = 0;
  int answered = 0;
  for (int i = 0; i < 10'000; ++i) {
    const ThreadsSnapshot snapshot = CaptureThreadStacks(limits);
    const ThreadSnapshot* waiter = FindThread(snapshot, waiting.tid());
    if (waiter != nullptr && !waiter->native.empty()) ++answered;
    if (i == 100) heap_after_warmup = HeapInUseBytes();
  }
  CHECK(answered > 9'900);
  const std::size_t heap = HeapInUseBytes();
  INFO("heap in use after 100 captures: " << heap_after_warmup << " bytes, after 10,000: " << heap << " bytes");
  CHECK(heap < heap_after_warmup + (1 << 20));
}

// Needs a process of its own: a process has one stack signal, installed once.
TEST_CASE("an application's own handler of the stack signal is left alone", "[own-process]") {
  struct sigaction own = {};
  own.sa_handler = [](int) {};
  sigemptyset(&own.sa_mask);
  REQUIRE(sigaction(kStackSignal, &own, nullptr) == 0);
  InstallStackSignal(kStackSignal);
  struct sigaction after = {};
  REQUIRE(sigaction(kStackSignal, nullptr, &after) == 0);
  CHECK(after.sa_handler == own.sa_handler);

  ReadingPipe reading;
  AwaitSleeping(reading.tid());
  const ThreadsSnapshot snapshot = CaptureThreadStacks();
  CHECK(snapshot.native_note.find("the application handles the stack signal") != std::string::npos);
  const ThreadSnapshot* reader = FindThread(snapshot, reading.tid());
  REQUIRE(reader != nullptr);
  CHECK(reader->native.empty());
  CHECK(reader->native_missing == snapshot.native_note);
  CHECK(reader->syscall == "read");  // what /proc says is still there
}

TEST_CASE("a thread's location: the innermost application frame and what it waits on") {
  const auto frame = [](const char* function, const char* file, int line, const char* module, std::uint64_t offset) {
    FrameSnapshot made;
    made.function = function;
    made.file = file;
    made.line = line;
    made.module = module;
    made.offset = offset;
    return made;
  };
  const auto thread = [](std::int64_t tid, const char* syscall, double blocked_seconds) {
    ThreadSnapshot made;
    made.tid = tid;
    made.state = "sleeping";
    made.syscall = syscall;
    made.blocked_seconds = blocked_seconds;
    return made;
  };
  ThreadsSnapshot snapshot;
  ThreadSnapshot main_thread = thread(100, "clock_nanosleep", 41.2);
  main_thread.python = {frame("sleep_a_bit", "/usr/lib/python3.11/helper.py", 3, "", 0),
                        frame("save_checkpoint", "train.py", 88, "", 0), frame("<module>", "train.py", 120, "", 0)};
  main_thread.native = {frame("clock_nanosleep", "", 0, "/lib/x86_64-linux-gnu/libc.so.6", 0xe0)};
  ThreadSnapshot worker = thread(101, "read", 12);
  worker.fd = 7;
  worker.fd_target = "pipe:[42]";
  worker.native = {frame("read", "", 0, "/lib/x86_64-linux-gnu/libc.so.6", 0xf82ea),
                   frame("write_checkpoint_shard", "/src/app.c", 42, "/opt/app/bin/app", 0x11a9),
                   frame("main", "", 0, "/opt/app/bin/app", 0x1000)};
  snapshot.threads = {main_thread, worker};

  // The thread that issued NCCL's operations first; Python's own library is not application code.
  const auto python = LocateProcess(snapshot, 100, 100);
  REQUIRE(python);
  CHECK(python->sentence == "in `save_checkpoint` (train.py:88), sleeping for 41 s");
  const auto native = LocateProcess(snapshot, 101, 100);
  REQUIRE(native);
  CHECK(native->sentence ==
        "in `write_checkpoint_shard` (app.c:42, in app+0x11a9), blocked in read() on pipe:[42] for 12 s");
  // An unknown thread: the main thread (tid == pid).
  const auto fallback = LocateProcess(snapshot, 555, 100);
  REQUIRE(fallback);
  CHECK(fallback->thread->tid == 100);
}

}  // namespace ncclguard
