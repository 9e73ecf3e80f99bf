// `ncclguard analyze` end to end: the built command run on job directories written in the real
// formats by the synthetic job generator, checked the way a user or a script reads it: the exit
// status, the text, the --json document and the --trace file.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/synthetic_job.h"
#include "tests/support/process.h"
#include "tests/support/redis_server.h"
#include "watchdog/report/job_board.h"

using ncclguard::SyntheticJob;
using ncclguard::testing::ProcessResult;
using ncclguard::testing::ReadFile;
using ncclguard::testing::RunProcess;
using ncclguard::testing::TemporaryDirectory;
using Json = nlohmann::json;

namespace {

constexpr int kHealthy = 0;
constexpr int kProblemFound = 1;
constexpr int kUsageError = 2;

ProcessResult Ncclguard(const std::vector<std::string>& arguments,
                        const std::map<std::string, std::optional<std::string>>& environment = {}) {
  std::vector<std::string> argv{NCCLGUARD_COMMAND};
  argv.insert(argv.end(), arguments.begin(), arguments.end());
  ncclguard::testing::ProcessOptions options;
  options.timeout_seconds = 30;
  options.environment = environment;
  return RunProcess(argv, options);
}

std::string Transcript(const ProcessResult& result) {
  return "exit " + std::to_string(result.exit_code) + "\n--- stdout\n" + result.out + "--- stderr\n" +
         result.err;
}

// A job written now into a fresh directory.
struct Job {
  explicit Job(SyntheticJob options) : path(directory.path() + "/job") {
    const absl::Status written = ncclguard::WriteSyntheticJob(path, options);
    INFO(written.ToString());
    REQUIRE(written.ok());
  }
  TemporaryDirectory directory;
  std::string path;
};

SyntheticJob Scenario(SyntheticJob::Scenario scenario, int late_rank = 0,
                      SyntheticJob::LateRank late_rank_state = SyntheticJob::LateRank::kBusy) {
  SyntheticJob options;
  options.ranks = 4;
  options.operations = 8;
  options.scenario = scenario;
  options.late_rank = late_rank;
  options.late_rank_state = late_rank_state;
  return options;
}

Json ParseJson(const std::string& text) {
  Json document = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  INFO(text.substr(0, 2000));
  REQUIRE(!document.is_discarded());
  return document;
}

}  // namespace

TEST_CASE("a healthy job exits 0 and says so") {
  Job job(Scenario(SyntheticJob::Scenario::kHealthy));
  const ProcessResult result = Ncclguard({"analyze", job.path});
  INFO(Transcript(result));
  CHECK(result.exit_code == kHealthy);
  CHECK(result.out.find("HEALTHY") != std::string::npos);
  CHECK(result.out.find("4 processes") != std::string::npos);
}

// The job's processes never list the job directory; analyze, which reads it all, removes the
// temporaries that killed writers left: .tmp-<name>~<host>~<pid>~<n> (temporaries.h).
TEST_CASE("analyze removes the temporaries of gone writers of this host, and reads none of them") {
  Job job(Scenario(SyntheticJob::Scenario::kHealthy));
  char host[256] = {};
  REQUIRE(gethostname(host, sizeof(host) - 1) == 0);
  const pid_t ended = fork();
  if (ended == 0) _exit(0);
  REQUIRE(ended > 0);
  REQUIRE(waitpid(ended, nullptr, 0) == ended);
  const std::string gone = job.path + "/.tmp-status-a-1.json~" + host + "~" + std::to_string(ended) + "~0";
  const std::string alive =
      job.path + "/.tmp-status-a-2.json~" + host + "~" + std::to_string(getpid()) + "~0";
  for (const std::string& path : {gone, alive}) std::ofstream(path) << "{\"format\":";
  const ProcessResult result = Ncclguard({"analyze", job.path});
  INFO(Transcript(result));
  CHECK(result.exit_code == kHealthy);
  CHECK(result.out.find("4 processes") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(gone));
  CHECK(std::filesystem::exists(alive));
}

