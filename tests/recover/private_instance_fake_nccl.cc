// A stand-in for libnccl in the private instance's unit tests: small enough to copy in every test,
// with a counter of its own so that a test can tell two loaded instances apart. Built a second
// time with FAKE_NOT_NCCL: a library that is not NCCL (no ncclGetVersion).
#include <nccl.h>

extern "C" {

#ifndef FAKE_NOT_NCCL
__attribute__((visibility("default"))) ncclResult_t ncclGetVersion(int* version) {
  *version = 22809;
  return ncclSuccess;
}
#endif

// How many times this instance was called: each loaded instance counts on its own.
__attribute__((visibility("default"))) int fake_nccl_count_call() {
  static int calls = 0;
  return ++calls;
}

}  // extern "C"
