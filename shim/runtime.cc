// What the C++ runtime linked into libncclguard.so (shim/CMakeLists.txt) would otherwise take from a
// newer glibc than the rest of ncclguard needs.
#include <sys/random.h>

#include <cstdint>

// libstdc++'s std::random_device, which its exception classes drag in, calls arc4random where the
// build machine's glibc has it (2.36): a preload library needing GLIBC_2.36 could not be loaded at
// all on an older node (every program there would fail to start). ncclguard never asks for a
// random device; this hidden definition, from getrandom() (glibc 2.25), is what the runtime binds
// to instead.
// NOLINTNEXTLINE(readability-identifier-naming): glibc's name, which the runtime calls.
extern "C" __attribute__((visibility("hidden"))) std::uint32_t arc4random() noexcept {
  std::uint32_t value = 0;
  while (getrandom(&value, sizeof(value), 0) != static_cast<long>(sizeof(value))) {
  }
  return value;
}
