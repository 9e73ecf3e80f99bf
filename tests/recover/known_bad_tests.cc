// The known-bad data file: parsing (and its errors), matching against facts, the shipped file, and
// the facts it needs in a dump.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "watchdog/report/dump.h"
#include "watchdog/report/dump_reader.h"
#include "watchdog/diagnose/known_bad.h"

namespace ncclguard {
namespace {

// One document with the given entries (JSON text, comma-separated).
std::string Document(const std::string& entries) {
  return R"({"format": "ncclguard-known-bad", "format_version": 1, "entries": [)" + entries + "]}";
}

std::string Entry(const std::string& id, const std::string& match, const std::string& action = "warn") {
  return R"({"id": ")" + id + R"(", "match": )" + match + R"(, "action": ")" + action +
         R"(", "summary": "it breaks", "remedy": "set NCCL_P2P_DISABLE=1", "source": "https://example.org/report"})";
}

std::vector<KnownBadEntry> Parse(const std::string& content) {
  absl::StatusOr<std::vector<KnownBadEntry>> entries = ParseKnownBad(content, "test.json");
  INFO(entries.status().message());
  REQUIRE(entries.ok());
  return *std::move(entries);
}

std::string ParseError(const std::string& content) {
  const absl::StatusOr<std::vector<KnownBadEntry>> entries = ParseKnownBad(content, "test.json");
  REQUIRE_FALSE(entries.ok());
  return std::string(entries.status().message());
}

ProcessFacts Facts(const std::string& gpu_name, const std::string& driver) {
  ProcessFacts facts;
  facts.driver_version = driver;
  facts.kernel_release = "6.8.0-45-generic";
  facts.cuda.device_count = 2;
  facts.cuda.peer_access = {{0, 1}, {1, 0}};
  facts.cuda.gpus.push_back(GpuFacts{.device = 0, .name = gpu_name});
  return facts;
}

std::vector<std::string> MatchedIds(const std::vector<KnownBadEntry>& entries, const ProcessFacts& facts) {
  std::vector<std::string> ids;
  for (const KnownBadMatch& match : MatchKnownBad(entries, facts)) ids.push_back(match.entry->id);
  return ids;
}

TEST_CASE("a known-bad document parses into its entries", "[known_bad]") {
  const std::vector<KnownBadEntry> entries =
      Parse(Document(Entry("a", R"({"driver_versions": ["545.23.08", "545.29.02"], "p2p_enabled": true})") + "," +
                     Entry("b", R"({"gpu_name": "GeForce", "kernel_older_than": "5.5", "min_gpus": 2,
                                    "peer_access": false})",
                           "disable")));
  REQUIRE(entries.size() == 2);
  CHECK(entries[0].id == "a");
  CHECK(entries[0].action == KnownBadAction::kWarn);
  CHECK(entries[0].match.driver_versions == std::vector<std::string>{"545.23.08", "545.29.02"});
  CHECK(entries[0].match.p2p_enabled == true);
  CHECK(entries[0].summary == "it breaks");
  CHECK(entries[0].remedy == "set NCCL_P2P_DISABLE=1");
  CHECK(entries[0].source == "https://example.org/report");
  CHECK(entries[1].action == KnownBadAction::kDisable);
  CHECK(entries[1].match.gpu_name == "GeForce");
  CHECK(entries[1].match.kernel_older_than == std::vector<int>{5, 5});
  CHECK(entries[1].match.min_gpus == 2);
  CHECK(entries[1].match.peer_access == false);
  CHECK(Parse(Document("")).empty());
}

