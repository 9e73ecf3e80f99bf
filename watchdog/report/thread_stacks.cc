#include "watchdog/report/thread_stacks.h"

// Local unwinding only: the _UL* entry points, in libunwind.so.8.
#define UNW_LOCAL_ONLY
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <libunwind.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/ucontext.h>
#include <sys/uio.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <map>
#include <mutex>
#include <optional>
#include <ratio>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "watchdog/common/clock.h"
#include "watchdog/report/python_stacks.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/report/symbolizer.h"

namespace ncclguard {
namespace {

// libunwind's local context is the kernel's ucontext_t on this architecture: the handler's third
// argument can be unwound from directly, starting at the interrupted instruction.
static_assert(std::is_same_v<unw_context_t, ucontext_t>);

#define NCCLGUARD_STRINGIFY_EXPANDED(name) NCCLGUARD_STRINGIFY(name)
#define NCCLGUARD_STRINGIFY(name) #name

// The few libunwind functions the handler needs, typed by their declarations.
struct Unwinder {
  decltype(&unw_init_local2) init_local2 = nullptr;
  decltype(&unw_step) step = nullptr;
  decltype(&unw_get_reg) get_reg = nullptr;
};

constexpr int kMaxFrames = 64;

// A request for one thread's stack, answered by that thread's signal handler. Static storage: the
// handler neither allocates nor locks. A request given up while its handler was writing leaves
// that mailbox to the handler, and the next one is used; with all of them lost, native stacks stop.
enum MailboxState : int { kIdle, kRequested, kWriting, kDone, kAbandoned };
struct Mailbox {
  std::atomic<int> state{kIdle};
  std::atomic<long> tid{0};  // as syscall(SYS_gettid) returns it
  std::uint64_t pthread = 0;
  int count = 0;
  std::array<unw_word_t, kMaxFrames> frames{};
};
constexpr int kMailboxes = 4;
std::array<Mailbox, kMailboxes> g_mailboxes;
std::atomic<Mailbox*> g_request{nullptr};
std::atomic<const Unwinder*> g_unwinder{nullptr};
std::atomic<int> g_stack_signal{0};
// Why native stacks cannot be taken at all ("" when they can), set once at installation.
std::atomic<const char*> g_install_problem{nullptr};

int UnwindFromSignal(const Unwinder& unwinder, void* context, std::array<unw_word_t, kMaxFrames>& frames) {
  unw_cursor_t cursor;
  if (unwinder.init_local2(&cursor, static_cast<unw_context_t*>(context), UNW_INIT_SIGNAL_FRAME) < 0)
    return 0;
  int count = 0;
  do {
    unw_word_t ip = 0;
    if (unwinder.get_reg(&cursor, UNW_REG_IP, &ip) < 0 || ip == 0) break;
    frames[count++] = ip;
  } while (count < kMaxFrames && unwinder.step(&cursor) > 0);
  return count;
}

// Async-signal-safe: atomics, gettid, pthread_self and libunwind's local unwinding with its caches
// off (UNW_CACHE_NONE), which locks nothing and allocates nothing.
void OnStackSignal(int /*signal*/, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  Mailbox* box = g_request.load(std::memory_order_acquire);
  const Unwinder* unwinder = g_unwinder.load(std::memory_order_acquire);
  int requested = kRequested;
  // Only our own tgkill for this very thread: a stray copy of the signal (sent by someone else, or
  // one that stayed pending past its deadline) does nothing. The thread is checked once the request
  // is won: the tid read then is the one published with it, not an earlier request's.
  if (box != nullptr && unwinder != nullptr && info != nullptr && info->si_code == SI_TKILL &&
      info->si_pid == getpid() &&
      box->state.compare_exchange_strong(requested, kWriting, std::memory_order_acq_rel)) {
    if (box->tid.load(std::memory_order_relaxed) == syscall(SYS_gettid)) {
      box->pthread = static_cast<std::uint64_t>(pthread_self());
      box->count = UnwindFromSignal(*unwinder, context, box->frames);
      box->state.store(kDone, std::memory_order_release);
    } else {
      box->state.store(kRequested, std::memory_order_release);  // another thread's request: left to it
    }
  }
  errno = saved_errno;
}

const Unwinder* LoadUnwinder() {
  // libunwind.so.8 also exports _Unwind_RaiseException and friends: loaded into the global scope
  // it would take over the application's C++ exceptions from libgcc_s. RTLD_LOCAL keeps it ours.
  void* library = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) return nullptr;
  auto* unwinder = new Unwinder;  // lives as long as the process: the handler may use it any time
  unwinder->init_local2 = reinterpret_cast<decltype(&unw_init_local2)>(
      dlsym(library, NCCLGUARD_STRINGIFY_EXPANDED(unw_init_local2)));
  unwinder->step =
      reinterpret_cast<decltype(&unw_step)>(dlsym(library, NCCLGUARD_STRINGIFY_EXPANDED(unw_step)));
  unwinder->get_reg =
      reinterpret_cast<decltype(&unw_get_reg)>(dlsym(library, NCCLGUARD_STRINGIFY_EXPANDED(unw_get_reg)));
  auto set_caching_policy = reinterpret_cast<decltype(&unw_set_caching_policy)>(
      dlsym(library, NCCLGUARD_STRINGIFY_EXPANDED(unw_set_caching_policy)));
  auto* address_space =
      static_cast<unw_addr_space_t*>(dlsym(library, NCCLGUARD_STRINGIFY_EXPANDED(unw_local_addr_space)));
  if (unwinder->init_local2 == nullptr || unwinder->step == nullptr || unwinder->get_reg == nullptr ||
      set_caching_policy == nullptr || address_space == nullptr) {
    delete unwinder;
    return nullptr;
  }
  // The global cache takes a lock: a thread interrupted while holding it would deadlock its own
  // handler. Without a cache every unwind reads the unwind tables afresh, which is fine for a dump.
  set_caching_policy(*address_space, UNW_CACHE_NONE);
  // libunwind initialises itself on first use: do that here, outside any handler.
  ucontext_t context;
  if (getcontext(&context) == 0) {
    unw_cursor_t cursor;
    if (unwinder->init_local2(&cursor, &context, 0) >= 0) {
      for (int i = 0; i < kMaxFrames && unwinder->step(&cursor) > 0; ++i) {
      }
    }
  }
  return unwinder;
}

bool HandlerInstalled(int signal) {
  struct sigaction current = {};
  return sigaction(signal, nullptr, &current) == 0 && (current.sa_flags & SA_SIGINFO) != 0 &&
         current.sa_sigaction == OnStackSignal;
}

// ---------------------------------------------------------------------------------------------
// /proc/self/task/<tid>: trusted kernel files, read whole into a small buffer.

std::string ReadProc(const std::string& path, std::size_t max_bytes = 4096) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string content(max_bytes, '\0');
  std::size_t used = 0;
  while (used < max_bytes) {
    const ssize_t got = read(fd, content.data() + used, max_bytes - used);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    used += static_cast<std::size_t>(got);
  }
  close(fd);
  content.resize(used);
  return content;
}

