// End-to-end tests of examples/train_loop: real rank processes, run through the launcher the way
// a user runs them. Tagged [emulator] (LD_LIBRARY_PATH names the emulator's libraries) or
// [real-nccl] (the toolkit's libnccl with the driver stub, on a machine without a GPU).
#include <catch2/catch.hpp>
#include <nccl.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

namespace {

struct Run {
  int wait_status = -1;
  std::string output;
  double seconds = 0;

  bool exited_with(int code) const { return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == code; }
  bool contains(const std::string& text) const { return output.find(text) != std::string::npos; }
};

// Starts `train_loop arguments` with `environment` (VAR=value ...) added; stdout and stderr
// together. Every run that could hang passes --timeout, so reading to the end terminates.
class Process {
 public:
  Process(const std::string& arguments, const std::string& environment = "")
      : start_(std::chrono::steady_clock::now()) {
    const std::string command = "env " + environment + " " + TRAIN_LOOP_PATH + " " + arguments + " 2>&1";
    pipe_ = popen(command.c_str(), "r");
    REQUIRE(pipe_ != nullptr);
  }

  // Reads until `text` has appeared: the way to know the process has reached a given point.
  bool read_until(const std::string& text) {
    char line[4096];
    while (output_.find(text) == std::string::npos) {
      if (std::fgets(line, sizeof line, pipe_) == nullptr) return false;
      output_ += line;
    }
    return true;
  }

  Run finish() {
    Run run;
    run.output = output_;
    char buffer[4096];
    size_t length = 0;
    while ((length = std::fread(buffer, 1, sizeof buffer, pipe_)) > 0) run.output.append(buffer, length);
    run.wait_status = pclose(pipe_);
    run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    UNSCOPED_INFO("train_loop output:\n" << run.output);
    return run;
  }

 private:
  FILE* pipe_ = nullptr;
  std::string output_;
  std::chrono::steady_clock::time_point start_;
};

Run train_loop(const std::string& arguments, const std::string& environment = "") {
  return Process(arguments, environment).finish();
}

std::map<int, std::string> checksums(const Run& run) {
  std::map<int, std::string> by_rank;
  const std::regex line(R"(rank (\d+) checksum (0x[0-9a-f]{16}))");
  for (auto match = std::sregex_iterator(run.output.begin(), run.output.end(), line); match != std::sregex_iterator(); ++match) {
    by_rank[std::stoi((*match)[1])] = (*match)[2];
  }
  return by_rank;
}

// The job's arithmetic done on one host, without NCCL: what every rank must end with when the
// broadcast and every AllReduce delivered the exact sums.
std::string expected_checksum(int ranks, long steps, size_t count, size_t model_count) {
  std::vector<float> model(model_count);
  for (size_t index = 0; index < model_count; ++index) model[index] = static_cast<float>(static_cast<int>(index % 13) - 6) * 0.5f;
  std::vector<float> sums(count);
  for (long step = 1; step <= steps; ++step) {
    for (size_t index = 0; index < count; ++index) {
      long sum = 0;
      for (int rank = 0; rank < ranks; ++rank) {
        sum += (rank + 3 * step + static_cast<long>(index % 7)) % 7 - 3 + (model[index % model_count] >= 0 ? 1 : -1);
      }
      sums[index] = static_cast<float>(sum);
    }
    for (size_t index = 0; index < count; ++index) model[index % model_count] -= 0.0625f * (sums[index] / static_cast<float>(ranks));
  }
  uint64_t hash = 14695981039346656037ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(model.data());
  for (size_t index = 0; index < model.size() * sizeof(float); ++index) hash = (hash ^ bytes[index]) * 1099511628211ull;
  char text[19];
  std::snprintf(text, sizeof text, "0x%016llx", static_cast<unsigned long long>(hash));
  return text;
}

void require_every_rank_reports(const Run& run, int ranks, const std::string& checksum) {
  const auto by_rank = checksums(run);
  REQUIRE(by_rank.size() == static_cast<size_t>(ranks));
  for (const auto& [rank, value] : by_rank) {
    INFO("rank " << rank);
    CHECK(value == checksum);
  }
}

// A port nobody listens on right now, for NCCL_COMM_ID.
int free_tcp_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  socklen_t length = sizeof address;
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  close(fd);
  return ntohs(address.sin_port);
}

}  // namespace

TEST_CASE("4 ranks x 200 steps end with the exact model on every rank and every loader", "[emulator]") {
  const std::string expected = expected_checksum(4, 200, 1024, 1024);
  for (const char* loader : {"linked", "dlopen", "rtld-local"}) {
    INFO("loader " << loader);
    const Run run = train_loop(std::string("--ranks 4 --steps 200 --timeout 60 --nccl-loader ") + loader);
    REQUIRE(run.exited_with(0));
    CHECK(run.contains("train_loop: all 4 ranks finished"));
    for (int rank = 0; rank < 4; ++rank) CHECK(run.contains("rank " + std::to_string(rank) + "/4: device "));
    CHECK(run.contains(std::string("loader ") + loader));
    require_every_rank_reports(run, 4, expected);
    // "A few seconds" on an idle machine; the bound leaves room for a loaded two-core runner.
    CHECK(run.seconds < 30);
  }
}

