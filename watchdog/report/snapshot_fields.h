// The JSON fields of each snapshot record (snapshot.h), one line a field: its name, its member,
// the documents that carry it and how its value is spelled. The dump writer and reader
// (snapshot_json.cc) and the status reader (status_reader.cc) are generated from these tables,
// so a new scalar field is one line here. A table's order is the order fields are written in.
// Nested lists (a communicator's operations, a thread's frames, ...) are written by hand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "watchdog/common/profile_events.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {

// Where a field is: each document has a bit saying it is written there (and read when present)
// and a second saying a reader refuses a document without it. "Optional" is for fields added to a
// format version later, which documents written before lack.
enum FieldIn : unsigned {
  kDumpOptional = 1u << 0,
  kDump = kDumpOptional | 1u << 1,
  kStatusOptional = 1u << 2,  // a status file (for operations: its last_completed_op)
  kStatus = kStatusOptional | 1u << 3,
  kOutstandingOptional = 1u << 4,  // operations: a status file's oldest_outstanding
  kOutstanding = kOutstandingOptional | 1u << 5,
  kProgress = 1u << 6 | 1u << 7,  // communicators: a dump's watchdog.progress entry
  kUnlessEmpty = 1u << 8,         // written only when not empty; read when present
  kFrame = 1u << 9,               // frames of a dump's threads: every frame, read when present
  kNativeFrame = 1u << 10,        // native frames only
};

// Which fields one document's reader or writer takes: those with any bit of `written`, requiring
// those with any bit of `required`.
struct FieldSet {
  unsigned written;
  unsigned required;
};
inline constexpr FieldSet kInDump{kDumpOptional, kDump & ~kDumpOptional};
inline constexpr FieldSet kInStatus{kStatusOptional, kStatus & ~kStatusOptional};
inline constexpr FieldSet kInOutstanding{kOutstandingOptional, kOutstanding & ~kOutstandingOptional};
inline constexpr FieldSet kInProgress{kProgress, kProgress};
inline constexpr FieldSet kInFrame{kFrame | kNativeFrame, 0};

// How a value is spelled: a codec turns the member into its Wire form and back.
struct AsIs {
  template <typename T>
  using Wire = T;
  template <typename T>
  static const T& Encode(const T& value) {
    return value;  // NOLINT(bugprone-return-const-ref-from-parameter): a record's member, which outlives the
                   // call
  }
  template <typename T>
  static void Decode(T wire, T& value) {
    value = std::move(wire);
  }
};

// Handles and streams as "0x…" strings: JSON numbers lose precision past 2^53. What is not hex
// reads as 0.
struct AsHex {
  template <typename T>
  using Wire = std::string;
  static std::string Encode(std::uint64_t value);
  static void Decode(const std::string& wire, std::uint64_t& value);
};

// NCCL's version code as its text, "2.28.9" (facts.h).
struct AsNcclVersion {
  template <typename T>
  using Wire = std::string;
  static std::string Encode(int code);
  static void Decode(const std::string& wire, int& code);
};

// A proxy operation's direction, "send" or "recv".
struct AsDirection {
  template <typename T>
  using Wire = std::string;
  static std::string Encode(bool send) { return send ? "send" : "recv"; }
  static void Decode(const std::string& wire, bool& send) { send = wire == "send"; }
};

// A step wait by its name (profile_events.h); an unknown name is std::runtime_error.
struct AsStepWait {
  template <typename T>
  using Wire = std::string;
  static std::string Encode(StepWait wait) { return StepWaitName(wait); }
  static void Decode(const std::string& wire, StepWait& wait);
};

// Frames' text, cut at kMaxFrameText bytes: a C++ template's name can run to kilobytes.
inline constexpr std::size_t kMaxFrameText = 512;
struct AsCutText {
  template <typename T>
  using Wire = std::string;
  static std::string Encode(const std::string& text) {
    return text.size() <= kMaxFrameText ? text : text.substr(0, kMaxFrameText) + "...";
  }
  static void Decode(std::string wire, std::string& text) { text = std::move(wire); }
};

// One field: `access` is the member pointer, or a function that returns the member of a member.
template <typename Record, typename T, typename Codec, typename Access>
struct Field {
  using Wire = typename Codec::template Wire<T>;
  std::string_view name;  // a literal's: name.data() ends with '\0'
  Access access;
  unsigned in;

