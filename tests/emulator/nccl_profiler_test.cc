// The emulated NCCL's profiler plugin interface (v5, as NCCL 2.28.9 drives it), with the test
// plugin of profiler_plugin.cc reporting every call here: how NCCL_PROFILER_PLUGIN finds the
// plugin, and init and finalize per communicator. The events of operations are in
// nccl_profiler_events_test.cc, those over NET in nccl_profiler_net_test.cc, both part of this
// program. Each case runs in a process of its own (ctest): NCCL looks the plugin up at the
// process's first init, and reads the transport settings once.
#include <cuda.h>
#include <dlfcn.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "nccl_test_support.h"
#include "profiler_events.h"
#include "tests/support/process.h"

using namespace std::chrono_literals;
using namespace profilertest;
using nccltest::LocalRanks;

// ---- Finding the plugin ------------------------------------------------------------------------

TEST_CASE(
    "NCCL_PROFILER_PLUGIN as a path: loaded once, init per communicator, finalize at destroy, closed after",
    "[path]") {
  InfoLog log;
  setenv("NCCL_PROFILER_PLUGIN", recorderPath().c_str(), 1);
  LocalRanks ranks(2);
  ranks.initAll();
  REQUIRE(loaded(recorderPath()));
  EventLog events(recordedCalls());
  const auto inits = events.callsOf(CallKind::Init);
  REQUIRE(inits.size() == 2);
  for (int r = 0; r < 2; ++r) {
    CHECK(inits[r].nranks == 2);
    CHECK(inits[r].n_nodes == 1);
    CHECK_FALSE(inits[r].has_name);
    CHECK(inits[r].has_logger);
  }
  CHECK(((inits[0].rank == 0 && inits[1].rank == 1) || (inits[0].rank == 1 && inits[1].rank == 0)));
  CHECK(inits[0].comm_id != 0);
  CHECK(inits[0].comm_id == inits[1].comm_id);  // NCCL's commHash: the same on every rank
  CHECK(log.contains("NCCL INFO NCCL_PROFILER_PLUGIN set by environment to " + recorderPath()));
  CHECK(log.contains("NCCL INFO PROFILER/Plugin: Loaded emu-recorder (v5)"));
  CHECK(log.contains("NCCL INFO Successfully loaded external profiler plugin " + recorderPath()));
  CHECK(log.contains("NCCL INFO emu-recorder: init rank 1 of 2"));  // through the logger NCCL passes

  ranks.destroyAll();
  const auto finalizes = EventLog(recordedCalls()).callsOf(CallKind::Finalize);
  REQUIRE(finalizes.size() == 2);
  std::vector<uint64_t> initialized{inits[0].context, inits[1].context};
  std::vector<uint64_t> finalized{finalizes[0].context, finalizes[1].context};
  std::sort(initialized.begin(), initialized.end());
  std::sort(finalized.begin(), finalized.end());
  CHECK(finalized == initialized);
  CHECK_FALSE(loaded(recorderPath()));  // the last communicator's free closes it
  CHECK(log.contains("PROFILER/Plugin: Closing profiler plugin emu-recorder"));
}

// Run with NCCL_PROFILER_PLUGIN=recorder and the plugins' directory in LD_LIBRARY_PATH.
TEST_CASE("NCCL_PROFILER_PLUGIN as a short name finds libnccl-profiler-<name>.so", "[short_name]") {
  InfoLog log;
  LocalRanks ranks(2);
  ranks.initAll();
  CHECK(EventLog(recordedCalls()).callsOf(CallKind::Init).size() == 2);
  CHECK(log.contains("PROFILER/Plugin: Loaded emu-recorder (v5)"));
  CHECK(log.contains("Successfully loaded external profiler plugin " + recorderPath()));
  ranks.destroyAll();
}

// Run with NCCL_PROFILER_PLUGIN unset and libnccl-profiler.so in LD_LIBRARY_PATH.
TEST_CASE("NCCL_PROFILER_PLUGIN unset: libnccl-profiler.so is tried", "[default_name]") {
  REQUIRE(getenv("NCCL_PROFILER_PLUGIN") == nullptr);
  LocalRanks ranks(2);
  ranks.initAll();
  CHECK(EventLog(recordedCalls()).callsOf(CallKind::Init).size() == 2);
  ranks.destroyAll();
  CHECK(EventLog(recordedCalls()).callsOf(CallKind::Finalize).size() == 2);
}

