#include "watchdog/report/flight_recorder.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "watchdog/common/files.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/job_read.h"
#include "watchdog/report/pickle_writer.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {
namespace {

struct OpShape {
  std::string_view ncclguard_name;
  std::string_view fr_name;
  int input_ranks;   // the input holds count × this many ranks' elements (0: × nranks)
  int output_ranks;  // the same for the output
};

// NCCL's counts are per rank where one rank's share differs from the whole: AllGather's and
// Gather's sendcount, ReduceScatter's and Scatter's recvcount, AlltoAll's count to each peer. FR
// records tensor shapes, and its analyzer checks AllGather's output against input × group size.
constexpr OpShape kShapes[] = {
    {"AllReduce", "all_reduce", 1, 1},
    {"Broadcast", "broadcast", 1, 1},
    {"Reduce", "reduce", 1, 1},
    {"AllGather", "all_gather", 1, 0},
    {"ReduceScatter", "reduce_scatter", 0, 1},
    {"AlltoAll", "all_to_all", 0, 0},
    {"Gather", "gather", 1, 0},
    {"Scatter", "scatter", 0, 1},
    {"Send", "send", 1, 1},
    {"Recv", "recv", 1, 1},
};

const OpShape* ShapeOf(std::string_view op) {
  for (const OpShape& shape : kShapes) {
    if (shape.ncclguard_name == op) return &shape;
  }
  return nullptr;
}

bool IsP2p(const OpSnapshot& op) { return op.op == "Send" || op.op == "Recv"; }

// FR's three states: completed, started (seen running on the GPU), scheduled (enqueued).
std::string_view FrState(const OpSnapshot& op, FlightRecorderStates states) {
  if (op.state == "completed") return "completed";
  if (states == FlightRecorderStates::kTimed && (op.state == "started" || op.start_ns > 0)) return "started";
  return "scheduled";
}

// Operations recorded while a CUDA graph was captured ran later, in graph launches that neither
// NCCL nor ncclguard sees; they are not in the dump, nor are operations FR does not know.
bool Exported(const OpSnapshot& op) {
  return op.state != "captured" && FlightRecorderOpName(op.op).has_value();
}

// A process group's name: the communicator's id (16 hex digits, the same on every rank) as a
// decimal number, since tools read FR's names as PyTorch makes them, numbers ("0", "1", ...:
// resiliency-ext's attribution parses them with int()). Its description is the id as ncclguard
// writes it elsewhere.
std::string GroupName(const std::string& comm_id) {
  std::uint64_t value = 0;
  for (char c : comm_id) {
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                             : -1;
    if (digit < 0) return comm_id;
    value = value << 4 | static_cast<std::uint64_t>(digit);
  }
  return std::to_string(value);
}

// One entry of the dump: an operation, or the "nccl:coalesced" entry that closes a group block.
struct Item {
  int comm = 0;                       // index in snapshot.comms
  const OpSnapshot* op = nullptr;     // the operation; for a coalesced entry, the block's last one
  const OpSnapshot* first = nullptr;  // the block's first operation, whose seq keys the block
  bool coalesced = false;
  bool p2p = false;  // a coalesced entry: the block holds point-to-point operations
  std::string_view state;
  std::int64_t key = 0;  // collective_seq_id and p2p_seq_id (BlockKey)
  std::int64_t record_id = 0;
  bool frames = false;  // carries its thread's Python frames
};

// The number FR matches an entry by (collective_seq_id) and finds a block's entries by (they share
// it, p2p_seq_id for point-to-point ones). The communicator's seq counts every operation of the
// rank, point-to-point ones too, which ranks issue in different numbers (a pipeline's first stage
// only sends): a collective is numbered by its coll_seq, the same on every rank (in files of
// earlier builds, which lack it, by its seq less the point-to-point operations before it in the
// ring). A block holding point-to-point operations takes its first seq, negated: never the number
// of a collective next to it, which FR's analyzer would take for part of the same block.
std::int64_t BlockKey(const OpSnapshot& first, std::uint64_t p2p_before, bool p2p) {
  if (p2p) return -static_cast<std::int64_t>(first.seq);
  if (first.coll_seq > 0) return static_cast<std::int64_t>(first.coll_seq);
  return static_cast<std::int64_t>(first.seq - p2p_before);
}

// A seq of the communicator in the numbering of collective_seq_id (BlockKey): the collectives up
// to it. pg_status's counts, which tools compare with the entries' numbers (resiliency-ext's
// attribution takes the operations numbered above the highest last_completed_collective as
// pending).
std::int64_t CollectiveNumber(const CommSnapshot& comm, std::uint64_t seq) {
  if (seq == comm.last_enqueued && comm.collectives > 0) return static_cast<std::int64_t>(comm.collectives);
  const auto op =
      std::find_if(comm.ring.begin(), comm.ring.end(), [seq](const OpSnapshot& op) { return op.seq == seq; });
  if (op != comm.ring.end() && (op->coll_seq > 0 || comm.collectives > 0))
    return static_cast<std::int64_t>(op->coll_seq);
  const auto p2p = std::count_if(comm.ring.begin(), comm.ring.end(),
                                 [seq](const OpSnapshot& op) { return op.seq <= seq && IsP2p(op); });
  return static_cast<std::int64_t>(seq) - static_cast<std::int64_t>(p2p);
}

// The items of one communicator, oldest first: each ncclGroupStart/End block's operations keyed
// by the block (BlockKey), then its coalesced entry.
void AddCommItems(const CommSnapshot& comm, int index, FlightRecorderStates states,
                  std::vector<Item>& items) {
  const auto& ring = comm.ring;
  std::uint64_t p2p_before = 0;  // point-to-point operations of the ring before ring[i]
  for (std::size_t i = 0; i < ring.size();) {
    std::size_t end = i + 1;
    if (ring[i].group != 0) {
      while (end < ring.size() && ring[end].group == ring[i].group) ++end;
    }
    const auto first = ring.begin() + static_cast<std::ptrdiff_t>(i);
    const auto last = ring.begin() + static_cast<std::ptrdiff_t>(end);
    const auto p2p_ops = static_cast<std::uint64_t>(std::count_if(first, last, IsP2p));
    if (!Exported(ring[i])) {
      p2p_before += IsP2p(ring[i]) ? 1 : 0;
      ++i;
      continue;
    }
    const std::int64_t key = BlockKey(ring[i], p2p_before, p2p_ops > 0);
    p2p_before += p2p_ops;
    Item block_end{.comm = index, .first = &ring[i], .coalesced = true, .state = "completed", .key = key};
    for (std::size_t k = i; k < end; ++k) {
      if (!Exported(ring[k])) continue;
      items.push_back(Item{
          .comm = index, .op = &ring[k], .first = &ring[i], .state = FrState(ring[k], states), .key = key});
      block_end.op = &ring[k];
      block_end.p2p = block_end.p2p || IsP2p(ring[k]);
      const std::string_view state = FrState(ring[k], states);
      if (state == "scheduled" || block_end.state == "completed") block_end.state = state;
    }
    // A lone collective in a block is an ordinary one to FR (JAX puts every collective in a block
    // of its own); point-to-point operations in a block are FR's batch, closed on every rank.
    const bool batch = std::count_if(ring.begin() + static_cast<std::ptrdiff_t>(i),
                                     ring.begin() + static_cast<std::ptrdiff_t>(end), Exported) > 1 ||
                       block_end.p2p;
    if (ring[i].group != 0 && block_end.op != nullptr && batch) items.push_back(block_end);
    i = end;
  }
}

// Every communicator's items in the order the process enqueued them, numbered as FR numbers its
// records: how many operations of the process came before, counted from each communicator's seq,
// so that the same operation has the same number on every rank whose rings reach back as far.
std::vector<Item> OrderedItems(const ProcessSnapshot& snapshot, const CommMembers& members,
                               FlightRecorderStates states) {
  std::vector<Item> items;
  for (std::size_t c = 0; c < snapshot.comms.size(); ++c) {
    if (members.contains(snapshot.comms[c].id))
      AddCommItems(snapshot.comms[c], static_cast<int>(c), states, items);
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.op->enqueue_ns < b.op->enqueue_ns; });
  std::vector<std::uint64_t> seen(snapshot.comms.size(), 0);
  for (std::size_t c = 0; c < snapshot.comms.size(); ++c) {
    if (!snapshot.comms[c].ring.empty()) seen[c] = snapshot.comms[c].ring.front().seq - 1;
  }
  for (Item& item : items) {
    seen[item.comm] = std::max(seen[item.comm], item.op->seq);
    std::uint64_t before = 0;
    for (std::uint64_t count : seen) before += count;
    item.record_id = static_cast<std::int64_t>(before) - 1;
  }
  return items;
}

