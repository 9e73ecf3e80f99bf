#include "watchdog/report/snapshot_json.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "watchdog/common/profile_events.h"
#include "watchdog/report/dump_reader.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/op_signature.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// Handles and streams are written as "0x…" strings: JSON numbers lose precision past 2^53.
std::string Hex(std::uint64_t value) { return fmt::format("0x{:x}", value); }

std::uint64_t ParseHex(const Json& value) {
  std::uint64_t number = 0;
  if (!absl::SimpleHexAtoi(value.get<std::string>(), &number)) return 0;
  return number;
}

// Throws unless every key is present.
void Require(const Json& json, std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    if (!json.is_object() || !json.contains(key))
      throw std::runtime_error(absl::StrCat("key '", key, "' not found"));
  }
}

// `field` = json[key] when present (nlohmann's type_error when of the wrong type); else unchanged.
template <typename T>
void ReadIfPresent(const Json& json, const char* key, T& field) {
  if (const auto found = json.find(key); found != json.end()) found->get_to(field);
}

// `full`'s values of `keys`, in that order.
OrderedJson Pick(const OrderedJson& full, std::initializer_list<const char*> keys) {
  OrderedJson picked = OrderedJson::object();
  for (const char* key : keys) picked[key] = full.at(key);
  return picked;
}

// The ranks' range is checked before anything is sized by them.
void ReadRanks(const Json& json, int& rank, int& nranks) {
  json.at("rank").get_to(rank);
  json.at("nranks").get_to(nranks);
  CheckRanks(rank, nranks);
}

OrderedJson ProfileJson(const std::vector<OpProfileSnapshot>& profile) {
  OrderedJson ops = OrderedJson::array();
  for (const OpProfileSnapshot& op : profile) {
    OrderedJson channels = OrderedJson::array();
    for (const ChannelSnapshot& channel : op.kernel_channels) {
      channels.push_back(OrderedJson{{"channel", channel.channel},
                                     {"stopped", channel.stopped},
                                     {"gpu_start_ns", channel.gpu_start_ns},
                                     {"gpu_stop_ns", channel.gpu_stop_ns}});
    }
    OrderedJson proxies = OrderedJson::array();
    for (const ProxyOpSnapshot& proxy : op.proxy_ops) {
      proxies.push_back(OrderedJson{{"channel", proxy.channel},
                                    {"peer", proxy.peer},
                                    {"direction", proxy.send ? "send" : "recv"},
                                    {"steps", proxy.steps},
                                    {"steps_done", proxy.steps_done},
                                    {"stopped", proxy.stopped},
                                    {"waiting_step", proxy.waiting_step},
                                    {"waiting", StepWaitName(proxy.waiting)},
                                    {"waiting_since_ns", proxy.waiting_since_ns}});
    }
    ops.push_back(OrderedJson{{"func", op.func},
                              {"nccl_seq", op.nccl_seq},
                              {"seq", op.seq},
                              {"algo", op.algo},
                              {"proto", op.proto},
                              {"channels", op.channels},
                              {"peer", op.peer},
                              {"start_ns", op.start_ns},
                              {"kernel_channels", std::move(channels)},
                              {"proxy_ops", std::move(proxies)}});
  }
  return ops;
}

StepWait ReadStepWait(const std::string& name) {
  const std::optional<StepWait> wait = StepWaitNamed(name);
  if (!wait) throw std::runtime_error(absl::StrCat("unknown step wait '", name, "'"));
  return *wait;
}

