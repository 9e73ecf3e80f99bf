// The private NCCL instance: the copy of the library (one per host and build, shared, removed by
// its last user), loading it as an instance of its own, P2P off for its first communicator with
// the user's environment restored, and the errors. The emulator's NCCL, which like NCCL reads
// NCCL_P2P_DISABLE once per loaded library and says which transport it chose, shows in a process
// of its own that only the private instance has P2P off; the real NCCL 2.28.9, where installed,
// that its copy loads and answers.
#include <dlfcn.h>
#include <fcntl.h>
#include <nccl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/status/status.h"
#include "tests/support/process.h"
#include "watchdog/common/files.h"
#include "watchdog/common/nccl_api.h"
#include "watchdog/recover/private_instance.h"

using ncclguard::Api;
using ncclguard::PrivateNcclInstance;
using ncclguard::RunWithP2pDisabled;
using ncclguard::testing::ProcessOptions;
using ncclguard::testing::ProcessResult;
using ncclguard::testing::RunProcess;
using ncclguard::testing::TemporaryDirectory;

namespace {

using CountCall = int (*)();
using GetVersion = decltype(&ncclGetVersion);

// <temporary>/job/nccl-instances, the copies' directory one level below a job directory.
std::string CopiesDirectory(const TemporaryDirectory& directory) {
  return directory.path() + "/job/nccl-instances";
}

std::vector<std::string> NamesIn(const std::string& directory) {
  std::vector<std::string> names;
  if (!std::filesystem::exists(directory)) return names;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    names.push_back(entry.path().filename().string());
  }
  return names;
}

struct stat StatOf(const std::string& path) {
  struct stat status {};
  REQUIRE(stat(path.c_str(), &status) == 0);
  return status;
}

std::unique_ptr<PrivateNcclInstance> LoadOrFail(const std::string& library, const std::string& directory) {
  auto instance = PrivateNcclInstance::Load(library, directory);
  INFO(instance.status().ToString());
  REQUIRE(instance.ok());
  return *std::move(instance);
}

std::string HostName() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

// The state of one environment variable: its value, or std::nullopt when unset.
std::optional<std::string> Variable(const char* name) {
  const char* value = getenv(name);
  return value != nullptr ? std::optional<std::string>(value) : std::nullopt;
}

void SetVariable(const char* name, const std::optional<std::string>& value) {
  if (value) {
    setenv(name, value->c_str(), 1);
  } else {
    unsetenv(name);
  }
}

}  // namespace

