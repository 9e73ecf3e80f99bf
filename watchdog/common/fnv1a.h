// FNV-1a, 64 bits: a hash that is the same in every process and on every host (std::hash is not),
// for names that several processes must derive alike (communicator ids, the private library copy).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ncclguard {

inline constexpr std::uint64_t kFnv1aOffsetBasis = 0xcbf29ce484222325ULL;

// The hash of `size` bytes at `data`, continuing from `hash` (chain calls to hash several fields).
inline std::uint64_t Fnv1a(const void* data, std::size_t size, std::uint64_t hash = kFnv1aOffsetBasis) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < size; ++i) {
    hash ^= bytes[i];
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

}  // namespace ncclguard
