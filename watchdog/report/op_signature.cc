#include "watchdog/report/op_signature.h"

#include <fmt/format.h>

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
  for (const std::uint32_t signature : signatures) fmt::format_to(std::back_inserter(hex), "{:08x}", signature);
  return hex;
}

bool SignaturesFromHex(const std::string& hex, std::vector<std::uint32_t>& signatures) {
  signatures.clear();
  if (hex.size() % 8 != 0 || hex.size() > kSignedOperations * 8) return false;
  for (size_t at = 0; at < hex.size(); at += 8) {
    std::uint32_t value = 0;
    for (size_t i = at; i < at + 8; ++i) {
      const char c = hex[i];
      const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (digit < 0) {
        signatures.clear();
        return false;
      }
      value = value << 4 | static_cast<std::uint32_t>(digit);
    }
    signatures.push_back(value);
  }
  return true;
}

}  // namespace ncclguard