TEST_CASE("the copy is an instance of its own, named by host and library build") {
  TemporaryDirectory directory;
  const auto instance = LoadOrFail(FAKE_NCCL_LIBRARY, CopiesDirectory(directory));
  const std::string copy = instance->CopyPath();
  const std::string name = std::filesystem::path(copy).filename().string();
  CHECK(std::filesystem::path(copy).parent_path() == CopiesDirectory(directory));
  CHECK(std::regex_match(name, std::regex("libnccl-[A-Za-z0-9._-]+-[0-9a-f]{16}\\.so\\.2")));
  CHECK(name.find(ncclguard::SafeFileName(HostName())) != std::string::npos);
  CHECK(instance->LibraryPath() == FAKE_NCCL_LIBRARY);
  CHECK(instance->Version() == 22809);

  // Private, read-only, complete, and not the library itself.
  const struct stat copied = StatOf(copy);
  const struct stat original = StatOf(FAKE_NCCL_LIBRARY);
  CHECK((copied.st_mode & 07777) == 0500);
  CHECK((StatOf(CopiesDirectory(directory)).st_mode & 07777) == 0700);
  CHECK(copied.st_size == original.st_size);
  CHECK(copied.st_ino != original.st_ino);
  CHECK(NamesIn(CopiesDirectory(directory)) == std::vector<std::string>{name});  // no temporary left

  // Statics of its own: the original, loaded beside it, counts separately.
  void* original_handle = dlopen(FAKE_NCCL_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(original_handle != nullptr);
  const auto count_original = reinterpret_cast<CountCall>(dlsym(original_handle, "fake_nccl_count_call"));
  const auto count_copy = reinterpret_cast<CountCall>(dlsym(instance->Handle(), "fake_nccl_count_call"));
  REQUIRE(count_original != nullptr);
  REQUIRE(count_copy != nullptr);
  CHECK(count_original != count_copy);
  const int original_before = count_original();
  CHECK(count_copy() == 1);
  CHECK(count_copy() == 2);
  CHECK(count_original() == original_before + 1);

  // Its functions are the copy's; what the library lacks is nullptr, or a clear error.
  const auto get_version = reinterpret_cast<GetVersion>(instance->Function(Api::ncclGetVersion));
  REQUIRE(get_version != nullptr);
  CHECK(get_version != reinterpret_cast<GetVersion>(dlsym(original_handle, "ncclGetVersion")));
  CHECK(instance->Function(Api::ncclCommInitRank) == nullptr);
  const absl::StatusOr<void*> missing = instance->RequiredFunction(Api::ncclCommInitRank);
  CHECK(absl::IsUnimplemented(missing.status()));
  CHECK_THAT(std::string(missing.status().message()),
             Catch::Contains("ncclCommInitRank") && Catch::Contains(copy));
  CHECK(instance->RequiredFunction(Api::ncclGetVersion).ok());
}

TEST_CASE("the copy's name changes with the host and with each part of the build's identity") {
  const std::string base = ncclguard::PrivateCopyName("node-1", 1, 2, 3, 4);
  CHECK(base == ncclguard::PrivateCopyName("node-1", 1, 2, 3, 4));
  std::set<std::string> names = {base,
                                 ncclguard::PrivateCopyName("node-2", 1, 2, 3, 4),
                                 ncclguard::PrivateCopyName("node-1", 9, 2, 3, 4),
                                 ncclguard::PrivateCopyName("node-1", 1, 9, 3, 4),
                                 ncclguard::PrivateCopyName("node-1", 1, 2, 9, 4),
                                 ncclguard::PrivateCopyName("node-1", 1, 2, 3, 9)};
  CHECK(names.size() == 6);
  // A host name is never a path.
  CHECK(ncclguard::PrivateCopyName("../../etc/x", 1, 2, 3, 4).find('/') == std::string::npos);
}

TEST_CASE("two loads share one copy, a complete copy is reused and an incomplete one made again") {
  TemporaryDirectory directory;
  const std::string copies = CopiesDirectory(directory);
  auto first = LoadOrFail(FAKE_NCCL_LIBRARY, copies);
  const struct stat made = StatOf(first->CopyPath());
  auto second = LoadOrFail(FAKE_NCCL_LIBRARY, copies);
  CHECK(second->CopyPath() == first->CopyPath());
  CHECK(StatOf(second->CopyPath()).st_ino == made.st_ino);  // reused, not copied again
  CHECK(NamesIn(copies).size() == 1);
  // One file, one loaded instance in this process.
  CHECK(second->Function(Api::ncclGetVersion) == first->Function(Api::ncclGetVersion));

  SECTION("a copy of the wrong size (a crash while copying) is replaced") {
    const std::string path = first->CopyPath();
    first.reset();
    second.reset();
    REQUIRE_FALSE(std::filesystem::exists(path));
    std::ofstream(path) << "cut short";
    auto third = LoadOrFail(FAKE_NCCL_LIBRARY, copies);
    CHECK(third->CopyPath() == path);
    CHECK(StatOf(path).st_size == StatOf(FAKE_NCCL_LIBRARY).st_size);
    CHECK(third->Version() == 22809);
  }
}

TEST_CASE("racing loads agree on one copy") {
  TemporaryDirectory directory;
  const std::string copies = CopiesDirectory(directory);
  // Each load waits on a thread of the private-file layer, which runs four at most.
  constexpr int kLoaders = 3;
  std::vector<std::unique_ptr<PrivateNcclInstance>> instances(kLoaders);
  std::vector<std::string> errors(kLoaders);
  std::vector<std::thread> threads;
  for (int i = 0; i < kLoaders; ++i) {
    threads.emplace_back([&, i] {
      auto instance = PrivateNcclInstance::Load(FAKE_NCCL_LIBRARY, copies);
      if (instance.ok()) {
        instances[i] = *std::move(instance);
      } else {
        errors[i] = instance.status().ToString();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::set<std::string> paths;
  for (int i = 0; i < kLoaders; ++i) {
    INFO("loader " << i << ": " << errors[i]);
    REQUIRE(instances[i] != nullptr);
    paths.insert(instances[i]->CopyPath());
  }
  CHECK(paths.size() == 1);
  CHECK(NamesIn(copies).size() == 1);
  // Each holds the copy: it goes with the last of them.
  for (int i = 0; i + 1 < kLoaders; ++i) instances[i].reset();
  CHECK(std::filesystem::exists(*paths.begin()));
  instances.back().reset();
  CHECK_FALSE(std::filesystem::exists(*paths.begin()));
}

TEST_CASE("the last user removes the copy and an earlier one does not, a later load makes it again") {
  TemporaryDirectory directory;
  const std::string copies = CopiesDirectory(directory);
  auto first = LoadOrFail(FAKE_NCCL_LIBRARY, copies);
  auto second = LoadOrFail(FAKE_NCCL_LIBRARY, copies);
  const std::string path = first->CopyPath();

  first->Release();
  CHECK(std::filesystem::exists(path));
  first->Release();  // idempotent
  CHECK(std::filesystem::exists(path));
  // Released, still loaded: the mapping does not need the file.
  const auto get_version = reinterpret_cast<GetVersion>(first->Function(Api::ncclGetVersion));
  int version = 0;
  CHECK(get_version(&version) == ncclSuccess);
  CHECK(version == 22809);

  second.reset();
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK(NamesIn(copies).empty());
  CHECK(get_version(&version) == ncclSuccess);

  auto later = LoadOrFail(FAKE_NCCL_LIBRARY, copies);
  CHECK(later->CopyPath() == path);
  CHECK(std::filesystem::exists(path));
}

TEST_CASE("a copy held by another process is not removed") {
  TemporaryDirectory directory;
  const std::string copies = CopiesDirectory(directory);
  auto instance = LoadOrFail(FAKE_NCCL_LIBRARY, copies);
  const std::string path = instance->CopyPath();
  // Another process's shared lock, as another rank on the node holds it.
  int ready[2];
  int finish[2];
  REQUIRE(pipe(ready) == 0);
  REQUIRE(pipe(finish) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    const char byte = fd >= 0 && flock(fd, LOCK_SH) == 0 ? 'y' : 'n';
    (void)!write(ready[1], &byte, 1);
    char ignored;
    (void)!read(finish[0], &ignored, 1);
    _exit(0);
  }
  char locked = 0;
  REQUIRE(read(ready[0], &locked, 1) == 1);
  REQUIRE(locked == 'y');
  instance->Release();
  CHECK(std::filesystem::exists(path));
  (void)!write(finish[1], "x", 1);
  int status = 0;
  waitpid(child, &status, 0);
  for (int fd : {ready[0], ready[1], finish[0], finish[1]}) close(fd);
}

TEST_CASE("a forked child's release leaves the parent's copy alone") {
  TemporaryDirectory directory;
  auto instance = LoadOrFail(FAKE_NCCL_LIBRARY, CopiesDirectory(directory));
  const std::string path = instance->CopyPath();
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    instance->Release();  // as an exit hook inherited by a forked worker would
    _exit(std::filesystem::exists(path) ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(std::filesystem::exists(path));
  instance->Release();
  CHECK_FALSE(std::filesystem::exists(path));
}

TEST_CASE("failures are errors that say what and where") {
  TemporaryDirectory directory;
  const std::string copies = CopiesDirectory(directory);

  SECTION("the library in use is not known") {
    const auto instance = PrivateNcclInstance::Load("", copies);
    REQUIRE_FALSE(instance.ok());
    CHECK_THAT(std::string(instance.status().message()), Catch::Contains("not known"));
  }
  SECTION("the library does not exist") {
    const std::string missing = directory.path() + "/lib/libnccl.so.2";
    const auto instance = PrivateNcclInstance::Load(missing, copies);
    REQUIRE_FALSE(instance.ok());
    CHECK(absl::IsNotFound(instance.status()));
    CHECK_THAT(std::string(instance.status().message()),
               Catch::Contains(missing) && Catch::Contains("No such file"));
    CHECK(NamesIn(copies).empty());
  }
  SECTION("the directory cannot be written") {
    // A regular file where a directory should be: refused even to root.
    std::ofstream(directory.path() + "/job") << "not a directory";
    const auto instance = PrivateNcclInstance::Load(FAKE_NCCL_LIBRARY, copies);
    REQUIRE_FALSE(instance.ok());
    CHECK_THAT(std::string(instance.status().message()), Catch::Contains(copies));
    if (geteuid() != 0) {  // permissions do not stop root
      std::filesystem::remove(directory.path() + "/job");
      std::filesystem::create_directories(copies);
      std::filesystem::permissions(copies,
                                   std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
      const auto read_only = PrivateNcclInstance::Load(FAKE_NCCL_LIBRARY, copies);
      REQUIRE_FALSE(read_only.ok());
      CHECK(absl::IsPermissionDenied(read_only.status()));
      CHECK_THAT(std::string(read_only.status().message()), Catch::Contains(copies));
      std::filesystem::permissions(copies, std::filesystem::perms::owner_all);
    }
  }
  SECTION("the copy cannot be loaded") {
    const std::string text = directory.path() + "/libnccl.so.2";
    std::ofstream(text) << "not an ELF file";
    const auto instance = PrivateNcclInstance::Load(text, copies);
    REQUIRE_FALSE(instance.ok());
    CHECK_THAT(std::string(instance.status().message()),
               Catch::Contains("cannot be loaded") && Catch::Contains(text));
    CHECK(NamesIn(copies).empty());  // its only user removed it
  }
  SECTION("the library is not NCCL") {
    const auto instance = PrivateNcclInstance::Load(NOT_NCCL_LIBRARY, copies);
    REQUIRE_FALSE(instance.ok());
    CHECK_THAT(std::string(instance.status().message()),
               Catch::Contains("not an NCCL library") && Catch::Contains("ncclGetVersion"));
  }
  SECTION("the library is not a regular file") {
    const auto instance = PrivateNcclInstance::Load("/dev/null", copies);
    REQUIRE_FALSE(instance.ok());
    CHECK_THAT(std::string(instance.status().message()), Catch::Contains("/dev/null is not a regular file"));
  }
}

TEST_CASE("copying streams in chunks and keeps to its deadline") {
  TemporaryDirectory directory;
  const std::string source = directory.path() + "/source";
  const std::string target = directory.path() + "/target";
  constexpr std::uint64_t kSize = (20 << 20) + 12345;  // several chunks and a piece
  {
    // A pattern that does not repeat at chunk boundaries, so a misplaced chunk shows.
    std::string content(kSize, '\0');
    for (std::uint64_t i = 0; i < kSize; ++i) content[i] = static_cast<char>((i * 7) % 251);
    std::ofstream(source, std::ios::binary)
        .write(content.data(), static_cast<std::streamsize>(content.size()));
  }
  const int from = open(source.c_str(), O_RDONLY | O_CLOEXEC);
  const int to = open(target.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  REQUIRE(from >= 0);
  REQUIRE(to >= 0);

  SECTION("a whole file") {
    const absl::Status copied = ncclguard::detail::CopyFileContents(
        from, to, kSize, std::chrono::steady_clock::now() + std::chrono::minutes(5));
    INFO(copied.ToString());
    CHECK(copied.ok());
    close(to);
    const std::string left = ncclguard::testing::ReadFile(source);
    const std::string right = ncclguard::testing::ReadFile(target);
    CHECK(left.size() == kSize);
    CHECK(left == right);
  }
  SECTION("to another file system, where the kernel may refuse to copy and read()/write() do it") {
    close(to);
    const std::string other = "/dev/shm/ncclguard-copy-test-" + std::to_string(getpid());
    const int shm = open(other.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (shm >= 0) {
      const absl::Status copied = ncclguard::detail::CopyFileContents(
          from, shm, kSize, std::chrono::steady_clock::now() + std::chrono::minutes(5));
      INFO(copied.ToString());
      CHECK(copied.ok());
      close(shm);
      CHECK(ncclguard::testing::ReadFile(other) == ncclguard::testing::ReadFile(source));
      unlink(other.c_str());
    }
  }
  SECTION("past the deadline") {
    const absl::Status copied = ncclguard::detail::CopyFileContents(
        from, to, kSize, std::chrono::steady_clock::now() - std::chrono::seconds(1));
    CHECK(absl::IsDeadlineExceeded(copied));
    close(to);
  }
  SECTION("a file shorter than said") {
    const absl::Status copied = ncclguard::detail::CopyFileContents(
        from, to, kSize + 1, std::chrono::steady_clock::now() + std::chrono::minutes(5));
    CHECK(absl::IsDataLoss(copied));
    close(to);
  }
  close(from);
}

TEST_CASE("P2P is off during the creation only, and the user's environment comes back exactly") {
  const std::optional<std::string> saved_disable = Variable("NCCL_P2P_DISABLE");
  const std::optional<std::string> saved_level = Variable("NCCL_P2P_LEVEL");
  struct Case {
    std::optional<std::string> disable;
    std::optional<std::string> level;
  };
  const Case user = GENERATE(Case{std::nullopt, std::nullopt}, Case{std::string("0"), std::string("NVL")},
                             Case{std::string(""), std::nullopt}, Case{std::string("1"), std::string("SYS")});
  SetVariable("NCCL_P2P_DISABLE", user.disable);
  SetVariable("NCCL_P2P_LEVEL", user.level);

  std::optional<std::string> seen_disable;
  std::optional<std::string> seen_level = std::string("not looked at");
  const ncclResult_t result = RunWithP2pDisabled([&] {
    seen_disable = Variable("NCCL_P2P_DISABLE");
    seen_level = Variable("NCCL_P2P_LEVEL");
    return ncclInvalidUsage;
  });
  CHECK(result == ncclInvalidUsage);  // what the creation returned
  CHECK(seen_disable == std::optional<std::string>("1"));
  CHECK(seen_level == std::nullopt);
  CHECK(Variable("NCCL_P2P_DISABLE") == user.disable);
  CHECK(Variable("NCCL_P2P_LEVEL") == user.level);

  // An exception does not cross, and does not leave the environment changed.
  CHECK(PrivateNcclInstance::WithP2pDisabled([]() -> ncclResult_t { throw std::runtime_error("no"); }) ==
        ncclInternalError);
  CHECK(Variable("NCCL_P2P_DISABLE") == user.disable);
  CHECK(Variable("NCCL_P2P_LEVEL") == user.level);

  SetVariable("NCCL_P2P_DISABLE", saved_disable);
  SetVariable("NCCL_P2P_LEVEL", saved_level);
}

TEST_CASE("on the emulator, only the private instance has P2P off, and the environment is the user's") {
  struct Case {
    std::optional<std::string> disable;
    std::optional<std::string> level;
  };
  const Case user = GENERATE(Case{std::nullopt, std::nullopt}, Case{std::string("0"), std::string("SYS")});
  if (std::string(PRIVATE_INSTANCE_PROBE).empty()) {
    WARN("the emulator is not built: nothing to test");
    return;
  }
  TemporaryDirectory directory;
  const std::string copies = CopiesDirectory(directory);
  ProcessOptions options;
  options.timeout_seconds = 60;
  options.environment["LD_LIBRARY_PATH"] = EMULATOR_LIBRARY_DIR;
  options.environment["NCCL_DEBUG"] = "INFO";
  options.environment["NCCL_DEBUG_FILE"] = std::nullopt;
  options.environment["NCCLEMU_FAULTS"] = std::nullopt;
  options.environment["NCCLEMU_P2P_ACCESS"] = std::nullopt;
  options.environment["NCCL_P2P_DISABLE"] = user.disable;
  options.environment["NCCL_P2P_LEVEL"] = user.level;
  const ProcessResult result = RunProcess({PRIVATE_INSTANCE_PROBE, copies}, options);
  INFO("stdout:\n" << result.out << "\nstderr:\n" << result.err);
  REQUIRE_FALSE(result.timed_out);
  REQUIRE(result.exit_code == 0);

  const std::size_t private_phase = result.out.find("probe: phase private ");
  const std::size_t after_phase = result.out.find("probe: phase after");
  REQUIRE(private_phase != std::string::npos);
  REQUIRE(after_phase != std::string::npos);
  const std::string default_part = result.out.substr(0, private_phase);
  const std::string private_part = result.out.substr(private_phase, after_phase - private_phase);
  CHECK_THAT(default_part, Catch::Contains(" via P2P/") && !Catch::Contains(" via SHM/"));
  CHECK_THAT(private_part, Catch::Contains(" via SHM/") && !Catch::Contains(" via P2P/"));
  CHECK_THAT(private_part, Catch::Contains("NCCL_P2P_DISABLE set by environment to 1"));
  CHECK_THAT(private_part, !Catch::Contains("NCCL_P2P_LEVEL set by environment"));
  CHECK_THAT(private_part, Catch::Contains(copies + "/libnccl-") && Catch::Contains("version 22809"));
  CHECK_THAT(result.out, Catch::Contains("probe: private allreduce ok"));
  CHECK_THAT(result.out,
             Catch::Contains(user.disable ? "probe: after: NCCL_P2P_DISABLE=" + *user.disable + "\n"
                                          : "probe: after: NCCL_P2P_DISABLE unset\n"));
  CHECK_THAT(result.out, Catch::Contains(user.level ? "probe: after: NCCL_P2P_LEVEL=" + *user.level + "\n"
                                                    : "probe: after: NCCL_P2P_LEVEL unset\n"));
  // Its only user released it.
  CHECK_THAT(result.out, Catch::Contains("probe: released"));
  CHECK(NamesIn(copies).empty());
}

TEST_CASE("the real NCCL's copy loads and answers") {
  const std::string library = REAL_NCCL_LIBRARY;
  if (library.empty() || !std::filesystem::exists(library)) {
    WARN("the real libnccl is not installed: nothing to test");
    return;
  }
  TemporaryDirectory directory;
  const auto instance = LoadOrFail(library, CopiesDirectory(directory));
  CHECK(instance->Version() == 22809);
  const auto get_version = reinterpret_cast<GetVersion>(instance->Function(Api::ncclGetVersion));
  REQUIRE(get_version != nullptr);
  int version = 0;
  CHECK(get_version(&version) == ncclSuccess);
  CHECK(version == 22809);
  const auto get_unique_id =
      reinterpret_cast<decltype(&ncclGetUniqueId)>(instance->Function(Api::ncclGetUniqueId));
  REQUIRE(get_unique_id != nullptr);
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  CHECK(get_unique_id(&id) == ncclSuccess);
  CHECK(std::any_of(std::begin(id.internal), std::end(id.internal), [](char byte) { return byte != 0; }));
  CHECK(StatOf(instance->CopyPath()).st_size == StatOf(library).st_size);
}
