#include "watchdog/report/status_reader.h"

#include <simdjson.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "watchdog/common/exit_gate.h"
#include "watchdog/common/pace.h"
#include "watchdog/common/profile_events.h"
#include "watchdog/report/dump_reader.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/report/job_files.h"
#include "watchdog/report/op_signature.h"
#include "watchdog/report/snapshot.h"
#include "watchdog/report/snapshot_fields.h"

namespace ncclguard {
namespace {

using simdjson::dom::element;
using simdjson::dom::object;

// The members of one object, walked once. They are looked up in about the order they were written,
// so each lookup starts where the one before ended: a status's hundred lookups take a step or two
// each, where simdjson's at_key walks the object from its start every time.
class Members {
 public:
  // Implicit: every reader below takes an object as Members.
  Members(object json) : object_(json) {  // NOLINT(google-explicit-constructor)
    for (const auto field : json) {
      if (count_ == fields_.size()) {
        overflowed_ = true;  // not a writer's of ours; looked up the slow way
        break;
      }
      fields_[count_++] = Field{.key = field.key, .value = field.value};
    }
  }
  Members(element json) : Members(json.get_object().value()) {}  // NOLINT(google-explicit-constructor)

  std::optional<element> Find(std::string_view key) const {
    if (overflowed_) {
      element value;
      if (object_.at_key(key).get(value) != simdjson::SUCCESS) return std::nullopt;
      return value;
    }
    for (std::size_t step = 0, at = next_; step < count_; ++step, at = at + 1 == count_ ? 0 : at + 1) {
      if (fields_[at].key == key) {
        next_ = at + 1 == count_ ? 0 : at + 1;
        return fields_[at].value;
      }
    }
    return std::nullopt;
  }

 private:
  struct Field {
    std::string_view key;
    element value;
  };
  static constexpr std::size_t kMostMembers = 24;  // a status has 17, its communicators 14
  // A communicator's own fields and its ops, profile, signatures and pace.
  static_assert(FieldCount(kCommFields, kInStatus) + 5 <= kMostMembers);

