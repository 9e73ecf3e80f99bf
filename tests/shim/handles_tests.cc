// ncclguard's own communicator handles (NCCLGUARD_RECOVER=inprocess) and the library slots the
// core adopts: the shim is linked into this program, whose exported nccl* functions are its
// wrappers, and the libraries behind the slots are copies of a stand-in libnccl that say which
// copy served a call, and a copy of the emulator's libnccl.
#include <dlfcn.h>
#include <nccl.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <catch2/catch.hpp>

#include "shim/libraries.h"
#include "tests/support/process.h"
#include "watchdog/common/in_process_recovery.h"
#include "watchdog/common/libraries.h"
#include "watchdog/recover/comm_handle.h"
#include "watchdog/recover/handles.h"

namespace {

using ncclguard::testing::TemporaryDirectory;

TemporaryDirectory& Scratch() {
  static TemporaryDirectory directory;
  return directory;
}

// Set before the first NCCL call, when the configuration is read. Slot 0 is the real libnccl, so
// that the copies below are never taken for the process's default NCCL.
const bool kConfigured =
    setenv("NCCLGUARD_LOG_LEVEL", getenv("HANDLES_LOG") ? getenv("HANDLES_LOG") : "off", 1) == 0 &&
    setenv("NCCLGUARD_RECOVER", "inprocess", 1) == 0 &&
    setenv("NCCLGUARD_NCCL_LIBRARY", REAL_NCCL_DIR "/libnccl.so.2", 1) == 0 &&
    setenv("NCCLGUARD_DUMP_DIR", Scratch().path().c_str(), 1) == 0;

// A copy of `library` under a file name of its own, loaded as a separate instance.
void* LoadCopy(const std::string& library, const std::string& name, std::string* path) {
  const std::filesystem::path directory = std::filesystem::path(Scratch().path()) / name;
  std::filesystem::create_directories(directory);
  *path = (directory / "libnccl.so.2").string();
  std::filesystem::copy_file(library, *path, std::filesystem::copy_options::overwrite_existing);
  void* handle = dlopen(path->c_str(), RTLD_NOW | RTLD_LOCAL);
  INFO(dlerror());
  REQUIRE(handle != nullptr);
  return handle;
}

// One copy of the stand-in libnccl, adopted by the core.
struct FakeCopy {
  std::string path;
  void* handle = nullptr;
  int slot = -1;
  int* id = nullptr;
  ncclComm_t* last_comm = nullptr;
  int* destroyed = nullptr;
};

template <typename T>
T* Variable(void* handle, const char* name) {
  auto* variable = static_cast<T*>(ncclguard::shim::RealDlsym()(handle, name));
  REQUIRE(variable != nullptr);
  return variable;
}

FakeCopy& Fake(int which) {
  static FakeCopy copies[2];
  FakeCopy& copy = copies[which];
  if (copy.handle == nullptr) {
    REQUIRE(kConfigured);
    copy.handle = LoadCopy(FAKE_NCCL, "fake" + std::to_string(which), &copy.path);
    copy.slot = ncclguard::shim::Libraries().AdoptLibrary(copy.handle, copy.path);
    copy.id = Variable<int>(copy.handle, "fake_nccl_id");
    *copy.id = 100 + which;
    copy.last_comm = Variable<ncclComm_t>(copy.handle, "fake_nccl_last_comm");
    copy.destroyed = Variable<int>(copy.handle, "fake_nccl_destroyed");
  }
  return copy;
}

std::string ObjectOf(void* address) {
  Dl_info info;
  return dladdr(address, &info) != 0 && info.dli_fname != nullptr ? info.dli_fname : "";
}

// Stands in for a real communicator: what a library was given is compared by address only.
std::uint64_t g_comm_a[4];
std::uint64_t g_comm_b[4];
ncclComm_t CommA() { return reinterpret_cast<ncclComm_t>(g_comm_a); }
ncclComm_t CommB() { return reinterpret_cast<ncclComm_t>(g_comm_b); }

}  // namespace

TEST_CASE("a library the core adopts gets a slot of its own that serves its functions", "[handles]") {
  const FakeCopy& first = Fake(0);
  const FakeCopy& second = Fake(1);
  CHECK(first.slot > 0);
  CHECK(second.slot > 0);
  CHECK(first.slot != second.slot);
  CHECK(ncclguard::shim::Libraries().AdoptLibrary(first.handle, first.path) == first.slot);
  CHECK(ncclguard::shim::LibraryPath(first.slot) == first.path);
  void* count = ncclguard::shim::RealFunction(second.slot, ncclguard::Api::ncclCommCount);
  CHECK(count == ncclguard::shim::RealDlsym()(second.handle, "ncclCommCount"));
  CHECK(ObjectOf(count) == second.path);
  // A function the copy lacks is missing from its slot, not found elsewhere.
  CHECK(ncclguard::shim::RealFunction(second.slot, ncclguard::Api::ncclBroadcast) == nullptr);
  // Neither nothing nor a library without NCCL's functions takes a slot.
  CHECK(ncclguard::shim::Libraries().AdoptLibrary(nullptr, "") == -1);
  void* libm = dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL);
  REQUIRE(libm != nullptr);
  CHECK(ncclguard::shim::Libraries().AdoptLibrary(libm, "libm.so.6") == -1);
}

