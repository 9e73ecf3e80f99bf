// Stream memory operations: a stream held back by cuStreamWaitValue32/64 until the host writes
// the word, cuStreamWriteValue32/64, the conditions and flags, the memory they accept (page-locked,
// registered, device), their symbols and cuGetProcAddress, capture, and a process whose stream
// waits forever still exiting.
#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <future>
#include <thread>

#include "cuda_test_support.h"

using emutest::PrimaryContext;
using namespace std::chrono_literals;

namespace {

bool staysBlocked(std::future<CUresult>& call) { return call.wait_for(100ms) == std::future_status::timeout; }

// Waits (generously) until the stream has run everything queued on it.
bool drainsWithin(CUstream stream, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (cuStreamQuery(stream) == CUDA_ERROR_NOT_READY) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

void hostWrite32(cuuint32_t* word, cuuint32_t value) { std::atomic_ref<cuuint32_t>(*word).store(value); }

double processCpuSeconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

int exitStatusOfChild(int (*child)()) {
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) std::exit(child());
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  pid_t waited = 0;
  while ((waited = waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  if (waited == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -2;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("a stream waits on a host-written word before running later work", "[memops]") {
  PrimaryContext context;
  CUstream stream;
  REQUIRE(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  void* host = nullptr;
  REQUIRE(cuMemHostAlloc(&host, 64, CU_MEMHOSTALLOC_PORTABLE) == CUDA_SUCCESS);
  auto* word = static_cast<cuuint32_t*>(host);
  *word = 0;
  CUdeviceptr device_word = 0;
  REQUIRE(cuMemHostGetDevicePointer(&device_word, host, 0) == CUDA_SUCCESS);
  CHECK(device_word == reinterpret_cast<CUdeviceptr>(host));

  std::atomic<int> runs{0};
  REQUIRE(cuStreamWaitValue32(stream, device_word, 1, CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS);
  REQUIRE(cuLaunchHostFunc(stream, emutest::countRun, &runs) == CUDA_SUCCESS);
  auto sync = std::async(std::launch::async, [&] { return cuStreamSynchronize(stream); });
  CHECK(staysBlocked(sync));
  CHECK(cuStreamQuery(stream) == CUDA_ERROR_NOT_READY);
  CHECK(runs == 0);

  // The wait sleeps: the whole process uses a small part of one core while it lasts.
  const double cpu_before = processCpuSeconds();
  const auto wall_before = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(400ms);
  const double cpu_used = processCpuSeconds() - cpu_before;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_before).count();
  CHECK(cpu_used < wall / 4);
  CHECK(runs == 0);

  hostWrite32(word, 1);
  CHECK(sync.get() == CUDA_SUCCESS);
  CHECK(runs == 1);

  // The stream writes the word back for the host: the release a gate needs.
  REQUIRE(cuStreamWriteValue32(stream, device_word, 7, CU_STREAM_WRITE_VALUE_DEFAULT) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(stream) == CUDA_SUCCESS);
  CHECK(*word == 7);
  REQUIRE(cuStreamDestroy(stream) == CUDA_SUCCESS);
  REQUIRE(cuMemFreeHost(host) == CUDA_SUCCESS);
}

TEST_CASE("each wait condition and the 64-bit forms", "[memops]") {
  PrimaryContext context;
  CUstream stream;
  REQUIRE(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  void* host = nullptr;
  REQUIRE(cuMemAllocHost(&host, 64) == CUDA_SUCCESS);
  auto* word = static_cast<cuuint32_t*>(host);
  auto* wide = reinterpret_cast<cuuint64_t*>(static_cast<char*>(host) + 8);
  const auto address = reinterpret_cast<CUdeviceptr>(word);
  const auto wide_address = reinterpret_cast<CUdeviceptr>(wide);

  struct Case {
    unsigned flags;
    cuuint32_t value, not_yet, satisfies;
  };
  // GEQ is cyclic: 0xFFFFFFF0 is "before" 5, 5 is "after" 0xFFFFFFF0.
  const Case cases[] = {{CU_STREAM_WAIT_VALUE_GEQ, 5, 0xFFFFFFF0u, 6},
                        {CU_STREAM_WAIT_VALUE_GEQ, 0xFFFFFFF0u, 0xFFFFFFE0u, 5},
                        {CU_STREAM_WAIT_VALUE_EQ, 9, 10, 9},
                        {CU_STREAM_WAIT_VALUE_AND, 0x6, 0x9, 0x4},
                        {CU_STREAM_WAIT_VALUE_NOR, 0xFFFF0000u, 0xFFFFFFFFu, 0xFFFF0FFFu}};
  for (const Case& c : cases) {
    INFO("flags " << c.flags << " value " << c.value);
    hostWrite32(word, c.not_yet);
    REQUIRE(cuStreamWaitValue32(stream, address, c.value, c.flags) == CUDA_SUCCESS);
    std::this_thread::sleep_for(20ms);
    CHECK(cuStreamQuery(stream) == CUDA_ERROR_NOT_READY);
    hostWrite32(word, c.satisfies);
    CHECK(drainsWithin(stream, 20s));
  }

  std::atomic_ref<cuuint64_t>(*wide).store(0x100000000ull);
  REQUIRE(cuStreamWaitValue64(stream, wide_address, 0x100000001ull, CU_STREAM_WAIT_VALUE_GEQ) ==
          CUDA_SUCCESS);
  std::this_thread::sleep_for(20ms);
  CHECK(cuStreamQuery(stream) == CUDA_ERROR_NOT_READY);
  std::atomic_ref<cuuint64_t>(*wide).store(0x100000001ull);
  CHECK(drainsWithin(stream, 20s));
  REQUIRE(cuStreamWriteValue64(stream, wide_address, 0x123456789abcull, CU_STREAM_WRITE_VALUE_DEFAULT) ==
          CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(stream) == CUDA_SUCCESS);
  CHECK(*wide == 0x123456789abcull);

  // A wait already satisfied holds nothing back.
  REQUIRE(cuStreamWaitValue32(stream, address, *word, CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(stream) == CUDA_SUCCESS);
  cuStreamDestroy(stream);
  cuMemFreeHost(host);
}

TEST_CASE("stream memory operations check their arguments", "[memops]") {
  PrimaryContext context;
  CUstream stream;
  REQUIRE(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  void* host = nullptr;
  REQUIRE(cuMemAllocHost(&host, 64) == CUDA_SUCCESS);
  const auto address = reinterpret_cast<CUdeviceptr>(host);
  cuuint32_t unknown_memory = 0;

  CHECK(cuStreamWaitValue32(stream, address + 2, 1, 0) == CUDA_ERROR_INVALID_VALUE);  // misaligned
  CHECK(cuStreamWaitValue64(stream, address + 4, 1, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuStreamWaitValue32(stream, address + 256, 1, 0) ==
        CUDA_ERROR_INVALID_VALUE);  // past the end (256-byte rounding)
  CHECK(cuStreamWaitValue32(stream, reinterpret_cast<CUdeviceptr>(&unknown_memory), 1, 0) ==
        CUDA_ERROR_INVALID_VALUE);
  CHECK(cuStreamWaitValue32(stream, address, 1, 4) == CUDA_ERROR_INVALID_VALUE);  // no such condition
  CHECK(cuStreamWaitValue32(stream, address, 1, CU_STREAM_WAIT_VALUE_FLUSH) == CUDA_ERROR_NOT_SUPPORTED);
  CHECK(cuStreamWriteValue32(stream, address, 1, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER) ==
        CUDA_ERROR_NOT_SUPPORTED);
  CHECK(cuStreamWriteValue32(stream, address, 1, 2) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuStreamWaitValue32(reinterpret_cast<CUstream>(&unknown_memory), address, 1, 0) ==
        CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuStreamQuery(stream) == CUDA_SUCCESS);  // nothing was queued

  // Device memory works too; the default stream resolves through the current context.
  CUdeviceptr device = 0;
  REQUIRE(cuMemAlloc(&device, 256) == CUDA_SUCCESS);
  REQUIRE(cuStreamWriteValue32(nullptr, device, 3, 0) == CUDA_SUCCESS);
  REQUIRE(cuStreamWaitValue32(nullptr, device, 3, CU_STREAM_WAIT_VALUE_EQ) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(nullptr) == CUDA_SUCCESS);
  CHECK(*reinterpret_cast<cuuint32_t*>(device) == 3);

  // Without a current context the default stream means nothing.
  REQUIRE(cuCtxSetCurrent(nullptr) == CUDA_SUCCESS);
  CHECK(cuStreamWaitValue32(nullptr, device, 3, 0) == CUDA_ERROR_INVALID_CONTEXT);
  REQUIRE(cuCtxSetCurrent(context.get()) == CUDA_SUCCESS);
  cuMemFree(device);
  cuMemFreeHost(host);
  cuStreamDestroy(stream);
}

TEST_CASE("registered host memory gates a stream through its device pointer", "[memops]") {
  PrimaryContext context;
  alignas(64) static cuuint32_t words[16];
  CUdeviceptr device_word = 0;
  CHECK(cuMemHostGetDevicePointer(&device_word, words, 0) == CUDA_ERROR_INVALID_VALUE);  // not registered yet
  REQUIRE(cuMemHostRegister(words, sizeof(words),
                            CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP) == CUDA_SUCCESS);
  CHECK(cuMemHostRegister(words + 4, 8, 0) == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  CHECK(cuMemHostRegister(words, 4, CU_MEMHOSTREGISTER_READ_ONLY) == CUDA_ERROR_NOT_SUPPORTED);
  REQUIRE(cuMemHostGetDevicePointer(&device_word, words + 2, 0) == CUDA_SUCCESS);
  CHECK(device_word == reinterpret_cast<CUdeviceptr>(words + 2));
  CHECK(cuMemHostGetDevicePointer(&device_word, words + 2, 1) == CUDA_ERROR_INVALID_VALUE);
  unsigned memory_type = 0;
  REQUIRE(cuPointerGetAttribute(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, device_word) == CUDA_SUCCESS);
  CHECK(memory_type == CU_MEMORYTYPE_HOST);
  CHECK(cuMemFreeHost(words) == CUDA_ERROR_INVALID_VALUE);  // the application owns it

  CUstream stream;
  REQUIRE(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  REQUIRE(cuStreamWaitValue32(stream, device_word, 1, CU_STREAM_WAIT_VALUE_EQ) == CUDA_SUCCESS);
  REQUIRE(cuStreamWriteValue32(stream, device_word + 4, 2, 0) == CUDA_SUCCESS);
  std::this_thread::sleep_for(20ms);
  CHECK(words[3] == 0);
  hostWrite32(&words[2], 1);
  REQUIRE(drainsWithin(stream, 20s));
  CHECK(std::atomic_ref<cuuint32_t>(words[3]).load() == 2);

  REQUIRE(cuMemHostUnregister(words) == CUDA_SUCCESS);
  CHECK(cuMemHostUnregister(words) == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  CHECK(cuStreamWaitValue32(stream, device_word, 1, 0) == CUDA_ERROR_INVALID_VALUE);
  cuStreamDestroy(stream);

  void* host = nullptr;
  REQUIRE(cuMemHostAlloc(&host, 16, CU_MEMHOSTALLOC_WRITECOMBINED) == CUDA_SUCCESS);
  unsigned flags = 0;
  REQUIRE(cuMemHostGetFlags(&flags, host) == CUDA_SUCCESS);
  CHECK(flags == (CU_MEMHOSTALLOC_WRITECOMBINED | CU_MEMHOSTALLOC_DEVICEMAP));
  CHECK(cuMemHostAlloc(&host, 16, 0x80) == CUDA_ERROR_INVALID_VALUE);
  cuMemFreeHost(host);
}

TEST_CASE("the device says the v2 stream memory operations are supported", "[memops]") {
  PrimaryContext context;
  auto attribute = [](CUdevice_attribute which) {
    int value = -1;
    REQUIRE(cuDeviceGetAttribute(&value, which, 0) == CUDA_SUCCESS);
    return value;
  };
  CHECK(attribute(CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS) == 1);
  CHECK(attribute(CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR) == 1);
  CHECK(attribute(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY) == 1);
  CHECK(attribute(CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1) == 0);
  CHECK(attribute(CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES) == 0);
}

TEST_CASE("stream memory operations carry cuda.h 13.0's symbol names", "[memops]") {
  PrimaryContext context;
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(library != nullptr);
  for (const char* name :
       {"cuStreamWaitValue32_v2", "cuStreamWaitValue64_v2", "cuStreamWriteValue32_v2",
        "cuStreamWriteValue64_v2", "cuMemHostRegister_v2", "cuMemHostGetDevicePointer_v2", "cuMemHostAlloc",
        "cuMemHostGetFlags", "cuMemHostUnregister", "cuStreamWaitValue32", "cuMemHostRegister"}) {
    INFO(name);
    CHECK(dlsym(library, name) != nullptr);
  }
  // The v1 operations need a driver option real systems leave off.
  using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned);
  auto v1 = reinterpret_cast<WaitValue32>(dlsym(library, "cuStreamWaitValue32"));
  void* host = nullptr;
  REQUIRE(cuMemAllocHost(&host, 16) == CUDA_SUCCESS);
  CHECK(v1(nullptr, reinterpret_cast<CUdeviceptr>(host), 0, 0) == CUDA_ERROR_NOT_SUPPORTED);

  // cuGetProcAddress hands out the v2 revision from CUDA 11.7 on, the v1 one before.
  void* function = nullptr;
  CUdriverProcAddressQueryResult status{};
  REQUIRE(cuGetProcAddress("cuStreamWaitValue32", &function, 13000, 0, &status) == CUDA_SUCCESS);
  CHECK(function == dlsym(library, "cuStreamWaitValue32_v2"));
  REQUIRE(cuGetProcAddress("cuStreamWriteValue64", &function, 12000, 0, &status) == CUDA_SUCCESS);
  CHECK(function == dlsym(library, "cuStreamWriteValue64_v2"));
  REQUIRE(cuGetProcAddress("cuStreamWaitValue32", &function, 11000, 0, &status) == CUDA_SUCCESS);
  CHECK(function == reinterpret_cast<void*>(v1));
  REQUIRE(cuGetProcAddress("cuMemHostRegister", &function, 13000, 0, &status) == CUDA_SUCCESS);
  CHECK(function == dlsym(library, "cuMemHostRegister_v2"));
  REQUIRE(cuGetProcAddress("cuMemHostGetDevicePointer", &function, 13000, 0, &status) == CUDA_SUCCESS);
  CHECK(function == dlsym(library, "cuMemHostGetDevicePointer_v2"));
  cuMemFreeHost(host);
  dlclose(library);
}

TEST_CASE("a captured wait and write run at every launch of the graph", "[memops]") {
  PrimaryContext context;
  CUstream stream;
  REQUIRE(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  void* host = nullptr;
  REQUIRE(cuMemAllocHost(&host, 16) == CUDA_SUCCESS);
  auto* gate = static_cast<cuuint32_t*>(host);
  auto* done = gate + 1;
  const auto gate_address = reinterpret_cast<CUdeviceptr>(gate);
  const auto done_address = reinterpret_cast<CUdeviceptr>(done);
  *gate = 0;
  *done = 0;
  std::atomic<int> runs{0};

  REQUIRE(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
  REQUIRE(cuStreamWaitValue32(stream, gate_address, 1, CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS);
  REQUIRE(cuLaunchHostFunc(stream, emutest::countRun, &runs) == CUDA_SUCCESS);
  REQUIRE(cuStreamWriteValue32(stream, done_address, 1, CU_STREAM_WRITE_VALUE_DEFAULT) == CUDA_SUCCESS);
  CUgraph graph = nullptr;
  REQUIRE(cuStreamEndCapture(stream, &graph) == CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  REQUIRE(cuGraphInstantiateWithFlags(&exec, graph, 0) == CUDA_SUCCESS);
  CHECK(cuStreamQuery(stream) == CUDA_SUCCESS);  // captured, not run

  REQUIRE(cuGraphLaunch(exec, stream) == CUDA_SUCCESS);
  std::this_thread::sleep_for(20ms);
  CHECK(cuStreamQuery(stream) == CUDA_ERROR_NOT_READY);
  CHECK(runs == 0);
  hostWrite32(gate, 1);
  REQUIRE(drainsWithin(stream, 20s));
  CHECK(runs == 1);
  CHECK(*done == 1);

  *done = 0;
  REQUIRE(cuGraphLaunch(exec, stream) == CUDA_SUCCESS);  // the gate is still open
  REQUIRE(cuStreamSynchronize(stream) == CUDA_SUCCESS);
  CHECK(runs == 2);
  CHECK(*done == 1);
  cuGraphExecDestroy(exec);
  cuGraphDestroy(graph);
  cuStreamDestroy(stream);
  cuMemFreeHost(host);
}

TEST_CASE("a process whose stream waits forever on a word still exits", "[memops]") {
  CHECK(exitStatusOfChild([] {
          CUcontext context = nullptr;
          if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&context, 0) != CUDA_SUCCESS ||
              cuCtxSetCurrent(context) != CUDA_SUCCESS) {
            return 1;
          }
          void* host = nullptr;
          if (cuMemAllocHost(&host, 16) != CUDA_SUCCESS) return 2;
          *static_cast<cuuint32_t*>(host) = 0;
          if (cuStreamWaitValue32(nullptr, reinterpret_cast<CUdeviceptr>(host), 1, CU_STREAM_WAIT_VALUE_EQ) !=
              CUDA_SUCCESS) {
            return 3;
          }
          std::atomic<int> runs{0};
          if (cuLaunchHostFunc(nullptr, emutest::countRun, &runs) != CUDA_SUCCESS) return 4;
          std::this_thread::sleep_for(50ms);
          return cuStreamQuery(nullptr) == CUDA_ERROR_NOT_READY && runs == 0 ? 9 : 5;
        }) == 9);
}

TEST_CASE("destroying a context ends its registrations and leaves the memory to the application",
          "[memops]") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CUcontext context = nullptr;
  REQUIRE(cuCtxCreate(&context, nullptr, 0, 0) == CUDA_SUCCESS);
  auto* words = static_cast<cuuint32_t*>(std::malloc(4096));
  REQUIRE(words != nullptr);
  REQUIRE(cuMemHostRegister(words, 4096, 0) == CUDA_SUCCESS);
  REQUIRE(cuCtxDestroy(context) == CUDA_SUCCESS);
  words[1023] = 5;  // still the application's memory
  PrimaryContext primary;
  CUdeviceptr device_word = 0;
  CHECK(cuMemHostGetDevicePointer(&device_word, words, 0) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuMemHostRegister(words, 4096, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemHostUnregister(words) == CUDA_SUCCESS);
  CHECK(words[1023] == 5);
  std::free(words);
}

TEST_CASE("a wait sees a word of shared memory that another process writes", "[memops]") {
  PrimaryContext context;
  void* shared = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(shared != MAP_FAILED);
  auto* word = static_cast<cuuint32_t*>(shared);
  REQUIRE(cuMemHostRegister(shared, 4096, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS);
  CUdeviceptr device_word = 0;
  REQUIRE(cuMemHostGetDevicePointer(&device_word, shared, 0) == CUDA_SUCCESS);
  CUstream stream;
  REQUIRE(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  REQUIRE(cuStreamWaitValue32(stream, device_word, 42, CU_STREAM_WAIT_VALUE_EQ) == CUDA_SUCCESS);
  std::this_thread::sleep_for(20ms);
  CHECK(cuStreamQuery(stream) == CUDA_ERROR_NOT_READY);

  const pid_t writer = fork();
  REQUIRE(writer >= 0);
  if (writer == 0) {
    std::atomic_ref<cuuint32_t>(*word).store(42);
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(writer, &status, 0) == writer);
  CHECK(drainsWithin(stream, 20s));
  cuStreamDestroy(stream);
  REQUIRE(cuMemHostUnregister(shared) == CUDA_SUCCESS);
  munmap(shared, 4096);
}