std::string ReadLink(const std::string& path) {
  std::array<char, 512> target{};
  const ssize_t length = readlink(path.c_str(), target.data(), target.size() - 1);
  return length > 0 ? std::string(target.data(), static_cast<std::size_t>(length)) : std::string();
}

std::string StateName(char state) {
  switch (state) {
    case 'R':
      return "running";
    case 'S':
      return "sleeping";
    case 'D':
      return "disk_sleep";
    case 'T':
      return "stopped";
    case 't':
      return "tracing_stop";
    case 'Z':
      return "zombie";
    case 'X':
      return "dead";
    case 'I':
      return "idle";
    default:
      return std::string(1, state);
  }
}

// The milliseconds of the scheduler's clock at which the thread last ran (CONFIG_SCHED_DEBUG's
// se.exec_start); nothing where the kernel does not say.
std::optional<double> LastRanMs(const std::string& sched_path) {
  const std::string sched = ReadProc(sched_path, 1024);
  const std::size_t key = sched.find("se.exec_start");
  if (key == std::string::npos) return std::nullopt;
  const std::size_t colon = sched.find(':', key);
  const std::size_t end = sched.find('\n', colon);
  double ms = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtod(absl::StripAsciiWhitespace(sched.substr(colon + 1, end - colon - 1)), &ms))
    return std::nullopt;
  return ms;
}

struct SyscallInfo {
  long number = -1;
  bool fd_first = false;   // its first argument is the descriptor it waits on
  bool cut_short = false;  // a signal handler makes it return early (EINTR), even with SA_RESTART
};