TEST_CASE("a one-process job is counted in the singular") {
  SyntheticJob options = Scenario(SyntheticJob::Scenario::kHealthy);
  options.ranks = 1;
  Job job(options);
  const ProcessResult result = Ncclguard({"analyze", job.path});
  INFO(Transcript(result));
  CHECK(result.out.find(": 1 process, read at") != std::string::npos);
}

TEST_CASE("the shipped known-bad file is found beside the command, and a missing one is said") {
  Job job(Scenario(SyntheticJob::Scenario::kHealthy));
  const ProcessResult shipped =
      Ncclguard({"analyze", job.path}, {{"NCCLGUARD_KNOWN_BAD_FILE", std::nullopt}});
  INFO(Transcript(shipped));
  CHECK(shipped.exit_code == kHealthy);
  CHECK(shipped.err.find("known-bad") == std::string::npos);

  const ProcessResult missing =
      Ncclguard({"analyze", job.path}, {{"NCCLGUARD_KNOWN_BAD_FILE", job.directory.path() + "/none.json"}});
  INFO(Transcript(missing));
  CHECK(missing.exit_code == kHealthy);
  CHECK(missing.err.find("known-bad configurations not used as P2P evidence") != std::string::npos);
  CHECK(missing.err.find("none.json") != std::string::npos);
}

TEST_CASE("a rank that never joined the collective exits 1, named with the collective") {
  Job job(Scenario(SyntheticJob::Scenario::kRankNotJoined, /*late_rank=*/2));
  const ProcessResult result = Ncclguard({"analyze", job.path});
  INFO(Transcript(result));
  CHECK(result.exit_code == kProblemFound);
  CHECK(result.out.find("RANK_NOT_JOINED  comm 5eed0c0ffee0cafe #8") != std::string::npos);
  CHECK(result.out.find("ranks: 2\n") != std::string::npos);
  // The per-rank table: the late rank completed #7, the others wait in #8 having completed #7 too.
  CHECK(result.out.find("RANK   PROCESS") != std::string::npos);
  CHECK(result.out.find("node0:20002") != std::string::npos);
}

// Reads every file `analyze --flight-recorder` wrote as PyTorch's analyzer reads them (the rank from
// the name, pickle.load, the ranks of pg_config with ast.literal_eval, the backend and operation
// from profiling_name) and prints, per rank: the members of its group and (operation, collective
// seq id, state) of each entry.
constexpr const char* kReadFlightRecorder = R"py(
import ast, json, os, pickle, re, sys
required = ["record_id", "pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "op_id",
            "profiling_name", "time_created_ns", "input_sizes", "input_dtypes", "output_sizes",
            "output_dtypes", "state", "time_discovered_started_ns", "time_discovered_completed_ns",
            "retired", "timeout_ms", "is_p2p", "frames", "thread_id", "thread_name"]
result = {}
for name in sorted(os.listdir(sys.argv[1])):
    rank = int(re.fullmatch(r"nccl_trace_rank_(\d+)", name).group(1))
    dump = pickle.load(open(os.path.join(sys.argv[1], name), "rb"))
    assert dump["version"] == "2.10" and set(dump) >= {"pg_config", "pg_status", "entries"}
    members = [ast.literal_eval(group["ranks"]) for group in dump["pg_config"].values()]
    entries = []
    for entry in dump["entries"]:
        assert all(key in entry for key in required), entry
        assert entry["process_group"][0] in dump["pg_config"]
        backend, operation = entry["profiling_name"].split(":")
        assert backend == "nccl"
        entries.append([operation, entry["collective_seq_id"], entry["state"]])
    result[rank] = {"members": members, "entries": entries}
print(json.dumps(result))
)py";

