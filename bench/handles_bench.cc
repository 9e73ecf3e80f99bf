// What ncclguard's communicator handles (NCCLGUARD_RECOVER=inprocess) cost an intercepted call:
// ncclAllReduce through the shim, linked into this program, to a stand-in libnccl whose
// ncclAllReduce does nothing, on a communicator ncclguard does not record (so that only the
// wrapper and its translation are measured). First before any handle exists (what every process
// without NCCLGUARD_RECOVER=inprocess runs), then with NCCL's own communicator and with a handle
// once handles exist. Prints "translation_ns_per_call: N" (handle minus no handle, medians).
// With --without-recovery, the first figure only, in a process without NCCLGUARD_RECOVER=inprocess
// (in-process recovery is off: the wrapper loads one null pointer and looks into nothing).
#include <nccl.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <benchmark/benchmark.h>

#include "watchdog/recover/comm_handle.h"
#include "watchdog/recover/handles.h"

namespace {

// Read at the first NCCL call: slot 0 is the stand-in, and nothing is logged.
bool Configure(bool recovery) {
  return setenv("NCCLGUARD_NCCL_LIBRARY", FAKE_NCCL, 1) == 0 &&
         setenv("NCCLGUARD_LOG_LEVEL", "off", 1) == 0 &&
         (recovery ? setenv("NCCLGUARD_RECOVER", "inprocess", 1) : unsetenv("NCCLGUARD_RECOVER")) == 0;
}

std::uint64_t g_real_comm[4];  // the stand-in never looks at it
ncclComm_t RealComm() { return reinterpret_cast<ncclComm_t>(g_real_comm); }

void AllReduceLoop(benchmark::State& state, ncclComm_t comm) {
  float buffer[4] = {};
  for (auto _ : state) {
    benchmark::DoNotOptimize(ncclAllReduce(buffer, buffer, 4, ncclFloat32, ncclSum, comm, nullptr));
  }
}

void BM_AllReduceBeforeAnyHandle(benchmark::State& state) {
  if (ncclguard::g_comm_handles_made.load()) state.SkipWithError("handles already exist");
  AllReduceLoop(state, RealComm());
}

ncclComm_t Handle() {
  static ncclComm_t handle = reinterpret_cast<ncclComm_t>(ncclguard::NewCommHandle(RealComm(), 0));
  return handle;
}

void BM_AllReduceNcclCommWithHandles(benchmark::State& state) {
  Handle();
  AllReduceLoop(state, RealComm());
}

void BM_AllReduceOnHandle(benchmark::State& state) { AllReduceLoop(state, Handle()); }

// Registered in this order, and run in it: handles exist from the second one on.
BENCHMARK(BM_AllReduceBeforeAnyHandle)->Repetitions(9)->ReportAggregatesOnly(true);
BENCHMARK(BM_AllReduceNcclCommWithHandles)->Repetitions(9)->ReportAggregatesOnly(true);
BENCHMARK(BM_AllReduceOnHandle)->Repetitions(9)->ReportAggregatesOnly(true);

class MedianReporter final : public benchmark::ConsoleReporter {
 public:
  MedianReporter() : ConsoleReporter(OO_Tabular) {}
  std::vector<double> medians_ns;
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.aggregate_name == "median") medians_ns.push_back(run.GetAdjustedRealTime());
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  bool recovery = true;
  std::vector<char*> arguments;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--without-recovery") == 0) {
      recovery = false;
    } else {
      arguments.push_back(argv[i]);
    }
  }
  if (!Configure(recovery)) return 1;
  // The handle's figures need in-process recovery: without it only the first one means anything.
  char only_first[] = "--benchmark_filter=BM_AllReduceBeforeAnyHandle";
  if (!recovery) arguments.push_back(only_first);
  int count = static_cast<int>(arguments.size());
  benchmark::Initialize(&count, arguments.data());
  MedianReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  if (!recovery && reporter.medians_ns.size() == 1) {
    std::printf("intercepted_allreduce_ns: without in-process recovery %.1f\n", reporter.medians_ns[0]);
    return 0;
  }
  if (reporter.medians_ns.size() == 3) {
    std::printf(
        "intercepted_allreduce_ns: before any handle %.1f, NCCL's comm with handles %.1f, on a handle %.1f\n",
        reporter.medians_ns[0], reporter.medians_ns[1], reporter.medians_ns[2]);
    std::printf("translation_ns_per_call: %.1f\n", reporter.medians_ns[2] - reporter.medians_ns[0]);
  }
  return 0;
}
