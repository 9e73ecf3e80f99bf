// What ncclguard costs an NCCL job, measured on the emulator under LD_PRELOAD=libncclguard.so:
//   overhead  host time of an intercepted ncclAllReduce against the same call made directly into
//             the emulated libnccl, in one process, with the driver's event calls broken out;
//   cpu       CPU time of the watchdog thread while the application issues collectives flat out;
//   memory    anonymous memory each additional watched communicator costs.
// bench/run.sh runs every phase and prints the figures.
#include <benchmark/benchmark.h>
#include <cuda.h>
#include <dirent.h>
#include <dlfcn.h>
#include <signal.h>
#include <nccl.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "watchdog/state/records.h"

namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "watchdog_bench: %s\n", what.c_str());
  std::exit(2);
}

void Check(CUresult result, const char* call) {
  if (result != CUDA_SUCCESS) Fail(std::string(call) + " failed with CUresult " + std::to_string(result));
}

void Check(ncclResult_t result, const char* call) {
  if (result != ncclSuccess) Fail(std::string(call) + " failed with ncclResult " + std::to_string(result));
}

// glibc's own dlsym: a versioned lookup passes over ncclguard's interposed dlsym, so what it
// returns for an NCCL name is libnccl's function itself.
using DlsymFunction = void* (*)(void*, const char*);
DlsymFunction GlibcDlsym() {
  for (const char* version : {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"}) {
    if (void* found = dlvsym(RTLD_DEFAULT, "dlsym", version)) return reinterpret_cast<DlsymFunction>(found);
  }
  Fail("glibc's dlsym not found");
}

template <typename Function>
Function Lookup(DlsymFunction lookup, void* library, const char* name) {
  void* found = lookup(library, name);
  if (found == nullptr) Fail(std::string("symbol ") + name + " not found");
  return reinterpret_cast<Function>(found);
}

// cuda.h maps some names to versioned symbols (cuMemAlloc is cuMemAlloc_v2): look up the name the
// macro expands to.
#define BENCH_EXPANDED_NAME(name) BENCH_NAME_TEXT(name)
#define BENCH_NAME_TEXT(name) #name

struct Driver {
  decltype(&::cuInit) init;
  decltype(&::cuDeviceGet) device_get;
  decltype(&::cuDevicePrimaryCtxRetain) primary_context_retain;
  decltype(&::cuCtxSetCurrent) context_set_current;
  decltype(&::cuStreamCreate) stream_create;
  decltype(&::cuStreamSynchronize) stream_synchronize;
  decltype(&::cuStreamIsCapturing) stream_is_capturing;
  decltype(&::cuMemAlloc) mem_alloc;
  decltype(&::cuEventCreate) event_create;
  decltype(&::cuEventRecord) event_record;
};

struct NcclFunctions {
  decltype(&::ncclGetUniqueId) get_unique_id;
  decltype(&::ncclCommInitRank) comm_init_rank;
  decltype(&::ncclAllReduce) all_reduce;
};

NcclFunctions LoadNccl(DlsymFunction lookup, void* library) {
  return {Lookup<decltype(&::ncclGetUniqueId)>(lookup, library, "ncclGetUniqueId"),
          Lookup<decltype(&::ncclCommInitRank)>(lookup, library, "ncclCommInitRank"),
          Lookup<decltype(&::ncclAllReduce)>(lookup, library, "ncclAllReduce")};
}

double EnvSeconds(const char* name, double fallback) {
  const char* text = std::getenv(name);
  return text != nullptr && *text != '\0' ? std::strtod(text, nullptr) : fallback;
}

// What every phase shares: one device, one stream, small buffers, and the two ways into NCCL.
struct Setup {
  Driver cuda{};
  NcclFunctions direct{};       // libnccl's own functions
  NcclFunctions intercepted{};  // what the application gets from dlsym(): ncclguard's wrappers
  CUstream stream = nullptr;
  CUdeviceptr send = 0;
  CUdeviceptr receive = 0;
  std::size_t ring_size = 2048;
  double poll_interval_s = 0.1;

  Setup() {
    // The way Paddle and JAX load NCCL: dlopen + dlsym on the handle, which ncclguard intercepts.
    void* libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    void* libnccl = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (libcuda == nullptr || libnccl == nullptr) {
      Fail(std::string("cannot load libcuda.so.1 and libnccl.so.2 (for the emulator, set "
                       "LD_LIBRARY_PATH=<build>/emulator/lib): ") + dlerror());
    }
    const DlsymFunction glibc = GlibcDlsym();
#define BENCH_RESOLVE(field, name) \
  cuda.field = Lookup<decltype(cuda.field)>(glibc, libcuda, BENCH_EXPANDED_NAME(name));
    BENCH_RESOLVE(init, cuInit)
    BENCH_RESOLVE(device_get, cuDeviceGet)
    BENCH_RESOLVE(primary_context_retain, cuDevicePrimaryCtxRetain)
    BENCH_RESOLVE(context_set_current, cuCtxSetCurrent)
    BENCH_RESOLVE(stream_create, cuStreamCreate)
    BENCH_RESOLVE(stream_synchronize, cuStreamSynchronize)
    BENCH_RESOLVE(stream_is_capturing, cuStreamIsCapturing)
    BENCH_RESOLVE(mem_alloc, cuMemAlloc)
    BENCH_RESOLVE(event_create, cuEventCreate)
    BENCH_RESOLVE(event_record, cuEventRecord)
#undef BENCH_RESOLVE
    direct = LoadNccl(glibc, libnccl);
    intercepted = LoadNccl(dlsym, libnccl);
    if (intercepted.all_reduce == direct.all_reduce) {
      Fail("ncclguard is not loaded: run under LD_PRELOAD=<build>/lib/libncclguard.so (bench/run.sh does)");
    }
    if (const char* ring = std::getenv("NCCLGUARD_RING_SIZE"); ring != nullptr && *ring != '\0') {
      ring_size = std::strtoull(ring, nullptr, 10);
    }
    poll_interval_s = EnvSeconds("NCCLGUARD_POLL_INTERVAL", 0.1);

    CUdevice device = 0;
    CUcontext context = nullptr;
    Check(cuda.init(0), "cuInit");
    Check(cuda.device_get(&device, 0), "cuDeviceGet");
    Check(cuda.primary_context_retain(&context, device), "cuDevicePrimaryCtxRetain");
    Check(cuda.context_set_current(context), "cuCtxSetCurrent");
    Check(cuda.stream_create(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    Check(cuda.mem_alloc(&send, 64), "cuMemAlloc");
    Check(cuda.mem_alloc(&receive, 64), "cuMemAlloc");
  }

  // A one-rank communicator, created through `functions`: ncclguard watches only those created
  // through its wrappers.
  ncclComm_t NewCommunicator(const NcclFunctions& functions) const {
    ncclUniqueId id;
    ncclComm_t comm = nullptr;
    Check(functions.get_unique_id(&id), "ncclGetUniqueId");
    Check(functions.comm_init_rank(&comm, 1, id, 0), "ncclCommInitRank");
    return comm;
  }

  ncclResult_t AllReduce(const NcclFunctions& functions, ncclComm_t comm) const {
    return functions.all_reduce(reinterpret_cast<const void*>(send), reinterpret_cast<void*>(receive), 4,
                                ncclFloat32, ncclSum, comm, stream);
  }

  void Synchronize() const { Check(cuda.stream_synchronize(stream), "cuStreamSynchronize"); }
};

// ---- overhead ---------------------------------------------------------------------------------

// Between batches, outside the timed region: the stream drains, and the watchdog gets the time to
// see every operation of the batch complete. Without that pause the ring fills with operations
// the watchdog has not yet seen finish, and ncclguard stops recording (it counts them as
// dropped): a cheaper path that is not the one to measure here.
template <typename Call>
void TimeBatches(benchmark::State& state, const Setup& setup, Call call) {
  // A quarter of the ring: the watchdog may miss a whole pause and still find free slots.
  const std::size_t batch = std::max<std::size_t>(1, setup.ring_size / 4);
  const auto catch_up = std::chrono::duration<double>(2.5 * setup.poll_interval_s);
  std::size_t in_batch = 0;
  for (auto _ : state) {
    call();
    if (++in_batch == batch) {
      state.PauseTiming();
      setup.Synchronize();
      std::this_thread::sleep_for(catch_up);
      in_batch = 0;
      state.ResumeTiming();
    }
  }
  setup.Synchronize();
  std::this_thread::sleep_for(catch_up);
}

// The driver calls ncclguard makes around a launch, on events of its own: one pair per ring slot,
// used in turn, like the ring's.
class EventCalls {
 public:
  explicit EventCalls(const Setup& setup) : setup_(setup), events_(2 * setup.ring_size) {
    for (CUevent& event : events_) Check(setup.cuda.event_create(&event, CU_EVENT_DEFAULT), "cuEventCreate");
  }
  void Before() {
    CUstreamCaptureStatus status;
    benchmark::DoNotOptimize(setup_.cuda.stream_is_capturing(setup_.stream, &status));
    benchmark::DoNotOptimize(setup_.cuda.event_record(events_[next_], setup_.stream));
  }
  void After() {
    benchmark::DoNotOptimize(setup_.cuda.event_record(events_[next_ + 1], setup_.stream));
    next_ = (next_ + 2) % events_.size();
  }

 private:
  const Setup& setup_;
  std::vector<CUevent> events_;
  std::size_t next_ = 0;
};

constexpr const char* kDirect = "allreduce_direct";
constexpr const char* kDirectWithEvents = "allreduce_direct_with_event_calls";
constexpr const char* kEventsAlone = "event_calls_alone";
constexpr const char* kIntercepted = "allreduce_intercepted";

void RegisterOverheadBenchmarks(const Setup& setup) {
  // One communicator watched by ncclguard; the direct calls use it too, unseen by ncclguard.
  const ncclComm_t comm = setup.NewCommunicator(setup.intercepted);
  auto* events = new EventCalls(setup);  // lives as long as the benchmarks
  auto add = [](const char* name, auto body) {
    benchmark::RegisterBenchmark(name, body)->UseRealTime()->Unit(benchmark::kNanosecond);
  };
  add(kDirect, [&setup, comm](benchmark::State& state) {
    TimeBatches(state, setup, [&] { benchmark::DoNotOptimize(setup.AllReduce(setup.direct, comm)); });
  });
  add(kDirectWithEvents, [&setup, comm, events](benchmark::State& state) {
    TimeBatches(state, setup, [&] {
      events->Before();
      benchmark::DoNotOptimize(setup.AllReduce(setup.direct, comm));
      events->After();
    });
  });
  add(kEventsAlone, [&setup, events](benchmark::State& state) {
    TimeBatches(state, setup, [&] {
      events->Before();
      events->After();
    });
  });
  add(kIntercepted, [&setup, comm](benchmark::State& state) {
    TimeBatches(state, setup, [&] { benchmark::DoNotOptimize(setup.AllReduce(setup.intercepted, comm)); });
  });
}

// Shows the usual console output and keeps each benchmark's median.
class MedianReporter : public benchmark::ConsoleReporter {
 public:
  MedianReporter() : ConsoleReporter(OO_Tabular) {}  // no colour codes: the output goes to files
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      const bool single = run.run_type == Run::RT_Iteration && run.repetitions <= 1;
      if ((median || single) && !run.error_occurred) medians_ns[run.run_name.function_name] = run.GetAdjustedRealTime();
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, double> medians_ns;
};

// Prints the figures whose benchmarks ran (--benchmark_filter may leave some out).
void PrintOverheadFigures(const std::map<std::string, double>& medians) {
  auto print = [&medians](const char* figure, std::initializer_list<const char*> names, auto compute) {
    std::vector<double> values;
    for (const char* name : names) {
      const auto found = medians.find(name);
      if (found == medians.end()) return;
      values.push_back(found->second);
    }
    std::printf("%s: %.1f\n", figure, compute(values));
  };
  auto first = [](const std::vector<double>& values) { return values[0]; };
  auto difference = [](const std::vector<double>& values) { return values[0] - values[1]; };
  print("direct_ns_per_collective", {kDirect}, first);
  print("intercepted_ns_per_collective", {kIntercepted}, first);
  print("event_calls_alone_ns", {kEventsAlone}, first);
  // The driver's share of the overhead: the same calls, made around a direct launch.
  print("driver_event_calls_ns_per_collective", {kDirectWithEvents, kDirect}, difference);
  print("ncclguard_bookkeeping_ns_per_collective", {kIntercepted, kDirectWithEvents}, difference);
  print("overhead_ns_per_collective", {kIntercepted, kDirect}, difference);
}

// ---- watchdog CPU -----------------------------------------------------------------------------

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

pid_t FindThread(const std::string& name) {
  DIR* tasks = opendir("/proc/self/task");
  if (tasks == nullptr) return -1;
  pid_t found = -1;
  while (const dirent* entry = readdir(tasks)) {
    if (entry->d_name[0] == '.') continue;
    std::string comm = ReadFile(std::string("/proc/self/task/") + entry->d_name + "/comm");
    if (!comm.empty() && comm.back() == '\n') comm.pop_back();
    if (comm == name) found = static_cast<pid_t>(std::atoi(entry->d_name));
  }
  closedir(tasks);
  return found;
}

// CPU time of a thread of this process, in seconds: from schedstat (nanoseconds) where the kernel
// keeps it, else utime + stime from stat (clock ticks, too coarse for a few seconds of a thread
// that mostly sleeps).
double ThreadCpuSeconds(pid_t tid) {
  const std::string task = "/proc/self/task/" + std::to_string(tid);
  std::istringstream schedstat(ReadFile(task + "/schedstat"));
  unsigned long long on_cpu_ns = 0;
  if (schedstat >> on_cpu_ns) return static_cast<double>(on_cpu_ns) / 1e9;
  const std::string stat = ReadFile(task + "/stat");
  const std::size_t name_end = stat.rfind(')');
  if (name_end == std::string::npos) Fail("cannot read the stat of thread " + std::to_string(tid));
  // After "pid (comm)": state is field 3, utime and stime are fields 14 and 15.
  std::istringstream fields(stat.substr(name_end + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int number = 3; number <= 15 && fields >> field; ++number) {
    if (number == 14) utime = std::stoull(field);
    if (number == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double ProcessCpuSeconds() {
  timespec now;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) / 1e9;
}

void MeasureWatchdogCpu(const Setup& setup, double seconds) {
  const ncclComm_t comm = setup.NewCommunicator(setup.intercepted);
  const pid_t watchdog = FindThread("ncclguard-wd");
  if (watchdog < 0) Fail("no thread named ncclguard-wd: the watchdog did not start");
  const std::size_t batch = std::max<std::size_t>(1, setup.ring_size / 2);
  using Clock = std::chrono::steady_clock;
  const double watchdog_before = ThreadCpuSeconds(watchdog);
  const double process_before = ProcessCpuSeconds();
  const Clock::time_point start = Clock::now();
  const Clock::time_point end = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::uint64_t operations = 0;
  while (Clock::now() < end) {
    for (std::size_t i = 0; i < batch; ++i) Check(setup.AllReduce(setup.intercepted, comm), "ncclAllReduce");
    operations += batch;
    setup.Synchronize();  // keeps the stream's queue bounded
  }
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  const double watchdog_cpu = ThreadCpuSeconds(watchdog) - watchdog_before;
  std::printf("collectives_per_second: %.0f\n", static_cast<double>(operations) / wall);
  std::printf("process_cpu_percent: %.1f\n", 100 * (ProcessCpuSeconds() - process_before) / wall);
  std::printf("watchdog_cpu_seconds: %.3f of %.3f wall\n", watchdog_cpu, wall);
  std::printf("watchdog_cpu_percent: %.2f\n", 100 * watchdog_cpu / wall);
}

// ---- memory per communicator ------------------------------------------------------------------

// Anonymous resident memory: the heap and private mappings, where ncclguard's rings live (the
// emulator's shared segments are file-backed and stay out of it).
long RssAnonBytes() {
  std::istringstream status(ReadFile("/proc/self/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::atol(line.c_str() + 8) * 1024;
  }
  Fail("no RssAnon in /proc/self/status");
}

// Growth of anonymous memory for `count` communicators made through `functions`, each filling a
// ring's worth of operations (so that every slot has its events).
long GrowthFor(const Setup& setup, const NcclFunctions& functions, int count) {
  const long before = RssAnonBytes();
  for (int i = 0; i < count; ++i) {
    const ncclComm_t comm = setup.NewCommunicator(functions);
    for (std::size_t op = 0; op < setup.ring_size; ++op) Check(setup.AllReduce(functions, comm), "ncclAllReduce");
    setup.Synchronize();
  }
  return RssAnonBytes() - before;
}

void MeasureMemory(const Setup& setup, int communicators) {
  // Warm-up: the first communicator of each kind brings one-time allocations (log, watchdog).
  GrowthFor(setup, setup.direct, 1);
  GrowthFor(setup, setup.intercepted, 1);
  const long direct = GrowthFor(setup, setup.direct, communicators);
  const long watched = GrowthFor(setup, setup.intercepted, communicators);
  const std::size_t ring = sizeof(ncclguard::OpRecord) * setup.ring_size + sizeof(ncclguard::CommState);
  std::printf("ring_bytes_per_communicator: %zu (sizeof(OpRecord) %zu x %zu slots + CommState %zu)\n", ring,
              sizeof(ncclguard::OpRecord), setup.ring_size, sizeof(ncclguard::CommState));
  std::printf("rss_anon_growth_per_communicator: direct %ld, watched %ld\n", direct / communicators,
              watched / communicators);
  std::printf("memory_per_communicator_bytes: %ld\n", (watched - direct) / communicators);
}

// ---- the watchdog's own view -----------------------------------------------------------------

std::size_t CountDumps(const std::string& directory) {
  std::size_t count = 0;
  if (DIR* entries = opendir(directory.c_str())) {
    while (const dirent* entry = readdir(entries)) count += std::strncmp(entry->d_name, "dump-", 5) == 0;
    closedir(entries);
  }
  return count;
}

// Asks ncclguard for a dump with its dump signal (the default, SIGUSR2) and waits for the file, so
// that run.sh can read from it how many operations went unrecorded. Not at exit: the watchdog
// thread writes it while the process is still whole.
void DumpAndWait() {
  const char* dump_dir = std::getenv("NCCLGUARD_DUMP_DIR");
  const char* job_id = std::getenv("NCCLGUARD_JOB_ID");
  if (dump_dir == nullptr || job_id == nullptr) Fail("--dump_at_end=1 needs NCCLGUARD_DUMP_DIR and NCCLGUARD_JOB_ID");
  const std::string job_dir = std::string(dump_dir) + "/" + job_id;
  const std::size_t before = CountDumps(job_dir);
  raise(SIGUSR2);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (CountDumps(job_dir) == before) {
    if (std::chrono::steady_clock::now() > deadline) Fail("ncclguard wrote no dump in " + job_dir);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// ---- main -------------------------------------------------------------------------------------

// Takes --name=value out of argv (Google Benchmark rejects flags it does not know).
std::string TakeOption(int& argc, char** argv, const std::string& name, const std::string& fallback) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      std::string value = argv[i] + prefix.size();
      for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
      --argc;
      return value;
    }
  }
  return fallback;
}

bool Given(int argc, char** argv, const char* flag) {
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], flag, std::strlen(flag)) == 0) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string phases = TakeOption(argc, argv, "phases", "overhead,cpu,memory");
  const double cpu_seconds = std::stod(TakeOption(argc, argv, "cpu_seconds", "3"));
  const int communicators = std::stoi(TakeOption(argc, argv, "communicators", "8"));
  const bool dump_at_end = TakeOption(argc, argv, "dump_at_end", "0") == "1";

  // Defaults for stable medians on a busy machine; flags given on the command line win.
  std::vector<char*> arguments(argv, argv + argc);
  std::vector<std::string> defaults;
  if (!Given(argc, argv, "--benchmark_repetitions")) defaults.emplace_back("--benchmark_repetitions=15");
  if (!Given(argc, argv, "--benchmark_min_time")) defaults.emplace_back("--benchmark_min_time=0.03");
  if (!Given(argc, argv, "--benchmark_enable_random_interleaving")) {
    // Repetitions of the four benchmarks in random order: drift in machine load hits them alike.
    defaults.emplace_back("--benchmark_enable_random_interleaving=true");
  }
  if (!Given(argc, argv, "--benchmark_display_aggregates_only")) {
    defaults.emplace_back("--benchmark_display_aggregates_only=true");
  }
  for (std::string& flag : defaults) arguments.push_back(flag.data());
  int argument_count = static_cast<int>(arguments.size());
  benchmark::Initialize(&argument_count, arguments.data());
  if (benchmark::ReportUnrecognizedArguments(argument_count, arguments.data())) return 2;

  const Setup setup;
  if (phases.find("memory") != std::string::npos) MeasureMemory(setup, communicators);
  if (phases.find("cpu") != std::string::npos) MeasureWatchdogCpu(setup, cpu_seconds);
  if (phases.find("overhead") != std::string::npos) {
    RegisterOverheadBenchmarks(setup);
    MedianReporter reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
    std::cout.flush();  // the reporter writes to std::cout, the figures go through stdio
    PrintOverheadFigures(reporter.medians_ns);
  }
  if (dump_at_end) DumpAndWait();
  std::fflush(stdout);
  benchmark::Shutdown();
  return 0;
}
