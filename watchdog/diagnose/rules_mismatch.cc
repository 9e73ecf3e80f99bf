// mismatch: the same #N issued as different calls on different ranks (a desync in the
// application), from the ranks' rings and, where a rank left none, its status file's signatures.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "watchdog/diagnose/rules.h"
#include "watchdog/report/op_signature.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard::classifier {
namespace {

// Whether two ranks' records of one seq describe the same call. A status file gives only the
// operation and its size: what is unknown on either side is not compared.
bool SameCall(const OpSnapshot& a, const OpSnapshot& b) {
  if (a.op != b.op) return false;
  if (a.bytes > 0 && b.bytes > 0 && a.bytes != b.bytes) return false;
  if (a.dtype.empty() || b.dtype.empty()) return true;
  return a.dtype == b.dtype && a.count == b.count && a.root == b.root && a.reduction == b.reduction;
}

bool DifferOnlyInCount(const OpSnapshot& a, const OpSnapshot& b) {
  return a.op == b.op && !a.dtype.empty() && a.dtype == b.dtype && a.root == b.root &&
         a.reduction == b.reduction && a.count != b.count;
}

// What one rank is known to have issued as #N: its ring's record (a dump's, or the operations a
// status file names), else only the signature its status file carries (kNoSignature when none).
struct KnownCall {
  std::uint64_t seq;
  int rank;
  const OpSnapshot* op;
  std::uint32_t signature;
};

std::uint32_t StatusSignature(const CommSnapshot& comm, std::uint64_t seq) {
  if (seq < comm.signatures_first_seq || seq - comm.signatures_first_seq >= comm.signatures.size()) {
    return kNoSignature;
  }
  return comm.signatures[seq - comm.signatures_first_seq];
}

// Whether `a` and `b` have the same signature for certain: what it signs is the same.
bool SameSigned(const OpSnapshot& a, const OpSnapshot& b) {
  return a.op == b.op && a.dtype == b.dtype && a.count == b.count && a.root == b.root &&
         a.reduction == b.reduction;
}

std::vector<KnownCall> KnownCalls(const Communicator& communicator) {
  std::vector<KnownCall> calls;
  calls.reserve(communicator.members.size() * 2);  // a status names two operations
  // Ranks mostly issued the same calls: the last signature is reused rather than hashed again.
  const OpSnapshot* last_signed = nullptr;
  std::uint32_t last_signature = kNoSignature;
  for (const Member& member : communicator.members) {
    const CommSnapshot& comm = *member.comm;
    for (const OpSnapshot& op : comm.ring) {
      // Where the ranks number operations differently, collectives are matched by coll_seq; a
      // status file's signatures are by #N, which names another operation on each rank.
      if (communicator.numbers_differ) {
        if (op.coll_seq == 0 || IsPointToPoint(op)) continue;
        calls.push_back(KnownCall{op.coll_seq, member.rank, &op, OperationSignature(op)});
        continue;
      }
      if (last_signed == nullptr || !SameSigned(op, *last_signed)) {
        last_signed = &op;
        last_signature = OperationSignature(op);
      }
      const std::uint32_t signature = last_signature;
      calls.push_back(KnownCall{op.seq, member.rank, &op,
                                signature != kNoSignature ? signature : StatusSignature(comm, op.seq)});
    }
    for (size_t i = 0; i < (communicator.numbers_differ ? 0 : comm.signatures.size()); ++i) {
      const std::uint64_t seq = comm.signatures_first_seq + i;
      if (comm.signatures[i] != kNoSignature && FindOp(comm, seq) == nullptr) {
        calls.push_back(KnownCall{seq, member.rank, nullptr, comm.signatures[i]});
      }
    }
  }
  std::sort(calls.begin(), calls.end(), [](const KnownCall& a, const KnownCall& b) {
    return a.seq != b.seq ? a.seq < b.seq : a.rank < b.rank;
  });
  return calls;
}

// What is unknown on either side is not compared.
bool SameKnownCall(const KnownCall& a, const KnownCall& b) {
  if (a.op != nullptr && b.op != nullptr && !SameCall(*a.op, *b.op)) return false;
  return a.signature == kNoSignature || b.signature == kNoSignature || a.signature == b.signature;
}

// How much a known call says: a full record, a status file's size only, a signature only.
int Detail(const KnownCall& call) {
  if (call.op == nullptr) return 0;
  return call.op->dtype.empty() ? 1 : 2;
}

struct CallGroup {
  KnownCall call;  // the most complete description of the group's call
  std::vector<int> ranks;
};

std::string SignatureText(std::uint32_t signature) { return SignaturesToHex({signature}); }

Json SideJson(const CallGroup& group) {
  return Json{{"ranks", group.ranks},
              {"call", group.call.op != nullptr ? OpJson(*group.call.op) : Json(nullptr)},
              {"signature", group.call.signature != kNoSignature ? SignatureText(group.call.signature) : ""}};
}

// "AllReduce #26 (float32 × 1024, sum)", or "#26 with signature 5e0c1f3a" when only a status
// file's signature tells.
std::string DescribeCall(const CallGroup& group, std::uint64_t seq) {
  if (group.call.op != nullptr && group.call.op->seq != seq) {  // matched by coll_seq
    return fmt::format("{} (collective {})", DescribeOp(group.call.op, group.call.op->seq), seq);
  }
  if (group.call.op != nullptr) return DescribeOp(group.call.op, seq);
  return fmt::format("#{} with signature {}", seq, SignatureText(group.call.signature));
}

// The ranks' calls at one seq, grouped by what they issued; empty when a point-to-point operation
// is among them (a Send on one rank legitimately meets a Recv on another under the same seq).
std::vector<CallGroup> GroupCalls(std::vector<KnownCall>::const_iterator begin,
                                  std::vector<KnownCall>::const_iterator end) {
  std::vector<CallGroup> groups;
  for (auto call = begin; call != end; ++call) {
    if (call->op != nullptr && IsPointToPoint(*call->op)) return {};
    auto group = std::find_if(groups.begin(), groups.end(),
                              [&](const CallGroup& known) { return SameKnownCall(known.call, *call); });
    if (group == groups.end()) {
      groups.push_back(CallGroup{*call, {call->rank}});
      continue;
    }
    if (group->ranks.back() != call->rank) group->ranks.push_back(call->rank);
    if (Detail(*call) > Detail(group->call)) group->call = *call;
  }
  return groups;
}

}  // namespace

