// The recovery rendezvous, with threads standing in for the ranks of one communicator: all ranks
// recover with rank 0's unique id, or all fall back with a reason that names the rank behind it;
// a missing rank, a failing rank 0 and files that are not the meeting's end it by the deadline.
#include <nccl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/support/board.h"
#include "tests/support/process.h"
#include "watchdog/common/files.h"
#include "watchdog/recover/rendezvous.h"

namespace ncclguard {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using testing::TemporaryDirectory;

constexpr char kComm[] = "93996a01f150309a";
constexpr char kInPlaceReason[] = "AllReduce #3 is in place and its input was not kept";

struct RankPlan {
  bool present = true;  // false: this rank never comes to the meeting
  bool ready = true;
  std::string not_ready_reason;
  milliseconds late{0};  // how long after the others it comes
};

// Rank 0's way to make a unique id: a recognisable one, or `failure`, counting its calls.
struct UniqueIdSource {
  std::atomic<int> calls{0};
  absl::Status failure = absl::OkStatus();

  static ncclUniqueId Made() {
    ncclUniqueId id{};
    for (std::size_t i = 0; i < sizeof id.internal; ++i) id.internal[i] = static_cast<char>(i * 7 + 1);
    return id;
  }
  UniqueIdMaker Maker() {
    return [this]() -> absl::StatusOr<ncclUniqueId> {
      calls.fetch_add(1);
      if (!failure.ok()) return failure;
      return Made();
    };
  }
};

bool SameId(const ncclUniqueId& a, const ncclUniqueId& b) {
  return std::memcmp(a.internal, b.internal, sizeof a.internal) == 0;
}

RendezvousRequest Request(const std::string& job_dir, int epoch, int nranks, int rank, const RankPlan& plan,
                          milliseconds timeout) {
  return RendezvousRequest{.board = testing::DirectoryBoard(job_dir),
                           .comm_id = kComm,
                           .epoch = epoch,
                           .nranks = nranks,
                           .rank = rank,
                           .other_local_ranks = {},
                           .ready = plan.ready,
                           .not_ready_reason = plan.not_ready_reason,
                           .timeout = timeout};
}

// Every present rank's answer (absent ranks: an Unknown status), each rank on a thread of its own.
std::vector<absl::StatusOr<RendezvousOutcome>> Meet(const std::string& job_dir, int epoch,
                                                    const std::vector<RankPlan>& plans, milliseconds timeout,
                                                    UniqueIdSource& source) {
  const int nranks = static_cast<int>(plans.size());
  std::vector<absl::StatusOr<RendezvousOutcome>> outcomes(plans.size(), absl::UnknownError("absent"));
  std::vector<std::thread> ranks;
  const UniqueIdMaker maker = source.Maker();
  for (int rank = 0; rank < nranks; ++rank) {
    if (!plans[static_cast<std::size_t>(rank)].present) continue;
    ranks.emplace_back([&, rank] {
      std::this_thread::sleep_for(plans[static_cast<std::size_t>(rank)].late);
      const RendezvousRequest request =
          Request(job_dir, epoch, nranks, rank, plans[static_cast<std::size_t>(rank)], timeout);
      outcomes[static_cast<std::size_t>(rank)] = MeetToRecover(request, rank == 0 ? maker : UniqueIdMaker{});
    });
  }
  for (std::thread& rank : ranks) rank.join();
  return outcomes;
}

// Checks that every present rank fell back with a reason containing each of `needles`.
void CheckAllFellBack(const std::vector<absl::StatusOr<RendezvousOutcome>>& outcomes,
                      const std::vector<RankPlan>& plans, const std::vector<std::string>& needles) {
  for (std::size_t rank = 0; rank < outcomes.size(); ++rank) {
    if (!plans[rank].present) continue;
    INFO("rank " << rank);
    REQUIRE(outcomes[rank].ok());
    INFO(outcomes[rank]->reason);
    CHECK_FALSE(outcomes[rank]->recover);
    for (const std::string& needle : needles) CHECK_THAT(outcomes[rank]->reason, Catch::Contains(needle));
  }
}

// Checks that every present rank read the same decision: one reason, word for word.
void CheckOneDecision(const std::vector<absl::StatusOr<RendezvousOutcome>>& outcomes,
                      const std::vector<RankPlan>& plans) {
  std::string first;
  for (std::size_t rank = 0; rank < outcomes.size(); ++rank) {
    if (!plans[rank].present || !outcomes[rank].ok()) continue;
    if (first.empty()) first = outcomes[rank]->reason;
    INFO("rank " << rank);
    CHECK(outcomes[rank]->reason == first);
  }
}

std::string MeetingDirectory(const std::string& job_dir, int epoch) {
  return RendezvousDirectory(Request(job_dir, epoch, 1, 0, {}, milliseconds(0)));
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  REQUIRE(chmod(path.c_str(), 0600) == 0);
}

nlohmann::json ReadJson(const std::string& path) { return nlohmann::json::parse(testing::ReadFile(path)); }

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST_CASE("four ready ranks all recover with the unique id rank 0 made, made once", "[rendezvous]") {
  TemporaryDirectory base;
  const std::string job_dir = base.path() + "/job";
  UniqueIdSource source;
  const std::vector<RankPlan> plans(4);
  const auto outcomes = Meet(job_dir, 1, plans, milliseconds(60'000), source);

  CHECK(source.calls.load() == 1);
  for (std::size_t rank = 0; rank < outcomes.size(); ++rank) {
    INFO("rank " << rank);
    REQUIRE(outcomes[rank].ok());
    INFO(outcomes[rank]->reason);
    CHECK(outcomes[rank]->recover);
    CHECK(SameId(outcomes[rank]->unique_id, UniqueIdSource::Made()));
  }

  // What a user finds in the job directory.
  const std::string directory = job_dir + "/recovery/" + kComm + "/1";
  CHECK(MeetingDirectory(job_dir, 1) == directory);
  const nlohmann::json decision = ReadJson(directory + "/decision.json");
  CHECK(decision.at("format") == "ncclguard-recovery-decision");
  CHECK(decision.at("format_version") == kRendezvousFormatVersion);
  CHECK(decision.at("comm") == kComm);
  CHECK(decision.at("epoch") == 1);
  CHECK(decision.at("decision") == "recover");
  CHECK(decision.at("rank") == 0);
  CHECK(decision.at("unique_id").get<std::string>().size() == 256);
  CHECK(decision.at("unique_id").get<std::string>().substr(0, 6) == "01080f");
  for (int rank = 0; rank < 4; ++rank) {
    const std::string path = directory + "/vote-" + std::to_string(rank) + ".json";
    const nlohmann::json vote = ReadJson(path);
    CHECK(vote.at("format") == "ncclguard-recovery-vote");
    CHECK(vote.at("rank") == rank);
    CHECK(vote.at("pid") == getpid());
    CHECK(vote.at("ready") == true);
    CHECK(vote.at("time_ns").get<std::int64_t>() > 0);
    struct stat file {};
    REQUIRE(stat(path.c_str(), &file) == 0);
    CHECK((file.st_mode & 0777) == 0600);
  }
  // No temporary file is left behind.
  for (const auto& entry : fs::directory_iterator(directory))
    CHECK(entry.path().filename().string()[0] != '.');
}

TEST_CASE("a process that drives several ranks votes for each of them, and leads if it holds rank 0",
          "[rendezvous]") {
  TemporaryDirectory base;
  const std::string job_dir = base.path() + "/job";
  UniqueIdSource source;
  const RankPlan ready;
  // Ranks 2 and 3 in one process, rank 0 and 1 in another: rank 1's process leads for rank 0.
  RendezvousRequest first = Request(job_dir, 1, 4, 2, ready, milliseconds(60'000));
  first.other_local_ranks = {3};
  RendezvousRequest second = Request(job_dir, 1, 4, 1, ready, milliseconds(60'000));
  second.other_local_ranks = {0};
  absl::StatusOr<RendezvousOutcome> first_outcome = absl::UnknownError("not met");
  std::thread other([&] { first_outcome = MeetToRecover(first, UniqueIdMaker{}); });
  const absl::StatusOr<RendezvousOutcome> second_outcome = MeetToRecover(second, source.Maker());
  other.join();
  for (const absl::StatusOr<RendezvousOutcome>* outcome :
       std::vector<const absl::StatusOr<RendezvousOutcome>*>{&first_outcome, &second_outcome}) {
    REQUIRE(outcome->ok());
    INFO((*outcome)->reason);
    CHECK((*outcome)->recover);
    CHECK(SameId((*outcome)->unique_id, UniqueIdSource::Made()));
  }
  CHECK(source.calls.load() == 1);
  const std::string directory = MeetingDirectory(job_dir, 1);
  for (int rank = 0; rank < 4; ++rank)
    CHECK(ReadJson(directory + "/vote-" + std::to_string(rank) + ".json").at("rank") == rank);

  SECTION("one of them not ready: every rank falls back at once, naming it") {
    RankPlan unsafe;
    unsafe.ready = false;
    unsafe.not_ready_reason = "its replay is unsafe";
    RendezvousRequest alone = Request(job_dir, 2, 4, 1, unsafe, milliseconds(60'000));
    alone.other_local_ranks = {0, 2, 3};
    const auto start = std::chrono::steady_clock::now();
    const absl::StatusOr<RendezvousOutcome> outcome = MeetToRecover(alone, source.Maker());
    REQUIRE(outcome.ok());
    CHECK_FALSE(outcome->recover);
    CHECK_THAT(outcome->reason, Catch::Contains("rank 1 cannot recover: its replay is unsafe"));
    CHECK(SecondsSince(start) < 30);
  }
}

TEST_CASE("ranks that come at different times are waited for", "[rendezvous]") {
  TemporaryDirectory base;
  UniqueIdSource source;
  std::vector<RankPlan> plans(4);
  plans[0].late = milliseconds(150);  // rank 0 comes after votes are there
  plans[3].late = milliseconds(400);  // rank 0 waits for the last vote
  const auto outcomes = Meet(base.path() + "/job", 1, plans, milliseconds(60'000), source);
  CHECK(source.calls.load() == 1);
  for (const auto& outcome : outcomes) {
    REQUIRE(outcome.ok());
    INFO(outcome->reason);
    CHECK(outcome->recover);
    CHECK(SameId(outcome->unique_id, UniqueIdSource::Made()));
  }
}

TEST_CASE("a rank that comes after the decision follows it", "[rendezvous]") {
  TemporaryDirectory base;
  const std::string job_dir = base.path() + "/job";
  UniqueIdSource source;
  std::vector<RankPlan> plans(3);
  plans[2].present = false;
  const auto outcomes = Meet(job_dir, 1, plans, milliseconds(500), source);
  CheckAllFellBack(outcomes, plans, {"rank 2 did not vote"});
  // Ready, but too late: the meeting is over and its decision stands.
  const absl::StatusOr<RendezvousOutcome> late =
      MeetToRecover(Request(job_dir, 1, 3, 2, {}, milliseconds(60'000)), UniqueIdMaker{});
  REQUIRE(late.ok());
  CHECK_FALSE(late->recover);
  CHECK(late->reason == outcomes[0]->reason);
}

TEST_CASE("a single rank recovers on its own", "[rendezvous]") {
  TemporaryDirectory base;
  UniqueIdSource source;
  const auto outcomes = Meet(base.path() + "/job", 1, std::vector<RankPlan>(1), milliseconds(60'000), source);
  REQUIRE(outcomes[0].ok());
  CHECK(outcomes[0]->recover);
  CHECK(source.calls.load() == 1);
}

TEST_CASE("one rank that cannot recover makes every rank fall back at once, naming it and why",
          "[rendezvous]") {
  const int not_ready = GENERATE(2, 0);
  TemporaryDirectory base;
  UniqueIdSource source;
  std::vector<RankPlan> plans(4);
  plans[static_cast<std::size_t>(not_ready)] = RankPlan{.ready = false, .not_ready_reason = kInPlaceReason};
  const auto start = std::chrono::steady_clock::now();
  const auto outcomes = Meet(base.path() + "/job", 1, plans, milliseconds(120'000), source);
  // Nobody waited for the deadline (two minutes): a bound no busy machine reaches.
  CHECK(SecondsSince(start) < 60);
  CHECK(source.calls.load() == 0);
  CheckAllFellBack(outcomes, plans, {"rank " + std::to_string(not_ready), kInPlaceReason});
  CheckOneDecision(outcomes, plans);
  const nlohmann::json decision = ReadJson(MeetingDirectory(base.path() + "/job", 1) + "/decision.json");
  CHECK(decision.at("decision") == "fallback");
  CHECK_FALSE(decision.contains("unique_id"));
}

TEST_CASE("a rank that never comes makes the others fall back by the deadline, naming it", "[rendezvous]") {
  const int absent = GENERATE(3, 0);
  TemporaryDirectory base;
  UniqueIdSource source;
  std::vector<RankPlan> plans(4);
  plans[static_cast<std::size_t>(absent)].present = false;
  const auto start = std::chrono::steady_clock::now();
  const auto outcomes = Meet(base.path() + "/job", 1, plans, milliseconds(1'500), source);
  CHECK(SecondsSince(start) >= 1.4);
  CHECK(source.calls.load() == 0);
  CheckAllFellBack(outcomes, plans,
                   {"no decision within 1500 ms", "rank " + std::to_string(absent) + " did not vote"});
  // Several ranks gave up at about the same time; the first to publish decided for all.
  CheckOneDecision(outcomes, plans);
}

TEST_CASE("several missing ranks are all named", "[rendezvous]") {
  TemporaryDirectory base;
  UniqueIdSource source;
  std::vector<RankPlan> plans(6);
  plans[1].present = plans[4].present = plans[5].present = false;
  const auto outcomes = Meet(base.path() + "/job", 1, plans, milliseconds(1'000), source);
  CheckAllFellBack(outcomes, plans, {"ranks 1, 4 and 5 did not vote"});
}

TEST_CASE("rank 0 failing to make the unique id makes every rank fall back with its message",
          "[rendezvous]") {
  TemporaryDirectory base;
  UniqueIdSource source;
  source.failure = absl::InternalError("ncclGetUniqueId: no usable network interface");
  const std::vector<RankPlan> plans(4);
  const auto outcomes = Meet(base.path() + "/job", 1, plans, milliseconds(60'000), source);
  CHECK(source.calls.load() == 1);
  CheckAllFellBack(outcomes, plans,
                   {"rank 0 could not make", "ncclGetUniqueId: no usable network interface"});
}

TEST_CASE("a rank 0 given no way to make a unique id falls back with the others", "[rendezvous]") {
  TemporaryDirectory base;
  const std::string job_dir = base.path() + "/job";
  std::vector<absl::StatusOr<RendezvousOutcome>> outcomes(2, absl::UnknownError("not run"));
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      outcomes[static_cast<std::size_t>(rank)] =
          MeetToRecover(Request(job_dir, 1, 2, rank, {}, milliseconds(60'000)), UniqueIdMaker{});
    });
  }
  for (std::thread& rank : ranks) rank.join();
  CheckAllFellBack(outcomes, std::vector<RankPlan>(2), {"rank 0 could not make"});
}

TEST_CASE("each epoch meets apart: a later recovery never reads an earlier decision", "[rendezvous]") {
  TemporaryDirectory base;
  const std::string job_dir = base.path() + "/job";
  UniqueIdSource source;
  std::vector<RankPlan> first(3);
  first[1] = RankPlan{.ready = false, .not_ready_reason = kInPlaceReason};
  CheckAllFellBack(Meet(job_dir, 1, first, milliseconds(60'000), source), first, {"rank 1", kInPlaceReason});

  const auto second = Meet(job_dir, 2, std::vector<RankPlan>(3), milliseconds(60'000), source);
  for (const auto& outcome : second) {
    REQUIRE(outcome.ok());
    INFO(outcome->reason);
    CHECK(outcome->recover);
  }
  CHECK(source.calls.load() == 1);
  // The first epoch's files stay, as the record of what was decided then.
  CHECK(ReadJson(MeetingDirectory(job_dir, 1) + "/decision.json").at("decision") == "fallback");
  CHECK(ReadJson(MeetingDirectory(job_dir, 2) + "/decision.json").at("decision") == "recover");
}

std::string DecisionText(const std::string& comm, int epoch) {
  return nlohmann::json{{"format", "ncclguard-recovery-decision"},
                        {"format_version", kRendezvousFormatVersion},
                        {"comm", comm},
                        {"epoch", epoch},
                        {"decision", "recover"},
                        {"unique_id", std::string(256, 'a')},
                        {"reason", "planted"}}
      .dump();
}

// Puts something that is not this meeting's at `name` in the meeting's directory; the kinds of
// thing a stranger, a crash or another program can leave there.
void Plant(const std::string& directory, const std::string& name, const std::string& kind,
           const std::string& elsewhere) {
  fs::create_directories(directory);
  const std::string path = directory + "/" + name;
  if (kind == "fifo") {
    REQUIRE(mkfifo(path.c_str(), 0600) == 0);
  } else if (kind == "symlink") {
    WriteText(elsewhere, DecisionText(kComm, 1));
    fs::create_symlink(elsewhere, path);
  } else if (kind == "huge") {
    WriteText(path, "{");
    fs::resize_file(path, std::uintmax_t{1} << 30);  // sparse: costs no disk
  } else if (kind == "garbage") {
    WriteText(path, "{\"format\": \"ncclguard-recovery-decision\", \"comm\": [[[[");
  } else if (kind == "another communicator's") {
    WriteText(path, DecisionText("0123456789abcdef", 1));
  } else if (kind == "a bad unique id") {
    std::string text = DecisionText(kComm, 1);
    text.replace(text.find("aaaa"), 4, "zzzz");
    WriteText(path, text);
  }
}

TEST_CASE("a decision file that is not a decision makes every rank fall back, without hanging",
          "[rendezvous]") {
  const std::string kind = GENERATE(as<std::string>{}, "fifo", "symlink", "huge", "garbage",
                                    "another communicator's", "a bad unique id");
  INFO(kind);
  TemporaryDirectory base;
  const std::string job_dir = base.path() + "/job";
  Plant(MeetingDirectory(job_dir, 1), "decision.json", kind, base.path() + "/elsewhere.json");
  UniqueIdSource source;
  const std::vector<RankPlan> plans(4);
  const auto outcomes = Meet(job_dir, 1, plans, milliseconds(3'000), source);
  CHECK(source.calls.load() == 0);
  CheckAllFellBack(outcomes, plans, {"decision.json is not a decision"});
  CheckOneDecision(outcomes, plans);
}

TEST_CASE("a vote file that is not a vote makes every rank fall back, without hanging", "[rendezvous]") {
  const std::string kind =
      GENERATE(as<std::string>{}, "fifo", "symlink", "huge", "garbage", "another rank's");
  INFO(kind);
  TemporaryDirectory base;
  const std::string job_dir = base.path() + "/job";
  const std::string directory = MeetingDirectory(job_dir, 1);
  if (kind == "another rank's") {
    fs::create_directories(directory);
    WriteText(directory + "/vote-3.json", nlohmann::json{{"format", "ncclguard-recovery-vote"},
                                                         {"format_version", kRendezvousFormatVersion},
                                                         {"comm", kComm},
                                                         {"epoch", 1},
                                                         {"rank", 1},
                                                         {"pid", 1},
                                                         {"host", "node"},
                                                         {"ready", true},
                                                         {"reason", ""}}
                                              .dump());
  } else {
    Plant(directory, "vote-3.json", kind, base.path() + "/elsewhere.json");
  }
  UniqueIdSource source;
  std::vector<RankPlan> plans(4);
  plans[3].present = false;  // its place is taken by the planted file
  const auto start = std::chrono::steady_clock::now();
  const auto outcomes = Meet(job_dir, 1, plans, milliseconds(120'000), source);
  // Seen as a problem, not waited out.
  CHECK(SecondsSince(start) < 60);
  CHECK(source.calls.load() == 0);
  CheckAllFellBack(outcomes, plans, {"the vote of rank 3", "vote-3.json"});
  CheckOneDecision(outcomes, plans);
}

TEST_CASE("a meeting directory that is a symbolic link is not met in", "[rendezvous]") {
  TemporaryDirectory base;
  const std::string job_dir = base.path() + "/job";
  fs::create_directories(job_dir + "/recovery/" + kComm);
  fs::create_directories(base.path() + "/elsewhere");
  fs::create_directory_symlink(base.path() + "/elsewhere", MeetingDirectory(job_dir, 1));
  UniqueIdSource source;
  const std::vector<RankPlan> plans(2);
  const auto outcomes = Meet(job_dir, 1, plans, milliseconds(3'000), source);
  CHECK(source.calls.load() == 0);
  CheckAllFellBack(outcomes, plans, {"could not write its vote", "symbolic link"});
  CHECK(fs::is_empty(base.path() + "/elsewhere"));
}

TEST_CASE("an invalid request is refused before any file is written", "[rendezvous]") {
  TemporaryDirectory base;
  const std::string job_dir = base.path() + "/job";
  RendezvousRequest request = Request(job_dir, 1, 4, 1, {}, milliseconds(1'000));
  SECTION("a relative job directory") { request.board = testing::DirectoryBoard("job"); }
  SECTION("no board") { request.board = nullptr; }
  SECTION("a communicator id that is not one") { request.comm_id = "../../etc"; }
  SECTION("an upper-case communicator id") { request.comm_id = "93996A01F150309A"; }
  SECTION("epoch 0") { request.epoch = 0; }
  SECTION("no ranks") { request.nranks = 0; }
  SECTION("a rank beyond the communicator") { request.rank = 4; }
  SECTION("another local rank beyond the communicator") { request.other_local_ranks = {2, 4}; }
  SECTION("a local rank named twice") { request.other_local_ranks = {2, 1}; }
  SECTION("a negative timeout") { request.timeout = milliseconds(-1); }
  const absl::StatusOr<RendezvousOutcome> outcome = MeetToRecover(request, UniqueIdMaker{});
  CHECK(absl::IsInvalidArgument(outcome.status()));
  CHECK_FALSE(fs::exists(job_dir));
}

TEST_CASE("a file published once has exactly one writer among many", "[rendezvous][files]") {
  TemporaryDirectory base;
  const std::string directory = base.path() + "/job";
  constexpr int kWriters = 8;
  std::vector<absl::Status> results(kWriters);
  std::vector<std::thread> writers;
  for (int writer = 0; writer < kWriters; ++writer) {
    writers.emplace_back([&, writer] {
      // Unavailable: more file operations at once than the process runs; a caller tries again.
      absl::Status& result = results[static_cast<std::size_t>(writer)];
      do {
        result = PublishFileOnce(directory, "decision.json", "writer " + std::to_string(writer), 0,
                                 milliseconds(30'000));
      } while (absl::IsUnavailable(result));
    });
  }
  for (std::thread& writer : writers) writer.join();
  int winner = -1;
  for (int writer = 0; writer < kWriters; ++writer) {
    const absl::Status& result = results[static_cast<std::size_t>(writer)];
    INFO(result.ToString());
    if (result.ok()) {
      CHECK(winner == -1);
      winner = writer;
    } else {
      CHECK(absl::IsAlreadyExists(result));
    }
  }
  REQUIRE(winner >= 0);
  CHECK(testing::ReadFile(directory + "/decision.json") == "writer " + std::to_string(winner));
  for (const auto& entry : fs::directory_iterator(directory))
    CHECK(entry.path().filename() == "decision.json");
}

}  // namespace
}  // namespace ncclguard
