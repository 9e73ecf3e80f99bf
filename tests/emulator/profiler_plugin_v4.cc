// A plugin with only the v4 interface (NCCL 2.27's): the emulated NCCL 2.28.9 loads v5 only, so
// it names this one, closes it and goes on without a profiler. Its functions are never called.
#include <cstdint>

extern "C" {

struct ncclProfilerV4Stub {
  const char* name;
  void* functions[5];
};

__attribute__((visibility("default"))) ncclProfilerV4Stub ncclProfiler_v4 = {"emu-v4-only", {}};

}  // extern "C"