  decltype(auto) Encode(const Record& record) const { return Codec::Encode(std::invoke(access, record)); }
  void Decode(Wire&& wire, Record& record) const {
    Codec::Decode(std::move(wire), std::invoke(access, record));
  }
  bool Skipped(const Record& record) const {
    if constexpr (std::is_same_v<T, std::string>)
      return (in & kUnlessEmpty) != 0 && std::invoke(access, record).empty();
    return false;
  }
};

template <typename Record, typename T, typename Codec = AsIs>
constexpr auto Mapped(std::string_view name, T Record::*member, unsigned in, Codec = {}) {
  return Field<Record, T, Codec, T Record::*>{name, member, in};
}

// A member of a member: `access` takes the record (const or not) and returns a reference to it.
template <typename Record, typename Codec = AsIs, typename Access>
constexpr auto MappedVia(std::string_view name, Access access, unsigned in, Codec = {}) {
  using T = std::remove_cvref_t<decltype(access(std::declval<Record&>()))>;
  return Field<Record, T, Codec, Access>{name, access, in};
}

// visit(field) for each field of `fields` in order.
template <typename Fields, typename Visit>
constexpr void ForEachField(const Fields& fields, Visit&& visit) {
  std::apply([&](const auto&... field) { (visit(field), ...); }, fields);
}

// How many of `fields` a document of `set` may carry.
template <typename Fields>
constexpr std::size_t FieldCount(const Fields& fields, FieldSet set) {
  std::size_t count = 0;
  ForEachField(fields, [&](const auto& field) { count += (field.in & set.written) != 0 ? 1 : 0; });
  return count;
}

// An operation: every field in a dump's ring; what was asked in a status's last_completed_op;
// what was asked, its state and times in its oldest_outstanding.
inline constexpr auto kOpFields = std::make_tuple(
    Mapped("seq", &OpSnapshot::seq, kDump | kStatus | kOutstanding),
    Mapped("op", &OpSnapshot::op, kDump | kStatus | kOutstanding),
    Mapped("coll_seq", &OpSnapshot::coll_seq, kDumpOptional | kStatusOptional | kOutstandingOptional),
    // The description after seq and op was added to status format version 1 later.
    Mapped("dtype", &OpSnapshot::dtype, kDump | kStatusOptional | kOutstandingOptional),
    Mapped("count", &OpSnapshot::count, kDump | kStatusOptional | kOutstandingOptional),
    Mapped("bytes", &OpSnapshot::bytes, kDump | kStatusOptional | kOutstanding),
    Mapped("root", &OpSnapshot::root, kDump | kStatusOptional | kOutstandingOptional),
    Mapped("peer", &OpSnapshot::peer, kDump | kStatusOptional | kOutstandingOptional),
    Mapped("reduction", &OpSnapshot::reduction, kDump | kStatusOptional | kOutstandingOptional),
    Mapped("stream", &OpSnapshot::stream, kDump, AsHex{}), Mapped("group", &OpSnapshot::group, kDump),
    Mapped("host_thread", &OpSnapshot::host_thread, kDump),
    Mapped("enqueue_ns", &OpSnapshot::enqueue_ns, kDump | kOutstanding),
    Mapped("start_ns", &OpSnapshot::start_ns, kDump | kOutstanding),
    Mapped("end_ns", &OpSnapshot::end_ns, kDump), Mapped("gpu_ms", &OpSnapshot::gpu_ms, kDump),
    Mapped("result", &OpSnapshot::result, kDump), Mapped("state", &OpSnapshot::state, kDump | kOutstanding));

// The order a status's oldest_outstanding is written in, which is not the table's: its state,
// bytes and times came first and the description was added after them. The same fields as
// kOutstandingOptional marks (checked below).
inline constexpr std::string_view kOutstandingOrder[] = {"seq",       "op",         "state",    "bytes",
                                                         "dtype",     "count",      "root",     "peer",
                                                         "reduction", "enqueue_ns", "start_ns", "coll_seq"};

