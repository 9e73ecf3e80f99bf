#include "watchdog/report/job_id.h"

#include <cstddef>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "watchdog/common/config.h"
#include "watchdog/common/files.h"
#include "watchdog/common/fnv1a.h"

namespace ncclguard {
namespace {

// SafeFileName keeps 100 characters; a longer id keeps fewer and a hash of the whole, so that two
// ids that differ only at their end stay apart.
constexpr std::size_t kMaxIdLength = 100;
constexpr std::size_t kHashDigits = 16;

std::string Variable(const EnvironmentReader& read_environment, const char* name) {
  std::string value;
  if (!read_environment || !read_environment(name, &value)) return {};
  return std::string(absl::StripAsciiWhitespace(value));
}

std::string BoundedFileName(const std::string& text) {
  if (text.size() <= kMaxIdLength) return SafeFileName(text);
  const std::string kept = text.substr(0, kMaxIdLength - kHashDigits - 1);
  return SafeFileName(fmt::format("{}-{:016x}", kept, Fnv1a(text.data(), text.size())));
}

}  // namespace

std::optional<std::string> LauncherJobId(const EnvironmentReader& read_environment) {
  std::vector<std::string> ids;
  if (std::string job = Variable(read_environment, "SLURM_JOB_ID"); !job.empty()) {
    const std::string step = Variable(read_environment, "SLURM_STEP_ID");
    ids.push_back(absl::StrCat("slurm-", job, step.empty() ? "" : ".", step));
  }
  // The launchers' defaults when the user names nothing (torchrun's --rdzv-id "none", Paddle's
  // --job_id "default") are shared by unrelated runs, so they are not ids.
  static constexpr std::tuple<const char*, const char*, const char*> kLaunchers[] = {
      {"TORCHELASTIC_RUN_ID", "torchelastic-", "none"},
      {"PADDLE_JOB_ID", "paddle-", "default"},
      {"OMPI_MCA_ess_base_jobid", "ompi-", ""},
      {"PMIX_NAMESPACE", "pmix-", ""},
      {"LSB_JOBID", "lsf-", ""},
      {"PBS_JOBID", "pbs-", ""},
      {"FLUX_JOB_ID", "flux-", ""}};
  for (const auto& [name, prefix, shared_default] : kLaunchers) {
    if (std::string id = Variable(read_environment, name); !id.empty() && id != shared_default)
      ids.push_back(prefix + id);
  }
  if (ids.empty()) return std::nullopt;
  return BoundedFileName(absl::StrJoin(ids, "_"));
}

std::optional<std::string> NamedJobId(const EnvironmentReader& read_environment) {
  if (std::string id = Variable(read_environment, "NCCLGUARD_JOB_ID"); !id.empty()) return SafeFileName(id);
  return LauncherJobId(read_environment);
}

std::string JobId(const EnvironmentReader& read_environment, const std::string& first_unique_id_hex) {
  if (std::optional<std::string> named = NamedJobId(read_environment)) return *std::move(named);
  return SafeFileName(
      "nccl-" + (first_unique_id_hex.empty() ? std::string("unknown") : first_unique_id_hex.substr(0, 32)));
}

std::string LaunchId(const EnvironmentReader& read_environment) {
  if (std::string id = Variable(read_environment, "NCCLGUARD_LAUNCH_ID"); !id.empty())
    return BoundedFileName(id);
  return LauncherJobId(read_environment).value_or("");
}

}  // namespace ncclguard