std::vector<OpProfileSnapshot> ReadProfile(const Json& json) {
  return ReadArray(json, [](const Json& entry) {
    OpProfileSnapshot op;
    entry.at("func").get_to(op.func);
    entry.at("nccl_seq").get_to(op.nccl_seq);
    entry.at("seq").get_to(op.seq);
    entry.at("algo").get_to(op.algo);
    entry.at("proto").get_to(op.proto);
    entry.at("channels").get_to(op.channels);
    entry.at("peer").get_to(op.peer);
    entry.at("start_ns").get_to(op.start_ns);
    op.kernel_channels = ReadArray(entry.at("kernel_channels"), [](const Json& channel) {
      return ChannelSnapshot{.channel = channel.at("channel").get<int>(),
                             .stopped = channel.at("stopped").get<bool>(),
                             .gpu_start_ns = channel.at("gpu_start_ns").get<std::int64_t>(),
                             .gpu_stop_ns = channel.at("gpu_stop_ns").get<std::int64_t>()};
    });
    op.proxy_ops = ReadArray(entry.at("proxy_ops"), [](const Json& proxy) {
      return ProxyOpSnapshot{.channel = proxy.at("channel").get<int>(),
                             .peer = proxy.at("peer").get<int>(),
                             .send = proxy.at("direction").get<std::string>() == "send",
                             .steps = proxy.at("steps").get<int>(),
                             .steps_done = proxy.at("steps_done").get<int>(),
                             .stopped = proxy.at("stopped").get<bool>(),
                             .waiting_step = proxy.at("waiting_step").get<int>(),
                             .waiting = ReadStepWait(proxy.at("waiting").get<std::string>()),
                             .waiting_since_ns = proxy.at("waiting_since_ns").get<std::int64_t>()};
    });
    return op;
  });
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

void to_json(OrderedJson& json, const OpSnapshot& op) {
  json = OrderedJson{{"seq", op.seq},
                     {"op", op.op},
                     {"dtype", op.dtype},
                     {"count", op.count},
                     {"bytes", op.bytes},
                     {"root", op.root},
                     {"peer", op.peer},
                     {"reduction", op.reduction},
                     {"stream", Hex(op.stream)},
                     {"group", op.group},
                     {"host_thread", op.host_thread},
                     {"enqueue_ns", op.enqueue_ns},
                     {"start_ns", op.start_ns},
                     {"end_ns", op.end_ns},
                     {"gpu_ms", op.gpu_ms},
                     {"result", op.result},
                     {"state", op.state}};
}

void from_json(const Json& json, OpSnapshot& op) {
  ReadIfPresent(json, "seq", op.seq);
  ReadIfPresent(json, "op", op.op);
  ReadIfPresent(json, "dtype", op.dtype);
  ReadIfPresent(json, "count", op.count);
  ReadIfPresent(json, "bytes", op.bytes);
  ReadIfPresent(json, "root", op.root);
  ReadIfPresent(json, "peer", op.peer);
  ReadIfPresent(json, "reduction", op.reduction);
  if (const auto stream = json.find("stream"); stream != json.end()) op.stream = ParseHex(*stream);
  ReadIfPresent(json, "group", op.group);
  ReadIfPresent(json, "host_thread", op.host_thread);
  ReadIfPresent(json, "enqueue_ns", op.enqueue_ns);
  ReadIfPresent(json, "start_ns", op.start_ns);
  ReadIfPresent(json, "end_ns", op.end_ns);
  ReadIfPresent(json, "gpu_ms", op.gpu_ms);
  ReadIfPresent(json, "result", op.result);
  ReadIfPresent(json, "state", op.state);
}

OrderedJson OpJson(const OpSnapshot& op, OpFields fields) {
  OrderedJson all = op;
  switch (fields) {
    case OpFields::kAll:
      return all;
    case OpFields::kDescription:
      return Pick(all, {"seq", "op", "dtype", "count", "bytes", "root", "peer", "reduction"});
    case OpFields::kOutstanding:
      // bytes and the times came first; the description after them was added later.
      return Pick(all, {"seq", "op", "state", "bytes", "dtype", "count", "root", "peer", "reduction",
                        "enqueue_ns", "start_ns"});
  }
  return all;
}

OpSnapshot ReadOp(const Json& json, OpFields fields) {
  switch (fields) {
    case OpFields::kAll:
      Require(json, {"seq", "op", "dtype", "count", "bytes", "root", "peer", "reduction", "stream", "group",
                     "host_thread", "enqueue_ns", "start_ns", "end_ns", "gpu_ms", "result", "state"});
      break;
    case OpFields::kDescription:
      Require(json, {"seq", "op"});  // the rest was added to format version 1 later
      break;
    case OpFields::kOutstanding:
      Require(json, {"seq", "op", "state", "bytes", "enqueue_ns", "start_ns"});
      break;
  }
  return json.get<OpSnapshot>();
}

OrderedJson CommJson(const CommSnapshot& comm, SnapshotDocument document) {
  const bool dump = document == SnapshotDocument::kDump;
  OrderedJson json{{"id", comm.id}};
  if (dump) json["handle"] = Hex(comm.handle);
  json["rank"] = comm.rank;
  json["nranks"] = comm.nranks;
  if (dump) {
    json["device"] = comm.device;
    json["created_by"] = comm.created_by;
    json["parent_id"] = comm.parent_id;
    json["library_path"] = comm.library_path;
    json["nccl_version"] = NcclVersionText(comm.nccl_version);
  }
  json["state"] = comm.state;
  if (!comm.timing.empty()) json["timing"] = comm.timing;
  if (dump) {
    json["init_start_ns"] = comm.init_start_ns;
    json["init_end_ns"] = comm.init_end_ns;
  } else {
    json["last_enqueued"] = comm.last_enqueued;
    json["last_started"] = comm.last_started;
    json["last_completed"] = comm.last_completed;
  }
  json["async_error"] = comm.async_error;
  if (dump) {
    json["dropped"] = comm.dropped;
    OrderedJson ops = OrderedJson::array();
    for (const OpSnapshot& op : comm.ring) ops.push_back(op);
    json["ops"] = std::move(ops);
    json["profile"] = ProfileJson(comm.profile);
  } else {
    json["last_completed_op"] = LastCompletedJson(comm);
    json["oldest_outstanding"] = OldestOutstandingJson(comm);
    json["signatures"] = SignaturesJson(comm);
    if (!comm.profile.empty()) json["profile"] = ProfileJson(comm.profile);
  }
  return json;
}

CommSnapshot ReadComm(const Json& json) {
  CommSnapshot comm;
  json.at("id").get_to(comm.id);
  ReadRanks(json, comm.rank, comm.nranks);
  json.at("state").get_to(comm.state);
  // Added to format version 2 later.
  if (const auto timing = json.find("timing"); timing != json.end()) timing->get_to(comm.timing);
  comm.handle = ParseHex(json.at("handle"));
  json.at("device").get_to(comm.device);
  json.at("created_by").get_to(comm.created_by);
  json.at("parent_id").get_to(comm.parent_id);
  json.at("library_path").get_to(comm.library_path);
  comm.nccl_version = NcclVersionCode(json.at("nccl_version").get<std::string>());
  json.at("init_start_ns").get_to(comm.init_start_ns);
  json.at("init_end_ns").get_to(comm.init_end_ns);
  json.at("async_error").get_to(comm.async_error);
  json.at("dropped").get_to(comm.dropped);
  comm.ring = ReadArray(json.at("ops"), [](const Json& op) { return ReadOp(op, OpFields::kAll); });
  // Added to format version 2 later.
  if (const auto profile = json.find("profile"); profile != json.end()) comm.profile = ReadProfile(*profile);
  return comm;
}

void to_json(OrderedJson& json, const CommSnapshot& comm) { json = CommJson(comm, SnapshotDocument::kDump); }

void from_json(const Json& json, CommSnapshot& comm) { comm = ReadComm(json); }

OrderedJson ProgressJson(const CommSnapshot& comm) {
  return OrderedJson{{"comm_id", comm.id},
                     {"rank", comm.rank},
                     {"last_enqueued", comm.last_enqueued},
                     {"last_started", comm.last_started},
                     {"last_completed", comm.last_completed}};
}

void ReadProgress(const Json& json, std::vector<CommSnapshot>& comms) {
  const std::string id = json.at("comm_id").get<std::string>();
  const int rank = json.at("rank").get<int>();
  for (CommSnapshot& comm : comms) {
    if (comm.id != id || comm.rank != rank) continue;
    json.at("last_enqueued").get_to(comm.last_enqueued);
    json.at("last_started").get_to(comm.last_started);
    json.at("last_completed").get_to(comm.last_completed);
  }
}

OrderedJson StallJson(const StallSnapshot& stall, SnapshotDocument document) {
  OrderedJson all = stall;
  if (document == SnapshotDocument::kDump) return all;
  return Pick(all, {"kind", "comm_id", "seq", "seconds", "verdict"});
}

StallSnapshot ReadStall(const Json& json) {
  Require(json, {"kind", "comm_id", "seq", "seconds", "message"});
  // The verdict was added to format version 1 later.
  return json.get<StallSnapshot>();
}

void to_json(OrderedJson& json, const StallSnapshot& stall) {
  json = OrderedJson{{"kind", stall.kind},
                     {"comm_id", stall.comm_id},
                     {"seq", stall.seq},
                     {"seconds", stall.seconds},
                     {"message", stall.message},
                     {"verdict", stall.verdict},
                     {"verdict_message", stall.verdict_message},
                     {"skipped_dumps", stall.skipped_dumps}};
}

void from_json(const Json& json, StallSnapshot& stall) {
  ReadIfPresent(json, "kind", stall.kind);
  ReadIfPresent(json, "comm_id", stall.comm_id);
  ReadIfPresent(json, "seq", stall.seq);
  ReadIfPresent(json, "seconds", stall.seconds);
  ReadIfPresent(json, "message", stall.message);
  ReadIfPresent(json, "verdict", stall.verdict);
  ReadIfPresent(json, "verdict_message", stall.verdict_message);
  ReadIfPresent(json, "skipped_dumps", stall.skipped_dumps);
}

void to_json(OrderedJson& json, const PendingInitSnapshot& init) {
  json = OrderedJson{{"comm_id", init.comm_id}, {"api", init.api},           {"rank", init.rank},
                     {"nranks", init.nranks},   {"start_ns", init.start_ns}, {"result", init.result}};
}

void from_json(const Json& json, PendingInitSnapshot& init) {
  ReadRanks(json, init.rank, init.nranks);
  json.at("comm_id").get_to(init.comm_id);
  json.at("api").get_to(init.api);
  json.at("start_ns").get_to(init.start_ns);
  ReadIfPresent(json, "result", init.result);  // added to format version 2 later
}

namespace {

// Frames' text is cut at this length: a C++ template's name can run to kilobytes.
constexpr std::size_t kMaxFrameText = 512;

std::string Cut(const std::string& text) {
  return text.size() <= kMaxFrameText ? text : text.substr(0, kMaxFrameText) + "...";
}

// About what a frame takes in the document, for the dump's budget.
std::size_t FrameBytes(const FrameSnapshot& frame) {
  return 64 + std::min(frame.function.size(), kMaxFrameText) + std::min(frame.file.size(), kMaxFrameText) +
         std::min(frame.module.size(), kMaxFrameText);
}

OrderedJson FramesJson(const std::vector<FrameSnapshot>& frames, bool native) {
  OrderedJson array = OrderedJson::array();
  for (const FrameSnapshot& frame : frames) {
    OrderedJson entry{{"function", Cut(frame.function)}, {"file", Cut(frame.file)}, {"line", frame.line}};
    if (native) {
      entry["module"] = Cut(frame.module);
      entry["offset"] = Hex(frame.offset);
    }
    array.push_back(std::move(entry));
  }
  return array;
}

FrameSnapshot ReadFrame(const Json& json) {
  FrameSnapshot frame;
  ReadIfPresent(json, "function", frame.function);
  ReadIfPresent(json, "file", frame.file);
  ReadIfPresent(json, "line", frame.line);
  ReadIfPresent(json, "module", frame.module);
  if (const auto offset = json.find("offset"); offset != json.end()) frame.offset = ParseHex(*offset);
  return frame;
}

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
    list.push_back(OrderedJson{{"tid", thread.tid},
                               {"name", thread.name},
                               {"state", thread.state},
                               {"wchan", thread.wchan},
                               {"syscall", thread.syscall},
                               {"fd", thread.fd},
                               {"fd_target", thread.fd_target},
                               {"blocked_seconds", thread.blocked_seconds},
                               {"native_missing", thread.native_missing},
                               {"frames_omitted", omitted},
                               {"python", FramesJson(omitted ? kNone : thread.python, false)},
                               {"native", FramesJson(omitted ? kNone : thread.native, true)}});
  }
  return OrderedJson{{"time_ns", threads.time_ns},
                     {"took_ms", threads.took_ms},
                     {"total", threads.total},
                     {"native_note", threads.native_note},
                     {"symbols_note", threads.symbols_note},
                     {"python_version", threads.python_version},
                     {"python_note", threads.python_note},
                     {"threads", std::move(list)}};
}

