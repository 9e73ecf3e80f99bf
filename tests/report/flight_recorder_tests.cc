// The pickle writer and PyTorch Flight Recorder dumps (report/pickle_writer.h,
// report/flight_recorder.h): the bytes of each opcode, and what Python's own pickle.load makes of
// a process's dump.
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "tests/support/process.h"
#include "watchdog/report/flight_recorder.h"
#include "watchdog/report/pickle_writer.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {
namespace {

using Json = nlohmann::json;
using testing::RunProcess;
using testing::TemporaryDirectory;

// What python3's pickle.load reads from `pickle`: its repr(), or, with `as_json`, the object as
// JSON (tuples become lists).
std::string PythonLoads(const std::string& pickle, bool as_json) {
  TemporaryDirectory directory;
  const std::string path = directory.path() + "/dump";
  std::ofstream(path, std::ios::binary) << pickle;
  const std::string script =
      as_json ? "import json,pickle,sys; print(json.dumps(pickle.load(open(sys.argv[1],'rb'))))"
              : "import pickle,sys; print(repr(pickle.load(open(sys.argv[1],'rb'))))";
  const testing::ProcessResult result = RunProcess({"python3", "-c", script, path});
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  return result.out.substr(0, result.out.find_last_not_of('\n') + 1);
}

TEST_CASE("a pickle starts with protocol 2 and ends with STOP") {
  PickleWriter out;
  out.None();
  const std::string pickle = out.Finish();
  CHECK(pickle == std::string("\x80\x02N.", 4));
}

TEST_CASE("integers take the shortest of protocol 2's forms") {
  PickleWriter out;
  out.BeginList();
  out.Int(7);
  out.Int(300);
  out.Int(-2);
  out.Int(std::int64_t{1} << 40);
  out.EndList();
  const std::string pickle = out.Finish();
  const std::string expected = std::string("\x80\x02](", 4) + "K\x07" + std::string("M\x2c\x01", 3) +
                               std::string("J\xfe\xff\xff\xff", 5) +
                               std::string("\x8a\x08\x00\x00\x00\x00\x00\x01\x00\x00", 10) + "e.";
  CHECK(pickle == expected);
  CHECK(PythonLoads(pickle, false) == "[7, 300, -2, 1099511627776]");
}

TEST_CASE("python reads every kind of value the writer writes") {
  PickleWriter out;
  out.BeginDict();
  out.String("values");
  out.BeginList();
  out.Bool(true);
  out.Bool(false);
  out.None();
  out.Float(1.5);
  out.Int(INT64_MIN);
  out.BeginTuple();
  out.String("pg");
  out.String("d\xc3\xa9sc");
  out.EndTuple();
  out.BeginList();
  out.EndList();
  out.EndList();
  out.String("empty");
  out.BeginDict();
  out.EndDict();
  out.EndDict();
  CHECK(PythonLoads(out.Finish(), false) ==
        "{'values': [True, False, None, 1.5, -9223372036854775808, ('pg', 'désc'), []], 'empty': {}}");
}

TEST_CASE("bytes that are not UTF-8 are replaced, so that python can read the string") {
  CHECK(ValidUtf8("ok \xc3\xa9") == "ok \xc3\xa9");
  CHECK(ValidUtf8("a\xff"
                  "b") ==
        "a\xef\xbf\xbd"
        "b");
  CHECK(ValidUtf8("\xc0\xaf") == "\xef\xbf\xbd\xef\xbf\xbd");                  // overlong
  CHECK(ValidUtf8("\xed\xa0\x80") == "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // a surrogate
  CHECK(ValidUtf8("\xe2\x82") == "\xef\xbf\xbd\xef\xbf\xbd");                  // cut short
  PickleWriter out;
  out.String("file\xfe.py");
  CHECK(PythonLoads(out.Finish(), false) == "'file\xef\xbf\xbd.py'");
}

TEST_CASE("a container left open is a bug of the caller") {
  PickleWriter out;
  out.BeginList();
  CHECK_THROWS_AS(out.Finish(), std::logic_error);
}

OpSnapshot Op(std::uint64_t seq, std::string op, std::string state, std::int64_t enqueue_ns) {
  OpSnapshot snapshot;
  snapshot.seq = seq;
  snapshot.op = std::move(op);
  snapshot.dtype = "bfloat16";
  snapshot.count = 1024;
  snapshot.state = std::move(state);
  snapshot.host_thread = 4242;
  snapshot.enqueue_ns = enqueue_ns;
  if (snapshot.state != "enqueued") snapshot.start_ns = enqueue_ns + 10;
  if (snapshot.state == "completed") snapshot.end_ns = enqueue_ns + 20;
  return snapshot;
}

FrameSnapshot PythonFrame(std::string function, std::string file, int line) {
  FrameSnapshot frame;
  frame.function = std::move(function);
  frame.file = std::move(file);
  frame.line = line;
  return frame;
}

// Rank 1 of a 4-rank data-parallel communicator and of a 2-rank pipeline communicator: an
// AllGather, a grouped send and receive, a custom operation, and an AllReduce stuck on the GPU
// while the pipeline's last receive waits to start.
ProcessSnapshot PipelineProcess() {
  ProcessSnapshot snapshot;
  snapshot.rank = 1;
  CommSnapshot dp;
  dp.id = "00000000000000ff";
  dp.rank = 1;
  dp.nranks = 4;
  dp.nccl_version = 22105;
  dp.last_enqueued = 12;
  dp.last_started = 12;
  dp.last_completed = 11;
  dp.ring = {Op(10, "AllGather", "completed", 100), Op(11, "FancyOp", "completed", 200),
             Op(12, "AllReduce", "started", 600)};
  CommSnapshot pp;
  pp.id = "0000000000000010";
  pp.rank = 0;
  pp.nranks = 2;
  OpSnapshot send = Op(5, "Send", "completed", 300);
  send.peer = 1;
  send.group = 9;
  OpSnapshot recv = Op(6, "Recv", "completed", 301);
  recv.peer = 1;
  recv.group = 9;
  OpSnapshot waiting = Op(7, "Recv", "enqueued", 700);
  waiting.peer = 1;
  pp.ring = {send, recv, waiting};
  snapshot.comms = {dp, pp};
  ThreadsSnapshot threads;
  ThreadSnapshot thread;
  thread.tid = 4242;
  thread.name = "pt_main_thread";
  thread.python = {PythonFrame("recv", "pipeline.py", 88), PythonFrame("<module>", "train.py", 3)};
  threads.threads = {thread};
  snapshot.threads = threads;
  return snapshot;
}

const CommMembers kMembers = {{"00000000000000ff", {0, 1, 2, 3}}, {"0000000000000010", {1, 3}}};

Json LoadDump(FlightRecorderStates states) {
  return Json::parse(PythonLoads(FlightRecorderDump(PipelineProcess(), kMembers, states), true));
}

std::vector<std::string> Names(const Json& dump) {
  std::vector<std::string> names;
  for (const Json& entry : dump["entries"]) names.push_back(entry["profiling_name"]);
  return names;
}

TEST_CASE("a dump has FR's top-level keys and a process group per communicator") {
  const Json dump = LoadDump(FlightRecorderStates::kUntimed);
  CHECK(dump["version"] == "2.10");
  CHECK(dump["comm_lib_version"] == "2.21.5");
  CHECK(dump["pg_config"]["255"] ==
        Json({{"name", "255"}, {"desc", "00000000000000ff"}, {"ranks", "[0, 1, 2, 3]"}}));
  CHECK(dump["pg_config"]["16"]["ranks"] == "[1, 3]");
  CHECK(dump["pg_status"]["0"] == Json({{"last_enqueued_collective", 12},
                                        {"last_started_collective", 12},
                                        {"last_completed_collective", 11}}));
}

TEST_CASE("operations are named as FR names them, in the order the process enqueued them") {
  const Json dump = LoadDump(FlightRecorderStates::kUntimed);
  // FancyOp is not one FR knows: its analyzer would stop on it.
  CHECK(Names(dump) == std::vector<std::string>{"nccl:all_gather", "nccl:send 0->1", "nccl:recv 0<-1",
                                                "nccl:coalesced", "nccl:all_reduce", "nccl:recv 0<-1"});
  std::int64_t previous = -1;
  for (const Json& entry : dump["entries"]) {
    CHECK(entry["record_id"].get<std::int64_t>() >= previous);
    previous = entry["record_id"];
  }
  const Json& all_gather = dump["entries"][0];
  CHECK(all_gather["process_group"] == Json::array({"255", "00000000000000ff"}));
  CHECK(all_gather["input_sizes"] == Json::parse("[[1024]]"));
  CHECK(all_gather["output_sizes"] == Json::parse("[[4096]]"));
  CHECK(all_gather["input_dtypes"] == Json::parse(R"(["BFloat16"])"));
  CHECK(all_gather["collective_seq_id"] == 10);
  CHECK(all_gather["is_p2p"] == false);
  CHECK(all_gather["thread_name"] == "pt_main_thread");
  CHECK(all_gather["thread_id"] == "4242");
}

TEST_CASE("a group block's operations share their seq ids and end with nccl:coalesced") {
  const Json dump = LoadDump(FlightRecorderStates::kUntimed);
  for (int i : {1, 2, 3}) {
    const Json& entry = dump["entries"][i];
    INFO(entry.dump());
    CHECK(entry["p2p_seq_id"] == -5);
    CHECK(entry["collective_seq_id"] == -5);
    CHECK(entry["is_p2p"] == true);
    CHECK(entry["pg_id"] == 1);
  }
  CHECK(dump["entries"][3]["input_sizes"] == Json::array());
  CHECK(dump["entries"][3]["state"] == "completed");
  CHECK(dump["entries"][5]["p2p_seq_id"] == -7);
}

// One step of a 3-stage pipeline on a 3-rank communicator: each stage receives from the one before
// it and sends to the one after it in a block, then every rank all-reduces. The first stage only
// sends, so its AllReduce is its communicator's #2 where the middle stage's is #3.
ProcessSnapshot PipelineStage(int rank) {
  ProcessSnapshot snapshot;
  snapshot.rank = rank;
  CommSnapshot comm;
  comm.id = "00000000000000aa";
  comm.rank = rank;
  comm.nranks = 3;
  std::uint64_t seq = 1;
  for (int peer : {rank - 1, rank + 1}) {
    if (peer < 0 || peer > 2) continue;
    OpSnapshot p2p =
        Op(seq, peer < rank ? "Recv" : "Send", "completed", 100 + static_cast<std::int64_t>(seq));
    ++seq;
    p2p.peer = peer;
    p2p.group = 7;
    comm.ring.push_back(p2p);
  }
  comm.ring.push_back(Op(seq, "AllReduce", "enqueued", 200));
  comm.last_enqueued = seq;
  comm.last_started = seq - 1;
  comm.last_completed = seq - 1;
  snapshot.comms = {comm};
  return snapshot;
}

TEST_CASE("a collective has the same number on every rank, however many point-to-point ops came before") {
  const CommMembers members = {{"00000000000000aa", {0, 1, 2}}};
  std::vector<Json> entries;
  for (int rank : {0, 1, 2}) {
    const Json dump = Json::parse(
        PythonLoads(FlightRecorderDump(PipelineStage(rank), members, FlightRecorderStates::kUntimed), true));
    INFO("rank " << rank << ": " << dump["entries"].dump());
    REQUIRE(dump["entries"].back()["profiling_name"] == "nccl:all_reduce");
    entries.push_back(dump["entries"]);
  }
  for (const Json& rank : entries) CHECK(rank.back()["collective_seq_id"] == 1);
  // pg_status counts in the same numbering: AllReduce #1 enqueued, no collective completed.
  for (int rank : {0, 1, 2}) {
    const Json dump = Json::parse(
        PythonLoads(FlightRecorderDump(PipelineStage(rank), members, FlightRecorderStates::kUntimed), true));
    CHECK(dump["pg_status"]["0"] == Json({{"last_enqueued_collective", 1},
                                          {"last_started_collective", 0},
                                          {"last_completed_collective", 0}}));
  }
  // A block's number is no collective's: FR's analyzer would take the AllReduce for part of it.
  const Json& middle = entries[1];
  REQUIRE(middle.size() == 4);  // recv, send, coalesced, all_reduce
  for (int i = 0; i < 3; ++i) {
    CHECK(middle[i]["p2p_seq_id"] == -1);
    CHECK(middle[i]["collective_seq_id"] == -1);
  }
}

// The same step 101 steps into the job: each stage's ring holds this step only, and the stages
// issued different numbers of sends and receives before it (rank r's #N starts at 100 + 100 r).
TEST_CASE("a collective keeps its number on every rank once the rings wrap, from its coll_seq") {
  const CommMembers members = {{"00000000000000aa", {0, 1, 2}}};
  for (int rank : {0, 1, 2}) {
    ProcessSnapshot stage = PipelineStage(rank);
    CommSnapshot& comm = stage.comms[0];
    const std::uint64_t offset = 100 + 100 * static_cast<std::uint64_t>(rank);
    for (OpSnapshot& op : comm.ring) {
      op.seq += offset;
      op.coll_seq = op.op == "AllReduce" ? 101 : 100;
    }
    comm.last_enqueued += offset;
    comm.last_started += offset;
    comm.last_completed += offset;
    comm.collectives = 101;
    const Json dump =
        Json::parse(PythonLoads(FlightRecorderDump(stage, members, FlightRecorderStates::kUntimed), true));
    INFO("rank " << rank << ": " << dump["entries"].dump());
    CHECK(dump["entries"].back()["collective_seq_id"] == 101);
    CHECK(dump["pg_status"]["0"] == Json({{"last_enqueued_collective", 101},
                                          {"last_started_collective", 100},
                                          {"last_completed_collective", 100}}));
  }
}

TEST_CASE("operations not completed are scheduled, or started when asked for timed states") {
  const Json untimed = LoadDump(FlightRecorderStates::kUntimed);
  CHECK(untimed["entries"][4]["state"] == "scheduled");
  CHECK(untimed["entries"][4]["time_discovered_started_ns"].is_null());
  CHECK(untimed["entries"][0]["state"] == "completed");
  CHECK(untimed["entries"][0]["time_discovered_completed_ns"] == 120);
  CHECK(untimed["entries"][0]["retired"] == true);
  const Json timed = LoadDump(FlightRecorderStates::kTimed);
  CHECK(timed["entries"][4]["state"] == "started");
  CHECK(timed["entries"][4]["time_discovered_started_ns"] == 610);
  CHECK(timed["entries"][5]["state"] == "scheduled");
}

TEST_CASE("the thread's Python frames go to its newest operation, which it waits in") {
  const Json dump = LoadDump(FlightRecorderStates::kUntimed);
  CHECK(dump["entries"][5]["frames"] ==
        Json::parse(R"([{"name": "recv", "filename": "pipeline.py", "line": 88},
                        {"name": "<module>", "filename": "train.py", "line": 3}])"));
  for (int i = 0; i < 5; ++i) CHECK(dump["entries"][i]["frames"] == Json::array());
}

}  // namespace
}  // namespace ncclguard