TEST_CASE("analyze --flight-recorder writes each rank's operations as PyTorch's Flight Recorder does") {
  Job job(Scenario(SyntheticJob::Scenario::kRankNotJoined, /*late_rank=*/2));
  TemporaryDirectory out;
  const std::string directory = out.path() + "/fr";
  const ProcessResult result = Ncclguard({"analyze", job.path, "--flight-recorder", directory});
  INFO(Transcript(result));
  CHECK(result.exit_code == kProblemFound);
  CHECK(result.out.find("Flight Recorder files of 4 ranks written to " + directory) != std::string::npos);

  const ProcessResult read = RunProcess({"python3", "-c", kReadFlightRecorder, directory});
  INFO(read.err);
  REQUIRE(read.exit_code == 0);
  const Json ranks = ParseJson(read.out);
  REQUIRE(ranks.size() == 4);
  for (const auto& [rank, dump] : ranks.items()) {
    INFO("rank " << rank << ": " << dump.dump());
    CHECK(dump["members"] == Json::parse("[[0, 1, 2, 3]]"));
    const Json& newest = dump["entries"].back();
    if (rank == "2") {
      // The late rank completed #7 and never enqueued #8.
      CHECK(newest == Json::parse(R"(["all_reduce", 7, "completed"])"));
    } else {
      CHECK(newest == Json::parse(R"(["all_reduce", 8, "scheduled"])"));
    }
  }
}