TEST_CASE("a bad known-bad document is refused with the file, the entry and what is wrong", "[known_bad]") {
  CHECK(absl::StartsWith(ParseError("{"), "test.json: not JSON"));
  CHECK(ParseError("[]") == "test.json: is not a JSON object");
  CHECK(ParseError(R"({"format": "other", "format_version": 1, "entries": []})") ==
        "test.json: \"format\" is \"other\", not \"ncclguard-known-bad\"");
  CHECK(ParseError(R"({"format": "ncclguard-known-bad", "format_version": 2, "entries": []})") ==
        "test.json: \"format_version\" is 2, not 1");
  CHECK(ParseError(R"({"format": "ncclguard-known-bad", "format_version": 1})") == "test.json: lacks \"entries\"");

  const std::string good = Entry("good", R"({"min_gpus": 2})");
  const auto second_entry_error = [&](const std::string& entry) { return ParseError(Document(good + "," + entry)); };
  CHECK(second_entry_error(Entry("x", R"({"min_gpu": 2})")) ==
        "test.json: entry 2 (\"x\"): unknown criterion \"min_gpu\" (known: driver_versions, gpu_name, "
        "kernel_older_than, min_gpus, p2p_enabled, peer_access)");
  CHECK(second_entry_error(Entry("x", "{}")) ==
        "test.json: entry 2 (\"x\"): \"match\" must be an object with at least one criterion");
  CHECK(second_entry_error(Entry("x", R"({"gpu_name": "RTX ("})")).starts_with(
      "test.json: entry 2 (\"x\"): \"gpu_name\" is not a regular expression: "));
  CHECK(second_entry_error(Entry("x", R"({"kernel_older_than": "5.5-rc1"})")) ==
        "test.json: entry 2 (\"x\"): \"kernel_older_than\" must be a release such as \"5.5\"");
  CHECK(second_entry_error(Entry("x", R"({"driver_versions": []})")) ==
        "test.json: entry 2 (\"x\"): \"driver_versions\" must be a non-empty array of strings");
  CHECK(second_entry_error(Entry("x", R"({"min_gpus": 0})")) ==
        "test.json: entry 2 (\"x\"): \"min_gpus\" must be an integer of at least 1");
  CHECK(second_entry_error(Entry("x", R"({"p2p_enabled": "yes"})")) ==
        "test.json: entry 2 (\"x\"): \"p2p_enabled\" must be true or false");
  CHECK(second_entry_error(Entry("x", R"({"min_gpus": 2})", "restart")) ==
        "test.json: entry 2 (\"x\"): \"action\" is \"restart\", not warn or disable");
  CHECK(second_entry_error(Entry("good", R"({"min_gpus": 2})")) ==
        "test.json: entry 2 (\"good\"): repeats an id used by an earlier entry");
  CHECK(second_entry_error(absl::StrReplaceAll(Entry("x", R"({"min_gpus": 2})"), {{R"("source")", R"("sauce")"}})) ==
        "test.json: entry 2 (\"x\"): unknown field \"sauce\"");
  CHECK(second_entry_error(absl::StrReplaceAll(Entry("x", R"({"min_gpus": 2})"), {{R"("remedy": "set NCCL_P2P_DISABLE=1")", R"("remedy": "")"}})) ==
        "test.json: entry 2 (\"x\"): \"remedy\" must be a non-empty string");
  CHECK(second_entry_error("7") == "test.json: entry 2: is not an object");
}

TEST_CASE("an entry matches when every criterion holds, and says which facts made it", "[known_bad]") {
  const std::vector<KnownBadEntry> entries =
      Parse(Document(Entry("driver", R"({"driver_versions": ["545.23.08"], "p2p_enabled": true})") + "," +
                     Entry("geforce", R"({"gpu_name": "GeForce|TITAN", "p2p_enabled": true})") + "," +
                     Entry("kernel", R"({"kernel_older_than": "5.5", "min_gpus": 2})") + "," +
                     Entry("isolated", R"({"peer_access": false})") + "," +
                     Entry("peers", R"({"peer_access": true})")));

  ProcessFacts facts = Facts("NVIDIA GeForce RTX 4090", "545.23.08");
  std::vector<KnownBadMatch> matches = MatchKnownBad(entries, facts);
  REQUIRE(matches.size() == 3);
  CHECK(matches[0].entry->id == "driver");
  REQUIRE(matches[0].facts.size() == 2);
  CHECK(matches[0].facts[0].criterion == "driver_versions");
  CHECK(matches[0].facts[0].value == "545.23.08");
  CHECK(DescribeMatch(matches[0]) == "[driver] driver 545.23.08, P2P not disabled: it breaks");
  CHECK(matches[1].entry->id == "geforce");
  CHECK(matches[1].facts[0].value == "NVIDIA GeForce RTX 4090");
  CHECK(DescribeMatch(matches[1]) == "[geforce] GPU NVIDIA GeForce RTX 4090, P2P not disabled: it breaks");
  CHECK(DescribeMatch(matches[2]) == "[peers] GPUs 0 and 1 have peer access: it breaks");

  SECTION("P2P turned off in the environment") {
    facts.environment = {{"NCCL_P2P_DISABLE", "1"}};
    CHECK(MatchedIds(entries, facts) == std::vector<std::string>{"peers"});
    facts.environment = {{"NCCL_P2P_LEVEL", "LOC"}};
    CHECK(MatchedIds(entries, facts) == std::vector<std::string>{"peers"});
    facts.environment = {{"NCCL_P2P_DISABLE", "0"}, {"NCCL_P2P_LEVEL", "NVL"}};
    CHECK(MatchedIds(entries, facts) == std::vector<std::string>{"driver", "geforce", "peers"});
  }
  SECTION("an old kernel with several GPUs") {
    facts = Facts("NVIDIA A100-SXM4-80GB", "550.54.15");
    facts.kernel_release = "5.4.0-150-generic";
    matches = MatchKnownBad(entries, facts);
    REQUIRE(matches.size() == 2);
    CHECK(DescribeMatch(matches[0]) == "[kernel] kernel 5.4.0-150-generic (older than 5.5), 2 GPUs visible: it breaks");
    facts.cuda.device_count = 1;
    CHECK(MatchedIds(entries, facts) == std::vector<std::string>{"peers"});
    facts.cuda.device_count = 2;
    for (const char* newer : {"5.5", "5.5.0", "5.15.0-1", "6.1"}) {
      facts.kernel_release = newer;
      CHECK(MatchedIds(entries, facts) == std::vector<std::string>{"peers"});
    }
    facts.kernel_release = "4.18.0-553.el8_10.x86_64";
    CHECK(MatchedIds(entries, facts) == std::vector<std::string>{"kernel", "peers"});
  }
  SECTION("no peer access") {
    facts.cuda.peer_access = {{0, 0}, {0, 0}};
    CHECK(MatchedIds(entries, facts) == std::vector<std::string>{"driver", "geforce", "isolated"});
  }
  SECTION("before the process initialised CUDA: the host's GPUs, from NVML") {
    facts.cuda = CudaFacts();
    facts.host_gpu_names = {"NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090"};
    facts.kernel_release = "5.4.0";
    matches = MatchKnownBad(entries, facts);
    REQUIRE(matches.size() == 3);
    CHECK(DescribeMatch(matches[1]) == "[geforce] GPU NVIDIA GeForce RTX 4090, P2P not disabled: it breaks");
    CHECK(DescribeMatch(matches[2]) == "[kernel] kernel 5.4.0 (older than 5.5), 3 GPUs on the host: it breaks");
  }
  SECTION("unknown facts match nothing") {
    facts = ProcessFacts();
    CHECK(facts.driver_version == "unknown");
    CHECK(facts.cuda.device_count == -1);
    CHECK(MatchedIds(entries, facts).empty());
  }
}

TEST_CASE("the shipped file parses and knows the field cases", "[known_bad]") {
  const absl::StatusOr<std::vector<KnownBadEntry>> shipped = LoadKnownBad(SHIPPED_KNOWN_BAD_FILE);
  INFO(shipped.status().message());
  REQUIRE(shipped.ok());
  for (const KnownBadEntry& entry : *shipped) {
    INFO(entry.id);
    CHECK(entry.source.starts_with("https://"));
  }
  // S2: the driver; S1: GeForce-class names, and the workstation and data-centre names that are not.
  CHECK(MatchedIds(*shipped, Facts("NVIDIA H100 80GB HBM3", "545.23.08")) ==
        std::vector<std::string>{"driver-545.23.08-p2p"});
  for (const char* consumer : {"NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 3090", "NVIDIA TITAN RTX",
                               "NVIDIA RTX 5090", "NVIDIA GeForce GTX 1080 Ti"}) {
    INFO(consumer);
    CHECK(MatchedIds(*shipped, Facts(consumer, "550.54.15")) == std::vector<std::string>{"geforce-p2p"});
  }
  for (const char* professional : {"NVIDIA RTX 4000 Ada Generation", "NVIDIA RTX A6000", "NVIDIA A100-SXM4-80GB",
                                    "NVIDIA L40S", "Tesla V100-SXM2-32GB"}) {
    INFO(professional);
    CHECK(MatchedIds(*shipped, Facts(professional, "550.54.15")).empty());
  }
  // S3: a kernel older than 5.5 on a host with several GPUs.
  ProcessFacts old_kernel = Facts("NVIDIA RTX A6000", "550.54.15");
  old_kernel.kernel_release = "5.4.0-150-generic";
  old_kernel.cuda.device_count = 3;
  CHECK(MatchedIds(*shipped, old_kernel) == std::vector<std::string>{"kernel-older-than-5.5"});
}

TEST_CASE("a file that cannot be read says which and why", "[known_bad]") {
  const absl::StatusOr<std::vector<KnownBadEntry>> missing = LoadKnownBad("/nonexistent/known-bad.json");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message() == "cannot read /nonexistent/known-bad.json: No such file or directory");
}