// The Python frames of a thread are where it is now: they are given to the thread's newest
// operation when that one has not completed (the thread may still be in it, or waiting on it),
// and to no older one.
void MarkFrames(const ProcessSnapshot& snapshot, std::vector<Item>& items) {
  if (!snapshot.threads) return;
  std::set<std::int64_t> done;
  for (auto item = items.rbegin(); item != items.rend(); ++item) {
    if (item->coalesced || !done.insert(item->op->host_thread).second) continue;
    item->frames = item->state != "completed";
  }
}

const ThreadSnapshot* ThreadOf(const ProcessSnapshot& snapshot, std::int64_t tid) {
  if (!snapshot.threads) return nullptr;
  for (const ThreadSnapshot& thread : snapshot.threads->threads) {
    if (thread.tid == tid) return &thread;
  }
  return nullptr;
}

void WriteSizes(PickleWriter& out, const Item& item, int nranks, bool input) {
  out.BeginList();
  if (!item.coalesced) {
    const OpShape* shape = ShapeOf(item.op->op);
    const int ranks = input ? shape->input_ranks : shape->output_ranks;
    out.BeginList();
    out.Int(static_cast<std::int64_t>(item.op->count) * (ranks == 0 ? std::max(nranks, 1) : ranks));
    out.EndList();
  }
  out.EndList();
}