// A communicator's own fields; its operations, profile and signatures are written by hand after
// them. Its progress is in a status's entry, and in a dump's watchdog.progress section.
inline constexpr auto kCommFields = std::make_tuple(
    Mapped("id", &CommSnapshot::id, kDump | kStatus), Mapped("handle", &CommSnapshot::handle, kDump, AsHex{}),
    Mapped("rank", &CommSnapshot::rank, kDump | kStatus),
    Mapped("nranks", &CommSnapshot::nranks, kDump | kStatus),
    Mapped("device", &CommSnapshot::device, kDump | kStatusOptional),
    Mapped("created_by", &CommSnapshot::created_by, kDump),
    Mapped("parent_id", &CommSnapshot::parent_id, kDump),
    Mapped("library_path", &CommSnapshot::library_path, kDump),
    Mapped("nccl_version", &CommSnapshot::nccl_version, kDump, AsNcclVersion{}),
    Mapped("state", &CommSnapshot::state, kDump | kStatus),
    Mapped("timing", &CommSnapshot::timing, kDumpOptional | kStatusOptional | kUnlessEmpty),
    Mapped("init_start_ns", &CommSnapshot::init_start_ns, kDump),
    Mapped("init_end_ns", &CommSnapshot::init_end_ns, kDump),
    Mapped("last_enqueued", &CommSnapshot::last_enqueued, kStatus | kProgress),
    Mapped("collectives", &CommSnapshot::collectives, kStatusOptional | kDumpOptional),
    Mapped("last_started", &CommSnapshot::last_started, kStatus | kProgress),
    Mapped("last_completed", &CommSnapshot::last_completed, kStatus | kProgress),
    Mapped("async_error", &CommSnapshot::async_error, kDump | kStatusOptional),
    Mapped("dropped", &CommSnapshot::dropped, kDump));

// A status's stall leaves out the message and the verdict's sentence; the verdict was added to
// format version 1 later.
inline constexpr auto kStallFields =
    std::make_tuple(Mapped("kind", &StallSnapshot::kind, kDump | kStatus),
                    Mapped("comm_id", &StallSnapshot::comm_id, kDump | kStatus),
                    Mapped("seq", &StallSnapshot::seq, kDump | kStatus),
                    Mapped("seconds", &StallSnapshot::seconds, kDump | kStatus),
                    Mapped("message", &StallSnapshot::message, kDump),
                    Mapped("verdict", &StallSnapshot::verdict, kDumpOptional | kStatusOptional),
                    Mapped("verdict_message", &StallSnapshot::verdict_message, kDumpOptional),
                    Mapped("skipped_dumps", &StallSnapshot::skipped_dumps, kDumpOptional));

inline constexpr auto kPendingInitFields = std::make_tuple(
    Mapped("comm_id", &PendingInitSnapshot::comm_id, kDump | kStatus),
    Mapped("api", &PendingInitSnapshot::api, kDump | kStatus),
    Mapped("rank", &PendingInitSnapshot::rank, kDump | kStatus),
    Mapped("nranks", &PendingInitSnapshot::nranks, kDump | kStatus),
    Mapped("start_ns", &PendingInitSnapshot::start_ns, kDump | kStatus),
    Mapped("result", &PendingInitSnapshot::result, kDumpOptional | kStatusOptional));  // format 2 on

// What NCCL's profiler told (profile_events.h); its channels and proxy operations follow by hand.
inline constexpr auto kOpProfileFields =
    std::make_tuple(Mapped("func", &OpProfileSnapshot::func, kDump | kStatus),
                    Mapped("nccl_seq", &OpProfileSnapshot::nccl_seq, kDump | kStatus),
                    Mapped("seq", &OpProfileSnapshot::seq, kDump | kStatus),
                    Mapped("algo", &OpProfileSnapshot::algo, kDump | kStatus),
                    Mapped("proto", &OpProfileSnapshot::proto, kDump | kStatus),
                    Mapped("channels", &OpProfileSnapshot::channels, kDump | kStatus),
                    Mapped("peer", &OpProfileSnapshot::peer, kDump | kStatus),
                    Mapped("start_ns", &OpProfileSnapshot::start_ns, kDump | kStatus));

