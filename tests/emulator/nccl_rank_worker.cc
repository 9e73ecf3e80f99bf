// One rank of a multi-process job on the emulated NCCL (or all ranks of a job, --local N), run by
// the multi-process tests. It reports each step on stdout and notices its own stalls: a
// collective that does not finish within --stall-ms is reported with the communicator's async
// error and NCCL's last error, then aborted.
//
//   emu_nccl_rank --rank R --nranks N (--id HEX | --ids HEX,HEX... | --id-from-env) [--steps S]
//                 [--count C] [--stall-ms M] [--nonblocking] [--reinit]
//   emu_nccl_rank --local N [--first-ranks K] [--steps S] [--setenv-between NAME=VALUE]
//                 [--then linked|copy|dlmopen]... [--copy-lib PATH]
//   emu_nccl_rank --log-action warn|init|reset|set:NAME=VALUE|unset:NAME ...
// --ids initialises with ncclCommInitRankScalable over those unique ids.
// --local runs one communicator over K (default N) devices through the linked library, sets the
// variable, then one communicator over N devices per --then: through the linked library again,
// through a separately loaded copy of it (its own statics, like a second NCCL in the process), or
// through the library loaded again into a new link-map namespace with dlmopen (with its own
// libcuda, whose devices and streams the communicator then uses).
// --log-action runs the actions in order and prints "host H pid P" first: warn provokes a WARN,
// init makes and destroys a 2-rank communicator, reset calls ncclResetDebugInit.
#include <cuda.h>
#include <dlfcn.h>
#include <link.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace {

struct Options {
  int rank = 0;
  int nranks = 1;
  int local = 0;
  std::string id_hex;
  bool id_from_env = false;
  int steps = 3;
  size_t count = 1000;
  int stall_ms = 1500;
  bool nonblocking = false;
  bool reinit = false;
  int first_ranks = 0;
  std::string setenv_between;
  std::vector<std::string> then;
  std::string copy_lib;
  std::vector<std::string> ids_hex;
  std::vector<std::string> log_actions;
};

// The driver entry points used for devices, streams and memory: the linked libcuda, or the one
// of a dlmopen namespace (a communicator must use its own namespace's streams).
struct Cuda {
  decltype(&cuInit) init = cuInit;
  decltype(&cuDevicePrimaryCtxRetain) retainContext = cuDevicePrimaryCtxRetain;
  decltype(&cuCtxSetCurrent) setCurrent = cuCtxSetCurrent;
  decltype(&cuStreamCreate) streamCreate = cuStreamCreate;
  decltype(&cuStreamQuery) streamQuery = cuStreamQuery;
  decltype(&cuMemAlloc) memAlloc = cuMemAlloc;
};

// The entry points used, from the linked library or from a separately loaded copy of it.
struct Nccl {
  decltype(&ncclCommInitAll) initAll = ncclCommInitAll;
  decltype(&ncclAllReduce) allReduce = ncclAllReduce;
  decltype(&ncclGroupStart) groupStart = ncclGroupStart;
  decltype(&ncclGroupEnd) groupEnd = ncclGroupEnd;
  decltype(&ncclCommDestroy) destroy = ncclCommDestroy;
  decltype(&ncclCommAbort) abort = ncclCommAbort;
  decltype(&ncclCommGetAsyncError) asyncError = ncclCommGetAsyncError;
  decltype(&ncclGetLastError) lastError = ncclGetLastError;
};

void check(bool ok, const char* what) {
  if (!ok) {
    printf("failed: %s\n", what);
    exit(10);
  }
}

template <class F>
void resolve(void* library, const char* name, F* function) {
  *function = reinterpret_cast<F>(dlsym(library, name));
  if (*function == nullptr) {
    fprintf(stderr, "missing %s in the library copy\n", name);
    exit(10);
  }
}

void* loadOrExit(void* library, const std::string& path) {
  if (library == nullptr) {
    fprintf(stderr, "loading %s: %s\n", path.c_str(), dlerror());
    exit(10);
  }
  return library;
}