TEST_CASE("each loader reaches NCCL the way it documents", "[emulator]") {
  const std::string preload = std::string("LD_PRELOAD=") + NCCL_PROBE_PATH;
  const std::string arguments = "--ranks 2 --steps 3 --timeout 60 --nccl-loader ";
  const std::string expected = expected_checksum(2, 3, 1024, 1024);

  // Linked: the preloaded definition is called, and the real one is next in the global scope.
  Run run = train_loop(arguments + "linked", preload);
  REQUIRE(run.exited_with(0));
  CHECK(run.contains("probe: ncclAllReduce intercepted; RTLD_NEXT finds libnccl"));
  require_every_rank_reports(run, 2, expected);

  // RTLD_LOCAL module: the preloaded definition is called, but libnccl is not in the global scope.
  run = train_loop(arguments + "rtld-local", preload);
  REQUIRE(run.exited_with(0));
  CHECK(run.contains("probe: ncclAllReduce intercepted; RTLD_NEXT does not find libnccl"));
  require_every_rank_reports(run, 2, expected);

  // dlopen + dlsym on the handle: the preloaded definition is never called.
  run = train_loop(arguments + "dlopen", preload);
  REQUIRE(run.exited_with(0));
  CHECK_FALSE(run.contains("probe:"));
  require_every_rank_reports(run, 2, expected);
}

TEST_CASE("the model broadcast and uneven sizes reach every rank", "[emulator]") {
  const Run run = train_loop("--ranks 3 --steps 7 --count 300 --model-count 77 --timeout 60 --nccl-loader dlopen");
  REQUIRE(run.exited_with(0));
  require_every_rank_reports(run, 3, expected_checksum(3, 7, 300, 77));
}

TEST_CASE("forked data loader workers come and go without disturbing the job", "[emulator]") {
  const Run run = train_loop("--ranks 2 --steps 20 --workers 2 --timeout 60");
  REQUIRE(run.exited_with(0));
  CHECK(run.contains("rank 0: 2 data loader workers finished"));
  CHECK(run.contains("rank 1: 2 data loader workers finished"));
  require_every_rank_reports(run, 2, expected_checksum(2, 20, 1024, 1024));
}

TEST_CASE("a rank that stops early leaves the others waiting in the next collective", "[emulator]") {
  const Run run = train_loop("--ranks 4 --steps 50 --stop-early 2:10 --timeout 8 --nccl-loader linked");
  CHECK(run.exited_with(1));
  CHECK(run.contains("rank 2: stopping early after step 10 (--stop-early), exit code 0"));
  CHECK(run.contains("train_loop: rank 2 exited 0"));
  for (int rank : {0, 1, 3}) CHECK(run.contains("train_loop: rank " + std::to_string(rank) + " did not finish within 8 s"));
  CHECK(run.contains("ranks failed: none; ranks not finished: 0,1,3"));
  CHECK(checksums(run).empty());
}

TEST_CASE("a rank that dies is reported as failed and the job does not finish", "[emulator]") {
  const Run run = train_loop("--ranks 4 --steps 50 --exit 1:5 --timeout 8 --nccl-loader dlopen");
  CHECK(run.exited_with(1));
  CHECK(run.contains("rank 1: exiting with code 3 after step 5 (--exit)"));
  CHECK(run.contains("train_loop: rank 1 failed: exit code 3"));
  CHECK(run.contains("train_loop: job failed: ranks failed: 1"));
  CHECK(checksums(run).empty());
}

TEST_CASE("a rank that sleeps after a step delays the job, which then completes exactly", "[emulator]") {
  const Run run = train_loop("--ranks 2 --steps 20 --sleep 1:10:2 --timeout 60 --nccl-loader rtld-local");
  REQUIRE(run.exited_with(0));
  CHECK(run.contains("rank 1: saving a checkpoint for 2 s after step 10 (--sleep)"));
  CHECK(run.seconds >= 2.0);
  require_every_rank_reports(run, 2, expected_checksum(2, 20, 1024, 1024));
}

TEST_CASE("a rank slow for a range of steps only is slow there, and the job completes exactly",
          "[emulator]") {
  const Run run = train_loop("--ranks 2 --steps 8 --slow 1:20:3-5 --verbose --timeout 60");
  REQUIRE(run.exited_with(0));
  for (long step = 1; step <= 8; ++step) {
    INFO("step " << step);
    CHECK(run.contains("rank 1: step " + std::to_string(step) + ": 20 ms longer (--slow)") ==
          (step >= 3 && step <= 5));
    CHECK_FALSE(run.contains("rank 0: step " + std::to_string(step) + ": 20 ms longer"));
  }
  require_every_rank_reports(run, 2, expected_checksum(2, 8, 1024, 1024));
  // Without a range, every step.
  const Run always = train_loop("--ranks 2 --steps 3 --slow 0:1 --verbose --timeout 60");
  REQUIRE(always.exited_with(0));
  for (const char* step : {"1", "2", "3"})
    CHECK(always.contains(std::string("rank 0: step ") + step + ": 1 ms longer (--slow)"));
}

