#include "watchdog/report/snapshot_json.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "watchdog/common/pace.h"
#include "watchdog/common/profile_events.h"
#include "watchdog/report/dump_reader.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/fields_json.h"
#include "watchdog/report/op_signature.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/report/snapshot_fields.h"

namespace ncclguard {

std::string AsHex::Encode(std::uint64_t value) { return fmt::format("0x{:x}", value); }

void AsHex::Decode(const std::string& wire, std::uint64_t& value) {
  if (!absl::SimpleHexAtoi(wire, &value)) value = 0;
}

std::string AsNcclVersion::Encode(int code) { return NcclVersionText(code); }

void AsNcclVersion::Decode(const std::string& wire, int& code) { code = NcclVersionCode(wire); }

void AsStepWait::Decode(const std::string& wire, StepWait& wait) {
  const std::optional<StepWait> named = StepWaitNamed(wire);
  if (!named) throw std::runtime_error(absl::StrCat("unknown step wait '", wire, "'"));
  wait = *named;
}

namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

OrderedJson ProfileJson(const std::vector<OpProfileSnapshot>& profile) {
  OrderedJson ops = OrderedJson::array();
  for (const OpProfileSnapshot& op : profile) {
    OrderedJson entry = Written(op, kOpProfileFields, kInDump);
    entry["kernel_channels"] = WrittenArray(op.kernel_channels, kChannelFields, kInDump);
    entry["proxy_ops"] = WrittenArray(op.proxy_ops, kProxyOpFields, kInDump);
    ops.push_back(std::move(entry));
  }
  return ops;
}

std::vector<OpProfileSnapshot> ReadProfile(const Json& json) {
  return ReadArray(json, [](const Json& entry) {
    auto op = ReadRecord<OpProfileSnapshot>(entry, kOpProfileFields, kInDump);
    op.kernel_channels = ReadArray(entry.at("kernel_channels"), [](const Json& channel) {
      return ReadRecord<ChannelSnapshot>(channel, kChannelFields, kInDump);
    });
    op.proxy_ops = ReadArray(entry.at("proxy_ops"), [](const Json& proxy) {
      return ReadRecord<ProxyOpSnapshot>(proxy, kProxyOpFields, kInDump);
    });
    return op;
  });
}

// Each block as [its fields..., [each link as [its fields...]]] (snapshot_fields.h).
OrderedJson PaceJson(const std::vector<PaceBlockSnapshot>& pace) {
  OrderedJson blocks = OrderedJson::array();
  for (const PaceBlockSnapshot& block : pace) {
    OrderedJson entry = WrittenPositionally(block, kPaceBlockFields);
    OrderedJson links = OrderedJson::array();
    for (const PaceLinkSnapshot& link : block.links)
      links.push_back(WrittenPositionally(link, kPaceLinkFields));
    entry.push_back(std::move(links));
    blocks.push_back(std::move(entry));
  }
  return blocks;
}

// At most kMaxPaceBlocks blocks of kMaxPaceLinks links each are read: more is no writer's of ours.
std::vector<PaceBlockSnapshot> ReadPace(const Json& json) {
  std::vector<PaceBlockSnapshot> blocks;
  for (const Json& entry : CheckedArray(json)) {
    if (blocks.size() == kMaxPaceBlocks) break;
    PaceBlockSnapshot& block = blocks.emplace_back();
    ReadPositionally(entry, block, kPaceBlockFields);
    for (const Json& link : CheckedArray(entry.at(kPaceBlockLinksAt))) {
      if (block.links.size() == kMaxPaceLinks) break;
      ReadPositionally(link, block.links.emplace_back(), kPaceLinkFields);
    }
  }
  return blocks;
}

OrderedJson SignaturesJson(const CommSnapshot& comm) {
  if (comm.signatures.empty()) return nullptr;
  return OrderedJson{{"first_seq", comm.signatures_first_seq}, {"hashes", SignaturesToHex(comm.signatures)}};
}

// What a status file shows of a communicator's ring: the operation #last_completed, and the oldest
// one not completed.
OrderedJson LastCompletedJson(const CommSnapshot& comm) {
  for (const OpSnapshot& op : comm.ring) {
    if (op.state == "enqueued" || op.state == "started") break;
    if (op.seq == comm.last_completed && op.state == "completed") return OpJson(op, OpFields::kDescription);
  }
  return nullptr;
}

OrderedJson OldestOutstandingJson(const CommSnapshot& comm) {
  for (const OpSnapshot& op : comm.ring) {
    if (op.state == "enqueued" || op.state == "started") return OpJson(op, OpFields::kOutstanding);
  }
  return nullptr;
}

}  // namespace

