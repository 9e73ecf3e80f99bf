#include "rank.h"

#include <cuda.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

namespace {

// A power of two, so that the update only rounds where the averaged gradient itself does.
constexpr float kLearningRate = 0.0625f;

struct Identity {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
};

struct Job {
  const Options& options;
  Identity identity;
  NcclApi nccl{};
  ncclComm_t comm = nullptr;
};

[[noreturn]] void fail(const Job& job, const std::string& message) {
  std::fprintf(stderr, "rank %d: %s\n", job.identity.rank, message.c_str());
  std::exit(EXIT_FAILURE);
}

void check_cuda(const Job& job, CUresult result, const char* call) {
  if (result == CUDA_SUCCESS) return;
  // A stub or broken driver may not even be able to name its errors.
  const char* name = nullptr;
  const char* description = nullptr;
  if (cuGetErrorName(result, &name) != CUDA_SUCCESS) name = nullptr;
  if (cuGetErrorString(result, &description) != CUDA_SUCCESS) description = nullptr;
  fail(job, std::string(call) + " failed: " + (name != nullptr ? name : "unnamed CUDA error") + ": " +
                (description != nullptr ? description : "no description") + " (CUresult " + std::to_string(result) + ")");
}

void check_nccl(const Job& job, ncclResult_t result, const char* call) {
  if (result == ncclSuccess) return;
  const char* last_error = job.nccl.getLastError(job.comm);
  fail(job, std::string(call) + " failed: " + job.nccl.getErrorString(result) + " (ncclResult_t " + std::to_string(result) +
                "); NCCL last error: " + (last_error != nullptr && *last_error != '\0' ? last_error : "(none)"));
}

int integer_from_environment(const char* name, int fallback, int minimum) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || errno != 0 || value < minimum || value > 1'000'000) {
    std::fprintf(stderr, "train_loop: %s=%s is not an integer >= %d\n", name, text, minimum);
    std::exit(kUsageExitCode);
  }
  return static_cast<int>(value);
}

Identity identity_from_environment() {
  Identity identity;
  identity.rank = integer_from_environment("RANK", 0, 0);
  identity.world_size = integer_from_environment("WORLD_SIZE", 1, 1);
  // One node unless told otherwise: the local rank is the rank.
  identity.local_rank = integer_from_environment("LOCAL_RANK", identity.rank, 0);
  if (identity.rank >= identity.world_size) {
    std::fprintf(stderr, "train_loop: RANK=%d is not below WORLD_SIZE=%d\n", identity.rank, identity.world_size);
    std::exit(kUsageExitCode);
  }
  return identity;
}

std::string nccl_version_text(int code) {
  // NCCL 2.9 changed the encoding from major*1000+minor*100+patch to major*10000+minor*100+patch.
  const int major_scale = code >= 10000 ? 10000 : 1000;
  return std::to_string(code / major_scale) + "." + std::to_string(code % major_scale / 100) + "." + std::to_string(code % 100);
}

void write_file_atomically(const Job& job, const std::string& path, const void* data, size_t size) {
  const std::string temporary = path + ".tmp." + std::to_string(getpid());
  const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(job, "cannot create " + temporary + ": " + std::strerror(errno));
  const bool written = write(fd, data, size) == static_cast<ssize_t>(size) && fsync(fd) == 0;
  const int saved_errno = errno;
  close(fd);
  // The rename publishes the whole id at once: a reader never sees a partial file.
  if (!written || rename(temporary.c_str(), path.c_str()) != 0) {
    fail(job, "cannot write " + path + ": " + std::strerror(written ? errno : saved_errno));
  }
}

bool read_unique_id(const std::string& path, ncclUniqueId& id) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool complete = read(fd, &id, sizeof id) == static_cast<ssize_t>(sizeof id);
  close(fd);
  return complete;
}

