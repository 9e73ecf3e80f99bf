// The symbolizer on this test program's own code, libc, a library of hidden symbols, and addresses
// in no module; its cost on 500 stacks of 64 frames, and its memory over repeated calls.
#include <cxxabi.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "watchdog/report/symbolizer.h"

extern "C" {
const void* ncclguard_symbolizer_library_static_address();
const void* ncclguard_symbolizer_library_hidden_address();

// Local to this program (no dynamic symbol), with a C name to look up.
static int ncclguard_symbolizer_static_in_test(int value) { return value * 7 + 3; }
}

namespace ncclguard {
namespace {

[[gnu::noinline]] std::uint64_t ReturnAddress() {
  const auto address = reinterpret_cast<std::uint64_t>(__builtin_return_address(0));
  asm volatile("" ::: "memory");
  return address;
}

// A function of internal linkage with debug info; returns the address its call of ReturnAddress() returns to,
// and the line of that call.
[[gnu::noinline]] std::pair<std::uint64_t, int> StaticCallerInTest() {
  std::pair<std::uint64_t, int> site{ReturnAddress(), __LINE__};
  asm volatile("" ::: "memory");  // no tail call: the return address stays in this function
  return site;
}

std::string ExecutablePath() {
  char path[4096];
  const ssize_t length = readlink("/proc/self/exe", path, sizeof(path) - 1);
  REQUIRE(length > 0);
  return std::string(path, static_cast<std::size_t>(length));
}

std::string Basename(const std::string& path) { return path.substr(path.rfind('/') + 1); }

long ResidentKilobytes() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0;
  long resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE) / 1024;
}

TEST_CASE("a static function of the program is named with its file and line", "[symbolizer]") {
  const auto [pc, line] = StaticCallerInTest();
  const std::vector<FrameAddress> addresses = {{.pc = pc, .return_address = true}};
  const Symbolization result = Symbolize(addresses);
  CHECK(result.limitation == "");
  REQUIRE(result.frames.size() == 1);
  const SymbolizedFrame& frame = result.frames[0];
  CHECK(frame.address == pc);
  CHECK_THAT(frame.function, Catch::Contains("StaticCallerInTest"));
  CHECK(frame.function_offset > 0);
  CHECK(frame.module == ExecutablePath());
  CHECK(Basename(frame.file) == "symbolizer_tests.cc");
  CHECK(frame.line == line);
}

TEST_CASE("a libc function is named with its module", "[symbolizer]") {
  const auto write_address = reinterpret_cast<std::uint64_t>(&write);
  const std::vector<FrameAddress> addresses = {{.pc = write_address},
                                               {.pc = write_address + 1, .return_address = true}};
  const Symbolization result = Symbolize(addresses);
  REQUIRE(result.frames.size() == 2);
  for (const SymbolizedFrame& frame : result.frames) {
    INFO(frame.function << " in " << frame.module);
    CHECK((frame.function == "write" || frame.function == "__write" || frame.function == "__libc_write"));
    CHECK_THAT(Basename(frame.module), Catch::StartsWith("libc.so") || Catch::StartsWith("libc-"));
    CHECK(frame.module_offset > 0);
    CHECK(frame.module_offset < write_address);
  }
  CHECK(result.frames[0].function_offset == 0);
  CHECK(result.frames[1].function_offset == 1);  // the return address, found at pc - 1
  CHECK(result.frames[0].module_offset + 1 == result.frames[1].module_offset);
}

TEST_CASE("an address in no module gives empty fields", "[symbolizer]") {
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(page != MAP_FAILED);
  const auto anonymous = reinterpret_cast<std::uint64_t>(page) + 16;
  const std::vector<FrameAddress> addresses = {
      {.pc = anonymous}, {.pc = 0}, {.pc = 1, .return_address = true}};
  const Symbolization result = Symbolize(addresses);
  munmap(page, 4096);
  REQUIRE(result.frames.size() == 3);
  for (std::size_t i = 0; i < addresses.size(); ++i) {
    const SymbolizedFrame& frame = result.frames[i];
    CHECK(frame.address == addresses[i].pc);
    CHECK(frame.function == "");
    CHECK(frame.function_offset == 0);
    CHECK(frame.module == "");
    CHECK(frame.module_offset == 0);
    CHECK(frame.file == "");
    CHECK(frame.line == 0);
  }
}

TEST_CASE("no addresses, no frames", "[symbolizer]") { CHECK(Symbolize({}).frames.empty()); }

TEST_CASE("one frame per address, in order, duplicates included", "[symbolizer]") {
  const auto [pc, line] = StaticCallerInTest();
  const auto write_address = reinterpret_cast<std::uint64_t>(&write);
  const std::vector<FrameAddress> addresses = {
      {.pc = write_address}, {.pc = pc, .return_address = true}, {.pc = write_address}, {.pc = 0}};
  const Symbolization result = Symbolize(addresses);
  REQUIRE(result.frames.size() == 4);
  CHECK(result.frames[0].function == result.frames[2].function);
  CHECK(result.frames[0].function != "");
  CHECK_THAT(result.frames[1].function, Catch::Contains("StaticCallerInTest"));
  CHECK(result.frames[1].line == line);
  CHECK(result.frames[3].module == "");
}