  object object_;
  std::array<Field, kMostMembers> fields_{};
  std::size_t count_ = 0;
  mutable std::size_t next_ = 0;
  bool overflowed_ = false;
};

std::optional<element> Find(const Members& json, std::string_view key) { return json.Find(key); }

element At(const Members& json, std::string_view key) {
  const std::optional<element> value = Find(json, key);
  if (!value)
    throw std::runtime_error(absl::StrCat("key '", absl::string_view(key.data(), key.size()), "' not found"));
  return *value;
}

template <typename Read>
auto ReadArray(element json, Read read) {
  std::vector<decltype(read(json))> elements;
  const simdjson::dom::array items = json.get_array().value();
  for (const element item : items) elements.push_back(read(item));
  return elements;
}

template <typename T>
struct IsVector : std::false_type {};
template <typename T>
struct IsVector<std::vector<T>> : std::true_type {};

// `value` as a T (a vector: an array of them); simdjson's exception when of another JSON type, ours when out
// of T's range.
template <typename T>
T Read(element value) {
  if constexpr (std::is_same_v<T, std::string>) {
    return std::string(value.get_string().value());
  } else if constexpr (std::is_same_v<T, bool>) {
    return value.get_bool().value();
  } else if constexpr (IsVector<T>::value) {
    return ReadArray(value, Read<typename T::value_type>);
  } else if constexpr (std::is_floating_point_v<T>) {
    return value.get_double().value();
  } else if constexpr (std::is_signed_v<T>) {
    const std::int64_t number = value.get_int64().value();
    if (number < std::numeric_limits<T>::min() || number > std::numeric_limits<T>::max())
      throw std::runtime_error(absl::StrCat(number, " is out of range"));
    return static_cast<T>(number);
  } else {
    const std::uint64_t number = value.get_uint64().value();
    if (number > std::numeric_limits<T>::max())
      throw std::runtime_error(absl::StrCat(number, " is out of range"));
    return static_cast<T>(number);
  }
}

template <typename T>
T ReadMember(const Members& json, std::string_view key) {
  return Read<T>(At(json, key));
}

// `field` = json[key] when present; else unchanged.
template <typename T>
void ReadIfPresent(const Members& json, std::string_view key, T& field) {
  if (const std::optional<element> value = Find(json, key)) field = Read<T>(*value);
}

// Reads the fields of `fields` that a document of `set` carries into `record`: those present;
// throws when a required one is absent.
template <typename Record, typename Fields>
void ReadFields(const Members& json, Record& record, const Fields& fields, FieldSet set) {
  ForEachField(fields, [&](const auto& field) {
    if ((field.in & set.written) == 0) return;
    const std::optional<element> value = Find(json, field.name);
    if (!value) {
      if ((field.in & set.required) != 0) At(json, field.name);  // throws, naming it
      return;
    }
    field.Decode(Read<typename std::decay_t<decltype(field)>::Wire>(*value), record);
  });
}

template <typename Record, typename Fields>
Record ReadRecord(const Members& json, const Fields& fields, FieldSet set) {
  Record record;
  ReadFields(json, record, fields, set);
  return record;
}

// What a status shows of an operation: what was asked (seq and op required) in its
// last_completed_op; what was asked, its state and times in its oldest_outstanding. Either is read
// for the fields of both.
constexpr FieldSet kInLastCompleted{kInStatus.written | kInOutstanding.written, kInStatus.required};
constexpr FieldSet kInOldestOutstanding{kInStatus.written | kInOutstanding.written, kInOutstanding.required};

// Signatures that cannot be read, or that do not end at #last_enqueued as written, are left out:
// they only add evidence. Call after reading last_enqueued.
void ReadSignatures(const Members& entry, CommSnapshot& comm) {
  const std::optional<element> signatures = Find(entry, "signatures");
  if (!signatures || !signatures->is_object()) return;
  const Members members(*signatures);
  const std::optional<element> first_seq = Find(members, "first_seq");
  const std::optional<element> hashes = Find(members, "hashes");
  std::uint64_t first = 0;
  std::string_view hex;
  if (!first_seq || first_seq->get_uint64().get(first) != simdjson::SUCCESS || !hashes ||
      hashes->get_string().get(hex) != simdjson::SUCCESS) {
    return;
  }
  const bool parsed = SignaturesFromHex(std::string(hex), comm.signatures);
  const std::uint64_t count = comm.signatures.size();
  if (!parsed || count == 0 || count > comm.last_enqueued || first != comm.last_enqueued - count + 1) {
    comm.signatures.clear();
    return;
  }
  comm.signatures_first_seq = first;
}

// The ring of a communicator in a status: its last completed operation and its oldest outstanding.
void ReadStatusOps(const Members& entry, CommSnapshot& comm) {
  comm.ring.reserve(2);  // at most these two: one allocation per communicator, not two
  // Added to format version 1 later: the last completed operation, for naming it.
  if (const std::optional<element> last = Find(entry, "last_completed_op"); last && !last->is_null()) {
    const Members members(*last);
    auto op = ReadRecord<OpSnapshot>(members, kOpFields, kInLastCompleted);
    op.state = "completed";
    comm.ring.push_back(std::move(op));
  }
  if (const element oldest = At(entry, "oldest_outstanding"); !oldest.is_null()) {
    const Members members(oldest);
    comm.ring.push_back(ReadRecord<OpSnapshot>(members, kOpFields, kInOldestOutstanding));
  }
}

// What NCCL's profiler told of the communicator's operations still running (added to format
// version 1 later).
OpProfileSnapshot ReadOpProfile(const Members& json) {
  auto op = ReadRecord<OpProfileSnapshot>(json, kOpProfileFields, kInStatus);
  op.kernel_channels = ReadArray(At(json, "kernel_channels"), [](element channel) {
    return ReadRecord<ChannelSnapshot>(channel, kChannelFields, kInStatus);
  });
  op.proxy_ops = ReadArray(At(json, "proxy_ops"), [](element proxy) {
    return ReadRecord<ProxyOpSnapshot>(proxy, kProxyOpFields, kInStatus);
  });
  return op;
}

// What WrittenPositionally (fields_json.h) wrote: `fields`' values in order; an array too short is
// simdjson's out-of-bounds error.
template <typename Record, typename Fields>
void ReadPositionally(element json, Record& record, const Fields& fields) {
  const simdjson::dom::array values = json.get_array().value();
  std::size_t index = 0;
  ForEachField(fields, [&](const auto& field) {
    field.Decode(Read<typename std::decay_t<decltype(field)>::Wire>(values.at(index++).value()), record);
  });
}

// A communicator's pace blocks (added to format version 2 later), kMaxPaceBlocks of kMaxPaceLinks
// links at most.
std::vector<PaceBlockSnapshot> ReadPace(element json) {
  std::vector<PaceBlockSnapshot> blocks;
  const simdjson::dom::array entries = json.get_array().value();
  for (const element entry : entries) {
    if (blocks.size() == kMaxPaceBlocks) break;
    PaceBlockSnapshot& block = blocks.emplace_back();
    ReadPositionally(entry, block, kPaceBlockFields);
    const simdjson::dom::array links = entry.get_array().at(kPaceBlockLinksAt).get_array().value();
    for (const element link : links) {
      if (block.links.size() == kMaxPaceLinks) break;
      ReadPositionally(link, block.links.emplace_back(), kPaceLinkFields);
    }
  }
  return blocks;
}

CommSnapshot ReadComm(const Members& json) {
  auto comm = ReadRecord<CommSnapshot>(json, kCommFields, kInStatus);
  CheckRanks(comm.rank, comm.nranks);
  ReadSignatures(json, comm);  // added to format version 1 later
  ReadStatusOps(json, comm);
  if (const std::optional<element> profile = Find(json, "profile")) {
    comm.profile = ReadArray(*profile, [](element op) { return ReadOpProfile(op); });
  }
  if (const std::optional<element> pace = Find(json, "pace")) comm.pace = ReadPace(*pace);
  return comm;
}

PendingInitSnapshot ReadPendingInit(const Members& json) {
  auto init = ReadRecord<PendingInitSnapshot>(json, kPendingInitFields, kInStatus);
  CheckRanks(init.rank, init.nranks);
  return init;
}

// The system facts a status shows: those of a dump without its memory figures (dump_reader.h's
// ParseSystemFacts reads a dump's).
void ReadSystemFacts(const Members& system, ProcessFacts& facts) {
  ReadFields(system, facts, kSystemFields, kInStatus);
  facts.cuda.gpus = ReadArray(At(system, "gpus"),
                              [](element gpu) { return ReadRecord<GpuFacts>(gpu, kGpuFields, kInStatus); });
}

// What a process that has not dumped shows of itself: the facts that the classifier's P2P
// evidence and the known-bad entries match on. Added to format version 1 later: statuses written
// before lack them.
void ReadFacts(const Members& document, ProcessFacts& facts) {
  if (const std::optional<element> environment = Find(document, "environment")) {
    const object variables = environment->get_object().value();
    for (const auto [name, value] : variables)
      facts.environment.emplace_back(std::string(name), Read<std::string>(value));
    std::sort(facts.environment.begin(), facts.environment.end());  // by name, as a dump's are read
  }
  if (const std::optional<element> system = Find(document, "system")) ReadSystemFacts(*system, facts);
}

// simdjson's implementation objects are static and destroyed at exit: a parse is made holding an
// ExitPass, so that none begins once the application's exit has.
constexpr char kExiting[] = "the process is exiting";

// `content` parsed, a document of `format` (`what` it is, for the error) at the status format's
// version. The parser is one per reading thread: it keeps its buffers from one status to the next.
Members ParseDocument(const std::string& content, std::string_view format, const char* what) {
  thread_local simdjson::dom::parser parser;
  Members document(parser.parse(content).get_object().value());
  if (At(document, "format").get_string().value() != format) {
    throw std::runtime_error(absl::StrCat("not an ncclguard ", what));
  }
  if (const int version = ReadMember<int>(document, "format_version"); version != kStatusFormatVersion) {
    throw std::runtime_error(
        absl::StrCat("status format version ", version, " is not ", kStatusFormatVersion));
  }
  return document;
}

}  // namespace

void ReadStatusFactsDocument(const std::string& content, ProcessFacts& facts) {
  const ExitPass pass;
  if (!pass.open()) throw std::runtime_error(kExiting);
  ReadFacts(ParseDocument(content, kStatusFactsFormat, "facts record"), facts);
}

PeerStatus ReadStatusDocument(const std::string& file, const std::string& content) {
  const ExitPass pass;
  if (!pass.open()) throw std::runtime_error(kExiting);
  const Members document(ParseDocument(content, kStatusFormat, "status file"));
  PeerStatus status;
  status.file = file;
  status.host = ReadMember<std::string>(document, "host");
  status.pid = ReadMember<int>(document, "pid");
  status.facts.host = status.host;
  status.facts.pid = status.pid;
  ProcessSnapshot& snapshot = status.snapshot;
  snapshot.rank = ReadMember<int>(document, "rank");
  snapshot.time_ns = ReadMember<std::int64_t>(document, "time_ns");
  ReadIfPresent(document, "in_nccl_call", snapshot.in_nccl_call);
  if (const element stall = At(document, "stall"); !stall.is_null())
    snapshot.stall = ReadRecord<StallSnapshot>(stall, kStallFields, kInStatus);
  snapshot.comms = ReadArray(At(document, "communicators"), [](element comm) { return ReadComm(comm); });
  // Added to format version 1 later: statuses written before may lack them.
  if (const std::optional<element> inits = Find(document, "pending_inits")) {
    snapshot.pending_inits = ReadArray(*inits, [](element init) { return ReadPendingInit(init); });
  }
  ReadIfPresent(document, "exiting", snapshot.exiting);
  if (const std::optional<element> fail_slow = Find(document, "fail_slow")) {  // added later
    snapshot.fail_slow = ReadArray(*fail_slow, [](element verdict) {
      return ReadRecord<FailSlowSnapshot>(verdict, kFailSlowFields, kInStatus);
    });
  }
  ReadFacts(document, status.facts);
  ReadIfPresent(document, "facts", status.facts_digest);
  return status;
}

void ChooseStatusParser() noexcept {
  try {
    simdjson::dom::parser parser;
    (void)parser.parse(simdjson::padded_string(std::string_view("{}")));
  } catch (...) {
    // No memory: the first status read chooses it.
  }
}

}  // namespace ncclguard