// The first seq at which the ranks' calls differ, from their rings and, where a rank left no
// ring, from the operation signatures of its status file.
std::optional<std::uint64_t> ClassifyMismatch(const Communicator& communicator, Buckets& buckets) {
  const std::vector<KnownCall> calls = KnownCalls(communicator);
  for (auto begin = calls.begin(); begin != calls.end();) {
    auto end =
        std::find_if(begin, calls.end(), [&](const KnownCall& call) { return call.seq != begin->seq; });
    std::vector<CallGroup> groups = GroupCalls(begin, end);
    const std::uint64_t seq = begin->seq;
    begin = end;
    if (groups.size() < 2) continue;
    // The largest group is taken as what the application meant (on a tie, the one of the lowest rank).
    std::stable_sort(groups.begin(), groups.end(),
                     [](const CallGroup& a, const CallGroup& b) { return a.ranks.size() > b.ranks.size(); });
    const CallGroup& majority = groups.front();
    bool counts_only = true;
    std::vector<std::string> clauses;
    std::vector<int> culprits;
    Json sides = Json::array({SideJson(majority)});
    for (size_t i = 1; i < groups.size(); ++i) {
      const CallGroup& other = groups[i];
      const bool count_only = other.call.op != nullptr && majority.call.op != nullptr &&
                              DifferOnlyInCount(*other.call.op, *majority.call.op);
      counts_only = counts_only && count_only;
      clauses.push_back(count_only
                            ? fmt::format("{} issued {} with {} {} elements", Ranks(other.ranks),
                                          OpName(other.call.op, other.call.op->seq), other.call.op->count,
                                          other.call.op->dtype)
                            : fmt::format("{} issued {}", Ranks(other.ranks), DescribeCall(other, seq)));
      culprits.insert(culprits.end(), other.ranks.begin(), other.ranks.end());
      sides.push_back(SideJson(other));
    }
    const std::string majority_call =
        counts_only ? absl::StrCat(majority.call.op->count) : DescribeCall(majority, seq);
    const bool signatures_only = std::any_of(groups.begin(), groups.end(),
                                             [](const CallGroup& group) { return group.call.op == nullptr; });
    std::sort(culprits.begin(), culprits.end());
    Add(buckets, kMismatch, communicator.id, seq, culprits,
        fmt::format(
            "{} while {} issued {}{} — the ranks' calls are out of step (a desync in the "
            "application), not a network fault",
            absl::StrJoin(clauses, " and "), Ranks(majority.ranks), majority_call,
            signatures_only ? " (operation signatures from status files: no record of the call itself)" : ""),
        Json{{"sides", std::move(sides)}});
    return seq;
  }
  return std::nullopt;
}

}  // namespace ncclguard::classifier