Nccl resolveNccl(void* library) {
  Nccl nccl;
  resolve(library, "ncclCommInitAll", &nccl.initAll);
  resolve(library, "ncclAllReduce", &nccl.allReduce);
  resolve(library, "ncclGroupStart", &nccl.groupStart);
  resolve(library, "ncclGroupEnd", &nccl.groupEnd);
  resolve(library, "ncclCommDestroy", &nccl.destroy);
  resolve(library, "ncclCommAbort", &nccl.abort);
  resolve(library, "ncclCommGetAsyncError", &nccl.asyncError);
  resolve(library, "ncclGetLastError", &nccl.lastError);
  return nccl;
}

// libnccl.so.2 and its libcuda.so.1 in a new namespace: their own copies, statics included.
std::pair<Nccl, Cuda> loadInNewNamespace() {
  void* nccl = loadOrExit(dlmopen(LM_ID_NEWLM, "libnccl.so.2", RTLD_NOW | RTLD_LOCAL), "libnccl.so.2");
  Lmid_t namespace_id = 0;
  check(dlinfo(nccl, RTLD_DI_LMID, &namespace_id) == 0, "dlinfo");
  void* cuda = loadOrExit(dlmopen(namespace_id, "libcuda.so.1", RTLD_NOW | RTLD_LOCAL), "libcuda.so.1");
  Cuda driver;
  resolve(cuda, "cuInit", &driver.init);
  resolve(cuda, "cuDevicePrimaryCtxRetain", &driver.retainContext);
  resolve(cuda, "cuCtxSetCurrent", &driver.setCurrent);
  resolve(cuda, "cuStreamCreate", &driver.streamCreate);
  resolve(cuda, "cuStreamQuery", &driver.streamQuery);
  resolve(cuda, "cuMemAlloc_v2", &driver.memAlloc);
  return {resolveNccl(nccl), driver};
}

