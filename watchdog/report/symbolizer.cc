#include "watchdog/report/symbolizer.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <link.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "watchdog/common/libraries.h"
#include "watchdog/common/mutex.h"

namespace ncclguard {
namespace {

// The libdw functions used, each typed by its declaration in <elfutils/libdwfl.h>, so that a wrong
// signature does not compile. Resolved with dlsym() from a private (RTLD_LOCAL) handle.
struct Libdw {
  decltype(&::dwfl_begin) begin = nullptr;
  decltype(&::dwfl_errno) error_number = nullptr;
  decltype(&::dwfl_errmsg) error_message = nullptr;
  decltype(&::dwfl_report_begin) report_begin = nullptr;
  decltype(&::dwfl_report_end) report_end = nullptr;
  decltype(&::dwfl_linux_proc_report) linux_proc_report = nullptr;
  decltype(&::dwfl_linux_proc_find_elf) linux_proc_find_elf = nullptr;
  decltype(&::dwfl_standard_find_debuginfo) standard_find_debuginfo = nullptr;
  decltype(&::dwfl_build_id_find_debuginfo) build_id_find_debuginfo = nullptr;
  decltype(&::dwfl_addrmodule) addrmodule = nullptr;
  decltype(&::dwfl_module_info) module_info = nullptr;
  decltype(&::dwfl_module_getelf) module_getelf = nullptr;
  decltype(&::dwfl_module_addrinfo) module_addrinfo = nullptr;
  decltype(&::dwfl_module_getsrc) module_getsrc = nullptr;
  decltype(&::dwfl_lineinfo) lineinfo = nullptr;
  decltype(&::dwfl_module_getsymtab) module_getsymtab = nullptr;
  decltype(&::dwfl_module_getsym_info) module_getsym_info = nullptr;
};

template <typename Function>
bool Bind(void* handle, const char* name, Function* function, std::string* missing) {
  *function = reinterpret_cast<Function>(Real().Symbol(handle, name));
  if (*function == nullptr) absl::StrAppend(missing, missing->empty() ? "" : ", ", name);
  return *function != nullptr;
}

// Loaded once per process and never unloaded (a Dwfl may still point into it). Set under the
// mutex of State; read by the find_debuginfo callback, which runs under that mutex too.
const Libdw* g_libdw = nullptr;
std::string* g_libdw_failure = nullptr;  // why it could not be loaded; leaked like g_libdw

const Libdw* LoadLibdw(std::string* why) {
  if (g_libdw != nullptr) return g_libdw;
  if (g_libdw_failure != nullptr) {
    *why = *g_libdw_failure;
    return nullptr;
  }
  std::string failure;
  // RTLD_LOCAL: libdw, libelf and what they pull in stay out of the application's global scope.
  void* handle = dlopen("libdw.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    failure = absl::StrCat("libdw.so.1 could not be loaded (", error != nullptr ? error : "no reason given",
                           "): only exported symbols are named, without files and lines");
  } else {
    auto* libdw = new Libdw;
    std::string missing;
    bool complete = true;
    complete &= Bind(handle, "dwfl_begin", &libdw->begin, &missing);
    complete &= Bind(handle, "dwfl_errno", &libdw->error_number, &missing);
    complete &= Bind(handle, "dwfl_errmsg", &libdw->error_message, &missing);
    complete &= Bind(handle, "dwfl_report_begin", &libdw->report_begin, &missing);
    complete &= Bind(handle, "dwfl_report_end", &libdw->report_end, &missing);
    complete &= Bind(handle, "dwfl_linux_proc_report", &libdw->linux_proc_report, &missing);
    complete &= Bind(handle, "dwfl_linux_proc_find_elf", &libdw->linux_proc_find_elf, &missing);
    complete &= Bind(handle, "dwfl_standard_find_debuginfo", &libdw->standard_find_debuginfo, &missing);
    complete &= Bind(handle, "dwfl_build_id_find_debuginfo", &libdw->build_id_find_debuginfo, &missing);
    complete &= Bind(handle, "dwfl_addrmodule", &libdw->addrmodule, &missing);
    complete &= Bind(handle, "dwfl_module_info", &libdw->module_info, &missing);
    complete &= Bind(handle, "dwfl_module_getelf", &libdw->module_getelf, &missing);
    complete &= Bind(handle, "dwfl_module_addrinfo", &libdw->module_addrinfo, &missing);
    complete &= Bind(handle, "dwfl_module_getsrc", &libdw->module_getsrc, &missing);
    complete &= Bind(handle, "dwfl_lineinfo", &libdw->lineinfo, &missing);
    complete &= Bind(handle, "dwfl_module_getsymtab", &libdw->module_getsymtab, &missing);
    complete &= Bind(handle, "dwfl_module_getsym_info", &libdw->module_getsym_info, &missing);
    if (complete) {
      g_libdw = libdw;
      return libdw;
    }
    delete libdw;
    failure = absl::StrCat("libdw.so.1 lacks ", missing, ": only exported symbols are named");
  }
  g_libdw_failure = new std::string(failure);
  *why = failure;
  return nullptr;
}

// elfutils' standard search ends by asking the debuginfod servers of DEBUGINFOD_URLS (Debian sets
// it in every login shell) to download the debug info: a network fetch of gigabytes in the middle
// of a dump. With servers configured, only the local build-id tree (/usr/lib/debug/.build-id, where
// distributions' debug packages go) is searched, which never reaches debuginfod.
int FindDebuginfo(Dwfl_Module* module, void** userdata, const char* module_name, Dwarf_Addr base,
                  const char* file_name, const char* debuglink_file, GElf_Word debuglink_crc,
                  char** debuginfo_file_name) {
  const char* servers = getenv("DEBUGINFOD_URLS");
  if (servers == nullptr || servers[0] == '\0') {
    return g_libdw->standard_find_debuginfo(module, userdata, module_name, base, file_name, debuglink_file,
                                            debuglink_crc, debuginfo_file_name);
  }
  return g_libdw->build_id_find_debuginfo(module, userdata, module_name, base, file_name, debuglink_file,
                                          debuglink_crc, debuginfo_file_name);
}

std::string ReadMaps() {
  std::string text;
  const int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return text;
  char buffer[65536];
  while (true) {
    const ssize_t got = read(fd, buffer, sizeof(buffer));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    text.append(buffer, static_cast<std::size_t>(got));
  }
  close(fd);
  return text;
}

// The lines of /proc/self/maps that map code from a file: what libdwfl reports as modules, less
// the data mappings (malloc arenas, thread stacks, mapped data files) that change all the time and
// never hold a return address.
std::string CodeMappings(std::string_view maps) {
  std::string code;
  while (!maps.empty()) {
    const std::size_t end = maps.find('\n');
    const std::string_view line = maps.substr(0, end);
    maps = end == std::string_view::npos ? std::string_view() : maps.substr(end + 1);
    const std::size_t perms = line.find(' ');
    if (perms == std::string_view::npos || perms + 3 >= line.size() || line[perms + 3] != 'x') continue;
    if (line.find('/') == std::string_view::npos && line.find("[vdso]") == std::string_view::npos) continue;
    code.append(line);
    code.push_back('\n');
  }
  return code;
}

// One module's function symbols by address. libdwfl's own dwfl_module_addrinfo() scans the whole
// symbol table at each lookup: a few hundred addresses in a library of 500,000 symbols (PyTorch's,
// CUDA's) would take seconds. Built on the first lookup in the module, 24 bytes a symbol.
struct SymbolIndex {
  struct Entry {
    GElf_Addr start = 0;  // run-time address
    GElf_Xword size = 0;
    int index = 0;  // in the module's symbol table
    int rank = 0;   // among aliases the global name wins, then the weak one, as libdwfl chooses
  };
  std::vector<Entry> entries;  // by start, then rank
};

// The symbolizer's state in one process. One Dwfl is kept between calls and re-reported only when
// the code mappings change (a dlopen() or dlclose()): libdwfl then keeps the modules reported again
// unchanged, with the symbol tables and DWARF it already read, and frees the others. A fresh Dwfl
// per call would read and index the DWARF of every library on the stacks again at each dump
// (seconds for CUDA and PyTorch libraries); the cache costs the open files and maps of those
// libraries for the rest of the process, which is what a second dump needs anyway.
struct State {
  explicit State(pid_t owner) : pid(owner) {}