TEST_CASE("a prefix of STATIC_PLUGIN finds ncclProfiler_v5 in the process's global scope", "[static]") {
  // As an LD_PRELOAD'ed library (ncclguard's) would provide it.
  void* preloaded = dlopen(recorderPath().c_str(), RTLD_NOW | RTLD_GLOBAL);
  REQUIRE(preloaded != nullptr);
  setenv("NCCL_PROFILER_PLUGIN", "static", 1);  // NCCL compares case-insensitively, as a prefix
  setenv("EMU_PROFILER_MASK", std::to_string(ncclProfileColl).c_str(), 1);
  LocalRanks ranks(2);
  ranks.initAll();
  CHECK(EventLog(recordedCalls()).callsOf(CallKind::Init).size() == 2);
  allReduce(ranks, 16);
  REQUIRE(ranks.synchronize());
  CHECK(EventLog(recordedCalls()).ofType(ncclProfileColl).size() == 2);
  ranks.destroyAll();
}

// Run with libnccl-profiler.so in LD_LIBRARY_PATH: "none" wins over it.
TEST_CASE("NCCL_PROFILER_PLUGIN=none (any case) loads nothing", "[none]") {
  setenv("NCCL_PROFILER_PLUGIN", "NoNe", 1);
  LocalRanks ranks(2);
  ranks.initAll();
  allReduce(ranks, 16);
  REQUIRE(ranks.synchronize());
  CHECK(recordedCalls().empty());
  CHECK_FALSE(loaded(pluginDirectory() + "/libnccl-profiler.so"));
  ranks.destroyAll();
}

TEST_CASE("a plugin that cannot be found is logged and never tried again in the process", "[missing]") {
  InfoLog log;
  setenv("NCCL_PROFILER_PLUGIN", "nope", 1);
  LocalRanks ranks(2);
  ranks.initAll();
  CHECK(log.contains("PROFILER/Plugin: Could not find: nope libnccl-profiler-nope.so"));
  ranks.destroyAll();
  // Sticky: a plugin that exists now is not looked for.
  setenv("NCCL_PROFILER_PLUGIN", recorderPath().c_str(), 1);
  ranks.initAll();
  allReduce(ranks, 16);
  REQUIRE(ranks.synchronize());
  CHECK(recordedCalls().empty());
  CHECK_FALSE(loaded(recorderPath()));
  ranks.destroyAll();
}

namespace {

// What the version 4 plugin (profiler_plugin_v4.cc) counted, while it is loaded.
long v4Count(const std::string& path, const char* what) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return -1;
  auto* count = reinterpret_cast<long (*)(const char*)>(dlsym(handle, "emuV4Count"));
  const long value = count != nullptr ? count(what) : -1;
  dlclose(handle);
  return value;
}

// A 2-rank AllReduce under the version 4 plugin at `path`, loaded by whatever looked it up: its
// inits, the Group and Coll events (each Coll under its Group, as version 4 has it), both kernel
// channels of each rank started and stopped, no other events; finalized at destroy.
void checkVersion4Plugin(const std::string& path) {
  LocalRanks ranks(2);
  ranks.initAll();
  REQUIRE(loaded(path));
  CHECK(v4Count(path, "init") == 2);
  const std::vector<float*> buffers = allReduce(ranks, 16);
  REQUIRE(ranks.synchronize());
  checkAllReduceResult(ranks, buffers, 16);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (v4Count(path, "kernel_channel_stops") < 4 && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(v4Count(path, "kernel_channel_stops") == 4);
  CHECK(v4Count(path, "KernelCh") == 4);
  CHECK(v4Count(path, "Coll") == 2);
  CHECK(v4Count(path, "tasks_under_groups") == 2);
  CHECK(v4Count(path, "Group") >= 1);
  CHECK(v4Count(path, "ProxyOp") == 0);  // P2P transfers: no proxy
  ranks.destroyAll();
}

}  // namespace

