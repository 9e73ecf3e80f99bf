// The pickle reader of analyze --flight-recorder-dumps: what Python writes, protocols 2 and 4, and
// what a stranger's file may hold instead.
#include <string>

#include <catch2/catch.hpp>

#include "cli/pickle_reader.h"

using ncclguard::PickleValue;
using ncclguard::ReadPickle;

namespace {

// pickle.dumps(value, protocol=2) and protocol=4 of
// {"version": "2.10", "entries": [{"pg_id": 1, "process_group": ("0", "default_pg"),
//  "collective_seq_id": 42, "time": 1758610505592849034, "retired": False, "done": True, "x": None,
//  "f": 1.5, "neg": -7, "big": 70000, "sizes": [[4096, 1, 5120]]}]}
const std::string kProtocol2(
    "\x80\x02\x7d\x71\x00\x28\x58\x07\x00\x00\x00\x76\x65\x72\x73\x69\x6f\x6e\x71\x01\x58\x04\x00\x00"
    "\x00\x32\x2e\x31\x30\x71\x02\x58\x07\x00\x00\x00\x65\x6e\x74\x72\x69\x65\x73\x71\x03\x5d\x71\x04"
    "\x7d\x71\x05\x28\x58\x05\x00\x00\x00\x70\x67\x5f\x69\x64\x71\x06\x4b\x01\x58\x0d\x00\x00\x00\x70"
    "\x72\x6f\x63\x65\x73\x73\x5f\x67\x72\x6f\x75\x70\x71\x07\x58\x01\x00\x00\x00\x30\x71\x08\x58\x0a"
    "\x00\x00\x00\x64\x65\x66\x61\x75\x6c\x74\x5f\x70\x67\x71\x09\x86\x71\x0a\x58\x11\x00\x00\x00\x63"
    "\x6f\x6c\x6c\x65\x63\x74\x69\x76\x65\x5f\x73\x65\x71\x5f\x69\x64\x71\x0b\x4b\x2a\x58\x04\x00\x00"
    "\x00\x74\x69\x6d\x65\x71\x0c\x8a\x08\x8a\xc2\x21\xf4\xef\xd6\x67\x18\x58\x07\x00\x00\x00\x72\x65"
    "\x74\x69\x72\x65\x64\x71\x0d\x89\x58\x04\x00\x00\x00\x64\x6f\x6e\x65\x71\x0e\x88\x58\x01\x00\x00"
    "\x00\x78\x71\x0f\x4e\x58\x01\x00\x00\x00\x66\x71\x10\x47\x3f\xf8\x00\x00\x00\x00\x00\x00\x58\x03"
    "\x00\x00\x00\x6e\x65\x67\x71\x11\x4a\xf9\xff\xff\xff\x58\x03\x00\x00\x00\x62\x69\x67\x71\x12\x4a"
    "\x70\x11\x01\x00\x58\x05\x00\x00\x00\x73\x69\x7a\x65\x73\x71\x13\x5d\x71\x14\x5d\x71\x15\x28\x4d"
    "\x00\x10\x4b\x01\x4d\x00\x14\x65\x61\x75\x61\x75\x2e",
    277);
const std::string kProtocol4(
    "\x80\x04\x95\xcd\x00\x00\x00\x00\x00\x00\x00\x7d\x94\x28\x8c\x07\x76\x65\x72\x73\x69\x6f\x6e\x94"
    "\x8c\x04\x32\x2e\x31\x30\x94\x8c\x07\x65\x6e\x74\x72\x69\x65\x73\x94\x5d\x94\x7d\x94\x28\x8c\x05"
    "\x70\x67\x5f\x69\x64\x94\x4b\x01\x8c\x0d\x70\x72\x6f\x63\x65\x73\x73\x5f\x67\x72\x6f\x75\x70\x94"
    "\x8c\x01\x30\x94\x8c\x0a\x64\x65\x66\x61\x75\x6c\x74\x5f\x70\x67\x94\x86\x94\x8c\x11\x63\x6f\x6c"
    "\x6c\x65\x63\x74\x69\x76\x65\x5f\x73\x65\x71\x5f\x69\x64\x94\x4b\x2a\x8c\x04\x74\x69\x6d\x65\x94"
    "\x8a\x08\x8a\xc2\x21\xf4\xef\xd6\x67\x18\x8c\x07\x72\x65\x74\x69\x72\x65\x64\x94\x89\x8c\x04\x64"
    "\x6f\x6e\x65\x94\x88\x8c\x01\x78\x94\x4e\x8c\x01\x66\x94\x47\x3f\xf8\x00\x00\x00\x00\x00\x00\x8c"
    "\x03\x6e\x65\x67\x94\x4a\xf9\xff\xff\xff\x8c\x03\x62\x69\x67\x94\x4a\x70\x11\x01\x00\x8c\x05\x73"
    "\x69\x7a\x65\x73\x94\x5d\x94\x5d\x94\x28\x4d\x00\x10\x4b\x01\x4d\x00\x14\x65\x61\x75\x61\x75\x2e",
    216);

void CheckEntry(const PickleValue& document) {
  REQUIRE(document.kind == PickleValue::Kind::kDict);
  REQUIRE(document.Find("version") != nullptr);
  CHECK(document.Find("version")->text == "2.10");
  const PickleValue* entries = document.Find("entries");
  REQUIRE(entries != nullptr);
  REQUIRE(entries->kind == PickleValue::Kind::kList);
  REQUIRE(entries->items.size() == 1);
  const PickleValue& entry = entries->items[0];
  CHECK(entry.Find("pg_id")->integer == 1);
  const PickleValue* group = entry.Find("process_group");
  REQUIRE(group->kind == PickleValue::Kind::kTuple);
  REQUIRE(group->items.size() == 2);
  CHECK(group->items[1].text == "default_pg");
  CHECK(entry.Find("collective_seq_id")->integer == 42);
  CHECK(entry.Find("time")->integer == 1758610505592849034);
  CHECK(entry.Find("retired")->kind == PickleValue::Kind::kBool);
  CHECK_FALSE(entry.Find("retired")->boolean);
  CHECK(entry.Find("done")->boolean);
  CHECK(entry.Find("x")->kind == PickleValue::Kind::kNone);
  CHECK(entry.Find("f")->number == 1.5);
  CHECK(entry.Find("neg")->integer == -7);
  CHECK(entry.Find("big")->integer == 70000);
  const PickleValue* sizes = entry.Find("sizes");
  REQUIRE(sizes->items.size() == 1);
  REQUIRE(sizes->items[0].items.size() == 3);
  CHECK(sizes->items[0].items[2].integer == 5120);
  CHECK(entry.Find("missing") == nullptr);
}

}  // namespace

