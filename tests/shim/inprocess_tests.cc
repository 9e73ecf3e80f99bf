// The shim linked into this test program (rather than preloaded), so that it runs under the
// sanitizers: this program's dlsym() is ncclguard's, and its exported nccl* functions are the
// wrappers the real libnccl's own PLT calls land in.
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

// Keeps the log quiet; set before the first NCCL call, when the configuration is read.
const bool kQuiet = setenv("NCCLGUARD_LOG_LEVEL", "off", 1) == 0;

void* RealNccl() {
  static void* handle = dlopen(REAL_NCCL_DIR "/libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  REQUIRE(handle != nullptr);
  return handle;
}

std::string ObjectOf(void* address) {
  Dl_info info;
  return dladdr(address, &info) != 0 && info.dli_fname != nullptr ? info.dli_fname : "";
}

std::string ThisProgram() {
  Dl_info info;
  dladdr(reinterpret_cast<void*>(&ObjectOf), &info);
  return info.dli_fname;
}

}  // namespace

TEST_CASE("lookups of NCCL functions on an NCCL handle return ncclguard's wrappers", "[inprocess]") {
  REQUIRE(kQuiet);
  void* get_version = dlsym(RealNccl(), "ncclGetVersion");
  REQUIRE(get_version != nullptr);
  CHECK(ObjectOf(get_version) == ThisProgram());
  int version = 0;
  CHECK(reinterpret_cast<decltype(&ncclGetVersion)>(get_version)(&version) == ncclSuccess);
  CHECK(version == NCCL_VERSION_CODE);

  // Names outside the table, and missing names, get glibc's own answer.
  void* aliased = dlsym(RealNccl(), "pncclGetVersion");
  CHECK(ObjectOf(aliased).find("libnccl.so") != std::string::npos);
  CHECK(dlsym(RealNccl(), "ncclNoSuchFunction") == nullptr);
  CHECK(dlerror() != nullptr);
}

TEST_CASE("a re-entered wrapper forwards to the library of the outer call", "[inprocess]") {
  auto bcast = reinterpret_cast<decltype(&ncclBcast)>(dlsym(RealNccl(), "ncclBcast"));
  REQUIRE(bcast != nullptr);
  CHECK(bcast(nullptr, 1, ncclFloat, 0, nullptr, nullptr) == ncclInvalidArgument);
}

TEST_CASE("concurrent first calls from many threads", "[inprocess]") {
  auto get_version = reinterpret_cast<decltype(&ncclGetVersion)>(dlsym(RealNccl(), "ncclGetVersion"));
  auto error_string =
      reinterpret_cast<decltype(&ncclGetErrorString)>(dlsym(RealNccl(), "ncclGetErrorString"));
  REQUIRE(get_version != nullptr);
  REQUIRE(error_string != nullptr);
  std::atomic<int> correct{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        int version = 0;
        if (get_version(&version) == ncclSuccess && version == NCCL_VERSION_CODE &&
            std::string(error_string(ncclSuccess)) == "no error") {
          correct.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(correct.load() == 8 * 200);
}