bool waitForStream(const Cuda& cuda, CUstream stream, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (cuda.streamQuery(stream) == CUDA_ERROR_NOT_READY) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

const char* resultName(ncclResult_t result) {
  static const char* const names[] = {"ncclSuccess",        "ncclUnhandledCudaError", "ncclSystemError",
                                      "ncclInternalError",  "ncclInvalidArgument",    "ncclInvalidUsage",
                                      "ncclRemoteError",    "ncclInProgress"};
  return result >= 0 && result <= ncclInProgress ? names[result] : "unknown";
}

// The ranks this process drives: one (multi-process job) or all (--local).
struct Ranks {
  std::vector<int> ranks;
  std::vector<ncclComm_t> comms;
  std::vector<CUstream> streams;
  std::vector<int32_t*> buffers;
};

void makeRanks(Ranks& job, const std::vector<int>& ranks, size_t count, const Cuda& cuda = Cuda{}) {
  check(cuda.init(0) == CUDA_SUCCESS, "cuInit");
  for (int rank : ranks) {
    CUcontext context = nullptr;
    check(cuda.retainContext(&context, rank) == CUDA_SUCCESS, "context");
    check(cuda.setCurrent(context) == CUDA_SUCCESS, "set context");
    CUstream stream = nullptr;
    check(cuda.streamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream");
    CUdeviceptr buffer = 0;
    check(cuda.memAlloc(&buffer, count * sizeof(int32_t)) == CUDA_SUCCESS, "memory");
    job.ranks.push_back(rank);
    job.streams.push_back(stream);
    job.buffers.push_back(reinterpret_cast<int32_t*>(buffer));
  }
  job.comms.assign(ranks.size(), nullptr);
}

// Runs the steps; returns the process exit code.
int runSteps(const Nccl& nccl, const Cuda& cuda, Ranks& job, int nranks, const Options& options) {
  for (int step = 1; step <= options.steps; ++step) {
    for (size_t i = 0; i < job.ranks.size(); ++i) {
      for (size_t e = 0; e < options.count; ++e) job.buffers[i][e] = job.ranks[i] + step + static_cast<int>(e % 7);
    }
    check(nccl.groupStart() == ncclSuccess, "group start");
    for (size_t i = 0; i < job.ranks.size(); ++i) {
      check(nccl.allReduce(job.buffers[i], job.buffers[i], options.count, ncclInt32, ncclSum, job.comms[i],
                           job.streams[i]) == ncclSuccess,
            "allreduce");
    }
    check(nccl.groupEnd() == ncclSuccess, "group end");
    bool stalled = false;
    for (size_t i = 0; i < job.ranks.size(); ++i) {
      if (!waitForStream(cuda, job.streams[i], options.stall_ms)) {
        ncclResult_t async = ncclSuccess;
        nccl.asyncError(job.comms[i], &async);
        printf("rank %d stalled at step %d async %s last [%s]\n", job.ranks[i], step, resultName(async),
               nccl.lastError(job.comms[i]));
        stalled = true;
        continue;
      }
      const int32_t expected_base = nranks * (nranks - 1) / 2 + nranks * step;
      for (size_t e = 0; e < options.count; ++e) {
        if (job.buffers[i][e] != expected_base + nranks * static_cast<int32_t>(e % 7)) {
          printf("rank %d wrong result at step %d\n", job.ranks[i], step);
          return 4;
        }
      }
      printf("rank %d step %d ok\n", job.ranks[i], step);
    }
    fflush(stdout);
    if (stalled) {
      for (ncclComm_t comm : job.comms) nccl.abort(comm);
      return 3;
    }
  }
  return 0;
}

ncclUniqueId parseId(const std::string& hex) {
  ncclUniqueId id{};
  check(hex.size() == 2 * sizeof(id.internal), "id length");
  for (size_t i = 0; i < sizeof(id.internal); ++i) id.internal[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return id;
}

int initOneRank(Ranks& job, const Options& options, const ncclUniqueId& id) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = options.nonblocking ? 0 : 1;
  std::vector<ncclUniqueId> ids;
  for (const std::string& hex : options.ids_hex) ids.push_back(parseId(hex));
  const ncclResult_t result =
      ids.empty() ? ncclCommInitRankConfig(&job.comms[0], options.nranks, id, options.rank, &config)
                  : ncclCommInitRankScalable(&job.comms[0], options.nranks, options.rank, static_cast<int>(ids.size()),
                                             ids.data(), &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    printf("init failed %s [%s]\n", resultName(result), ncclGetLastError(nullptr));
    return 2;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options.stall_ms);
  ncclResult_t state = ncclInProgress;
  while (ncclCommGetAsyncError(job.comms[0], &state) == ncclSuccess && state == ncclInProgress &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (state == ncclInProgress) {
    printf("rank %d init stalled\n", options.rank);
    ncclCommAbort(job.comms[0]);
    return 3;
  }
  return 0;
}

int runRank(const Options& options) {
  Ranks job;
  makeRanks(job, {options.rank}, options.count);
  const int rounds = options.reinit ? 2 : 1;
  for (int round = 0; round < rounds; ++round) {
    ncclUniqueId id{};
    if (options.id_from_env) {
      // Every rank derives the id from NCCL_COMM_ID on its own.
      check(ncclGetUniqueId(&id) == ncclSuccess, "unique id from NCCL_COMM_ID");
    } else if (options.ids_hex.empty()) {
      id = parseId(options.id_hex);
    }
    if (int code = initOneRank(job, options, id); code != 0) return code;
    if (int code = runSteps(Nccl{}, Cuda{}, job, options.nranks, options); code != 0) return code;
    check(ncclCommDestroy(job.comms[0]) == ncclSuccess, "destroy");
  }
  printf("rank %d done\n", options.rank);
  return 0;
}

int runLocal(const Options& options) {
  std::vector<std::string> rounds = {"linked"};
  rounds.insert(rounds.end(), options.then.begin(), options.then.end());
  for (size_t round = 0; round < rounds.size(); ++round) {
    if (round == 1 && !options.setenv_between.empty()) {
      const size_t equals = options.setenv_between.find('=');
      setenv(options.setenv_between.substr(0, equals).c_str(), options.setenv_between.substr(equals + 1).c_str(), 1);
    }
    Nccl nccl;
    Cuda cuda;
    if (rounds[round] == "copy") {
      nccl = resolveNccl(loadOrExit(dlopen(options.copy_lib.c_str(), RTLD_NOW | RTLD_LOCAL), options.copy_lib));
    } else if (rounds[round] == "dlmopen") {
      std::tie(nccl, cuda) = loadInNewNamespace();
    }
    const int nranks = round == 0 && options.first_ranks > 0 ? options.first_ranks : options.local;
    std::vector<int> ranks;
    for (int r = 0; r < nranks; ++r) ranks.push_back(r);
    Ranks job;
    makeRanks(job, ranks, options.count, cuda);
    printf("communicator %zu (%s, %d ranks)\n", round + 1, rounds[round].c_str(), nranks);
    if (ncclResult_t result = nccl.initAll(job.comms.data(), nranks, nullptr); result != ncclSuccess) {
      printf("init failed %s [%s]\n", resultName(result), nccl.lastError(nullptr));
      return 2;
    }
    if (int code = runSteps(nccl, cuda, job, nranks, options); code != 0) return code;
    for (ncclComm_t comm : job.comms) check(nccl.destroy(comm) == ncclSuccess, "destroy");
  }
  printf("done\n");
  return 0;
}

int runLogActions(const Options& options) {
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  printf("host %s pid %d\n", host, getpid());
  for (const std::string& action : options.log_actions) {
    if (action == "warn") {
      int count = 0;
      check(ncclCommCount(nullptr, &count) == ncclInvalidArgument, "a NULL communicator is refused");
      printf("last [%s]\n", ncclGetLastError(nullptr));
    } else if (action == "init") {
      Ranks job;
      makeRanks(job, {0, 1}, 1);
      check(ncclCommInitAll(job.comms.data(), 2, nullptr) == ncclSuccess, "init");
      for (ncclComm_t comm : job.comms) check(ncclCommDestroy(comm) == ncclSuccess, "destroy");
    } else if (action == "reset") {
      // Deprecated in nccl.h, yet exported and documented to re-read the NCCL_DEBUG* variables.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
      ncclResetDebugInit();
#pragma GCC diagnostic pop
    } else if (action.rfind("set:", 0) == 0) {
      const size_t equals = action.find('=');
      check(equals != std::string::npos, "set:NAME=VALUE");
      setenv(action.substr(4, equals - 4).c_str(), action.substr(equals + 1).c_str(), 1);
    } else if (action.rfind("unset:", 0) == 0) {
      unsetenv(action.substr(6).c_str());
    } else {
      check(false, action.c_str());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&] {
      check(i + 1 < argc, "flag value");
      return std::string(argv[++i]);
    };
    if (flag == "--rank") options.rank = std::stoi(value());
    else if (flag == "--nranks") options.nranks = std::stoi(value());
    else if (flag == "--local") options.local = std::stoi(value());
    else if (flag == "--id") options.id_hex = value();
    else if (flag == "--id-from-env") options.id_from_env = true;
    else if (flag == "--steps") options.steps = std::stoi(value());
    else if (flag == "--count") options.count = std::stoul(value());
    else if (flag == "--stall-ms") options.stall_ms = std::stoi(value());
    else if (flag == "--nonblocking") options.nonblocking = true;
    else if (flag == "--reinit") options.reinit = true;
    else if (flag == "--first-ranks") options.first_ranks = std::stoi(value());
    else if (flag == "--setenv-between") options.setenv_between = value();
    else if (flag == "--then") options.then.push_back(value());
    else if (flag == "--copy-lib") options.copy_lib = value();
    else if (flag == "--ids") {
      const std::string list = value();
      for (size_t start = 0; start <= list.size();) {
        const size_t comma = std::min(list.find(',', start), list.size());
        options.ids_hex.push_back(list.substr(start, comma - start));
        start = comma + 1;
      }
    } else if (flag == "--log-action") options.log_actions.push_back(value());
    else check(false, argv[i]);
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (!options.log_actions.empty()) return runLogActions(options);
  return options.local > 0 ? runLocal(options) : runRank(options);
}
