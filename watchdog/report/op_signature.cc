#include "watchdog/report/op_signature.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {

std::uint32_t OperationSignature(const OpSnapshot& op) {
  if (op.op.empty() || op.dtype.empty() || op.op == "Send" || op.op == "Recv") return kNoSignature;
  const std::string text = fmt::format("{}/{}/{}/{}/{}", op.op, op.dtype, op.count, op.root, op.reduction);
  std::uint32_t hash = 2166136261u;
  for (const unsigned char c : text) {
    hash ^= c;
    hash *= 16777619u;
  }
  // 0 means "nothing to compare": a real signature never takes it.
  return hash == kNoSignature ? 1 : hash;
}

std::string SignaturesToHex(const std::vector<std::uint32_t>& signatures) {
  std::string hex;
  hex.reserve(signatures.size() * 8);
  for (const std::uint32_t signature : signatures)
    fmt::format_to(std::back_inserter(hex), "{:08x}", signature);
  return hex;
}

bool SignaturesFromHex(const std::string& hex, std::vector<std::uint32_t>& signatures) {
  signatures.clear();
  // Only what SignaturesToHex writes: SimpleHexAtoi alone would also take "0x", signs and spaces.
  const auto lowercase_hex = [](char c) {
    return absl::ascii_isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
  };
  if (hex.size() % 8 != 0 || hex.size() > kSignedOperations * 8 ||
      !std::all_of(hex.begin(), hex.end(), lowercase_hex)) {
    return false;
  }
  for (size_t at = 0; at < hex.size(); at += 8) {
    std::uint32_t value = 0;
    if (!absl::SimpleHexAtoi(absl::string_view(hex).substr(at, 8), &value)) {
      signatures.clear();
      return false;
    }
    signatures.push_back(value);
  }
  return true;
}

}  // namespace ncclguard
