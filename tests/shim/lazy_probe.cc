// Says which of ncclguard's libraries and their dependencies the process has mapped, from
// /proc/self/maps, before and after ncclGetVersion; with "call" as its argument it makes that one
// NCCL call, otherwise none. Linked with libnccl, as an NCCL application is.
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

namespace {

bool Mapped(const char* name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(name) != std::string::npos) return true;
  }
  return false;
}

void PrintMapped(const char* when) {
  std::printf("%s core=%d absl=%d simdjson=%d front_end=%d\n", when, Mapped("libncclguard-core.so"),
              Mapped("libabsl_"), Mapped("libsimdjson"), Mapped("libncclguard.so"));
}

}  // namespace

int main(int argc, char** argv) {
  PrintMapped("start");
  if (argc > 1 && std::strcmp(argv[1], "call") == 0) {
    int version = 0;
    const ncclResult_t result = ncclGetVersion(&version);
    std::printf("version %d result %d\n", version, static_cast<int>(result));
    // A second call: the core is loaded (or found missing) once.
    ncclGetVersion(&version);
    PrintMapped("after_call");
  }
  return 0;
}