void WriteDtypes(PickleWriter& out, const Item& item) {
  out.BeginList();
  if (!item.coalesced) out.String(FlightRecorderDtype(item.op->dtype));
  out.EndList();
}

void WriteFrames(PickleWriter& out, const ThreadSnapshot* thread, bool wanted) {
  out.String("frames");
  out.BeginList();
  if (wanted && thread != nullptr) {
    for (const FrameSnapshot& frame : thread->python) {
      out.BeginDict();
      out.String("name");
      out.String(frame.function);
      out.String("filename");
      out.String(frame.file);
      out.String("line");
      out.Int(frame.line);
      out.EndDict();
    }
  }
  out.EndList();
}

std::string ProfilingName(const Item& item, const CommSnapshot& comm) {
  if (item.coalesced) return "nccl:coalesced";
  // Only operations FR knows are items (Exportable).
  const std::string_view name = FlightRecorderOpName(item.op->op).value_or("unknown");
  // Point-to-point names carry the group-local ranks: "send <self>-><peer>", "recv <self><-<peer>".
  if (item.op->op == "Send")
    return absl::StrCat("nccl:", std::string(name), " ", comm.rank, "->", item.op->peer);
  if (item.op->op == "Recv")
    return absl::StrCat("nccl:", std::string(name), " ", comm.rank, "<-", item.op->peer);
  return absl::StrCat("nccl:", std::string(name));
}

void OptionalTime(PickleWriter& out, std::string_view key, std::int64_t ns) {
  out.String(key);
  if (ns > 0) {
    out.Int(ns);
  } else {
    out.None();
  }
}