// Always called on a part of a document that outlives the loop over it.
// NOLINTBEGIN(bugprone-return-const-ref-from-parameter)
const Json& CheckedArray(const Json& json) {
  if (!json.is_array())
    throw std::runtime_error(absl::StrCat("an array was expected, not ", json.type_name()));
  return json;
}
// NOLINTEND(bugprone-return-const-ref-from-parameter)

void to_json(OrderedJson& json, const OpSnapshot& op) { json = Written(op, kOpFields, kInDump); }

void from_json(const Json& json, OpSnapshot& op) {
  ReadFields(json, op, kOpFields, FieldSet{.written = kInDump.written, .required = 0});
}

OrderedJson OpJson(const OpSnapshot& op, OpFields fields) {
  switch (fields) {
    case OpFields::kAll:
      break;
    case OpFields::kDescription:
      return Written(op, kOpFields, kInStatus);
    case OpFields::kOutstanding: {
      const OrderedJson all = Written(op, kOpFields, kInOutstanding);
      OrderedJson picked = OrderedJson::object();
      for (const std::string_view key : kOutstandingOrder) picked[key.data()] = all.at(key.data());
      return picked;
    }
  }
  return Written(op, kOpFields, kInDump);
}

OpSnapshot ReadOp(const Json& json, OpFields fields) {
  switch (fields) {
    case OpFields::kAll:
      break;
    case OpFields::kDescription:
      return ReadRecord<OpSnapshot>(json, kOpFields, kInStatus);
    case OpFields::kOutstanding:
      return ReadRecord<OpSnapshot>(json, kOpFields, kInOutstanding);
  }
  return ReadRecord<OpSnapshot>(json, kOpFields, kInDump);
}

OrderedJson CommJson(const CommSnapshot& comm, SnapshotDocument document) {
  if (document == SnapshotDocument::kDump) {
    OrderedJson json = Written(comm, kCommFields, kInDump);
    json["ops"] = WrittenArray(comm.ring, kOpFields, kInDump);
    json["profile"] = ProfileJson(comm.profile);
    json["pace"] = PaceJson(comm.pace);
    return json;
  }
  OrderedJson json = Written(comm, kCommFields, kInStatus);
  json["last_completed_op"] = LastCompletedJson(comm);
  json["oldest_outstanding"] = OldestOutstandingJson(comm);
  json["signatures"] = SignaturesJson(comm);
  if (!comm.profile.empty()) json["profile"] = ProfileJson(comm.profile);
  if (!comm.pace.empty()) json["pace"] = PaceJson(comm.pace);
  return json;
}

CommSnapshot ReadComm(const Json& json) {
  auto comm = ReadRecord<CommSnapshot>(json, kCommFields, kInDump);
  CheckRanks(comm.rank, comm.nranks);  // before anything is sized by them
  comm.ring = ReadArray(json.at("ops"), [](const Json& op) { return ReadOp(op, OpFields::kAll); });
  // Added to format version 2 later.
  if (const auto profile = json.find("profile"); profile != json.end()) comm.profile = ReadProfile(*profile);
  if (const auto pace = json.find("pace"); pace != json.end()) comm.pace = ReadPace(*pace);
  return comm;
}

void to_json(OrderedJson& json, const CommSnapshot& comm) { json = CommJson(comm, SnapshotDocument::kDump); }

void from_json(const Json& json, CommSnapshot& comm) { comm = ReadComm(json); }

