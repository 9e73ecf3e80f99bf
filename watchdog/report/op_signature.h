// Short, stable hashes of what an operation asked NCCL to do, so that ranks can compare their
// recent operations through their small status files: the same #N with a different signature is a
// desync. Format: docs/dump-format.md ("Operation signatures").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "watchdog/report/snapshot.h"

namespace ncclguard {

// How many of a communicator's latest operations a status file signs.
inline constexpr std::size_t kSignedOperations = 64;
// Status files sign at most this many communicators, so that they stay a few KiB however many
// communicators a process holds.
inline constexpr std::size_t kMaxSignedCommunicators = 32;
// Nothing to compare: a point-to-point operation (a Send meets a Recv under one #N), or one that
// is no longer in the ring.
inline constexpr std::uint32_t kNoSignature = 0;

// FNV-1a of "op/dtype/count/root/reduction"; kNoSignature for point-to-point operations and for
// operations not described (no operation name or datatype).
std::uint32_t OperationSignature(const OpSnapshot& op);

// Eight lowercase hex digits per signature, and back. SignaturesFromHex refuses (false, nothing
// parsed) text that is not such a list or holds more than kSignedOperations signatures.
std::string SignaturesToHex(const std::vector<std::uint32_t>& signatures);
bool SignaturesFromHex(const std::string& hex, std::vector<std::uint32_t>& signatures);

}  // namespace ncclguard