// More statuses than one round trip to Redis brings (8 batches of 1,000): each batch is parsed
// while the next is fetched, and every status is read once, whichever thread parsed it.
TEST_CASE("a job of 20000 ranks on Redis: every status read, batch by batch, and the late rank named") {
  ncclguard::testing::RedisServer redis;
  REQUIRE(redis.started());
  TemporaryDirectory directory;
  const std::string job_dir = directory.path() + "/job-20k";
  SyntheticJob options = Scenario(SyntheticJob::Scenario::kRankNotJoined, /*late_rank=*/13'777);
  options.ranks = 20'000;
  absl::StatusOr<std::shared_ptr<ncclguard::JobBoard>> board =
      ncclguard::OpenJobBoard(redis.Url(), job_dir, "job-20k", ncclguard::BoardIdentity{});
  REQUIRE(board.ok());
  const absl::Status written = ncclguard::WriteSyntheticJob(*board, options);
  INFO(written.ToString());
  REQUIRE(written.ok());

  const ProcessResult result =
      Ncclguard({"analyze", "--json", redis.Url() + "/job-20k", "--dump-dir", job_dir});
  INFO(Transcript(result).substr(0, 4000));
  CHECK(result.exit_code == kProblemFound);
  const Json document = ParseJson(result.out);
  const Json& first = document.at("verdicts").at(0);
  CHECK(first.at("kind") == "rank_not_joined");
  CHECK(first.at("ranks") == Json::array({13'777}));
  CHECK(document.at("not_read").at("processes") == 0);
  const Json& processes = document.at("processes");
  REQUIRE(processes.size() == 20'000);
  std::vector<bool> ranks_seen(20'000, false);
  for (const Json& process : processes) {
    const int rank = process.at("rank").get<int>();
    REQUIRE((rank >= 0 && rank < 20'000));
    CHECK_FALSE(ranks_seen[rank]);
    ranks_seen[rank] = true;
  }
  // The one thing left out: most dumps, sampled, nobody blamed for them.
  REQUIRE(document.at("problems").size() == 1);
  CHECK(document["problems"][0].get<std::string>().find("dumps: not read, their processes' statuses are like "
                                                        "most of the job's, and 1024 of their dumps were "
                                                        "read") != std::string::npos);
}

TEST_CASE("analyze --json prints only the verdicts document") {
  SECTION("rank_not_joined") {
    Job job(Scenario(SyntheticJob::Scenario::kRankNotJoined, /*late_rank=*/1));
    const ProcessResult result = Ncclguard({"analyze", "--json", job.path});
    INFO(Transcript(result));
    CHECK(result.exit_code == kProblemFound);
    const Json document = ParseJson(result.out);
    REQUIRE(document.at("verdicts").is_array());
    REQUIRE(!document["verdicts"].empty());
    const Json& first = document["verdicts"][0];
    CHECK(first.at("kind") == "rank_not_joined");
    CHECK(first.at("comm") == "5eed0c0ffee0cafe");
    CHECK(first.at("seq") == 8);
    CHECK(first.at("ranks") == Json::array({1}));
    CHECK(first.at("message").get<std::string>().size() > 0);
    // Read whole: the verdicts rest on every file.
    CHECK(first.at("partial_read").is_null());
    CHECK(document.at("not_read").at("files") == 0);
    CHECK(document["not_read"].at("processes") == 0);
  }
  SECTION("stuck_inside_nccl") {
    Job job(Scenario(SyntheticJob::Scenario::kAllStuck));
    const ProcessResult result = Ncclguard({"analyze", job.path, "--json"});
    INFO(Transcript(result));
    CHECK(result.exit_code == kProblemFound);
    const Json document = ParseJson(result.out);
    CHECK(document.at("verdicts").at(0).at("kind") == "stuck_inside_nccl");
    CHECK(document["verdicts"][0].at("seq") == 8);
  }
  SECTION("healthy") {
    Job job(Scenario(SyntheticJob::Scenario::kHealthy));
    const ProcessResult result = Ncclguard({"analyze", "--json", job.path});
    INFO(Transcript(result));
    CHECK(result.exit_code == kHealthy);
    const Json document = ParseJson(result.out);
    REQUIRE(document.at("verdicts").size() == 1);
    CHECK(document["verdicts"][0].at("kind") == "healthy");
  }
}

TEST_CASE("analyze --deadline: what is not read in time is said, and no rank is blamed for it") {
  SyntheticJob options = Scenario(SyntheticJob::Scenario::kRankNotJoined, /*late_rank=*/40);
  options.ranks = 64;
  Job job(options);
  SECTION("time enough: the late rank, read whole") {
    const ProcessResult result = Ncclguard({"analyze", job.path, "--deadline", "60"});
    INFO(Transcript(result));
    CHECK(result.exit_code == kProblemFound);
    CHECK(result.out.find("RANK_NOT_JOINED") != std::string::npos);
    CHECK(result.out.find("Read in part") == std::string::npos);
  }
  SECTION("a millisecond: given up, or read in part and said so") {
    const ProcessResult result = Ncclguard({"analyze", "--json", job.path, "--deadline", "0.001"});
    INFO(Transcript(result));
    if (result.exit_code == kUsageError) {
      CHECK(result.err.find("took longer than 1 ms") != std::string::npos);
    } else {
      const Json document = ParseJson(result.out);
      const std::size_t read = document.at("processes").size();
      CHECK(read + document.at("not_read").at("processes").get<std::size_t>() == 64);
      for (const Json& verdict : document.at("verdicts")) {
        if (read < 64) CHECK(verdict.at("partial_read").at("processes_read") == read);
        // A rank is named only from its own record.
        for (const Json& rank : verdict.at("ranks")) {
          const bool seen = std::any_of(document["processes"].begin(), document["processes"].end(),
                                        [&](const Json& process) { return process.at("rank") == rank; });
          CHECK(seen);
        }
      }
    }
  }
  SECTION("a deadline that is no number of seconds is a usage error") {
    const std::string deadline = GENERATE("0", "-1", "nan", "soon");
    const ProcessResult result = Ncclguard({"analyze", job.path, "--deadline", deadline});
    INFO(Transcript(result));
    CHECK(result.exit_code == kUsageError);
    CHECK(result.err.find("--deadline") != std::string::npos);
  }
}

TEST_CASE("a rank that died without a dump is named dead") {
  Job job(Scenario(SyntheticJob::Scenario::kRankNotJoined, /*late_rank=*/3, SyntheticJob::LateRank::kGone));
  const ProcessResult result = Ncclguard({"analyze", "--json", job.path});
  INFO(Transcript(result));
  CHECK(result.exit_code == kProblemFound);
  const Json document = ParseJson(result.out);
  bool named_dead = false;
  for (const Json& verdict : document.at("verdicts")) {
    named_dead = named_dead || (verdict.at("kind") == "rank_dead" && verdict.at("ranks") == Json::array({3}));
  }
  CHECK(named_dead);
}

TEST_CASE("a rank that finished its loop is shown as exited") {
  Job job(Scenario(SyntheticJob::Scenario::kRankNotJoined, /*late_rank=*/3, SyntheticJob::LateRank::kExited));
  const ProcessResult result = Ncclguard({"analyze", job.path});
  INFO(Transcript(result));
  CHECK(result.exit_code == kProblemFound);
  CHECK(result.out.find("ranks: 3\n") != std::string::npos);
  const std::size_t row = result.out.find("\n3      node0:20003");
  REQUIRE(row != std::string::npos);
  CHECK(result.out.substr(row, result.out.find('\n', row + 1) - row).find(" exited ") != std::string::npos);
}

TEST_CASE(
    "analyze --trace writes a Chrome trace: a track per rank, a slice per operation, stuck ones marked") {
  Job job(Scenario(SyntheticJob::Scenario::kRankNotJoined, /*late_rank=*/0));
  const std::string trace_path = job.directory.path() + "/trace.json";
  const ProcessResult result = Ncclguard({"analyze", job.path, "--trace", trace_path});
  INFO(Transcript(result));
  CHECK(result.exit_code == kProblemFound);
  REQUIRE(std::filesystem::exists(trace_path));
  const Json trace = ParseJson(ReadFile(trace_path));
  REQUIRE(trace.at("traceEvents").is_array());

  std::map<int, std::string> process_names;  // trace pid -> name
  std::map<int, int> slices_per_process;
  std::set<int> processes_with_stuck_slice;
  int names_per_pid_max = 0;
  std::map<int, int> names_per_pid;
  for (const Json& event : trace["traceEvents"]) {
    const std::string phase = event.at("ph");
    const int pid = event.at("pid");
    if (phase == "M" && event.at("name") == "process_name") {
      process_names[pid] = event.at("args").at("name");
      names_per_pid_max = std::max(names_per_pid_max, ++names_per_pid[pid]);
    }
    if (phase == "X") {
      CHECK(event.at("dur").get<double>() >= 0);
      CHECK(event.at("ts").get<double>() >= 0);
      ++slices_per_process[pid];
      const std::string name = event.at("name");
      if (name == "AllReduce #8 (stuck)") {
        CHECK(event.at("args").at("state") == "started");
        CHECK(event.at("args").at("op") == "AllReduce");
        CHECK(event.at("args").at("count") == 1 << 20);
        processes_with_stuck_slice.insert(pid);
      }
    }
  }
  CHECK(names_per_pid_max == 1);
  REQUIRE(process_names.size() == 4);
  std::set<std::string> names;
  for (const auto& [pid, name] : process_names) names.insert(name);
  for (int rank = 0; rank < 4; ++rank) {
    const std::string expected =
        "rank " + std::to_string(rank) + " (node0:" + std::to_string(20000 + rank) + ")";
    CHECK(names.count(expected) == 1);
  }
  // Ranks 1-3 wait inside #8; rank 0 never issued it.
  CHECK(processes_with_stuck_slice.size() == 3);
  for (const auto& [pid, name] : process_names) {
    CHECK(slices_per_process[pid] >= 4);  // the ring's operations and the initialisation
    if (name.rfind("rank 0 ", 0) == 0) CHECK(processes_with_stuck_slice.count(pid) == 0);
  }
}

TEST_CASE("analyze --trace gives rank 2147483647 a track of its own, with no negative number") {
  Job job(Scenario(SyntheticJob::Scenario::kHealthy));
  for (const auto& entry : std::filesystem::directory_iterator(job.path)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("status-", 0) != 0) continue;
    Json status = ParseJson(ReadFile(entry.path().string()));
    if (status.at("rank") != 3) continue;
    status["rank"] = 2147483647;
    for (Json& comm : status.at("communicators")) comm["rank"] = 2147483647;
    std::ofstream(entry.path()) << status.dump();
  }
  const std::string trace_path = job.directory.path() + "/trace.json";
  const ProcessResult result = Ncclguard({"analyze", job.path, "--trace", trace_path});
  INFO(Transcript(result));
  REQUIRE(std::filesystem::exists(trace_path));
  const Json trace = ParseJson(ReadFile(trace_path));
  std::set<std::int64_t> process_tracks;
  for (const Json& event : trace.at("traceEvents")) {
    const std::int64_t pid = event.at("pid").get<std::int64_t>();
    CHECK(pid >= 0);
    if (event.at("ph") == "M" && event.at("name") == "process_name") CHECK(process_tracks.insert(pid).second);
  }
  CHECK(process_tracks.size() == 4);
}

namespace {

// The trace `analyze --trace` writes of a running job of `ranks` ranks whose link from `slow_rank`
// to the next is 3x slower on channel 1; that analyze named it.
Json SlowLinkTrace(int ranks, int slow_rank) {
  SyntheticJob options = Scenario(SyntheticJob::Scenario::kSlowLink);
  options.ranks = ranks;
  options.slow_link_rank = slow_rank;
  options.slow_link_channel = 1;
  Job job(options);
  const std::string trace_path = job.directory.path() + "/trace.json";
  const ProcessResult result = Ncclguard({"analyze", job.path, "--trace", trace_path});
  INFO(Transcript(result));
  CHECK(result.exit_code == kProblemFound);
  CHECK(result.out.find("SLOW_LINK") != std::string::npos);
  REQUIRE(std::filesystem::exists(trace_path));
  return ParseJson(ReadFile(trace_path));
}

}  // namespace

TEST_CASE("analyze --trace marks a slow link over the blocks it was judged on, with the pace counters") {
  const Json trace = SlowLinkTrace(8, 5);

  std::map<int, int> wait_counters;  // trace pid (rank + 1) -> GPU wait counter events
  std::vector<Json> link_counters;   // rank 5's link to rank 6
  std::set<int> marked;              // trace pids with the slow link's slice
  for (const Json& event : trace.at("traceEvents")) {
    const std::string name = event.value("name", "");
    if (event.at("ph") == "C" && name.find("GPU wait") != std::string::npos) {
      CHECK(event.at("args").at("wait_ms").get<double>() > 0);
      ++wait_counters[event.at("pid").get<int>()];
    }
    if (event.at("ph") == "C" && event.at("pid") == 6 && name.find("network to rank 6") != std::string::npos)
      link_counters.push_back(event);
    if (event.at("ph") == "X" && name == "slow_link: rank 5 to rank 6") {
      CHECK(event.at("args").at("first_seq") == 33);
      CHECK(event.at("args").at("last_seq") == 64);
      // Four blocks of 8 operations, 100 ms apart.
      CHECK(event.at("dur").get<double>() == Approx(3.2e6).epsilon(0.01));
      marked.insert(event.at("pid").get<int>());
    }
  }
  CHECK(marked == std::set<int>{6, 7});
  CHECK(wait_counters.size() == 8);
  for (const auto& [pid, count] : wait_counters) CHECK(count == 8);
  REQUIRE(link_counters.size() == 8);
  for (const Json& counter : link_counters) {
    const Json& channels = counter.at("args");
    CHECK(channels.at("channel 1").get<double>() > 2 * channels.at("channel 0").get<double>());
  }
}

TEST_CASE("analyze --trace of a large job keeps the pace counters of the ranks a fail-slow verdict names") {
  const Json trace = SlowLinkTrace(80, 40);
  std::set<int> with_counters;
  for (const Json& event : trace.at("traceEvents")) {
    if (event.at("ph") == "C") with_counters.insert(event.at("pid").get<int>());
  }
  CHECK(with_counters == std::set<int>{41, 42});  // ranks 40 and 41
}

TEST_CASE("control characters from the job directory are escaped in analyze's text") {
  Job job(Scenario(SyntheticJob::Scenario::kRankNotJoined, /*late_rank=*/0));
  for (const auto& entry : std::filesystem::directory_iterator(job.path)) {
    if (entry.path().filename().string().rfind("status-", 0) != 0) continue;
    Json status = ParseJson(ReadFile(entry.path().string()));
    if (status.at("rank") != 1) continue;
    status["host"] = "node0\x1b[2J";
    status["in_nccl_call"] = "ncclAllReduce\n7      forged:1     alive";
    std::ofstream(entry.path()) << status.dump();
  }
  const ProcessResult result = Ncclguard({"analyze", job.path});
  INFO(Transcript(result));
  CHECK(result.exit_code == kProblemFound);
  CHECK(result.out.find('\x1b') == std::string::npos);
  CHECK(result.out.find("\n7      forged") == std::string::npos);
  CHECK(result.out.find("ncclAllReduce\\n7      forged") != std::string::npos);
}

TEST_CASE("usage errors and unreadable directories exit 2 with a message") {
  TemporaryDirectory empty;
  SECTION("no command") {
    const ProcessResult result = Ncclguard({});
    INFO(Transcript(result));
    CHECK(result.exit_code == kUsageError);
    CHECK(!result.err.empty());
  }
  SECTION("no directory") {
    const ProcessResult result = Ncclguard({"analyze"});
    INFO(Transcript(result));
    CHECK(result.exit_code == kUsageError);
    CHECK(result.err.find("DIR") != std::string::npos);
  }
  SECTION("unknown option") {
    const ProcessResult result = Ncclguard({"analyze", empty.path(), "--frobnicate"});
    INFO(Transcript(result));
    CHECK(result.exit_code == kUsageError);
  }
  SECTION("bad status interval") {
    const std::string interval = GENERATE("0", "nan", "inf", "-1", "1e9", "soon");
    const ProcessResult result = Ncclguard({"analyze", empty.path(), "--status-interval", interval});
    INFO(Transcript(result));
    CHECK(result.exit_code == kUsageError);
    CHECK(result.err.find("--status-interval") != std::string::npos);
  }
  SECTION("missing directory") {
    const std::string missing = empty.path() + "/no-such-job";
    const ProcessResult result = Ncclguard({"analyze", missing});
    INFO(Transcript(result));
    CHECK(result.exit_code == kUsageError);
    CHECK(result.err.find(missing) != std::string::npos);
    CHECK(result.out.empty());
  }
  SECTION("a directory without status files or dumps") {
    const ProcessResult result = Ncclguard({"analyze", "--json", empty.path()});
    INFO(Transcript(result));
    CHECK(result.exit_code == kUsageError);
    CHECK(result.err.find("no status file or dump") != std::string::npos);
    CHECK(result.out.empty());
  }
  SECTION("an unwritable trace file") {
    Job job(Scenario(SyntheticJob::Scenario::kHealthy));
    const ProcessResult result =
        Ncclguard({"analyze", job.path, "--trace", empty.path() + "/missing/trace.json"});
    INFO(Transcript(result));
    CHECK(result.exit_code == kUsageError);
    CHECK(result.err.find("trace.json") != std::string::npos);
  }
  SECTION("--help is not an error") {
    const ProcessResult result = Ncclguard({"analyze", "--help"});
    INFO(Transcript(result));
    CHECK(result.exit_code == 0);
    CHECK(result.out.find("--trace") != std::string::npos);
  }
}