  const pid_t pid;
  Mutex mutex;
  Dwfl_Callbacks callbacks ABSL_GUARDED_BY(mutex){};  // must outlive dwfl, which points to it
  Dwfl* dwfl ABSL_GUARDED_BY(mutex) = nullptr;
  std::string code_mappings ABSL_GUARDED_BY(mutex);  // as last reported to dwfl
  // Of the modules of dwfl; emptied when it is re-reported, which may free modules.
  std::unordered_map<Dwfl_Module*, SymbolIndex> symbols ABSL_GUARDED_BY(mutex);
};

std::atomic<State*> g_state{nullptr};

// The state of this process. A child of fork() makes its own and leaks its parent's, never
// touching it: the parent's mutex may have been held by a thread the child does not have.
State& CurrentState() {
  const pid_t pid = getpid();
  State* state = g_state.load(std::memory_order_acquire);
  while (state == nullptr || state->pid != pid) {
    auto* fresh = new State(pid);
    if (g_state.compare_exchange_strong(state, fresh, std::memory_order_acq_rel)) return *fresh;
    delete fresh;
  }
  return *state;
}

// The Dwfl of the current code mappings, or nullptr with the reason in *why.
Dwfl* CurrentDwfl(State& state, const Libdw& libdw, std::string* why)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mutex) {
  std::string code = CodeMappings(ReadMaps());
  if (state.dwfl != nullptr && code == state.code_mappings) return state.dwfl;
  if (state.dwfl == nullptr) {
    state.callbacks.find_elf = libdw.linux_proc_find_elf;
    state.callbacks.find_debuginfo = FindDebuginfo;
    state.dwfl = libdw.begin(&state.callbacks);
    if (state.dwfl == nullptr) {
      *why = absl::StrCat("libdw: dwfl_begin failed (", libdw.error_message(-1), ")");
      return nullptr;
    }
  }
  state.symbols.clear();
  libdw.report_begin(state.dwfl);
  const int reported = libdw.linux_proc_report(state.dwfl, getpid());
  if (libdw.report_end(state.dwfl, nullptr, nullptr) != 0 || reported != 0) {
    *why = absl::StrCat("libdw could not read this process's mappings (",
                        reported > 0 ? std::string(strerror(reported)) : std::string(libdw.error_message(-1)),
                        ")");
    // Reported again from scratch next time.
    state.code_mappings.clear();
    return nullptr;
  }
  state.code_mappings = std::move(code);
  return state.dwfl;
}

std::string Demangle(const char* name) {
  if (name == nullptr) return "";
  if (name[0] != '_' || name[1] != 'Z') return name;
  int status = 0;
  char* demangled = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || demangled == nullptr) {
    free(demangled);
    return name;
  }
  std::string result(demangled);
  free(demangled);
  return result;
}