TEST_CASE("a Flight Recorder-like dict reads the same from protocol 2 and protocol 4", "[pickle]") {
  for (const std::string* data : {&kProtocol2, &kProtocol4}) {
    const auto value = ReadPickle(*data);
    INFO(value.status().ToString());
    REQUIRE(value.ok());
    CheckEntry(*value);
  }
}

TEST_CASE("a list the memo holds is seen whole, with what was added after it was memoized", "[pickle]") {
  // l = []; pickle.dumps({"a": l, "b": l}, protocol=2) after l.append(1)
  const std::string shared(
      "\x80\x02\x7d\x71\x00\x28\x58\x01\x00\x00\x00\x61\x71\x01\x5d\x71\x02\x4b\x01\x61\x58\x01\x00\x00"
      "\x00\x62\x71\x03\x68\x02\x75\x2e",
      32);
  const auto value = ReadPickle(shared);
  REQUIRE(value.ok());
  REQUIRE(value->Find("b") != nullptr);
  REQUIRE(value->Find("b")->items.size() == 1);
  CHECK(value->Find("b")->items[0].integer == 1);
}

TEST_CASE("a stranger's pickle is refused, never followed: cut off, lying, executable or endless",
          "[pickle]") {
  for (std::size_t size = 0; size < kProtocol2.size(); ++size) {
    INFO(size);
    CHECK_FALSE(ReadPickle(kProtocol2.substr(0, size)).ok());
  }
  // A string that claims 4 GiB.
  CHECK_FALSE(ReadPickle(std::string("\x80\x02X\xff\xff\xff\xff", 8) + "abc.").ok());
  // GLOBAL os.system, then REDUCE: nothing is imported or called.
  const auto global = ReadPickle(
      "\x80\x02"
      "cos\nsystem\n"
      "X\x02\x00\x00\x00ls\x85R.");
  REQUIRE_FALSE(global.ok());
  CHECK(global.status().message().find("not read") != std::string::npos);
  // l = []; l.append(l): a list that contains itself.
  CHECK_FALSE(ReadPickle(std::string("\x80\x02]q\x00h\x00"
                                     "a.",
                                     9))
                  .ok());
  // x = [1]; 30 times x = [x, x]: 2^30 values from 100 bytes, through the memo.
  std::string doubling(
      "\x80\x02]q\x00K\x01"
      "a",
      8);
  for (int level = 1; level <= 30; ++level) {
    doubling += std::string("0]q") + static_cast<char>(level) + "(h" + static_cast<char>(level - 1) + "h" +
                static_cast<char>(level - 1) + "e";
  }
  doubling += ".";
  const auto blown = ReadPickle(doubling);
  REQUIRE_FALSE(blown.ok());
  INFO(blown.status().message());
  CHECK(blown.status().message().find("too many values") != std::string::npos);
  // Items added to what is no container, a MARK never closed, two values at the end.
  CHECK_FALSE(ReadPickle("\x80\x02K\x01K\x02"
                         "a.")
                  .ok());
  CHECK_FALSE(ReadPickle("\x80\x02(K\x01.").ok());
  CHECK_FALSE(ReadPickle("\x80\x02K\x01K\x02.").ok());
}
