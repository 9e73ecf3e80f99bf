// The rank a launcher (torchrun, Slurm, Open MPI, PMI, PMIx, Paddle) gave this process, read the
// same way for the log prefix and for dumps and status files, so that they name the same rank.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"

namespace ncclguard {

// In order of preference: the variables that hold a process's rank in the whole job.
inline constexpr std::array<std::string_view, 6> kLauncherRankVariables = {
    "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "PADDLE_TRAINER_ID"};

// The value of a variable, or std::nullopt when it is not set.
using VariableLookup = absl::FunctionRef<std::optional<std::string>(std::string_view name)>;

// The first of kLauncherRankVariables whose value is a rank (a non-negative decimal number);
// -1 when none is.
int LauncherRankFrom(VariableLookup lookup);

// LauncherRankFrom this process's environment.
int LauncherRankFromEnvironment();

}  // namespace ncclguard