TEST_CASE("the default file is found from the object that holds the code", "[known_bad]") {
  // This test program holds the code itself: its bin-relative data directory.
  const std::string path = DefaultKnownBadPath();
  CHECK(path.ends_with("/share/ncclguard/known-bad.json"));
  Config config;
  CHECK(KnownBadPath(config) == path);
  config.known_bad_file = "/etc/site/known-bad.json";
  CHECK(KnownBadPath(config) == "/etc/site/known-bad.json");
}

TEST_CASE("the GPU count, peer access and the host's GPUs travel through a dump", "[known_bad]") {
  ProcessFacts facts = Facts("NVIDIA GeForce RTX 4090", "545.23.08");
  facts.cuda.device_count = 3;
  facts.cuda.peer_access = {{0, 1, 0}, {1, 0, 0}, {0, 0, 0}};
  facts.host_gpu_names = {"NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090"};
  const absl::StatusOr<ParsedDump> parsed = ParseDump(FormatDump(ProcessSnapshot(), facts));
  INFO(parsed.status().message());
  REQUIRE(parsed.ok());
  CHECK(parsed->facts.cuda.device_count == 3);
  CHECK(parsed->facts.cuda.peer_access == facts.cuda.peer_access);
  CHECK(parsed->facts.host_gpu_names == facts.host_gpu_names);

  SECTION("a dump of an earlier build has neither: unknown") {
    nlohmann::json document = nlohmann::json::parse(FormatDump(ProcessSnapshot(), facts));
    document["system"].erase("gpu_count");
    document["system"].erase("peer_access");
    document["system"].erase("host_gpus");
    const absl::StatusOr<ParsedDump> older = ParseDump(document.dump());
    REQUIRE(older.ok());
    CHECK(older->facts.cuda.device_count == -1);
    CHECK(older->facts.cuda.peer_access.empty());
    CHECK(older->facts.host_gpu_names.empty());
  }
}

}  // namespace
}  // namespace ncclguard
