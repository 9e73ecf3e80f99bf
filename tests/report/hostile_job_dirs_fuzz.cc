// 520 generated hostile job directories (seeded, the same on every run), each an honest two-rank
// job damaged one to three ways: FIFOs, devices, symbolic links, truncated and corrupt files,
// huge claimed counts, deep nesting, big files, wrong types, foreign formats. Each is read and
// classified in this process as the watchdog does and analysed by the `ncclguard` command: no
// crash, no hang past the read deadline, and memory within ten times what the largest honest job
// directory takes.
#include <fcntl.h>
#include <malloc.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <new>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "tests/support/process.h"
#include "tests/report/honest_job.h"
#include "watchdog/common/config.h"
#include "watchdog/report/dump.h"
#include "watchdog/report/dump_reader.h"
#include "watchdog/report/job_dir.h"
#include "watchdog/diagnose/verdicts.h"

// ---------------------------------------------------------------------------------------------
// Heap accounting: the peak of live bytes, over every thread, while one directory is analysed.

namespace {
std::atomic<std::int64_t> g_live_bytes{0};
std::atomic<std::int64_t> g_peak_bytes{0};

void* Allocate(std::size_t size) noexcept {
  void* memory = std::malloc(size == 0 ? 1 : size);
  if (memory == nullptr) return nullptr;
  const std::int64_t live = g_live_bytes.fetch_add(static_cast<std::int64_t>(malloc_usable_size(memory))) +
                            static_cast<std::int64_t>(malloc_usable_size(memory));
  std::int64_t peak = g_peak_bytes.load(std::memory_order_relaxed);
  while (live > peak && !g_peak_bytes.compare_exchange_weak(peak, live)) {
  }
  return memory;
}

void Release(void* memory) noexcept {
  if (memory == nullptr) return;
  g_live_bytes.fetch_sub(static_cast<std::int64_t>(malloc_usable_size(memory)));
  std::free(memory);
}
}  // namespace

