// A libncclguard-core.so of another build: its door's table has a version of its own, and nothing
// in it may be called.
#include <cstdint>

// NOLINTNEXTLINE(readability-identifier-naming): the name the front end looks up.
extern "C" __attribute__((visibility("default"))) const std::uint64_t ncclguard_core_entries[64] = {1};