TEST_CASE("a call on a handle reaches its communicator's library and once re-pointed the new one",
          "[handles]") {
  FakeCopy& first = Fake(0);
  FakeCopy& second = Fake(1);
  ncclguard::CommHandle* handle = ncclguard::NewCommHandle(CommA(), first.slot);
  REQUIRE(handle != nullptr);
  const auto application_comm = reinterpret_cast<ncclComm_t>(handle);
  CHECK(ncclguard::AsCommHandle(application_comm) == handle);
  CHECK(ncclguard::AsCommHandle(CommA()) == nullptr);
  CHECK(ncclguard::FindCommHandle(CommA()) == handle);

  int count = 0;
  REQUIRE(ncclCommCount(application_comm, &count) == ncclSuccess);
  CHECK(count == *first.id);
  CHECK(*first.last_comm == CommA());
  // ncclguard started at that call, with in-process recovery in place: the shim resolves through it.
  CHECK(ncclguard::InProcessRecoveryOn() != nullptr);

  REQUIRE(ncclguard::RepointHandle(handle, CommB(), second.slot));
  REQUIRE(ncclCommCount(application_comm, &count) == ncclSuccess);
  CHECK(count == *second.id);
  CHECK(*second.last_comm == CommB());
  CHECK(*first.last_comm == CommA());
  CHECK(ncclguard::FindCommHandle(CommB()) == handle);
  CHECK(ncclguard::FindCommHandle(CommA()) == nullptr);

  // Anything that is not a handle is passed through as it is, null included.
  int slot = 7;
  CHECK(ncclguard::ResolveComm(CommA(), &slot) == CommA());
  CHECK(ncclguard::ResolveComm(nullptr, &slot) == nullptr);
  CHECK(slot == 7);
  CHECK(ncclguard::ResolveComm(application_comm, &slot) == CommB());
  CHECK(slot == second.slot);
}

TEST_CASE("a creation the core sends to another slot is made there and handed out as a handle", "[handles]") {
  FakeCopy& first = Fake(0);
  ncclguard::SendCreationsTo(first.slot);
  ncclComm_t comm = nullptr;
  ncclUniqueId id{};
  id.internal[0] = 42;
  const ncclResult_t result = ncclCommInitRank(&comm, 1, id, 0);
  ncclguard::SendCreationsTo(-1);
  REQUIRE(result == ncclSuccess);
  REQUIRE(comm != nullptr);
  ncclguard::CommHandle* handle = ncclguard::AsCommHandle(comm);
  REQUIRE(handle != nullptr);
  int slot = -1;
  const ncclComm_t real = ncclguard::ResolveComm(comm, &slot);
  CHECK(slot == first.slot);
  CHECK(real != comm);

  int count = 0;
  REQUIRE(ncclCommCount(comm, &count) == ncclSuccess);
  CHECK(count == *first.id);
  CHECK(*first.last_comm == real);
  const int destroyed = *first.destroyed;
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  CHECK(*first.destroyed == destroyed + 1);
  CHECK(*first.last_comm == real);
}

TEST_CASE("an adopted copy of the emulator's libnccl makes communicators behind handles", "[handles]") {
  REQUIRE(kConfigured);
  std::string path;
  void* copy = LoadCopy(EMULATOR_NCCL, "emulator", &path);
  const int slot = ncclguard::shim::Libraries().AdoptLibrary(copy, path);
  REQUIRE(slot > 0);
  void* init_all = ncclguard::shim::RealFunction(slot, ncclguard::Api::ncclCommInitAll);
  CHECK(ObjectOf(init_all) == path);
  CHECK(ncclguard::shim::Libraries().Version(slot) > 0);

  ncclguard::SendCreationsTo(slot);
  ncclComm_t comms[2] = {};
  const ncclResult_t result = ncclCommInitAll(comms, 2, nullptr);
  ncclguard::SendCreationsTo(-1);
  REQUIRE(result == ncclSuccess);
  for (int rank = 0; rank < 2; ++rank) {
    REQUIRE(ncclguard::AsCommHandle(comms[rank]) != nullptr);
    int served_by = -1;
    ncclguard::ResolveComm(comms[rank], &served_by);
    CHECK(served_by == slot);
    int count = 0;
    int user_rank = -1;
    CHECK(ncclCommCount(comms[rank], &count) == ncclSuccess);
    CHECK(ncclCommUserRank(comms[rank], &user_rank) == ncclSuccess);
    CHECK(count == 2);
    CHECK(user_rank == rank);
  }
  for (ncclComm_t comm : comms) CHECK(ncclCommDestroy(comm) == ncclSuccess);
  // No slot is left after this one: a further library is refused.
  std::string spare_path;
  void* spare = LoadCopy(FAKE_NCCL, "spare", &spare_path);
  CHECK(ncclguard::shim::Libraries().AdoptLibrary(spare, spare_path) == -1);
}
