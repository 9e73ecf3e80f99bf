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
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {
namespace {

std::uint32_t Fnv1a32(absl::string_view bytes, std::uint32_t hash) {
  for (const unsigned char c : bytes) {
    hash ^= c;
    hash *= 16777619u;
  }
  return hash;
}

}  // namespace

std::uint32_t OperationSignature(const OpSnapshot& op) {
  if (op.op.empty() || op.dtype.empty() || op.op == "Send" || op.op == "Recv") return kNoSignature;
  // FNV-1a (32 bits) of "<op>/<dtype>/<count>/<root>/<reduction>", hashed piece by piece: the
  // analysis of a large job signs every rank's operations, and building the text costs more.
  const absl::AlphaNum count(op.count);
  const absl::AlphaNum root(op.root);
  const absl::string_view pieces[] = {op.op, "/",          op.dtype, "/",         count.Piece(),
                                      "/",   root.Piece(), "/",      op.reduction};
  std::uint32_t hash = 2166136261u;
  for (const absl::string_view piece : pieces) hash = Fnv1a32(piece, hash);
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