inline constexpr auto kChannelFields =
    std::make_tuple(Mapped("channel", &ChannelSnapshot::channel, kDump | kStatus),
                    Mapped("stopped", &ChannelSnapshot::stopped, kDump | kStatus),
                    Mapped("gpu_start_ns", &ChannelSnapshot::gpu_start_ns, kDump | kStatus),
                    Mapped("gpu_stop_ns", &ChannelSnapshot::gpu_stop_ns, kDump | kStatus));

inline constexpr auto kProxyOpFields =
    std::make_tuple(Mapped("channel", &ProxyOpSnapshot::channel, kDump | kStatus),
                    Mapped("peer", &ProxyOpSnapshot::peer, kDump | kStatus),
                    Mapped("direction", &ProxyOpSnapshot::send, kDump | kStatus, AsDirection{}),
                    Mapped("steps", &ProxyOpSnapshot::steps, kDump | kStatus),
                    Mapped("steps_done", &ProxyOpSnapshot::steps_done, kDump | kStatus),
                    Mapped("stopped", &ProxyOpSnapshot::stopped, kDump | kStatus),
                    Mapped("network_ns", &ProxyOpSnapshot::network_ns, kDumpOptional | kStatusOptional),
                    Mapped("network_bytes", &ProxyOpSnapshot::network_bytes, kDumpOptional | kStatusOptional),
                    Mapped("network_steps", &ProxyOpSnapshot::network_steps, kDumpOptional | kStatusOptional),
                    Mapped("waiting_step", &ProxyOpSnapshot::waiting_step, kDump | kStatus),
                    Mapped("waiting", &ProxyOpSnapshot::waiting, kDump | kStatus, AsStepWait{}),
                    Mapped("waiting_since_ns", &ProxyOpSnapshot::waiting_since_ns, kDump | kStatus));

// A communicator's pace blocks (common/pace.h), in statuses and dumps from format version 2 on, a
// status carrying a thousand of them in a large job: each block is written as an array of these
// fields' values in this order, then the array of its links, each an array of theirs.
inline constexpr std::size_t kMaxPaceBlocks = 2 * kPaceBlocks;
inline constexpr std::size_t kMaxPaceLinks = 2 * kPaceLinksPerBlock;
inline constexpr auto kPaceBlockFields =
    std::make_tuple(Mapped("first_seq", &PaceBlockSnapshot::first_seq, kDump | kStatus),
                    Mapped("collectives", &PaceBlockSnapshot::collectives, kDump | kStatus),
                    Mapped("wait_ms", &PaceBlockSnapshot::wait_ms, kDump | kStatus),
                    Mapped("span_ms", &PaceBlockSnapshot::span_ms, kDump | kStatus));
inline constexpr std::size_t kPaceBlockLinksAt = std::tuple_size_v<decltype(kPaceBlockFields)>;

inline constexpr auto kPaceLinkFields =
    std::make_tuple(Mapped("peer", &PaceLinkSnapshot::peer, kDump | kStatus),
                    Mapped("channel", &PaceLinkSnapshot::channel, kDump | kStatus),
                    Mapped("bytes", &PaceLinkSnapshot::bytes, kDump | kStatus),
                    Mapped("steps", &PaceLinkSnapshot::steps, kDump | kStatus),
                    Mapped("network_ms", &PaceLinkSnapshot::network_ms, kDump | kStatus));

// A fail-slow verdict held now (statuses and dumps of the process that judges the job's pace).
inline constexpr auto kFailSlowFields =
    std::make_tuple(Mapped("kind", &FailSlowSnapshot::kind, kDump | kStatus),
                    Mapped("comm_id", &FailSlowSnapshot::comm_id, kDump | kStatus),
                    Mapped("ranks", &FailSlowSnapshot::ranks, kDump | kStatus),
                    Mapped("message", &FailSlowSnapshot::message, kDump | kStatus));

// A dump's threads section (format version 2 on); its list of threads follows by hand.
inline constexpr auto kThreadsFields =
    std::make_tuple(Mapped("time_ns", &ThreadsSnapshot::time_ns, kDumpOptional),
                    Mapped("took_ms", &ThreadsSnapshot::took_ms, kDumpOptional),
                    Mapped("total", &ThreadsSnapshot::total, kDumpOptional),
                    Mapped("native_note", &ThreadsSnapshot::native_note, kDumpOptional),
                    Mapped("symbols_note", &ThreadsSnapshot::symbols_note, kDumpOptional),
                    Mapped("python_version", &ThreadsSnapshot::python_version, kDumpOptional),
                    Mapped("python_note", &ThreadsSnapshot::python_note, kDumpOptional));

