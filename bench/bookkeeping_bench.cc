// ncclguard's own cost per collective, without any driver: BeforeOperation/AfterOperation with GPU
// events that cost nothing, on a communicator whose operations the "GPU" finishes at once. This
// is the figure the project's target (at most 100 ns beyond the driver's event calls) is about.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <iostream>

#include "watchdog/record/hooks.h"
#include "watchdog/state/registry.h"

namespace {

using namespace ncclguard;

// Every event is reached as soon as it is asked about, and every call is free.
class FreeEvents final : public GpuEvents {
 public:
  bool Available() override { return true; }
  GpuContext CurrentContext() override { return nullptr; }
  bool IsCapturing(GpuStream) override { return false; }
  GpuEvent Create() override { return reinterpret_cast<GpuEvent>(++created_); }
  bool Record(GpuEvent, GpuStream) override { return true; }
  EventStatus Query(GpuContext, GpuEvent) override { return EventStatus::kReached; }
  float ElapsedMs(GpuContext, GpuEvent, GpuEvent) override { return 0; }
  void Destroy(GpuContext, GpuEvent) override {}
  void PrepareWatchdogThread() override {}

 private:
  std::uintptr_t created_ = 0;
};

void BM_Bookkeeping(benchmark::State& state) {
  static FreeEvents events;
  ReplaceGpuEventsForTesting(&events);
  CommState* comm = GetRegistry().Add(reinterpret_cast<ncclComm_t>(0x1000), 0, 2048);
  comm->lifecycle = CommLifecycle::kReady;
  OperationArguments arguments;
  arguments.comm = comm->handle;
  arguments.stream = reinterpret_cast<void*>(0x10);
  arguments.count = 1024;
  arguments.datatype = ncclFloat32;
  arguments.reduction = ncclSum;
  for (auto _ : state) {
    const Ticket ticket = BeforeOperation(Api::ncclAllReduce, 0, arguments);
    AfterOperation(ticket, ncclSuccess);
    benchmark::DoNotOptimize(ticket.seq);
  }
  ReplaceGpuEventsForTesting(nullptr);
}
BENCHMARK(BM_Bookkeeping)->Repetitions(9)->ReportAggregatesOnly(true);

class MedianReporter final : public benchmark::ConsoleReporter {
 public:
  MedianReporter() : ConsoleReporter(OO_Tabular) {}  // no colour codes before the figure line
  double median_ns = 0;
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.aggregate_name == "median") median_ns = run.GetAdjustedRealTime();
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  MedianReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  std::cout.flush();
  std::printf("bookkeeping_ns_per_collective: %.1f\n", reporter.median_ns);
  benchmark::Shutdown();
  return 0;
}