void WriteEntry(PickleWriter& out, const ProcessSnapshot& snapshot, const Item& item) {
  const CommSnapshot& comm = snapshot.comms[static_cast<std::size_t>(item.comm)];
  const OpSnapshot& op = *item.op;
  const ThreadSnapshot* thread = ThreadOf(snapshot, op.host_thread);
  out.BeginDict();
  WriteFrames(out, thread, item.frames);
  out.String("record_id");
  out.Int(item.record_id);
  out.String("pg_id");
  out.Int(item.comm);
  out.String("process_group");
  out.BeginTuple();
  out.String(GroupName(comm.id));
  out.String(comm.id);
  out.EndTuple();
  out.String("thread_name");
  out.String(thread != nullptr ? thread->name : "");
  out.String("thread_id");
  out.String(std::to_string(op.host_thread));
  out.String("collective_seq_id");
  out.Int(item.key);
  out.String("p2p_seq_id");
  out.Int(item.key);
  out.String("op_id");
  out.Int(static_cast<std::int64_t>(op.seq));
  out.String("profiling_name");
  out.String(ProfilingName(item, comm));
  out.String("time_created_ns");
  out.Int(op.enqueue_ns);
  if (!item.coalesced && op.gpu_ms >= 0) {
    out.String("duration_ms");
    out.Float(op.gpu_ms);
  }
  out.String("input_sizes");
  WriteSizes(out, item, comm.nranks, /*input=*/true);
  out.String("input_dtypes");
  WriteDtypes(out, item);
  out.String("output_sizes");
  WriteSizes(out, item, comm.nranks, /*input=*/false);
  out.String("output_dtypes");
  WriteDtypes(out, item);
  out.String("state");
  out.String(item.state);
  OptionalTime(out, "time_discovered_started_ns", item.state == "scheduled" ? 0 : op.start_ns);
  OptionalTime(out, "time_discovered_completed_ns", item.state == "completed" ? op.end_ns : 0);
  out.String("retired");
  out.Bool(item.state == "completed");
  out.String("timeout_ms");
  out.Int(0);
  out.String("is_p2p");
  out.Bool(item.coalesced ? item.p2p : IsP2p(op));
  out.EndDict();
}

// FR's ranks field is the text of a Python list, which its analyzer reads with ast.literal_eval.
std::string RanksText(const std::vector<int>& ranks) {
  std::vector<int> known;
  for (int rank : ranks) {
    if (rank >= 0) known.push_back(rank);
  }
  return absl::StrCat("[", absl::StrJoin(known, ", "), "]");
}

void WriteProcessGroups(PickleWriter& out, const ProcessSnapshot& snapshot, const CommMembers& members) {
  out.String("pg_config");
  out.BeginDict();
  for (const CommSnapshot& comm : snapshot.comms) {
    const auto found = members.find(comm.id);
    if (found == members.end()) continue;
    out.String(GroupName(comm.id));
    out.BeginDict();
    out.String("name");
    out.String(GroupName(comm.id));
    out.String("desc");
    out.String(comm.id);
    out.String("ranks");
    out.String(RanksText(found->second));
    out.EndDict();
  }
  out.EndDict();
  out.String("pg_status");
  out.BeginDict();
  for (std::size_t c = 0; c < snapshot.comms.size(); ++c) {
    if (!members.contains(snapshot.comms[c].id)) continue;
    out.String(std::to_string(c));
    out.BeginDict();
    const CommSnapshot& comm = snapshot.comms[c];
    out.String("last_enqueued_collective");
    out.Int(CollectiveNumber(comm, comm.last_enqueued));
    out.String("last_started_collective");
    out.Int(CollectiveNumber(comm, comm.last_started));
    out.String("last_completed_collective");
    out.Int(CollectiveNumber(comm, comm.last_completed));
    out.EndDict();
  }
  out.EndDict();
}

}  // namespace

std::optional<std::string_view> FlightRecorderOpName(std::string_view op) {
  const OpShape* shape = ShapeOf(op);
  if (shape == nullptr) return std::nullopt;
  return shape->fr_name;
}

std::string_view FlightRecorderDtype(std::string_view dtype) {
  static constexpr std::pair<std::string_view, std::string_view> kNames[] = {
      {"int8", "Char"},
      {"uint8", "Byte"},
      {"int32", "Int"},
      {"uint32", "UInt32"},
      {"int64", "Long"},
      {"uint64", "UInt64"},
      {"float16", "Half"},
      {"float32", "Float"},
      {"float64", "Double"},
      {"bfloat16", "BFloat16"},
      {"float8_e4m3", "Float8_e4m3fn"},
      {"float8_e5m2", "Float8_e5m2"},
  };
  for (const auto& [ours, theirs] : kNames) {
    if (ours == dtype) return theirs;
  }
  return "Undefined";
}