std::uint64_t LookupAddress(const FrameAddress& address) {
  return address.return_address && address.pc > 0 ? address.pc - 1 : address.pc;
}

// Calls `visit(entry, name, symbol, address)` for each named symbol that the module defines, in
// the order of its symbol table, until `visit` returns true.
template <typename Visit>
void ForEachDefinedSymbol(const Libdw& libdw, Dwfl_Module* module, Visit visit) {
  const int count = libdw.module_getsymtab(module);
  // Entry 0 of an ELF symbol table is the null symbol.
  for (int entry = 1; entry < count; ++entry) {
    GElf_Sym symbol{};
    GElf_Addr address = 0;
    GElf_Word section = 0;
    Elf* elf = nullptr;
    Dwarf_Addr bias = 0;
    const char* name = libdw.module_getsym_info(module, entry, &symbol, &address, &section, &elf, &bias);
    if (name == nullptr || name[0] == '\0' || section == SHN_UNDEF) continue;
    if (visit(entry, name, symbol, address)) return;
  }
}

const SymbolIndex& IndexOf(State& state, const Libdw& libdw, Dwfl_Module* module)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mutex) {
  const auto [found, added] = state.symbols.try_emplace(module);
  SymbolIndex& index = found->second;
  if (!added) return index;
  ForEachDefinedSymbol(
      libdw, module, [&index](int entry, const char*, const GElf_Sym& symbol, GElf_Addr address) {
        const int type = GELF_ST_TYPE(symbol.st_info);
        if (symbol.st_size == 0 || (type != STT_FUNC && type != STT_GNU_IFUNC)) return false;
        const int binding = GELF_ST_BIND(symbol.st_info);
        const int rank = binding == STB_GLOBAL ? 0 : binding == STB_WEAK ? 1 : 2;
        index.entries.push_back({.start = address, .size = symbol.st_size, .index = entry, .rank = rank});
        return false;
      });
  std::sort(index.entries.begin(), index.entries.end(), [](const auto& a, const auto& b) {
    return a.start != b.start ? a.start < b.start : a.rank < b.rank;
  });
  return index;
}