// The blocking system calls worth naming. Those that a handler cuts short are never interrupted
// for a stack: sleep(), poll() and friends would return early in code that may not expect it.
const std::vector<std::pair<SyscallInfo, const char*>>& KnownSyscalls() {
  static const auto* known = new std::vector<std::pair<SyscallInfo, const char*>>{
      {{SYS_read, true, false}, "read"},
      {{SYS_write, true, false}, "write"},
      {{SYS_readv, true, false}, "readv"},
      {{SYS_writev, true, false}, "writev"},
      {{SYS_pread64, true, false}, "pread64"},
      {{SYS_pwrite64, true, false}, "pwrite64"},
      {{SYS_recvfrom, true, false}, "recvfrom"},
      {{SYS_recvmsg, true, false}, "recvmsg"},
      {{SYS_sendto, true, false}, "sendto"},
      {{SYS_sendmsg, true, false}, "sendmsg"},
      {{SYS_accept, true, false}, "accept"},
      {{SYS_accept4, true, false}, "accept4"},
      {{SYS_connect, true, true}, "connect"},
      {{SYS_fsync, true, false}, "fsync"},
      {{SYS_fdatasync, true, false}, "fdatasync"},
      {{SYS_flock, true, false}, "flock"},
      {{SYS_ioctl, true, false}, "ioctl"},
      {{SYS_fcntl, true, false}, "fcntl"},
      {{SYS_openat, false, false}, "openat"},
      {{SYS_futex, false, false}, "futex"},
      {{SYS_wait4, false, false}, "wait4"},
      {{SYS_waitid, false, false}, "waitid"},
      {{SYS_nanosleep, false, true}, "nanosleep"},
      {{SYS_clock_nanosleep, false, true}, "clock_nanosleep"},
      {{SYS_select, false, true}, "select"},
      {{SYS_pselect6, false, true}, "pselect6"},
      {{SYS_poll, false, true}, "poll"},
      {{SYS_ppoll, false, true}, "ppoll"},
      {{SYS_epoll_wait, true, true}, "epoll_wait"},
      {{SYS_epoll_pwait, true, true}, "epoll_pwait"},
#ifdef SYS_epoll_pwait2
      {{SYS_epoll_pwait2, true, true}, "epoll_pwait2"},
#endif
      {{SYS_pause, false, true}, "pause"},
      {{SYS_rt_sigtimedwait, false, true}, "rt_sigtimedwait"},
      {{SYS_rt_sigsuspend, false, true}, "rt_sigsuspend"},
      {{SYS_io_getevents, false, true}, "io_getevents"},
      {{SYS_msgrcv, false, true}, "msgrcv"},
      {{SYS_msgsnd, false, true}, "msgsnd"},
      {{SYS_semtimedop, false, true}, "semtimedop"},
      {{SYS_mq_timedreceive, false, true}, "mq_timedreceive"},
      {{SYS_mq_timedsend, false, true}, "mq_timedsend"},
  };
  return *known;
}

const std::pair<SyscallInfo, const char*>* FindSyscall(long number) {
  for (const auto& entry : KnownSyscalls()) {
    if (entry.first.number == number) return &entry;
  }
  return nullptr;
}

// What /proc says of one thread, and whether it can answer the stack signal.
struct ThreadFacts {
  ThreadSnapshot snapshot;
  char state = '?';
  bool signal_blocked = false;
  bool cut_short = false;
};

bool SignalBlocked(const std::string& status, int signal) {
  const std::size_t key = status.find("SigBlk:");
  if (key == std::string::npos || signal <= 0) return false;
  const std::size_t end = status.find('\n', key);
  std::uint64_t mask = 0;
  if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(status.substr(key + 7, end - key - 7)), &mask))
    return false;
  return ((mask >> (signal - 1)) & 1U) != 0;
}