TEST_CASE("a plugin with only ncclProfiler_v4 is loaded behind NCCL 2.28.9's adapter, without API events",
          "[v4_only]") {
  InfoLog log;
  const std::string path = pluginDirectory() + "/libnccl-profiler-v4only.so";
  setenv("NCCL_PROFILER_PLUGIN", path.c_str(), 1);
  void* keep = nullptr;  // the counts outlive the last communicator's dlclose
  {
    checkVersion4Plugin(path);
    keep = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  }
  CHECK(log.contains("PROFILER/Plugin: Loaded emu-v4-only (v4)"));
  if (keep != nullptr) dlclose(keep);
}

// Run with NCCLEMU_PROFILER_VERSION=4: the emulator looks the plugin up as NCCL 2.26 and 2.27 do,
// ncclProfiler_v4 first; preloaded, ncclguard serves that version and forwards it to this plugin.
TEST_CASE("as NCCL 2.26 and 2.27, ncclProfiler_v4 is looked up and called in version 4", "[v4_nccl]") {
  InfoLog log;
  const std::string path = pluginDirectory() + "/libnccl-profiler-v4only.so";
  setenv("NCCL_PROFILER_PLUGIN", path.c_str(), 1);
  checkVersion4Plugin(path);
  const char* preload = getenv("LD_PRELOAD");
  const bool behind_ncclguard = preload != nullptr && std::string(preload).find("ncclguard") != std::string::npos;
  CHECK(log.contains(behind_ncclguard ? "PROFILER/Plugin: Loaded ncclguard (v4)"
                                      : "PROFILER/Plugin: Loaded emu-v4-only (v4)"));
}

// ---- Lifetime ----------------------------------------------------------------------------------

namespace {

std::vector<RecordedCall> initsSince(size_t first) {
  const auto inits = EventLog(recordedCalls()).callsOf(CallKind::Init);
  return std::vector<RecordedCall>(inits.begin() + std::min(first, inits.size()), inits.end());
}

// The inits a new communicator of `nranks` ranks made: one per rank, named as expected.
void checkInits(const std::vector<RecordedCall>& inits, int nranks, const char* name) {
  REQUIRE(inits.size() == static_cast<size_t>(nranks));
  std::vector<int> ranks;
  for (const RecordedCall& init : inits) {
    ranks.push_back(init.rank);
    CHECK(init.nranks == nranks);
    CHECK(init.comm_id == inits[0].comm_id);
    CHECK(init.has_name == (name != nullptr));
    if (name != nullptr) CHECK(init.comm_name == name);
  }
  std::sort(ranks.begin(), ranks.end());
  for (int r = 0; r < nranks; ++r) CHECK(ranks[r] == r);
}

std::vector<ncclComm_t> initNonBlocking(LocalRanks& ranks, int n, const char* name) {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = name;
  std::vector<ncclComm_t> comms(n, nullptr);
  for (int r = 0; r < n; ++r) {
    ranks.makeCurrent(r);
    REQUIRE(ncclCommInitRankConfig(&comms[r], n, id, r, &config) == ncclInProgress);
  }
  for (ncclComm_t comm : comms) REQUIRE(nccltest::waitForAsyncResult(comm, ncclSuccess, 10s));
  return comms;
}

std::vector<ncclComm_t> initScalable(LocalRanks& ranks, int n) {
  std::vector<ncclUniqueId> ids(2);
  for (ncclUniqueId& id : ids) REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  std::vector<ncclComm_t> comms(n, nullptr);
  std::vector<ncclResult_t> results(n, ncclInternalError);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      if (cuCtxSetCurrent(ranks.context(r)) != CUDA_SUCCESS) return;
      results[r] = ncclCommInitRankScalable(&comms[r], n, r, 2, ids.data(), nullptr);
    });
  }
  for (std::thread& thread : threads) thread.join();
  REQUIRE(results == std::vector<ncclResult_t>(n, ncclSuccess));
  return comms;
}

}  // namespace