// The function symbol that holds `address`: the one starting last before it whose size covers it
// (a function's local labels and aliases start inside or at it), or nullptr.
const SymbolIndex::Entry* FunctionAt(const SymbolIndex& index, GElf_Addr address) {
  auto after =
      std::upper_bound(index.entries.begin(), index.entries.end(), address,
                       [](GElf_Addr value, const SymbolIndex::Entry& entry) { return value < entry.start; });
  // Functions rarely nest: a few symbols back are enough.
  for (int steps = 0; after != index.entries.begin() && steps < 16; ++steps) {
    --after;
    if (address - after->start < after->size) {
      // The best ranked alias at that start is the first of them.
      while (after != index.entries.begin() && std::prev(after)->start == after->start) --after;
      return &*after;
    }
  }
  return nullptr;
}

void DescribeWithLibdw(State& state, const Libdw& libdw, const FrameAddress& address, SymbolizedFrame* frame)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mutex) {
  const std::uint64_t lookup = LookupAddress(address);
  // libdwfl's module spans from its first segment to its last, holes included, where the kernel may
  // place an anonymous mapping: only an address inside a loaded segment is the module's, which the
  // dynamic linker's own check (dladdr) says exactly.
  Dl_info loaded{};
  if (dladdr(reinterpret_cast<void*>(lookup), &loaded) == 0) return;
  Dwfl_Module* module = libdw.addrmodule(state.dwfl, lookup);
  if (module == nullptr) return;
  Dwarf_Addr start = 0;
  const char* name = libdw.module_info(module, nullptr, &start, nullptr, nullptr, nullptr, nullptr, nullptr);
  if (name != nullptr) frame->module = name;
  GElf_Addr bias = 0;
  frame->module_offset =
      libdw.module_getelf(module, &bias) != nullptr ? address.pc - bias : address.pc - start;

  GElf_Sym symbol{};
  GElf_Word section = 0;
  Elf* elf = nullptr;
  Dwarf_Addr symbol_bias = 0;
  const char* symbol_name = nullptr;
  GElf_Off offset = 0;
  if (const SymbolIndex::Entry* function = FunctionAt(IndexOf(state, libdw, module), lookup)) {
    GElf_Addr function_start = 0;
    symbol_name = libdw.module_getsym_info(module, function->index, &symbol, &function_start, &section, &elf,
                                           &symbol_bias);
    offset = lookup - function->start;
  } else {
    // Symbols without a size, or code no symbol covers: libdwfl's own search, which scans the table.
    symbol_name = libdw.module_addrinfo(module, lookup, &offset, &symbol, &section, &elf, &symbol_bias);
  }
  if (symbol_name != nullptr) {
    frame->function = Demangle(symbol_name);
    frame->function_offset = offset + (address.pc - lookup);
  }

  Dwfl_Line* line = libdw.module_getsrc(module, lookup);
  if (line != nullptr) {
    int line_number = 0;
    const char* file = libdw.lineinfo(line, nullptr, &line_number, nullptr, nullptr, nullptr);
    if (file != nullptr) {
      frame->file = file;
      frame->line = line_number;
    }
  }
}

std::string ExecutablePath() {
  char path[4096];
  const ssize_t length = readlink("/proc/self/exe", path, sizeof(path) - 1);
  return length > 0 ? std::string(path, static_cast<std::size_t>(length)) : std::string();
}