ThreadFacts ReadThreadFacts(pid_t tid, int signal, std::optional<double> now_ms) {
  ThreadFacts facts;
  ThreadSnapshot& thread = facts.snapshot;
  thread.tid = tid;
  const std::string task = fmt::format("/proc/self/task/{}/", tid);
  const std::string stat = ReadProc(task + "stat");
  const std::size_t open_paren = stat.find('(');
  const std::size_t close_paren = stat.rfind(')');
  if (open_paren != std::string::npos && close_paren != std::string::npos && close_paren > open_paren) {
    thread.name = stat.substr(open_paren + 1, close_paren - open_paren - 1);
    if (close_paren + 2 < stat.size()) facts.state = stat[close_paren + 2];
  }
  thread.state = StateName(facts.state);
  const std::string wchan = ReadProc(task + "wchan", 256);
  if (wchan != "0") thread.wchan = wchan;
  facts.signal_blocked = SignalBlocked(ReadProc(task + "status"), signal);
  // "<nr> <args...> <sp> <pc>" while in a system call, "running", or "-1 <sp> <pc>" when blocked
  // outside one (a page fault).
  const std::string syscall_line(absl::StripAsciiWhitespace(ReadProc(task + "syscall", 512)));
  const std::vector<std::string> fields = absl::StrSplit(syscall_line, ' ', absl::SkipEmpty());
  long number = -1;
  if (fields.size() >= 2 && absl::SimpleAtoi(fields[0], &number) && number >= 0) {
    const auto* known = FindSyscall(number);
    thread.syscall = known != nullptr ? known->second : fmt::format("syscall {}", number);
    facts.cut_short = known != nullptr && known->first.cut_short;
    std::uint64_t fd = 0;
    if (known != nullptr && known->first.fd_first && absl::SimpleHexAtoi(fields[1], &fd) && fd < (1U << 30)) {
      thread.fd = static_cast<int>(fd);
      thread.fd_target = ReadLink(fmt::format("/proc/self/fd/{}", fd));
    }
  }
  if (now_ms && (facts.state == 'S' || facts.state == 'D')) {
    if (const std::optional<double> last_ran = LastRanMs(task + "sched"); last_ran && *now_ms >= *last_ran) {
      thread.blocked_seconds = (*now_ms - *last_ran) / 1000.0;
    }
  }
  return facts;
}

std::vector<pid_t> ListThreads() {
  std::vector<pid_t> tids;
  DIR* directory = opendir("/proc/self/task");
  if (directory == nullptr) return tids;
  while (const dirent* entry = readdir(directory)) {
    int tid = 0;
    if (absl::SimpleAtoi(entry->d_name, &tid) && tid > 0) tids.push_back(tid);
  }
  closedir(directory);
  std::sort(tids.begin(), tids.end());
  return tids;
}

// Sends the stack signal to `tid` and waits for its handler; the frames, or why there are none.
struct Answer {
  std::vector<std::uint64_t> frames;
  std::uint64_t pthread = 0;
  std::string missing;
};

Mailbox* FreeMailbox() {
  for (Mailbox& box : g_mailboxes) {
    if (box.state.load(std::memory_order_acquire) != kWriting) return &box;
  }
  return nullptr;
}