OrderedJson ProgressJson(const CommSnapshot& comm) {
  OrderedJson json{{"comm_id", comm.id}, {"rank", comm.rank}};
  WriteFields(json, comm, kCommFields, kInProgress);
  return json;
}

void ReadProgress(const Json& json, std::vector<CommSnapshot>& comms) {
  const std::string id = json.at("comm_id").get<std::string>();
  const int rank = json.at("rank").get<int>();
  for (CommSnapshot& comm : comms) {
    if (comm.id == id && comm.rank == rank) ReadFields(json, comm, kCommFields, kInProgress);
  }
}

OrderedJson StallJson(const StallSnapshot& stall, SnapshotDocument document) {
  return Written(stall, kStallFields, document == SnapshotDocument::kDump ? kInDump : kInStatus);
}

StallSnapshot ReadStall(const Json& json) { return ReadRecord<StallSnapshot>(json, kStallFields, kInDump); }

void to_json(OrderedJson& json, const StallSnapshot& stall) {
  json = StallJson(stall, SnapshotDocument::kDump);
}

void from_json(const Json& json, StallSnapshot& stall) { stall = ReadStall(json); }

void to_json(OrderedJson& json, const PendingInitSnapshot& init) {
  json = Written(init, kPendingInitFields, kInDump);
}

void from_json(const Json& json, PendingInitSnapshot& init) {
  ReadFields(json, init, kPendingInitFields, kInDump);
  CheckRanks(init.rank, init.nranks);
}

namespace {

// About what a frame takes in the document, for the dump's budget.
std::size_t FrameBytes(const FrameSnapshot& frame) {
  return 64 + std::min(frame.function.size(), kMaxFrameText) + std::min(frame.file.size(), kMaxFrameText) +
         std::min(frame.module.size(), kMaxFrameText);
}

OrderedJson FramesJson(const std::vector<FrameSnapshot>& frames, bool native) {
  OrderedJson array = OrderedJson::array();
  for (const FrameSnapshot& frame : frames)
    array.push_back(Written(frame, kFrameFields, FieldSet{native ? kNativeFrame : kFrame, 0}));
  return array;
}

FrameSnapshot ReadFrame(const Json& json) { return ReadRecord<FrameSnapshot>(json, kFrameFields, kInFrame); }

}  // namespace

OrderedJson ThreadsJson(const ThreadsSnapshot& threads, std::size_t frame_budget_bytes) {
  OrderedJson list = OrderedJson::array();
  std::size_t spent = 0;
  for (const ThreadSnapshot& thread : threads.threads) {
    std::size_t bytes = 0;
    for (const auto* frames : {&thread.native, &thread.python}) {
      for (const FrameSnapshot& frame : *frames) bytes += FrameBytes(frame);
    }
    const bool omitted = thread.frames_omitted || spent + bytes > frame_budget_bytes;
    if (!omitted) spent += bytes;
    static const std::vector<FrameSnapshot> kNone;
    OrderedJson entry = Written(thread, kThreadFields, kInDump);
    entry["frames_omitted"] = omitted;
    entry["python"] = FramesJson(omitted ? kNone : thread.python, false);
    entry["native"] = FramesJson(omitted ? kNone : thread.native, true);
    list.push_back(std::move(entry));
  }
  OrderedJson json = Written(threads, kThreadsFields, kInDump);
  json["threads"] = std::move(list);
  return json;
}

ThreadsSnapshot ReadThreads(const Json& json) {
  auto threads = ReadRecord<ThreadsSnapshot>(json, kThreadsFields, kInDump);
  threads.threads = ReadArray(json.at("threads"), [](const Json& entry) {
    auto thread = ReadRecord<ThreadSnapshot>(entry, kThreadFields, kInDump);
    if (const auto omitted = entry.find("frames_omitted"); omitted != entry.end())
      omitted->get_to(thread.frames_omitted);
    if (const auto python = entry.find("python"); python != entry.end())
      thread.python = ReadArray(*python, ReadFrame);
    if (const auto native = entry.find("native"); native != entry.end())
      thread.native = ReadArray(*native, ReadFrame);
    return thread;
  });
  return threads;
}

}  // namespace ncclguard