TEST_CASE("a rank that issues a different element count makes the job fail or hang", "[emulator]") {
  const Run run = train_loop("--ranks 2 --steps 20 --desync 1:5 --timeout 8");
  CHECK(run.exited_with(1));
  CHECK(run.contains("train_loop: job failed:"));
  // NCCL does not compare counts across ranks: one rank may even finish, with wrong data.
  CHECK(checksums(run).size() < 2);
  CHECK(checksums(run) != std::map<int, std::string>{{0, expected_checksum(2, 20, 1024, 1024)}});
}

TEST_CASE("ranks started by another launcher meet through the rendezvous file", "[emulator]") {
  char directory_template[] = "/tmp/train_loop_test.XXXXXX";
  REQUIRE(mkdtemp(directory_template) != nullptr);
  const std::string file = std::string(directory_template) + "/unique_id";
  // Rank 1 first, up to the point where it looks for the file: it must wait for rank 0's file.
  Process rank1("--steps 30 --rendezvous " + file + " --rendezvous-timeout 30", "RANK=1 WORLD_SIZE=2 LOCAL_RANK=1");
  REQUIRE(rank1.read_until("rank 1/2: device "));
  Process rank0("--steps 30 --rendezvous " + file + " --rendezvous-timeout 30", "RANK=0 WORLD_SIZE=2 LOCAL_RANK=0");
  const Run run0 = rank0.finish();
  const Run run1 = rank1.finish();
  CHECK(run0.exited_with(0));
  CHECK(run1.exited_with(0));
  const std::string expected = expected_checksum(2, 30, 1024, 1024);
  CHECK(checksums(run0) == std::map<int, std::string>{{0, expected}});
  CHECK(checksums(run1) == std::map<int, std::string>{{1, expected}});
  CHECK_FALSE(std::filesystem::exists(file));  // rank 0 removed it once every rank had joined
  std::filesystem::remove_all(directory_template);
}

TEST_CASE("with NCCL_COMM_ID every rank makes the unique id itself", "[emulator]") {
  const Run run = train_loop("--ranks 3 --steps 30 --timeout 60", "NCCL_COMM_ID=127.0.0.1:" + std::to_string(free_tcp_port()));
  REQUIRE(run.exited_with(0));
  require_every_rank_reports(run, 3, expected_checksum(3, 30, 1024, 1024));
}

TEST_CASE("a rank whose rendezvous file never appears gives up with a clear message", "[emulator]") {
  const Run run = train_loop("--rendezvous /nonexistent/train_loop/unique_id --rendezvous-timeout 0.3", "RANK=1 WORLD_SIZE=2");
  CHECK(run.exited_with(1));
  CHECK(run.contains("rank 1: no NCCL unique id in /nonexistent/train_loop/unique_id after"));
}

TEST_CASE("bad command lines are refused with the reason", "[emulator]") {
  Run run = train_loop("--stop-early 1");
  CHECK(run.exited_with(2));
  CHECK(run.contains("--stop-early expects RANK:STEP, got '1'"));
  run = train_loop("--ranks 2 --exit 2:1");
  CHECK(run.exited_with(2));
  CHECK(run.contains("--exit names rank 2 but the job has 2 ranks"));
  run = train_loop("--slow 1:20:5");
  CHECK(run.exited_with(2));
  CHECK(run.contains("--slow expects RANK:MILLISECONDS[:FIRST-LAST], got '1:20:5'"));
  run = train_loop("--slow 1:20:5-4");
  CHECK(run.exited_with(2));
  CHECK(run.contains("--slow last step expects an integer >= 5, got '4'"));
  run = train_loop("--steps 10 --slow 1:20:5-11");
  CHECK(run.exited_with(2));
  CHECK(run.contains("--slow last step must be at most --steps (10)"));
  run = train_loop("--nccl-loader static");
  CHECK(run.exited_with(2));
  CHECK(run.contains("--nccl-loader expects linked, dlopen or rtld-local, got 'static'"));
}

TEST_CASE("with the real NCCL and no GPU every loader fails cleanly with the CUDA error", "[real-nccl]") {
  const std::string version = std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." + std::to_string(NCCL_PATCH);
  for (const char* loader : {"linked", "dlopen", "rtld-local"}) {
    INFO("loader " << loader);
    const Run run = train_loop(std::string("--ranks 2 --verbose --timeout 60 --nccl-loader ") + loader,
                               std::string("LD_LIBRARY_PATH=") + REAL_NCCL_LIBRARY_PATH);
    CHECK(run.exited_with(1));
    for (const std::string rank : {"0", "1"}) {
      CHECK(run.contains("rank " + rank + ": NCCL " + version + " loaded (" + loader + ")"));
      CHECK(run.contains("rank " + rank + ": cuInit failed: "));
      CHECK(run.contains("train_loop: rank " + rank + " failed: exit code 1"));
    }
    CHECK_FALSE(run.contains("signal"));
  }
}
