// A dump and a status file checked in under tests/report/data, written from Sample() by an
// earlier build: this build writes the same bytes from it, and reads every field back. A change
// of format shows here; when one is meant (docs/dump-format.md), write the samples again with
//   build/tests/report/snapshot_samples_tests "[.write-samples]"
// and say why in the commit.
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

#include "watchdog/common/version.h"
#include "watchdog/report/dump.h"
#include "watchdog/report/dump_reader.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/report/op_signature.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {
namespace {

const std::string kDumpSample = std::string(NCCLGUARD_SAMPLES_DIR) + "/dump-v2.json";
const std::string kStatusSample = std::string(NCCLGUARD_SAMPLES_DIR) + "/status-v1.json";

OpSnapshot SampleOp(std::uint64_t seq, const char* state) {
  return OpSnapshot{.seq = seq,
                    .coll_seq = seq - 2,
                    .op = "AllReduce",
                    .dtype = "bfloat16",
                    .count = 1000 + seq,
                    .bytes = 2000 + 2 * seq,
                    .root = 3,
                    .peer = 5,
                    .reduction = "max",
                    .stream = 0xfedc'ba98'7654'3210,
                    .group = 9,
                    .host_thread = 4321,
                    .enqueue_ns = 1'700'000'000'000'000'000 + static_cast<std::int64_t>(seq),
                    .start_ns = 1'700'000'000'000'001'000 + static_cast<std::int64_t>(seq),
                    .end_ns = state == std::string("completed") ? 1'700'000'000'000'002'000 : 0,
                    .gpu_ms = state == std::string("completed") ? 1.25 : -1,
                    .result = 0,
                    .state = state};
}

OpProfileSnapshot SampleProfile() {
  return OpProfileSnapshot{
      .func = "AllReduce",
      .nccl_seq = 41,
      .seq = 8,
      .algo = "Ring",
      .proto = "Simple",
      .channels = 2,
      .peer = -1,
      .start_ns = 1'700'000'000'000'003'000,
      .kernel_channels = {ChannelSnapshot{
                              .channel = 0, .stopped = true, .gpu_start_ns = 11, .gpu_stop_ns = 12},
                          ChannelSnapshot{
                              .channel = 1, .stopped = false, .gpu_start_ns = 13, .gpu_stop_ns = 0}},
      .proxy_ops = {ProxyOpSnapshot{.channel = 1,
                                    .peer = 6,
                                    .send = true,
                                    .steps = 8,
                                    .steps_done = 3,
                                    .stopped = false,
                                    .network_ns = 2'500'000,
                                    .network_bytes = 3 << 20,
                                    .network_steps = 3,
                                    .waiting_step = 4,
                                    .waiting = StepWait::kSendPeer,
                                    .waiting_since_ns = 1'700'000'000'000'004'000}}};
}

CommSnapshot SampleComm() {
  CommSnapshot comm;
  comm.id = "9f3a000000000001";
  comm.handle = 0x55d0'c0de'0000'0001;
  comm.rank = 2;
  comm.nranks = 8;
  comm.device = 1;
  comm.created_by = "ncclCommSplit";
  comm.parent_id = "77aa000000000002";
  comm.library_path = "/usr/lib/libnccl.so.2";
  comm.nccl_version = 22809;
  comm.state = "ready";
  comm.timing = "profiler";
  comm.init_start_ns = 1'600'000'000'000'000'000;
  comm.init_end_ns = 1'600'000'000'500'000'000;
  comm.last_enqueued = 8;
  comm.collectives = 6;
  comm.last_started = 8;
  comm.last_completed = 7;
  comm.async_error = "ncclRemoteError";
  comm.dropped = 3;
  comm.ring = {SampleOp(7, "completed"), SampleOp(8, "started")};
  comm.signatures_first_seq = 7;
  comm.signatures = {0x1234'5678, 0x9abc'def0};
  comm.profile = {SampleProfile()};
  comm.pace = {PaceBlockSnapshot{
      .first_seq = 1,
      .collectives = 7,
      .wait_ms = 12.5,
      .span_ms = 250.25,
      .links = {PaceLinkSnapshot{.peer = 3, .channel = 1, .bytes = 8 << 20, .steps = 8, .network_ms = 6.5}}}};
  return comm;
}

ThreadsSnapshot SampleThreads() {
  ThreadSnapshot thread{.tid = 4321,
                        .name = "python3",
                        .state = "sleeping",
                        .wchan = "futex_wait_queue",
                        .syscall = "futex",
                        .fd = 7,
                        .fd_target = "pipe:[42]",
                        .blocked_seconds = 12.5,
                        .native_missing = "",
                        .native = {FrameSnapshot{.function = "ncclAllReduce",
                                                 .file = "collectives.cc",
                                                 .line = 88,
                                                 .module = "/usr/lib/libnccl.so.2",
                                                 .offset = 0x1f00}},
                        .python = {}};
  FrameSnapshot python;
  python.function = "train_step";
  python.file = "train.py";
  python.line = 17;
  thread.python = {python};
  ThreadSnapshot other;
  other.tid = 4322;
  other.name = "pt_watchdog";
  other.native_missing = "it blocks signals";
  return ThreadsSnapshot{.time_ns = 1'700'000'000'200'000'000,
                         .took_ms = 3.5,
                         .total = 2,
                         .native_note = "",
                         .symbols_note = "no debug information for libnccl.so.2",
                         .python_version = "3.11.2",
                         .python_note = "",
                         .threads = {thread, other}};
}

// Every field set, none to its default.
ProcessSnapshot Sample() {
  ProcessSnapshot snapshot;
  snapshot.reason = "stall";
  snapshot.time_ns = 1'700'000'000'123'456'789;
  snapshot.rank = 2;
  snapshot.in_nccl_call = "ncclAllReduce";
  snapshot.comms = {SampleComm()};
  snapshot.stall = StallSnapshot{.kind = "not_completed",
                                 .comm_id = "9f3a000000000001",
                                 .seq = 8,
                                 .seconds = 15.5,
                                 .message = "rank 2 comm 9f3a…: AllReduce #8 started 15.5 s ago",
                                 .verdict = "stuck_inside_nccl",
                                 .verdict_message = "every rank entered AllReduce #8",
                                 .skipped_dumps = 2};
  snapshot.last_nccl_warning = "NCCL WARN peer 3 closed the connection";
  snapshot.pending_inits = {PendingInitSnapshot{.comm_id = "5555000000000003",
                                                .api = "ncclCommInitRank",
                                                .rank = 1,
                                                .nranks = 4,
                                                .start_ns = 1'700'000'000'000'000'500,
                                                .result = "ncclInvalidArgument"}};
  snapshot.exiting = true;
  snapshot.fail_slow = {
      FailSlowSnapshot{.kind = "slow_link",
                       .comm_id = "9f3a000000000001",
                       .ranks = {2, 3},
                       .message = "the link from rank 2 to rank 3 on channel 1 is 3.0x slower"}};
  snapshot.threads = SampleThreads();
  return snapshot;
}

ProcessFacts SampleFacts() {
  ProcessFacts facts;
  facts.host = "node17";
  facts.pid = 4242;
  facts.ppid = 1;
  facts.program = "/usr/bin/python3";
  facts.command_line = {"python3", "train.py"};
  facts.launcher = {{"RANK", "2"}, {"WORLD_SIZE", "8"}};
  facts.environment = {{"NCCL_DEBUG", "WARN"}, {"NCCL_P2P_DISABLE", "1"}};
  facts.kernel_release = "6.1.0";
  facts.driver_version = "580.65.06";
  facts.cuda.driver_version = 13000;
  facts.cuda.device_count = 2;
  facts.host_gpu_names = {"NVIDIA H100", "NVIDIA H100"};
  facts.cuda.peer_access = {{1, 1}, {1, 1}};
  facts.cuda.gpus.push_back(GpuFacts{.device = 1,
                                     .name = "NVIDIA H100",
                                     .pci_bus_id = "0000:19:00.0",
                                     .memory_free_bytes = 10,
                                     .memory_total_bytes = 80});
  facts.host_memory_total_bytes = 1000;
  facts.host_memory_available_bytes = 123;
  facts.rss_bytes = 456;
  facts.peak_rss_bytes = 789;
  return facts;
}

std::string Contents(const std::string& path) {
  std::ifstream file(path);
  std::stringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

// A dump names the ncclguard that wrote it: the sample's version becomes this build's.
std::string WithThisVersion(const std::string& dump) {
  return std::regex_replace(dump, std::regex("\"ncclguard_version\":\"[^\"]*\""),
                            std::string("\"ncclguard_version\":\"") + kVersion + "\"");
}

TEST_CASE("the checked-in dump is what this build writes, and reads back whole", "[dump]") {
  const std::string sample = Contents(kDumpSample);
  REQUIRE(!sample.empty());
  const std::string written = FormatDump(Sample(), SampleFacts());
  CHECK(written == WithThisVersion(sample));

  const absl::StatusOr<ParsedDump> parsed = ParseDump(sample);
  REQUIRE(parsed.ok());
  // Every field read: what is read writes the sample again.
  CHECK(WithThisVersion(FormatDump(parsed->snapshot, parsed->facts)) == WithThisVersion(sample));
  const CommSnapshot& comm = parsed->snapshot.comms.at(0);
  CHECK(comm.handle == 0x55d0'c0de'0000'0001);
  CHECK(comm.nccl_version == 22809);
  CHECK(comm.last_completed == 7);
  CHECK(comm.ring.at(1).stream == 0xfedc'ba98'7654'3210);
  CHECK(comm.profile.at(0).proxy_ops.at(0).waiting == StepWait::kSendPeer);
  CHECK(comm.profile.at(0).proxy_ops.at(0).network_bytes == 3 << 20);
  CHECK(comm.pace.at(0).links.at(0).network_ms == 6.5);
  CHECK(parsed->snapshot.fail_slow.at(0).ranks == std::vector<int>{2, 3});
  CHECK(parsed->snapshot.stall->skipped_dumps == 2);
  CHECK(parsed->snapshot.threads->threads.at(0).native.at(0).offset == 0x1f00);
}

TEST_CASE("the checked-in status is what this build writes, and reads back whole", "[status]") {
  const std::string sample = Contents(kStatusSample);
  REQUIRE(!sample.empty());
  const absl::StatusOr<std::string> written = FormatStatus(Sample(), SampleFacts());
  REQUIRE(written.ok());
  CHECK(*written == sample);

  const absl::StatusOr<PeerStatus> parsed = ParseStatusRecord("status-node17-4242.json", sample);
  REQUIRE(parsed.ok());
  const absl::StatusOr<std::string> again = FormatStatus(parsed->snapshot, parsed->facts);
  REQUIRE(again.ok());
  CHECK(*again == sample);
  const CommSnapshot& comm = parsed->snapshot.comms.at(0);
  CHECK(comm.timing == "profiler");
  CHECK(comm.signatures == std::vector<std::uint32_t>{0x1234'5678, 0x9abc'def0});
  CHECK(comm.ring.at(1).start_ns == 1'700'000'000'000'001'008);
  CHECK(parsed->snapshot.pending_inits.at(0).result == "ncclInvalidArgument");
  CHECK(comm.pace.at(0).wait_ms == 12.5);
  CHECK(comm.device == 1);
  CHECK(parsed->snapshot.fail_slow.at(0).kind == "slow_link");
}

TEST_CASE("write the samples again", "[.write-samples]") {
  std::ofstream(kDumpSample) << FormatDump(Sample(), SampleFacts());
  std::ofstream(kStatusSample) << FormatStatus(Sample(), SampleFacts()).value();
}

}  // namespace
}  // namespace ncclguard