ThreadsSnapshot ReadThreads(const Json& json) {
  Require(json, {"threads"});
  ThreadsSnapshot threads;
  ReadIfPresent(json, "time_ns", threads.time_ns);
  ReadIfPresent(json, "took_ms", threads.took_ms);
  ReadIfPresent(json, "total", threads.total);
  ReadIfPresent(json, "native_note", threads.native_note);
  ReadIfPresent(json, "symbols_note", threads.symbols_note);
  ReadIfPresent(json, "python_version", threads.python_version);
  ReadIfPresent(json, "python_note", threads.python_note);
  threads.threads = ReadArray(json.at("threads"), [](const Json& entry) {
    Require(entry, {"tid"});
    ThreadSnapshot thread;
    entry.at("tid").get_to(thread.tid);
    ReadIfPresent(entry, "name", thread.name);
    ReadIfPresent(entry, "state", thread.state);
    ReadIfPresent(entry, "wchan", thread.wchan);
    ReadIfPresent(entry, "syscall", thread.syscall);
    ReadIfPresent(entry, "fd", thread.fd);
    ReadIfPresent(entry, "fd_target", thread.fd_target);
    ReadIfPresent(entry, "blocked_seconds", thread.blocked_seconds);
    ReadIfPresent(entry, "native_missing", thread.native_missing);
    ReadIfPresent(entry, "frames_omitted", thread.frames_omitted);
    if (const auto python = entry.find("python"); python != entry.end())
      thread.python = ReadArray(*python, ReadFrame);
    if (const auto native = entry.find("native"); native != entry.end())
      thread.native = ReadArray(*native, ReadFrame);
    return thread;
  });
  return threads;
}

}  // namespace ncclguard