// One thread; whether its frames were omitted, and its frames, follow by hand.
inline constexpr auto kThreadFields = std::make_tuple(
    Mapped("tid", &ThreadSnapshot::tid, kDump), Mapped("name", &ThreadSnapshot::name, kDumpOptional),
    Mapped("state", &ThreadSnapshot::state, kDumpOptional),
    Mapped("wchan", &ThreadSnapshot::wchan, kDumpOptional),
    Mapped("syscall", &ThreadSnapshot::syscall, kDumpOptional),
    Mapped("fd", &ThreadSnapshot::fd, kDumpOptional),
    Mapped("fd_target", &ThreadSnapshot::fd_target, kDumpOptional),
    Mapped("blocked_seconds", &ThreadSnapshot::blocked_seconds, kDumpOptional),
    Mapped("native_missing", &ThreadSnapshot::native_missing, kDumpOptional));

// A frame of a thread's stack; the module and offset for native frames only.
inline constexpr auto kFrameFields =
    std::make_tuple(Mapped("function", &FrameSnapshot::function, kFrame | kNativeFrame, AsCutText{}),
                    Mapped("file", &FrameSnapshot::file, kFrame | kNativeFrame, AsCutText{}),
                    Mapped("line", &FrameSnapshot::line, kFrame | kNativeFrame),
                    Mapped("module", &FrameSnapshot::module, kNativeFrame, AsCutText{}),
                    Mapped("offset", &FrameSnapshot::offset, kNativeFrame, AsHex{}));

// The system facts of a dump and of a status (or its facts record); the memory figures change
// while the process runs and are in dumps only. Its GPUs follow by hand.
inline constexpr auto kSystemFields = std::make_tuple(
    Mapped("kernel_release", &ProcessFacts::kernel_release, kDump | kStatus),
    Mapped("driver_version", &ProcessFacts::driver_version, kDump | kStatus),
    MappedVia<ProcessFacts>(
        "cuda_driver_version", [](auto& facts) -> auto& { return facts.cuda.driver_version; },
        kDump | kStatus),
    // Added after format version 1 was first written: absent in older documents.
    MappedVia<ProcessFacts>(
        "gpu_count", [](auto& facts) -> auto& { return facts.cuda.device_count; },
        kDumpOptional | kStatusOptional),
    Mapped("host_gpus", &ProcessFacts::host_gpu_names, kDumpOptional | kStatusOptional),
    MappedVia<ProcessFacts>(
        "peer_access", [](auto& facts) -> auto& { return facts.cuda.peer_access; },
        kDumpOptional | kStatusOptional),
    Mapped("host_memory_total_bytes", &ProcessFacts::host_memory_total_bytes, kDumpOptional),
    Mapped("host_memory_available_bytes", &ProcessFacts::host_memory_available_bytes, kDumpOptional));

inline constexpr auto kGpuFields = std::make_tuple(
    Mapped("device", &GpuFacts::device, kDump | kStatus), Mapped("name", &GpuFacts::name, kDump | kStatus),
    Mapped("pci_bus_id", &GpuFacts::pci_bus_id, kDump | kStatus),
    Mapped("memory_free_bytes", &GpuFacts::memory_free_bytes, kDumpOptional),
    Mapped("memory_total_bytes", &GpuFacts::memory_total_bytes, kDumpOptional));

namespace fields_detail {
constexpr bool OutstandingOrderMatches() {
  for (const std::string_view name : kOutstandingOrder) {
    bool found = false;
    ForEachField(kOpFields, [&](const auto& field) {
      found = found || (field.name == name && (field.in & kOutstandingOptional) != 0);
    });
    if (!found) return false;
  }
  return FieldCount(kOpFields, kInOutstanding) == std::size(kOutstandingOrder);
}
static_assert(OutstandingOrderMatches(), "kOutstandingOrder lists the fields marked kOutstanding");
}  // namespace fields_detail

}  // namespace ncclguard