void* operator new(std::size_t size) {
  if (void* memory = Allocate(size)) return memory;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) {
  if (void* memory = Allocate(size)) return memory;
  throw std::bad_alloc();
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept { return Allocate(size); }
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept { return Allocate(size); }
void operator delete(void* memory) noexcept { Release(memory); }
void operator delete[](void* memory) noexcept { Release(memory); }
void operator delete(void* memory, std::size_t) noexcept { Release(memory); }
void operator delete[](void* memory, std::size_t) noexcept { Release(memory); }

namespace ncclguard {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testing::HonestFacts;
using testing::HonestSnapshot;
using testing::kHonestNow;
using testing::TemporaryDirectory;

constexpr int kDirectories = 520;
constexpr std::uint32_t kSeed = 0x5eed1423;
// Past the read deadline, the reader has given up: more than that is a hang.
constexpr double kHangSeconds = std::chrono::duration<double>(kReadDeadline).count() + 20;

using Rng = std::mt19937;

std::size_t Pick(Rng& rng, std::size_t n) { return rng() % n; }

// "" for a file over 16 MiB: a sparse planted one would cost this process its claimed size, and
// every command it starts would count that in its peak (a fork's image before exec).
std::string ReadAll(const std::string& path) {
  std::error_code unknown_size;
  if (fs::file_size(path, unknown_size) > (16u << 20) || unknown_size) return "";
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteAll(const std::string& path, const std::string& content) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
}

// Regular files of the job directory (not the requests), by name.
std::vector<std::string> JobFiles(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ignored;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file(ignored) && !entry.is_symlink(ignored)) names.push_back(entry.path().filename());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string PlantedName(Rng& rng) {
  const std::string kind = Pick(rng, 2) == 0 ? "dump-planted-" : "status-planted-";
  return absl::StrCat(kind, rng() % 1000, "-0-1.json");
}

// Every value of a document, for mutating one at random.
void CollectValues(Json& value, std::vector<Json*>& values) {
  values.push_back(&value);
  if (value.is_structured()) {
    for (Json& child : value) CollectValues(child, values);
  }
}

Json HostileNumber(Rng& rng) {
  switch (Pick(rng, 9)) {
    case 0: return 100'000'000;
    case 1: return -1;
    case 2: return std::numeric_limits<std::int32_t>::max();
    case 3: return std::numeric_limits<std::int32_t>::min();
    case 4: return std::numeric_limits<std::uint64_t>::max();
    case 5: return std::numeric_limits<std::int64_t>::min();
    case 6: return 1e300;
    case 7: return 131072;
    default: return 0;
  }
}

Json HostileValue(Rng& rng) {
  switch (Pick(rng, 8)) {
    case 0: return nullptr;
    case 1: return "a string";
    case 2: return Json::array({1, 2, 3});
    case 3: return Json::object({{"x", 1}});
    case 4: return true;
    case 5: return std::string(100'000, 'x');
    case 6: return -0.5;
    default: return HostileNumber(rng);
  }
}

// Edits one JSON file of the directory; false when none parses any more.
bool EditJson(Rng& rng, const std::string& dir, const std::function<void(Rng&, Json&)>& edit) {
  const std::vector<std::string> files = JobFiles(dir);
  if (files.empty()) return false;
  const std::string path = dir + "/" + files[Pick(rng, files.size())];
  Json document;
  try {
    document = ParseBoundedJson(ReadAll(path));  // a planted deep one would overflow the stack here
  } catch (const std::exception&) {
    return false;
  }
  edit(rng, document);
  WriteAll(path, document.dump());
  return true;
}

std::string Nested(Rng& rng) {
  const std::size_t depth = 33 + Pick(rng, 200'000);
  if (Pick(rng, 2) == 0) return std::string(depth, '[') + std::string(depth, ']');
  std::string text;
  for (std::size_t i = 0; i < depth; ++i) text += "{\"a\":";
  text += "1";
  text += std::string(depth, '}');
  return text;
}

std::string Repeated(const std::string& open, const std::string& item, const std::string& close, std::size_t bytes) {
  std::string text = open;
  while (text.size() + item.size() + close.size() < bytes) text += item;
  if (!item.empty() && text.back() == ',') text.pop_back();
  return text + close;
}

std::string ForeignFormat(Rng& rng) {
  switch (Pick(rng, 12)) {
    case 0: return std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16);
    case 1: return "";
    case 2: return "null";
    case 3: return "[]";
    case 4: return "{}";
    case 5: return std::string("\xff\xfe{\0\"\0f\0", 8);
    case 6: return R"({"format": "ncclguard-dump", "format_version": 999})";
    case 7: return R"({"format": "ncclguard-status", "format_version": 1, "host": 7, "pid": "x"})";
    case 8: return R"({"format": "ncclguard-known-bad", "format_version": 1, "entries": []})";
    case 9: return R"({"format": "ncclguard-p2p-verdict", "format_version": 1})";
    case 10: {
      std::string binary(4096, '\0');
      for (char& c : binary) c = static_cast<char>(rng());
      return binary;
    }
    default: return "{\"format\": \"ncclguard-status\", \"format_version\": 1, \"communicators\": " +
                    Repeated("[", R"({"id":"a","rank":0,"nranks":131072,"state":"ready"},)", "]", 64 << 10) + "}";
  }
}

// One way to damage a job directory; returns its name.
std::string Damage(Rng& rng, const std::string& dir) {
  std::error_code ignored;  // a damage that cannot be done leaves the directory as it was
  const std::vector<std::string> files = JobFiles(dir);
  const std::string some_file = files.empty() ? PlantedName(rng) : files[Pick(rng, files.size())];
  const std::size_t kind = Pick(rng, 14);
  const char* const kNames[] = {"fifo",         "generation-fifo", "symlink",       "truncated",   "flipped-bytes",
                                "hostile-number", "wrong-type",     "deep-nesting",  "sparse-big",  "costly-values",
                                "foreign-format", "directory-or-device", "many-large-communicators", "empty"};
  switch (kind) {
    case 0:  // a FIFO where a file is read
      fs::remove(dir + "/" + some_file, ignored);
      mkfifo((dir + "/" + (Pick(rng, 2) == 0 ? some_file : PlantedName(rng))).c_str(), 0600);
      break;
    case 1:  // the requests' generation file as a FIFO
      fs::remove(dir + "/dump-requests/generation", ignored);
      mkfifo((dir + "/dump-requests/generation").c_str(), 0600);
      break;
    case 2: {  // a symbolic link to a device, a file elsewhere, the directory, nowhere
      const char* targets[] = {"/dev/zero", "/dev/urandom", "/etc/passwd", ".", "/nonexistent", "/proc/self/mem"};
      fs::remove(dir + "/" + some_file, ignored);
      fs::create_symlink(targets[Pick(rng, std::size(targets))], dir + "/" + some_file, ignored);
      break;
    }
    case 3:  // cut off by a crash
      if (!files.empty()) {
        const std::uintmax_t size = fs::file_size(dir + "/" + some_file, ignored);
        fs::resize_file(dir + "/" + some_file, size == static_cast<std::uintmax_t>(-1) ? 0 : Pick(rng, size + 1), ignored);
      }
      break;
    case 4: {  // bytes flipped
      std::string content = ReadAll(dir + "/" + some_file);
      for (int flips = 1 + static_cast<int>(Pick(rng, 8)); flips > 0 && !content.empty(); --flips) {
        content[Pick(rng, content.size())] = static_cast<char>(rng());
      }
      WriteAll(dir + "/" + some_file, content);
      break;
    }
    case 5:  // a huge or negative count anywhere, nranks and ranks included
      EditJson(rng, dir, [](Rng& rng, Json& document) {
        std::vector<Json*> values;
        CollectValues(document, values);
        std::vector<Json*> numbers;
        for (Json* value : values) {
          if (value->is_number()) numbers.push_back(value);
        }
        if (!numbers.empty()) *numbers[Pick(rng, numbers.size())] = HostileNumber(rng);
      });
      break;
    case 6:  // a value of the wrong type
      EditJson(rng, dir, [](Rng& rng, Json& document) {
        std::vector<Json*> values;
        CollectValues(document, values);
        *values[Pick(rng, values.size())] = HostileValue(rng);
      });
      break;
    case 7:  // deep nesting
      WriteAll(dir + "/" + PlantedName(rng), Nested(rng));
      break;
    case 8: {  // a big file, sparse: claimed by its size
      const int fd = open((dir + "/" + PlantedName(rng)).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd >= 0) {
        if (ftruncate(fd, static_cast<off_t>((1 + Pick(rng, 1024)) << 20)) != 0) {
        }
        close(fd);
      }
      break;
    }
    case 9: {  // a big file just under the caps, of values that cost the most memory
      const std::size_t bytes = (Pick(rng, 2) == 0 ? 1 : 3) << 20;
      const char* items[] = {"{},", "[],", "0,", "\"\","};
      WriteAll(dir + "/" + PlantedName(rng), Repeated("[", items[Pick(rng, std::size(items))], "]", bytes - 16));
      break;
    }
    case 10:  // a foreign format under a name that is read
      WriteAll(dir + "/" + PlantedName(rng), ForeignFormat(rng));
      break;
    case 11:  // a directory or a device under a name that is read
      if (Pick(rng, 2) == 0 || mknod((dir + "/" + PlantedName(rng)).c_str(), S_IFCHR | 0600, makedev(1, 5)) != 0) {
        fs::create_directory(dir + "/" + PlantedName(rng), ignored);
      }
      break;
    case 12:  // many copies of one process's file, every one claiming the largest communicator
      for (int copy = 0; copy < 200; ++copy) {
        Json status;
        try {
          status = ParseBoundedJson(ReadAll(dir + "/status-node-a-101.json"));
        } catch (const std::exception&) {
          break;
        }
        if (!status.is_object()) break;
        status["pid"] = 1000 + copy;
        if (status.contains("communicators") && status["communicators"].is_array()) {
          for (Json& comm : status["communicators"]) {
            comm["id"] = absl::StrCat("ffff", copy);
            comm["nranks"] = 131072;
          }
        }
        WriteAll(absl::StrCat(dir, "/status-node-a-", 1000 + copy, ".json"), status.dump());
      }
      break;
    default:  // an empty file
      WriteAll(dir + "/" + some_file, "");
      break;
  }
  return absl::StrCat(kNames[kind], " ", some_file);
}

// The honest job the hostile ones start from: rank 0 dumped and keeps a status, rank 1 stalled.
void WriteTemplateJob(const std::string& dir) {
  ProcessSnapshot rank0 = HonestSnapshot(0, 2, 1, 8);
  rank0.pending_inits.push_back(PendingInitSnapshot{
      .comm_id = "00000000000000bb", .api = "ncclCommInitRank", .rank = 0, .nranks = 2, .start_ns = kHonestNow - 1, .result = ""});
  REQUIRE(WriteDump(dir, rank0, HonestFacts("node-a", 100)).ok());
  REQUIRE(WriteStatus(dir, rank0, HonestFacts("node-a", 100)).ok());
  ProcessSnapshot rank1 = HonestSnapshot(1, 2, 1, 8);
  rank1.stall = StallSnapshot{.kind = "not_completed", .comm_id = rank1.comms[0].id, .seq = rank1.comms[0].last_enqueued,
                              .seconds = 30, .message = "stalled", .verdict = "", .verdict_message = ""};
  REQUIRE(WriteStatus(dir, rank1, HonestFacts("node-a", 101)).ok());
  REQUIRE(RequestDumps(dir, "stall").ok());
}

struct Cost {
  double seconds = 0;
  std::int64_t peak_bytes = 0;
};

// What the watchdog does at a stall, and `ncclguard analyze --json` in this process.
Cost AnalyseInProcess(const std::string& dir) {
  const auto start = std::chrono::steady_clock::now();
  const std::int64_t before = g_live_bytes.load();
  g_peak_bytes.store(before);
  {
    absl::StatusOr<JobView> job = ReadJobDirectory(dir, kHonestNow, 2);
    if (job.ok()) {
      const std::vector<Verdict> verdicts = Classify(*job, ProcessKnownBad().entries);
      CHECK_FALSE(verdicts.empty());
      CHECK_FALSE(VerdictsToJson(*job, verdicts).dump(-1, ' ', false, Json::error_handler_t::replace).empty());
    }
    DumpRequestWatcher watcher(dir, "node-b", 7, 0);
    (void)watcher.Poll();
  }
  return Cost{std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
              g_peak_bytes.load() - before};
}

long ChildrenPeakRssKiB() {
  rusage usage {};
  getrusage(RUSAGE_CHILDREN, &usage);
  return usage.ru_maxrss;
}

testing::ProcessResult AnalyseWithCommand(const std::string& dir) {
  return testing::RunProcess({NCCLGUARD_COMMAND, "analyze", "--json", dir},
                             {.environment = {}, .timeout_seconds = kHangSeconds, .working_directory = ""});
}

TEST_CASE("520 hostile job directories: no crash, no hang, bounded memory", "[fuzz]") {
  TemporaryDirectory root;
  // The largest honest job: two processes, each dumping kMaxDumpedRings full default rings.
  const std::string honest = root.path() + "/honest";
  const long ring = Config{}.ring_size.value;
  for (int rank = 0; rank < 2; ++rank) {
    const ProcessSnapshot snapshot = HonestSnapshot(rank, 2, static_cast<int>(kMaxDumpedRings), static_cast<int>(ring));
    REQUIRE(WriteDump(honest, snapshot, HonestFacts("node-a", 100 + rank)).ok());
    REQUIRE(WriteStatus(honest, snapshot, HonestFacts("node-a", 100 + rank)).ok());
  }
  const absl::StatusOr<JobView> honest_job = ReadJobDirectory(honest, kHonestNow, 2);
  REQUIRE(honest_job.ok());
  REQUIRE(honest_job->problems.empty());
  REQUIRE(honest_job->processes.size() == 2);
  const Cost honest_cost = AnalyseInProcess(honest);
  REQUIRE(AnalyseWithCommand(honest).exit_code == 1);
  const long honest_rss_kib = ChildrenPeakRssKiB();
  INFO("honest job: " << honest_cost.peak_bytes << " bytes at peak, " << honest_rss_kib << " KiB RSS for the command");

  const std::string template_dir = root.path() + "/template";
  WriteTemplateJob(template_dir);
  std::int64_t worst_peak = 0;
  double slowest = 0;
  for (int index = 0; index < kDirectories; ++index) {
    Rng rng(kSeed + static_cast<std::uint32_t>(index));
    const std::string dir = absl::StrCat(root.path(), "/hostile-", index);
    fs::copy(template_dir, dir, fs::copy_options::recursive);
    std::string damages;
    for (int damage = 1 + static_cast<int>(Pick(rng, 3)); damage > 0; --damage) absl::StrAppend(&damages, Damage(rng, dir), "; ");
    INFO("hostile job directory #" << index << ": " << damages);

    const Cost cost = AnalyseInProcess(dir);
    CHECK(cost.seconds < kHangSeconds);
    CHECK(cost.peak_bytes <= 10 * honest_cost.peak_bytes);
    worst_peak = std::max(worst_peak, cost.peak_bytes);
    slowest = std::max(slowest, cost.seconds);

    const testing::ProcessResult analysed = AnalyseWithCommand(dir);
    CHECK_FALSE(analysed.timed_out);
    CHECK(analysed.signal == 0);
    CHECK((analysed.exit_code == 0 || analysed.exit_code == 1 || analysed.exit_code == 2));
    // The largest of every command run so far: the first directory past the bound is the culprit.
    CHECK(ChildrenPeakRssKiB() <= 10 * honest_rss_kib);
    fs::remove_all(dir);
  }
  WARN("honest peak " << honest_cost.peak_bytes << " B, worst hostile peak " << worst_peak << " B, slowest "
                      << slowest << " s; command RSS honest " << honest_rss_kib << " KiB, worst "
                      << ChildrenPeakRssKiB() << " KiB");
}

}  // namespace
}  // namespace ncclguard