namespace ncclguard {
namespace {

ProcessFacts LauncherFacts(std::string rank, std::string world_size) {
  ProcessFacts facts;
  facts.launcher = {{"RANK", std::move(rank)}, {"WORLD_SIZE", std::move(world_size)}};
  return facts;
}

TEST_CASE("alone, a process knows the members of a communicator of the world's size and of one rank") {
  ProcessSnapshot snapshot = PipelineProcess();  // in a 4-rank communicator and a 2-rank one
  CommSnapshot alone;
  alone.id = "0000000000000001";
  alone.rank = 0;
  alone.nranks = 1;
  snapshot.comms.push_back(alone);
  CHECK(OwnCommMembers(snapshot, LauncherFacts("1", "4")) ==
        CommMembers{{"00000000000000ff", {0, 1, 2, 3}}, {"0000000000000001", {1}}});
  // Rank 1 of the world is not rank 1 of the communicator: its members are not the world's ranks.
  CHECK(OwnCommMembers(snapshot, LauncherFacts("2", "4")) == CommMembers{{"0000000000000001", {2}}});
  CHECK(OwnCommMembers(snapshot, LauncherFacts("1", "8")) == CommMembers{{"0000000000000001", {1}}});
}

TEST_CASE("at dump time a process writes its file with the communicators whose members it knows") {
  TemporaryDirectory directory;
  const absl::StatusOr<std::vector<std::string>> written =
      WriteOwnFlightRecorder(directory.path() + "/fr", PipelineProcess(), LauncherFacts("1", "4"));
  INFO(written.status().ToString());
  REQUIRE(written.ok());
  REQUIRE(*written == std::vector<std::string>{directory.path() + "/fr/nccl_trace_rank_1"});
  const Json dump = Json::parse(PythonLoads(testing::ReadFile(written->front()), true));
  CHECK(dump["pg_config"].size() == 1);
  CHECK(dump["pg_config"]["255"]["ranks"] == "[0, 1, 2, 3]");
  CHECK(dump["pg_status"].size() == 1);
  // The pipeline communicator's members are unknown: its operations are left out with it.
  CHECK(Names(dump) == std::vector<std::string>{"nccl:all_gather", "nccl:all_reduce"});
}

// Process `process` of a job of 2 processes that drive 2 devices each, as JAX does: devices 0 and 1
// hold ranks 2 * process and 2 * process + 1 of one communicator, each a communicator of its own
// too; every rank completed AllReduce #1 and waits in #2.
ProcessSnapshot TwoDeviceProcess(int process) {
  ProcessSnapshot snapshot;
  snapshot.rank = 2 * process;
  for (int device : {0, 1}) {
    CommSnapshot world;
    world.id = "0000000000000abc";
    world.rank = 2 * process + device;
    world.nranks = 4;
    world.device = device;
    world.ring = {Op(1, "AllReduce", "completed", 100 + device),
                  Op(2, "AllReduce", "enqueued", 200 + device)};
    world.ring[1].count = 64 + static_cast<std::uint64_t>(world.rank);  // tells the ranks' entries apart
    CommSnapshot own;
    own.id = absl::StrCat("00000000000001", process, device);
    own.rank = 0;
    own.nranks = 1;
    own.device = device;
    snapshot.comms.push_back(world);
    snapshot.comms.push_back(own);
  }
  return snapshot;
}

TEST_CASE("a process that drives several devices has a rank per device, named by the widest communicator") {
  const std::vector<FlightRecorderRankOf> ranks = FlightRecorderRanks(TwoDeviceProcess(1), 1);
  REQUIRE(ranks.size() == 2);
  CHECK((ranks[0].rank == 2 && ranks[0].device == 0));
  CHECK((ranks[1].rank == 3 && ranks[1].device == 1));
  const std::vector<FlightRecorderRankOf> one = FlightRecorderRanks(PipelineProcess(), 5);
  REQUIRE(one.size() == 1);
  CHECK((one[0].rank == 5 && one[0].device == -1));
}

TEST_CASE("at dump time a process that drives several devices writes each device's rank its own file") {
  TemporaryDirectory directory;
  const absl::StatusOr<std::vector<std::string>> written =
      WriteOwnFlightRecorder(directory.path(), TwoDeviceProcess(1), LauncherFacts("1", "2"));
  INFO(written.status().ToString());
  REQUIRE(written.ok());
  REQUIRE(*written == std::vector<std::string>{directory.path() + "/nccl_trace_rank_2",
                                               directory.path() + "/nccl_trace_rank_3"});
  for (int rank : {2, 3}) {
    const Json dump = Json::parse(PythonLoads(testing::ReadFile((*written)[rank - 2]), true));
    INFO("rank " << rank << ": " << dump.dump());
    CHECK(dump["pg_config"]["2748"]["ranks"] == "[0, 1, 2, 3]");
    CHECK(dump["pg_config"][std::to_string(0x110 + (rank - 2))]["ranks"] == absl::StrCat("[", rank, "]"));
    REQUIRE(dump["entries"].size() == 2);
    CHECK(dump["entries"][1]["input_sizes"] == Json::parse(absl::StrCat("[[", 64 + rank, "]]")));
  }
}

TEST_CASE("analyze writes a file per rank of the processes that drive several devices") {
  JobView job;
  for (int process : {0, 1}) {
    ProcessView view;
    view.snapshot = TwoDeviceProcess(process);
    view.facts = LauncherFacts(std::to_string(process), "2");
    job.processes.push_back(view);
  }
  const std::vector<FlightRecorderFile> files = FlightRecorderFiles(job, FlightRecorderStates::kUntimed);
  REQUIRE(files.size() == 4);
  for (int rank = 0; rank < 4; ++rank) {
    CHECK(files[static_cast<std::size_t>(rank)].rank == rank);
    const Json dump = Json::parse(PythonLoads(files[static_cast<std::size_t>(rank)].contents, true));
    INFO("rank " << rank << ": " << dump.dump());
    CHECK(dump["pg_config"]["2748"]["ranks"] == "[0, 1, 2, 3]");
    REQUIRE(dump["entries"].size() == 2);
    CHECK(dump["entries"][1]["input_sizes"] == Json::parse(absl::StrCat("[[", 64 + rank, "]]")));
  }
}

}  // namespace
}  // namespace ncclguard
