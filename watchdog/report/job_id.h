// What names a job: the name of its job directory (and of its keys on a Redis board), and what
// tells the attempts of one job from another job that shares that name.
#pragma once

#include <optional>
#include <string>

#include "watchdog/common/config.h"

namespace ncclguard {

// Every launcher id present, in a fixed order and joined with '_': the Slurm job (with its step,
// when there is one), the TorchElastic run, the Paddle job, the Open MPI job, the PMIx namespace,
// the LSF, PBS and Flux jobs. Two torchrun jobs in one Slurm allocation differ in their run id
// although they share the Slurm job, so no single id names a job. A safe file name; one too long
// for a file name keeps its beginning and a hash of the whole. nullopt when no launcher names the
// job (their shared defaults, torchrun's "none" and Paddle's "default", name nothing).
std::optional<std::string> LauncherJobId(const EnvironmentReader& read_environment);

// The name of the job's directory, the same on every process of one launch: NCCLGUARD_JOB_ID,
// else LauncherJobId, else "nccl-" + the first communicator's unique id in hex (which every rank
// of that communicator shares). Reduced to a safe file name.
std::string JobId(const EnvironmentReader& read_environment, const std::string& first_unique_id_hex);

// The job's name when the user or the launcher gives one (NCCLGUARD_JOB_ID or LauncherJobId);
// nullopt when only the first communicator could name the job.
std::optional<std::string> NamedJobId(const EnvironmentReader& read_environment);

// What the attempts of one job share and another job does not, even under the same job id (a
// NCCLGUARD_JOB_ID given to several jobs): NCCLGUARD_LAUNCH_ID (which `ncclguard run` sets for
// every attempt it starts), else LauncherJobId (torchrun keeps its run id across restarts, Slurm its
// job and step ids), else "".
std::string LaunchId(const EnvironmentReader& read_environment);

}  // namespace ncclguard