ncclUniqueId obtain_unique_id(const Job& job) {
  ncclUniqueId id{};
  const std::string& path = job.options.rendezvous_file;
  // With NCCL_COMM_ID set, NCCL builds the id from the variable on every rank.
  if (std::getenv("NCCL_COMM_ID") != nullptr || job.identity.world_size == 1) {
    check_nccl(job, job.nccl.getUniqueId(&id), "ncclGetUniqueId");
    return id;
  }
  if (path.empty()) fail(job, "WORLD_SIZE > 1 needs --rendezvous FILE or NCCL_COMM_ID");
  if (job.identity.rank == 0) {
    check_nccl(job, job.nccl.getUniqueId(&id), "ncclGetUniqueId");
    write_file_atomically(job, path, &id, sizeof id);
    return id;
  }
  // Polling works on a shared filesystem too, where file change notifications do not.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(job.options.rendezvous_timeout_s);
  while (!read_unique_id(path, id)) {
    if (std::chrono::steady_clock::now() >= deadline) {
      fail(job, "no NCCL unique id in " + path + " after " + std::to_string(job.options.rendezvous_timeout_s) +
                    " s (is rank 0 running?)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return id;
}

float gradient(float weight, int rank, long step, size_t index) {
  // Small integers: sums over any number of ranks are exact in float, so the AllReduce result
  // does not depend on the reduction order and every rank, loader and library agrees bit for bit.
  const long base = (rank + 3 * step + static_cast<long>(index % 7)) % 7 - 3;
  return static_cast<float>(base + (weight >= 0 ? 1 : -1));
}

uint64_t checksum(const std::vector<float>& values) {
  // FNV-1a over the bytes.
  uint64_t hash = 14695981039346656037ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  for (size_t index = 0; index < values.size() * sizeof(float); ++index) {
    hash = (hash ^ bytes[index]) * 1099511628211ull;
  }
  return hash;
}

// Runs in a child forked from a process with CUDA and NCCL threads: only plain computation on
// the stack, then _exit, so that no lock another thread held at fork is ever taken.
[[noreturn]] void run_data_loader_worker(int worker) {
  unsigned sample = 2166136261u ^ static_cast<unsigned>(worker);
  for (int index = 0; index < 100000; ++index) sample = (sample ^ static_cast<unsigned>(index)) * 16777619u;
  volatile unsigned batch = sample;
  (void)batch;
  _exit(0);
}

std::vector<pid_t> start_data_loader_workers(const Job& job) {
  std::vector<pid_t> workers;
  std::fflush(nullptr);
  for (int worker = 0; worker < job.options.workers; ++worker) {
    const pid_t pid = fork();
    if (pid < 0) fail(job, std::string("fork of a data loader worker failed: ") + std::strerror(errno));
    if (pid == 0) run_data_loader_worker(worker);
    workers.push_back(pid);
  }
  return workers;
}

void reap_data_loader_workers(const Job& job, const std::vector<pid_t>& workers) {
  for (size_t worker = 0; worker < workers.size(); ++worker) {
    int status = 0;
    if (waitpid(workers[worker], &status, 0) != workers[worker]) {
      fail(job, "waitpid of data loader worker " + std::to_string(worker) + " failed: " + std::strerror(errno));
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fail(job, "data loader worker " + std::to_string(worker) + " (pid " + std::to_string(workers[worker]) +
                    ") ended with wait status " + std::to_string(status));
    }
  }
  if (!workers.empty()) std::printf("rank %d: %zu data loader workers finished\n", job.identity.rank, workers.size());
}

bool fault_here(const std::optional<RankStep>& fault, const Job& job, long step) {
  return fault && fault->rank == job.identity.rank && fault->step == step;
}

struct DeviceState {
  CUdevice device = 0;
  CUstream stream = nullptr;
  CUdeviceptr model = 0;
  CUdeviceptr gradients = 0;
};

DeviceState open_device(const Job& job, int nccl_version) {
  DeviceState state;
  check_cuda(job, cuInit(0), "cuInit");
  int device_count = 0;
  check_cuda(job, cuDeviceGetCount(&device_count), "cuDeviceGetCount");
  if (device_count == 0) fail(job, "no CUDA device");
  const int ordinal = job.identity.local_rank % device_count;
  check_cuda(job, cuDeviceGet(&state.device, ordinal), "cuDeviceGet");
  char device_name[256] = {};
  check_cuda(job, cuDeviceGetName(device_name, sizeof device_name, state.device), "cuDeviceGetName");
  CUcontext context = nullptr;
  check_cuda(job, cuDevicePrimaryCtxRetain(&context, state.device), "cuDevicePrimaryCtxRetain");
  check_cuda(job, cuCtxSetCurrent(context), "cuCtxSetCurrent");
  std::printf("rank %d/%d: device %d (%s), NCCL %s, loader %s, pid %d\n", job.identity.rank, job.identity.world_size, ordinal,
              device_name, nccl_version_text(nccl_version).c_str(), loader_name(job.options.loader).data(),
              static_cast<int>(getpid()));
  return state;
}

void allocate_buffers(const Job& job, DeviceState& state) {
  check_cuda(job, cuStreamCreate(&state.stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  check_cuda(job, cuMemAlloc(&state.model, job.options.model_count * sizeof(float)), "cuMemAlloc");
  // Room for the longer AllReduce of --desync.
  const size_t gradient_capacity = job.options.count + (job.options.desync ? kDesyncExtraElements : 0);
  check_cuda(job, cuMemAlloc(&state.gradients, gradient_capacity * sizeof(float)), "cuMemAlloc");
}

std::vector<float> broadcast_model(const Job& job, const DeviceState& state) {
  const size_t model_count = job.options.model_count;
  std::vector<float> model(model_count);
  for (size_t index = 0; index < model_count; ++index) {
    // Ranks other than 0 start from different values (uninitialised memory, in a real job), so
    // a broadcast that did not arrive shows in their checksum.
    model[index] = job.identity.rank == 0 ? static_cast<float>(static_cast<int>(index % 13) - 6) * 0.5f
                                          : 1000.0f + static_cast<float>(index % 97);
  }
  const size_t bytes = model_count * sizeof(float);
  check_cuda(job, cuMemcpyHtoDAsync(state.model, model.data(), bytes, state.stream), "cuMemcpyHtoDAsync");
  check_nccl(job,
             job.nccl.broadcast(reinterpret_cast<const void*>(state.model), reinterpret_cast<void*>(state.model), model_count,
                                ncclFloat, 0, job.comm, state.stream),
             "ncclBroadcast");
  check_cuda(job, cuMemcpyDtoHAsync(model.data(), state.model, bytes, state.stream), "cuMemcpyDtoHAsync");
  check_cuda(job, cuStreamSynchronize(state.stream), "cuStreamSynchronize");
  return model;
}

void train_step(const Job& job, const DeviceState& state, long step, std::vector<float>& model, std::vector<float>& gradients) {
  const size_t count = job.options.count;
  const size_t model_count = job.options.model_count;
  const int rank = job.identity.rank;
  for (size_t index = 0; index < count; ++index) gradients[index] = gradient(model[index % model_count], rank, step, index);
  if (job.options.slow && job.options.slow->rank == rank && job.options.slow->covers(step)) {
    if (job.options.verbose)
      std::printf("rank %d: step %ld: %g ms longer (--slow)\n", rank, step, job.options.slow->milliseconds);
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(job.options.slow->milliseconds));
  }
  const size_t elements = fault_here(job.options.desync, job, step) ? count + kDesyncExtraElements : count;
  check_cuda(job, cuMemcpyHtoDAsync(state.gradients, gradients.data(), elements * sizeof(float), state.stream),
             "cuMemcpyHtoDAsync");
  check_nccl(job,
             job.nccl.allReduce(reinterpret_cast<const void*>(state.gradients), reinterpret_cast<void*>(state.gradients), elements,
                                ncclFloat, ncclSum, job.comm, state.stream),
             "ncclAllReduce");
  check_cuda(job, cuMemcpyDtoHAsync(gradients.data(), state.gradients, count * sizeof(float), state.stream), "cuMemcpyDtoHAsync");
  // A collective that never completes leaves the rank asleep here, as on a GPU.
  check_cuda(job, cuStreamSynchronize(state.stream), "cuStreamSynchronize");
  for (size_t index = 0; index < count; ++index) {
    model[index % model_count] -= kLearningRate * (gradients[index] / static_cast<float>(job.identity.world_size));
  }
  check_cuda(job, cuMemcpyHtoDAsync(state.model, model.data(), model_count * sizeof(float), state.stream), "cuMemcpyHtoDAsync");
  if (job.options.verbose) std::printf("rank %d: step %ld: gradient[0] %g, model[0] %g\n", rank, step, gradients[0], model[0]);
}

// A checkpoint save that takes `seconds` (--sleep): the rank waits for its shard to be written, as a
// framework waits for a background writer, on a condition variable that nobody signals. A timed
// condition wait is what a dump's stack signal can interrupt and resume unnoticed (a sleep() would
// return early), so a late rank's stack shows it in here.
__attribute__((noinline)) void save_checkpoint(double seconds) {
  pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t written = PTHREAD_COND_INITIALIZER;
  timespec until{};
  clock_gettime(CLOCK_REALTIME, &until);
  const auto whole = static_cast<time_t>(seconds);
  until.tv_sec += whole;
  until.tv_nsec += static_cast<long>((seconds - static_cast<double>(whole)) * 1e9);
  if (until.tv_nsec >= 1'000'000'000) {
    until.tv_sec += 1;
    until.tv_nsec -= 1'000'000'000;
  }
  pthread_mutex_lock(&mutex);
  while (pthread_cond_timedwait(&written, &mutex, &until) != ETIMEDOUT) {
  }
  pthread_mutex_unlock(&mutex);
}

// Applies the faults due after `step`; returns false when this rank stops issuing collectives.
bool continue_after_faults(const Job& job, long step) {
  const Options& options = job.options;
  const int rank = job.identity.rank;
  if (fault_here(options.stop_early, job, step)) {
    std::printf("rank %d: stopping early after step %ld (--stop-early), exit code 0\n", rank, step);
    return false;
  }
  if (fault_here(options.exit_after, job, step)) {
    std::printf("rank %d: exiting with code %d after step %ld (--exit)\n", rank, kInjectedExitCode, step);
    std::fflush(nullptr);
    // _exit: a rank that dies runs no clean-up of its own.
    _exit(kInjectedExitCode);
  }
  if (options.sleep && options.sleep->rank == rank && options.sleep->step == step) {
    std::printf("rank %d: saving a checkpoint for %g s after step %ld (--sleep)\n", rank, options.sleep->seconds, step);
    std::fflush(stdout);
    save_checkpoint(options.sleep->seconds);
  }
  return true;
}

void report_and_release(Job& job, DeviceState& state, std::vector<float>& model) {
  check_cuda(job, cuMemcpyDtoHAsync(model.data(), state.model, model.size() * sizeof(float), state.stream), "cuMemcpyDtoHAsync");
  check_cuda(job, cuStreamSynchronize(state.stream), "cuStreamSynchronize");
  std::printf("rank %d checksum 0x%016" PRIx64 "\n", job.identity.rank, checksum(model));

  const ncclResult_t destroyed = job.nccl.commDestroy(job.comm);
  job.comm = nullptr;
  check_nccl(job, destroyed, "ncclCommDestroy");
  check_cuda(job, cuMemFree(state.gradients), "cuMemFree");
  check_cuda(job, cuMemFree(state.model), "cuMemFree");
  check_cuda(job, cuStreamDestroy(state.stream), "cuStreamDestroy");
  check_cuda(job, cuDevicePrimaryCtxRelease(state.device), "cuDevicePrimaryCtxRelease");
}

}  // namespace

int run_rank(const Options& options) {
  Job job{options, identity_from_environment()};
  check_fault_ranks(options, job.identity.world_size);
  job.nccl = load_nccl(options.loader);
  int nccl_version = 0;
  check_nccl(job, job.nccl.getVersion(&nccl_version), "ncclGetVersion");
  if (options.verbose) {
    std::printf("rank %d: NCCL %s loaded (%s)\n", job.identity.rank, nccl_version_text(nccl_version).c_str(),
                loader_name(options.loader).data());
  }
  DeviceState state = open_device(job, nccl_version);

  const ncclUniqueId id = obtain_unique_id(job);
  check_nccl(job, job.nccl.commInitRank(&job.comm, job.identity.world_size, id, job.identity.rank), "ncclCommInitRank");
  // Init returns only once every rank has joined, so every rank has read the file by now.
  if (job.identity.rank == 0 && !options.rendezvous_file.empty()) unlink(options.rendezvous_file.c_str());

  allocate_buffers(job, state);
  std::vector<float> model = broadcast_model(job, state);
  const std::vector<pid_t> workers = start_data_loader_workers(job);
  std::vector<float> gradients(options.count + (options.desync ? kDesyncExtraElements : 0), 0.0f);
  for (long step = 0; step <= options.steps; ++step) {
    if (step > 0) train_step(job, state, step, model, gradients);
    if (!continue_after_faults(job, step)) {
      // Out of data: a normal end of the process, communicator left to the exit.
      reap_data_loader_workers(job, workers);
      return EXIT_SUCCESS;
    }
  }
  reap_data_loader_workers(job, workers);
  report_and_release(job, state, model);
  return EXIT_SUCCESS;
}