TEST_CASE("C++ names are demangled", "[symbolizer]") {
  const auto address = reinterpret_cast<std::uint64_t>(&ExecutablePath);
  const Symbolization result = Symbolize(std::vector<FrameAddress>{{.pc = address}});
  REQUIRE(result.frames.size() == 1);
  CHECK_THAT(result.frames[0].function,
             Catch::StartsWith("ncclguard::(anonymous namespace)::ExecutablePath"));
}

TEST_CASE("hidden and static symbols are found in the full symbol table of a module", "[symbolizer]") {
  // The test program's own static function.
  const auto static_in_test = reinterpret_cast<std::uint64_t>(&ncclguard_symbolizer_static_in_test);
  CHECK(dlsym(RTLD_DEFAULT, "ncclguard_symbolizer_static_in_test") == nullptr);
  CHECK(FindSymbolInModuleOf(reinterpret_cast<const void*>(&ReturnAddress),
                             "ncclguard_symbolizer_static_in_test") == static_in_test);

  // A shared library's static and hidden functions, from the address of one of its exports.
  const void* exported = reinterpret_cast<const void*>(&ncclguard_symbolizer_library_static_address);
  CHECK(dlsym(RTLD_DEFAULT, "ncclguard_symbolizer_static_in_library") == nullptr);
  CHECK(dlsym(RTLD_DEFAULT, "ncclguard_symbolizer_hidden_in_library") == nullptr);
  CHECK(FindSymbolInModuleOf(exported, "ncclguard_symbolizer_static_in_library") ==
        reinterpret_cast<std::uint64_t>(ncclguard_symbolizer_library_static_address()));
  CHECK(FindSymbolInModuleOf(exported, "ncclguard_symbolizer_hidden_in_library") ==
        reinterpret_cast<std::uint64_t>(ncclguard_symbolizer_library_hidden_address()));
  // Each module only answers for itself.
  CHECK(FindSymbolInModuleOf(exported, "ncclguard_symbolizer_static_in_test") == std::nullopt);
  CHECK(FindSymbolInModuleOf(reinterpret_cast<const void*>(&ReturnAddress),
                             "ncclguard_symbolizer_static_in_library") == std::nullopt);

  // libc, stripped: its dynamic symbols.
  CHECK(FindSymbolInModuleOf(reinterpret_cast<const void*>(&write), "write") ==
        reinterpret_cast<std::uint64_t>(&write));
  CHECK(FindSymbolInModuleOf(reinterpret_cast<const void*>(&write), "no_such_symbol_anywhere") ==
        std::nullopt);
  int on_stack = 0;
  CHECK(FindSymbolInModuleOf(&on_stack, "write") == std::nullopt);
}

// 500 threads of 64 frames, as a dump of a large process could hold: code addresses spread over
// this program, libc and libstdc++, most stacks sharing most frames.
std::vector<FrameAddress> ManyStacks() {
  const std::vector<std::uint64_t> anchors = {
      reinterpret_cast<std::uint64_t>(&write), reinterpret_cast<std::uint64_t>(&malloc),
      reinterpret_cast<std::uint64_t>(&ReturnAddress), reinterpret_cast<std::uint64_t>(&Symbolize),
      reinterpret_cast<std::uint64_t>(&abi::__cxa_demangle)};
  std::vector<FrameAddress> addresses;
  for (int thread = 0; thread < 500; ++thread) {
    for (int depth = 0; depth < 64; ++depth) {
      const std::uint64_t anchor = anchors[static_cast<std::size_t>(depth + thread) % anchors.size()];
      const std::uint64_t spread = static_cast<std::uint64_t>((depth * 37 + (thread % 16) * 5) % 400) * 16;
      addresses.push_back({.pc = anchor + spread, .return_address = depth > 0});
    }
  }
  return addresses;
}

TEST_CASE("500 stacks of 64 frames take well under a second after the first call", "[symbolizer]") {
  const std::vector<FrameAddress> addresses = ManyStacks();
  const auto time = [&] {
    const auto start = std::chrono::steady_clock::now();
    const Symbolization result = Symbolize(addresses);
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    CHECK(result.frames.size() == addresses.size());
    CHECK(result.limitation == "");
    return took.count();
  };
  const double first = time();
  const double second = time();
  const double third = time();
  std::printf("symbolizing %zu addresses: first call %.3f s, then %.3f s and %.3f s\n", addresses.size(),
              first, second, third);
  CHECK(second < 0.5);
  CHECK(third < 0.5);
}

TEST_CASE("repeated symbolization does not grow the memory", "[symbolizer]") {
  const std::vector<FrameAddress> addresses = ManyStacks();
  for (int warm = 0; warm < 5; ++warm) Symbolize(addresses);
  const long before = ResidentKilobytes();
  for (int round = 0; round < 100; ++round) {
    const Symbolization result = Symbolize(addresses);
    REQUIRE(result.frames.size() == addresses.size());
    FindSymbolInModuleOf(reinterpret_cast<const void*>(&ReturnAddress),
                         "ncclguard_symbolizer_static_in_test");
  }
  const long after = ResidentKilobytes();
  std::printf("resident memory over 100 rounds: %ld kB -> %ld kB\n", before, after);
  CHECK(after - before < 2048);
}

}  // namespace
}  // namespace ncclguard