void DescribeWithDladdr(const FrameAddress& address, SymbolizedFrame* frame) {
  const std::uint64_t lookup = LookupAddress(address);
  Dl_info info{};
  link_map* map = nullptr;
  if (dladdr1(reinterpret_cast<void*>(lookup), &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) == 0) {
    return;
  }
  frame->module = info.dli_fname != nullptr ? info.dli_fname : "";
  // The main program's link map has an empty name.
  if (frame->module.empty() || (map != nullptr && map->l_name[0] == '\0')) frame->module = ExecutablePath();
  frame->module_offset =
      address.pc - (map != nullptr ? map->l_addr : reinterpret_cast<std::uint64_t>(info.dli_fbase));
  if (info.dli_sname != nullptr && info.dli_saddr != nullptr) {
    frame->function = Demangle(info.dli_sname);
    frame->function_offset = address.pc - reinterpret_cast<std::uint64_t>(info.dli_saddr);
  }
}

}  // namespace

Symbolization Symbolize(std::span<const FrameAddress> addresses) noexcept {
  Symbolization result;
  try {
    result.frames.resize(addresses.size());
    for (std::size_t i = 0; i < addresses.size(); ++i) result.frames[i].address = addresses[i].pc;

    // Stacks of many threads share most of their frames: each distinct address is looked up once.
    std::vector<std::size_t> order(addresses.size());
    std::iota(order.begin(), order.end(), 0);
    const auto key = [&](std::size_t i) { return std::pair(addresses[i].pc, addresses[i].return_address); };
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return key(a) < key(b); });

    State& state = CurrentState();
    const MutexLock lock(state.mutex);
    const Libdw* libdw = LoadLibdw(&result.limitation);
    Dwfl* dwfl = libdw != nullptr ? CurrentDwfl(state, *libdw, &result.limitation) : nullptr;
    if (libdw != nullptr && dwfl == nullptr) {
      absl::StrAppend(&result.limitation, ": only exported symbols are named, without files and lines");
    }
    for (std::size_t first = 0; first < order.size();) {
      std::size_t last = first + 1;
      while (last < order.size() && key(order[last]) == key(order[first])) ++last;
      SymbolizedFrame& frame = result.frames[order[first]];
      if (dwfl != nullptr) {
        DescribeWithLibdw(state, *libdw, addresses[order[first]], &frame);
      } else {
        DescribeWithDladdr(addresses[order[first]], &frame);
      }
      for (std::size_t same = first + 1; same < last; ++same) result.frames[order[same]] = frame;
      first = last;
    }
  } catch (...) {
    // Out of memory: the addresses are still worth reporting, unnamed.
    result.limitation = "out of memory";  // short enough not to allocate
    for (SymbolizedFrame& frame : result.frames) {
      const std::uint64_t address = frame.address;
      frame = SymbolizedFrame();
      frame.address = address;
    }
  }
  return result;
}

std::optional<std::uint64_t> FindSymbolInModuleOf(const void* address_inside_module,
                                                  std::string_view symbol) noexcept {
  try {
    State& state = CurrentState();
    const MutexLock lock(state.mutex);
    std::string why;
    const Libdw* libdw = LoadLibdw(&why);
    if (libdw == nullptr) return std::nullopt;
    Dwfl* dwfl = CurrentDwfl(state, *libdw, &why);
    if (dwfl == nullptr) return std::nullopt;
    Dwfl_Module* module = libdw->addrmodule(dwfl, reinterpret_cast<Dwarf_Addr>(address_inside_module));
    if (module == nullptr) return std::nullopt;
    std::optional<std::uint64_t> found;
    ForEachDefinedSymbol(
        *libdw, module, [&](int, const char* name, const GElf_Sym& entry, GElf_Addr address) {
          const int type = GELF_ST_TYPE(entry.st_info);
          if (symbol != name || (type != STT_FUNC && type != STT_OBJECT && type != STT_GNU_IFUNC))
            return false;
          found = address;
          return true;
        });
    if (found) return found;
  } catch (...) {
    // Out of memory: not found.
  }
  return std::nullopt;
}

}  // namespace ncclguard
