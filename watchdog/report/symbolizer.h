// Names the code addresses of this process: function, module, offset, source file and line. Runs on
// the watchdog thread when a dump is written, never in a signal handler.
//
// elfutils' libdw is opened with dlopen() on the first call, never linked: libncclguard is
// preloaded into arbitrary applications, so libdw (and what it pulls in) must neither enter the
// global symbol scope nor cost anything before a dump. Without libdw the exported symbols that
// dladdr() knows are all that can be named, and the result says so.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ncclguard {

struct FrameAddress {
  std::uint64_t pc = 0;
  // A return address points after its call instruction, maybe at the first instruction of the
  // next line or function: it is looked up at pc - 1.
  bool return_address = false;
};

struct SymbolizedFrame {
  std::uint64_t address = 0;          // the pc given
  std::string function;               // demangled; "" when unknown
  std::uint64_t function_offset = 0;  // address - the function's start
  std::string module;                 // path of the ELF file mapped there; "" when in none
  std::uint64_t module_offset = 0;    // address in the module's own terms (what addr2line -e takes)
  std::string file;                   // source file; "" without debug info
  int line = 0;                       // 0 without debug info
};

struct Symbolization {
  std::vector<SymbolizedFrame> frames;  // one per address given, in the same order
  // Why only dladdr() was used (exported symbols, no files or lines): "" when libdw was.
  std::string limitation;
};

// Never throws; addresses in no module get empty fields. Function names are those of the symbol
// table: code inlined into a function is named by that function, its file and line by the
// inlined code's.
Symbolization Symbolize(std::span<const FrameAddress> addresses) noexcept;

// The run-time address of `symbol` (a function or object, by its linkage name) in the full symbol
// table of the module that holds `address_inside_module`: .symtab, else that of its separate debug
// file, else .dynsym, so hidden and static symbols are found too. std::nullopt when absent, when
// the module has no such table, or without libdw.
std::optional<std::uint64_t> FindSymbolInModuleOf(const void* address_inside_module,
                                                  std::string_view symbol) noexcept;

}  // namespace ncclguard