Answer AskThread(pid_t tid, int signal, std::chrono::steady_clock::time_point deadline) {
  Answer answer;
  Mailbox* box = FreeMailbox();
  if (box == nullptr) {
    answer.missing = "earlier captures' handlers never finished: native stacks are off";
    return answer;
  }
  box->tid.store(tid, std::memory_order_relaxed);
  box->count = 0;
  box->state.store(kRequested, std::memory_order_release);
  g_request.store(box, std::memory_order_release);
  if (syscall(SYS_tgkill, getpid(), tid, signal) != 0) {
    int requested = kRequested;
    box->state.compare_exchange_strong(requested, kAbandoned, std::memory_order_acq_rel);
    answer.missing = "it ended before it could answer";
    return answer;
  }
  auto pause = std::chrono::microseconds(10);
  for (;;) {
    const int state = box->state.load(std::memory_order_acquire);
    if (state == kDone) {
      answer.pthread = box->pthread;
      answer.frames.assign(box->frames.begin(), box->frames.begin() + std::clamp(box->count, 0, kMaxFrames));
      box->state.store(kIdle, std::memory_order_release);
      return answer;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      int requested = kRequested;
      if (box->state.compare_exchange_strong(requested, kAbandoned, std::memory_order_acq_rel)) {
        answer.missing = "it did not answer the stack signal in time";
        return answer;
      }
      // Its handler is writing: give it a moment more, else leave the mailbox to it.
      if (std::chrono::steady_clock::now() >= deadline + std::chrono::milliseconds(500)) {
        answer.missing = "its stack signal's handler did not finish in time";
        return answer;
      }
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

// The kernel thread id behind a pthread_t that CPython reports: pthread_getcpuclockid encodes it in
// the clock id (the kernel's CPUCLOCK ABI: ~tid << 3 | flags). The pthread_t is first checked to
// point at readable memory, so that a thread that ended meanwhile cannot fault the capture.
pid_t TidOfPthread(std::uint64_t thread) {
  std::uint64_t probe = 0;
  iovec local{&probe, sizeof probe};
  iovec remote{reinterpret_cast<void*>(thread), sizeof probe};
  if (thread == 0 || process_vm_readv(getpid(), &local, 1, &remote, 1, 0) != sizeof probe) return 0;
  clockid_t clock = 0;
  if (pthread_getcpuclockid(static_cast<pthread_t>(thread), &clock) != 0) return 0;
  return static_cast<pid_t>(~(clock >> 3));
}

void AddPythonFrames(ThreadsSnapshot& snapshot, const std::map<std::uint64_t, pid_t>& tid_of_pthread) {
  const std::optional<PythonStacks> python = CapturePythonStacks();
  if (!python) return;
  snapshot.python_version = python->version;
  snapshot.python_note = python->unavailable;
  for (const PythonThread& thread : python->threads) {
    const auto known = tid_of_pthread.find(thread.thread_id);
    const pid_t tid = known != tid_of_pthread.end() ? known->second : TidOfPthread(thread.thread_id);
    const auto target = std::find_if(snapshot.threads.begin(), snapshot.threads.end(),
                                     [tid](const ThreadSnapshot& candidate) { return candidate.tid == tid; });
    if (tid == 0 || target == snapshot.threads.end()) continue;
    for (const PythonFrame& frame : thread.frames) {
      target->python.push_back(FrameSnapshot{
          .function = frame.function, .file = frame.file, .line = frame.line, .module = "", .offset = 0});
    }
  }
}

// Returns why the names are incomplete ("" when they are not).
std::string Symbolize(std::vector<ThreadSnapshot>& threads,
                      const std::vector<std::vector<std::uint64_t>>& frames) {
  std::vector<FrameAddress> addresses;
  for (const auto& stack : frames) {
    for (std::size_t i = 0; i < stack.size(); ++i) {
      // The first is the interrupted instruction; the others are return addresses, whose call is
      // the instruction before.
      addresses.push_back(FrameAddress{.pc = stack[i], .return_address = i > 0});
    }
  }
  if (addresses.empty()) return "";
  const Symbolization symbolization = ncclguard::Symbolize(addresses);
  const std::vector<SymbolizedFrame>& symbols = symbolization.frames;
  std::size_t next = 0;
  for (std::size_t t = 0; t < threads.size() && t < frames.size(); ++t) {
    for (std::size_t i = 0; i < frames[t].size() && next < symbols.size(); ++i, ++next) {
      const SymbolizedFrame& symbol = symbols[next];
      threads[t].native.push_back(FrameSnapshot{.function = symbol.function,
                                                .file = symbol.file,
                                                .line = symbol.line,
                                                .module = symbol.module,
                                                .offset = symbol.module_offset});
    }
  }
  return symbolization.limitation;
}

std::mutex g_capture_mutex;

// Takes `mutex` within `deadline`, trying every millisecond. (Not std::timed_mutex: its clock-based
// lock is one ThreadSanitizer does not follow, which then reports every unlock as wrong.)
bool LockWithin(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds deadline) {
  const auto give_up = std::chrono::steady_clock::now() + deadline;
  while (!lock.try_lock()) {
    if (std::chrono::steady_clock::now() >= give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace

void InstallStackSignal(int signal) noexcept {
  if (signal <= 0 || g_stack_signal.load() != 0) return;
  const Unwinder* unwinder = LoadUnwinder();
  if (unwinder == nullptr) {
    g_install_problem.store("libunwind (libunwind.so.8) could not be loaded");
    return;
  }
  g_unwinder.store(unwinder, std::memory_order_release);
  struct sigaction action = {};
  action.sa_sigaction = OnStackSignal;
  // SA_RESTART: a read() or a futex wait the signal interrupts goes on as if nothing happened.
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&action.sa_mask);
  struct sigaction previous = {};
  if (sigaction(signal, nullptr, &previous) != 0) {
    g_install_problem.store("the stack signal is not a valid signal");
    return;
  }
  const bool application_handles = (previous.sa_flags & SA_SIGINFO) != 0
                                       ? previous.sa_sigaction != nullptr
                                       : previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN;
  if (application_handles) {
    g_install_problem.store("the application handles the stack signal itself (NCCLGUARD_STACK_SIGNAL)");
    return;
  }
  if (sigaction(signal, &action, nullptr) != 0) {
    g_install_problem.store("the stack signal's handler could not be installed");
    return;
  }
  g_stack_signal.store(signal, std::memory_order_release);
}

ThreadsSnapshot CaptureThreadStacks(const StackCaptureLimits& limits) noexcept {
  ThreadsSnapshot snapshot;
  try {
    std::unique_lock<std::mutex> lock(g_capture_mutex, std::defer_lock);
    if (!LockWithin(lock, limits.total_deadline)) {
      snapshot.native_note = "another capture of the stacks was under way";
      return snapshot;
    }
    const auto started = std::chrono::steady_clock::now();
    snapshot.time_ns = WallNowNs();
    const auto give_up = started + limits.total_deadline;
    const int signal = g_stack_signal.load(std::memory_order_acquire);
    if (signal == 0) {
      const char* problem = g_install_problem.load();
      snapshot.native_note = problem != nullptr ? problem : "no stack signal (NCCLGUARD_STACK_SIGNAL=0)";
    } else if (!HandlerInstalled(signal)) {
      snapshot.native_note = fmt::format(
          "the application replaced the handler of signal {} (NCCLGUARD_STACK_SIGNAL): native stacks of "
          "other threads are skipped",
          signal);
    }
    const bool native = snapshot.native_note.empty();
    const pid_t self = static_cast<pid_t>(syscall(SYS_gettid));
    const std::optional<double> now_ms = LastRanMs("/proc/thread-self/sched");
    const std::vector<pid_t> tids = ListThreads();
    snapshot.total = static_cast<int>(tids.size());
    std::vector<std::vector<std::uint64_t>> frames;
    std::map<std::uint64_t, pid_t> tid_of_pthread;
    tid_of_pthread[static_cast<std::uint64_t>(pthread_self())] = self;
    for (const pid_t tid : tids) {
      if (static_cast<int>(snapshot.threads.size()) >= limits.max_threads) break;
      ThreadFacts facts = ReadThreadFacts(tid, signal, now_ms);
      ThreadSnapshot& thread = snapshot.threads.emplace_back(std::move(facts.snapshot));
      std::vector<std::uint64_t>& stack = frames.emplace_back();
      if (tid == self) {
        thread.native_missing = "the thread taking the stacks";
      } else if (!native) {
        thread.native_missing = snapshot.native_note;
      } else if (facts.state == 'D') {
        thread.native_missing = "in uninterruptible sleep: it cannot answer a signal";
      } else if (facts.state == 'T' || facts.state == 't' || facts.state == 'Z' || facts.state == 'X') {
        thread.native_missing = fmt::format("{}: it cannot answer a signal", thread.state);
      } else if (facts.signal_blocked) {
        thread.native_missing = "it blocks the stack signal";
      } else if (facts.cut_short) {
        thread.native_missing =
            fmt::format("not interrupted: a signal would cut its {}() short", thread.syscall);
      } else if (std::chrono::steady_clock::now() >= give_up) {
        thread.native_missing = "the capture's time was spent on earlier threads";
      } else {
        Answer answer = AskThread(
            tid, signal, std::min(give_up, std::chrono::steady_clock::now() + limits.thread_deadline));
        thread.native_missing = std::move(answer.missing);
        stack = std::move(answer.frames);
        if (answer.pthread != 0) tid_of_pthread[answer.pthread] = tid;
      }
    }
    g_request.store(nullptr, std::memory_order_release);
    if (limits.symbolize) {
      snapshot.symbols_note = Symbolize(snapshot.threads, frames);
    } else {
      for (std::size_t t = 0; t < frames.size(); ++t) {
        for (const std::uint64_t pc : frames[t])
          snapshot.threads[t].native.push_back(
              FrameSnapshot{.function = "", .file = "", .line = 0, .module = "", .offset = pc});
      }
    }
    if (limits.python) AddPythonFrames(snapshot, tid_of_pthread);
    snapshot.took_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  } catch (...) {
    snapshot.native_note = "out of memory while taking the stacks";
  }
  return snapshot;
}

}  // namespace ncclguard