std::string FlightRecorderDump(const ProcessSnapshot& snapshot, const CommMembers& members,
                               FlightRecorderStates states) {
  std::vector<Item> items = OrderedItems(snapshot, members, states);
  MarkFrames(snapshot, items);
  PickleWriter out;
  out.BeginDict();
  out.String("version");
  out.String(kFlightRecorderVersion);
  WriteProcessGroups(out, snapshot, members);
  out.String("comm_lib_version");
  out.String(snapshot.comms.empty() ? "" : NcclVersionText(snapshot.comms.front().nccl_version));
  out.String("entries");
  out.BeginList();
  for (const Item& item : items) WriteEntry(out, snapshot, item);
  out.EndList();
  out.EndDict();
  return out.Finish();
}

int FlightRecorderRank(const ProcessView& process) {
  const int launcher = LauncherRank(process.facts);
  return launcher >= 0 ? launcher : process.snapshot.rank;
}

namespace {

// The widest communicator of which the process holds ranks on several devices; nullptr when it
// drives one device.
const CommSnapshot* DevicesWorld(const ProcessSnapshot& snapshot) {
  const CommSnapshot* widest = nullptr;
  for (const CommSnapshot& comm : snapshot.comms) {
    const bool several = std::any_of(
        snapshot.comms.begin(), snapshot.comms.end(),
        [&](const CommSnapshot& other) { return other.id == comm.id && other.device != comm.device; });
    if (several && (widest == nullptr || comm.nranks > widest->nranks)) widest = &comm;
  }
  return widest;
}

}  // namespace

std::vector<FlightRecorderRankOf> FlightRecorderRanks(const ProcessSnapshot& snapshot, int process_rank) {
  const CommSnapshot* world = DevicesWorld(snapshot);
  if (world == nullptr) return {FlightRecorderRankOf{.rank = process_rank}};
  std::vector<FlightRecorderRankOf> ranks;
  for (const CommSnapshot& comm : snapshot.comms) {
    if (comm.id == world->id && comm.rank >= 0) ranks.push_back({.rank = comm.rank, .device = comm.device});
  }
  return ranks;
}

ProcessSnapshot DeviceSnapshot(const ProcessSnapshot& snapshot, int device) {
  ProcessSnapshot copy = snapshot;
  if (device < 0) return copy;
  std::erase_if(copy.comms, [device](const CommSnapshot& comm) { return comm.device != device; });
  return copy;
}

namespace {

int LauncherWorldSize(const ProcessFacts& facts) {
  for (const char* variable : {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}) {
    for (const auto& [name, value] : facts.launcher) {
      if (name != variable) continue;
      int size = 0;
      for (char c : value) {
        if (c < '0' || c > '9' || size > 100'000'000) return -1;
        size = size * 10 + (c - '0');
      }
      return value.empty() ? -1 : size;
    }
  }
  return -1;
}

}  // namespace

namespace {

// OwnCommMembers of a process that drives several devices: the widest communicator spans the
// ranks by definition, and one of a single rank is its device's rank.
CommMembers OwnDevicesMembers(const ProcessSnapshot& snapshot, const CommSnapshot& world) {
  CommMembers members;
  std::vector<int>& ranks = members[world.id];
  for (int i = 0; i < world.nranks; ++i) ranks.push_back(i);
  for (const CommSnapshot& comm : snapshot.comms) {
    if (comm.nranks != 1) continue;
    for (const CommSnapshot& mine : snapshot.comms) {
      if (mine.id == world.id && mine.device == comm.device) members[comm.id] = {mine.rank};
    }
  }
  return members;
}

}  // namespace

CommMembers OwnCommMembers(const ProcessSnapshot& snapshot, const ProcessFacts& facts) {
  if (const CommSnapshot* devices = DevicesWorld(snapshot)) return OwnDevicesMembers(snapshot, *devices);
  const int rank = LauncherRank(facts) >= 0 ? LauncherRank(facts) : snapshot.rank;
  const int world = LauncherWorldSize(facts);
  CommMembers members;
  if (rank < 0) return members;
  for (const CommSnapshot& comm : snapshot.comms) {
    if (comm.nranks == 1) {
      members[comm.id] = {rank};
    } else if (comm.nranks > 1 && comm.nranks == world && comm.rank == rank) {
      std::vector<int>& ranks = members[comm.id];
      for (int i = 0; i < comm.nranks; ++i) ranks.push_back(i);
    }
  }
  return members;
}