TEST_CASE(
    "init once per communicator on every init path; finalize at destroy and abort; reload after the last",
    "[lifecycle]") {
  InfoLog log;
  setenv("NCCL_PROFILER_PLUGIN", recorderPath().c_str(), 1);
  LocalRanks ranks(4);
  ranks.initAll();
  checkInits(initsSince(0), 4, nullptr);

  ncclConfig_t named = NCCL_CONFIG_INITIALIZER;
  named.commName = "split-child";
  std::vector<ncclComm_t> children(4, nullptr);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < 4; ++r)
    REQUIRE(ncclCommSplit(ranks.comm(r), r / 2, r, &children[r], &named) == ncclSuccess);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  const auto split_inits = initsSince(4);
  REQUIRE(split_inits.size() == 4);
  for (const RecordedCall& init : split_inits) {
    CHECK(init.nranks == 2);
    CHECK(init.comm_name == "split-child");
  }

  int excluded[] = {3};
  std::vector<ncclComm_t> shrunk(3, nullptr);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < 3; ++r) {
    REQUIRE(ncclCommShrink(ranks.comm(r), excluded, 1, &shrunk[r], nullptr, NCCL_SHRINK_DEFAULT) ==
            ncclSuccess);
  }
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  checkInits(initsSince(8), 3, nullptr);  // without a config: the parent's, which has no name

  const auto nonblocking = initNonBlocking(ranks, 2, "nonblocking");
  checkInits(initsSince(11), 2, "nonblocking");
  const auto scalable = initScalable(ranks, 2);
  checkInits(initsSince(13), 2, nullptr);

  for (ncclComm_t comm : children) REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  for (ncclComm_t comm : shrunk) REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  for (ncclComm_t comm : nonblocking) REQUIRE(ncclCommAbort(comm) == ncclSuccess);
  for (ncclComm_t comm : scalable) REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  CHECK(EventLog(recordedCalls()).callsOf(CallKind::Finalize).size() == 11);
  CHECK(loaded(recorderPath()));  // the first communicator still holds it
  ranks.destroyAll();

  // Every context finalized exactly once.
  const EventLog all(recordedCalls());
  std::vector<uint64_t> initialized, finalized;
  for (const RecordedCall& init : all.callsOf(CallKind::Init)) initialized.push_back(init.context);
  for (const RecordedCall& end : all.callsOf(CallKind::Finalize)) finalized.push_back(end.context);
  std::sort(initialized.begin(), initialized.end());
  std::sort(finalized.begin(), finalized.end());
  CHECK(initialized.size() == 15);
  CHECK(finalized == initialized);
  CHECK_FALSE(loaded(recorderPath()));

  // The next communicator loads the plugin afresh.
  ranks.initAll();
  CHECK(loaded(recorderPath()));
  checkInits(initsSince(15), 4, nullptr);
  CHECK(ncclguard::testing::CountOccurrences(log.text(), "PROFILER/Plugin: Loaded emu-recorder (v5)") == 2);
  ranks.destroyAll();
}

// NCCL reads its config files into the environment at its first call, without overriding it: a
// plugin named in $NCCL_CONF_FILE is loaded like one named in the environment, and a setting in the
// environment wins over the file's.
TEST_CASE("NCCL_PROFILER_PLUGIN in the file NCCL_CONF_FILE names is loaded, the environment winning over it",
          "[conf_file]") {
  InfoLog log;
  ncclguard::testing::TemporaryDirectory directory;
  const std::string conf = directory.path() + "/nccl.conf";
  {
    std::ofstream out(conf);
    out << "# a comment\nNCCL_PROFILER_PLUGIN=" << recorderPath() << "\r\nNCCL_EMU_UNUSED=1\nno equals sign\n";
  }
  setenv("NCCL_CONF_FILE", conf.c_str(), 1);
  setenv("NCCL_EMU_UNUSED", "from the environment", 1);
  REQUIRE(getenv("NCCL_PROFILER_PLUGIN") == nullptr);
  LocalRanks ranks(2);
  initWithMask(ranks, kAllV5Events);
  CHECK(std::string(text(getenv("NCCL_EMU_UNUSED"))) == "from the environment");
  REQUIRE(loaded(recorderPath()));
  // emu-recorder, or ncclguard with emu-recorder behind it when preloaded.
  CHECK(log.contains("NCCL INFO PROFILER/Plugin: Loaded "));
  CHECK(EventLog(recordedCalls()).callsOf(CallKind::Init).size() == 2);
  const std::vector<float*> buffers = allReduce(ranks, 1024);
  REQUIRE(ranks.synchronize());
  checkAllReduceResult(ranks, buffers, 1024);
  CHECK(waitForCalls([](const EventLog& events) { return stoppedKernelChannels(events) == 4; }));
}
