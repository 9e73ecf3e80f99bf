// Identifiers and facts for every row of the NCCL API table, shared by the shim and the watchdog.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "watchdog/common/nccl_api_table.h"

namespace ncclguard {

enum class ApiKind : std::uint8_t {
  kCollective,
  kPointToPoint,
  kGroup,
  kCommCreate,
  kCommLifecycle,
  kQuery,
  kMemory,
  kRegistration,
  kError,
  kDebug,
};

enum class Api : std::uint16_t {
#define NCCLGUARD_API_ENUMERATOR(name, ret, kind, since, params, args) name,
  NCCLGUARD_FOR_EACH_NCCL_API(NCCLGUARD_API_ENUMERATOR)
#undef NCCLGUARD_API_ENUMERATOR
};

struct ApiInfo {
  std::string_view name;
  ApiKind kind;
  int since;                        // NCCL_VERSION code of the first release that declared the function
  std::string_view argument_names;  // "(sendbuff, recvbuff, count, ...)"
};

inline constexpr ApiInfo kApis[] = {
#define NCCLGUARD_API_INFO(name, ret, kind, since, params, args) {#name, ApiKind::k##kind, since, #args},
    NCCLGUARD_FOR_EACH_NCCL_API(NCCLGUARD_API_INFO)
#undef NCCLGUARD_API_INFO
};

inline constexpr int kApiCount = sizeof(kApis) / sizeof(kApis[0]);

constexpr const ApiInfo& Describe(Api api) { return kApis[static_cast<int>(api)]; }

constexpr bool IsOperation(Api api) {
  const ApiKind kind = Describe(api).kind;
  return kind == ApiKind::kCollective || kind == ApiKind::kPointToPoint;
}

// Finds the table row of an NCCL function name. Cheap enough for every dlsym() of the process:
// names that do not start with "nccl" are rejected before the table is searched.
constexpr std::optional<Api> FindApi(std::string_view name) {
  if (name.substr(0, 4) != "nccl") return std::nullopt;
  for (int i = 0; i < kApiCount; ++i) {
    if (kApis[i].name == name) return static_cast<Api>(i);
  }
  return std::nullopt;
}

}  // namespace ncclguard