absl::StatusOr<std::vector<std::string>> WriteOwnFlightRecorder(const std::string& directory,
                                                                const ProcessSnapshot& snapshot,
                                                                const ProcessFacts& facts) noexcept {
  try {
    const int rank = LauncherRank(facts) >= 0 ? LauncherRank(facts) : snapshot.rank;
    const CommMembers members = OwnCommMembers(snapshot, facts);
    std::vector<std::string> written;
    for (const FlightRecorderRankOf& file : FlightRecorderRanks(snapshot, rank)) {
      if (file.rank < 0)
        return absl::FailedPreconditionError("no rank known to name the Flight Recorder file by");
      const std::string contents =
          FlightRecorderDump(file.device < 0 ? snapshot : DeviceSnapshot(snapshot, file.device), members,
                             FlightRecorderStates::kUntimed);
      absl::StatusOr<std::string> path =
          WriteFileAtomically(directory, absl::StrCat(std::string(kFlightRecorderFilePrefix), file.rank),
                              contents, /*durable=*/false);
      if (!path.ok()) return path.status();
      written.push_back(*std::move(path));
    }
    return written;
  } catch (const std::exception& error) {
    return absl::InternalError(absl::StrCat("cannot write the Flight Recorder file: ", error.what()));
  }
}

namespace {

// One rank's file: a process, or one device of a process that drives several.
struct RankFile {
  const ProcessView* process = nullptr;
  int device = -1;
};

// Each communicator's members from every rank of the job that has it. A communicator some of
// whose ranks left nothing names the missing ones only when it spans the whole job (rank i of it
// is then taken to be global rank i); otherwise they stay unknown and out of pg_config.
CommMembers MembersOf(const std::map<int, RankFile>& files) {
  CommMembers members;
  int world = 0;
  for (const auto& [rank, file] : files) {
    world = std::max(world, rank + 1);
    for (const CommSnapshot& comm : file.process->snapshot.comms) {
      if (comm.nranks <= 0 || comm.rank < 0 || comm.rank >= comm.nranks) continue;
      if (file.device >= 0 && comm.device != file.device) continue;
      std::vector<int>& ranks = members[comm.id];
      if (ranks.size() < static_cast<std::size_t>(comm.nranks))
        ranks.resize(static_cast<std::size_t>(comm.nranks), -1);
      ranks[static_cast<std::size_t>(comm.rank)] = rank;
    }
  }
  for (auto& [id, ranks] : members) {
    if (static_cast<int>(ranks.size()) != world) continue;
    const std::set<int> used(ranks.begin(), ranks.end());
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] < 0 && !used.contains(static_cast<int>(i))) ranks[i] = static_cast<int>(i);
    }
  }
  return members;
}

}  // namespace

std::vector<FlightRecorderFile> FlightRecorderFiles(const JobView& job, FlightRecorderStates states) {
  std::map<int, RankFile> newest;
  for (const ProcessView& process : job.processes) {
    for (const FlightRecorderRankOf& rank :
         FlightRecorderRanks(process.snapshot, FlightRecorderRank(process))) {
      if (rank.rank < 0) continue;
      RankFile& slot = newest[rank.rank];
      if (slot.process == nullptr || process.last_seen_ns > slot.process->last_seen_ns)
        slot = RankFile{.process = &process, .device = rank.device};
    }
  }
  const CommMembers members = MembersOf(newest);
  std::vector<FlightRecorderFile> files;
  files.reserve(newest.size());
  for (const auto& [rank, file] : newest) {
    const ProcessSnapshot& snapshot = file.process->snapshot;
    files.push_back(FlightRecorderFile{
        .rank = rank,
        .contents = FlightRecorderDump(file.device < 0 ? snapshot : DeviceSnapshot(snapshot, file.device),
                                       members, states)});
  }
  return files;
}

}  // namespace ncclguard
