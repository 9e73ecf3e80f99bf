// PyTorch's Flight Recorder dump format, written from ncclguard's own records so that PyTorch's
// analyzer (`torchfrtrace`, python -m torch.distributed.flight_recorder.fr_trace) and the tools
// built on it read a job that ran without PyTorch, or whose PyTorch recorded nothing. One pickle
// per rank, named <prefix><global rank> as ProcessGroupNCCL names its own; format version 2.10.
// The facts of the format this relies on, with the PyTorch files they come from, are in
// docs/formats.md.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "watchdog/report/facts.h"
#include "watchdog/report/job_read.h"
#include "watchdog/report/snapshot.h"

namespace ncclguard {

inline constexpr std::string_view kFlightRecorderVersion = "2.10";
// The file name of ProcessGroupNCCL's default TORCH_NCCL_DEBUG_INFO_TEMP_FILE prefix
// (/tmp/nccl_trace_rank_), followed by the rank.
inline constexpr std::string_view kFlightRecorderFilePrefix = "nccl_trace_rank_";

// The global rank of each rank of each communicator (by communicator id), -1 where unknown: the
// members of a process group in FR's pg_config, the same list in every rank's file.
using CommMembers = std::map<std::string, std::vector<int>>;

// Which of FR's states an operation that has not completed is in. PyTorch knows an operation
// started only with TORCH_NCCL_ENABLE_TIMING=1 (it then records a start event); by default every
// operation not completed is "scheduled", and tools built on FR dumps (NVIDIA resiliency-ext's
// attribution) look for the hang among the "scheduled" ones.
enum class FlightRecorderStates {
  kUntimed,  // completed or scheduled, as PyTorch writes by default
  kTimed,    // completed, started (ncclguard saw it running on the GPU) or scheduled
};

// FR's name of an NCCL operation ("AllReduce" → "all_reduce"); std::nullopt for an operation its
// analyzer does not know, which must stay out of the dump (the analyzer stops on it).
std::optional<std::string_view> FlightRecorderOpName(std::string_view op);
// c10's name of a dtype ("float32" → "Float").
std::string_view FlightRecorderDtype(std::string_view dtype);

// The dump of one process: its communicators in `members` as process groups named by their ids,
// their operations oldest first, each ncclGroupStart/End block on one communicator closed by a
// "nccl:coalesced" entry. A communicator not in `members` is left out with its operations: FR's
// analyzer needs every group's members, the same in every rank's file.
std::string FlightRecorderDump(const ProcessSnapshot& snapshot, const CommMembers& members,
                               FlightRecorderStates states);

// The rank a process's file is named by: the launcher's rank, else the best known.
int FlightRecorderRank(const ProcessView& process);

// The ranks a process writes files for. A process drives one rank, named by `process_rank`, or
// several devices, each with its own rank of the same communicator (as JAX and XLA drive a host's
// GPUs): then one file per device, holding that device's communicators, named by the device's
// rank in the widest communicator the process has on several devices (the job's world).
struct FlightRecorderRankOf {
  int rank = -1;
  int device = -1;  // -1: every communicator of the process
};
std::vector<FlightRecorderRankOf> FlightRecorderRanks(const ProcessSnapshot& snapshot, int process_rank);
// The communicators of `snapshot` on `device` (every one for -1): what one rank's file holds.
ProcessSnapshot DeviceSnapshot(const ProcessSnapshot& snapshot, int device);

// What a process knows alone of its communicators' members, at dump time: a communicator of the
// launcher's world size (WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS) in which the
// process's rank is its global rank spans the job (rank i is global rank i), and one of a single
// rank is the process. In a process that drives several devices, the widest communicator names
// the ranks (FlightRecorderRanks): its rank i is global rank i. The members of other communicators
// are known only from the whole job (FlightRecorderFiles).
CommMembers OwnCommMembers(const ProcessSnapshot& snapshot, const ProcessFacts& facts);

// NCCLGUARD_FLIGHT_RECORDER_DIR at dump time: the process's file, <directory>/nccl_trace_rank_<rank>
// (one per device of a process that drives several, FlightRecorderRanks), replaced atomically, with
// the communicators of OwnCommMembers. Never throws; the paths written.
absl::StatusOr<std::vector<std::string>> WriteOwnFlightRecorder(const std::string& directory,
                                                                const ProcessSnapshot& snapshot,
                                                                const ProcessFacts& facts) noexcept;

struct FlightRecorderFile {
  int rank = -1;
  std::string contents;
};
// A file for every rank of the job's processes (FlightRecorderRanks; the newest process of a rank
// when there are several), with the communicators' members taken from the whole job.
std::vector<FlightRecorderFile> FlightRecorderFiles(const JobView& job, FlightRecorderStates states);

}  // namespace ncclguard
