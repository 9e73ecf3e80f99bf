// Renders an intercepted call's arguments and result for the log. Only used when the log level
// asks for it: nothing here runs on the hot path otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

#include "watchdog/common/nccl_api.h"

namespace ncclguard {

std::string_view ResultName(ncclResult_t result);
// An error, as opposed to success or a non-blocking call still in progress.
constexpr bool IsNcclError(ncclResult_t result) { return result != ncclSuccess && result != ncclInProgress; }

inline void AppendValue(fmt::memory_buffer& out, ncclResult_t value) {
  fmt::format_to(std::back_inserter(out), "{}", ResultName(value));
}
inline void AppendValue(fmt::memory_buffer& out, const ncclUniqueId& id) {
  // The first 16 bytes (magic and the root's address family and port) tell ids apart.
  fmt::format_to(std::back_inserter(out), "id:");
  for (int i = 0; i < 16; ++i) {
    fmt::format_to(std::back_inserter(out), "{:02x}", static_cast<unsigned char>(id.internal[i]));
  }
}
inline void AppendValue(fmt::memory_buffer& out, const char* text) {
  fmt::format_to(std::back_inserter(out), "\"{}\"", text != nullptr ? text : "(null)");
}
template <typename T>
void AppendValue(fmt::memory_buffer& out, const T& value) {
  if constexpr (std::is_pointer_v<T>) {
    fmt::format_to(std::back_inserter(out), "{}", fmt::ptr(reinterpret_cast<const void*>(value)));
  } else if constexpr (std::is_enum_v<T>) {
    fmt::format_to(std::back_inserter(out), "{}", static_cast<std::underlying_type_t<T>>(value));
  } else {
    fmt::format_to(std::back_inserter(out), "{}", value);
  }
}

// "name(a=1, b=0x10)" from the table's argument names and the values.
template <typename... Args>
std::string DescribeCall(Api api, const Args&... args) {
  const ApiInfo& info = Describe(api);
  fmt::memory_buffer out;
  fmt::format_to(std::back_inserter(out), "{}(", info.name);
  std::string_view names = info.argument_names.substr(1, info.argument_names.size() - 2);
  bool first = true;
  [[maybe_unused]] auto append_one = [&](const auto& value) {
    const size_t comma = names.find(',');
    std::string_view name = names.substr(0, comma);
    names = comma == std::string_view::npos ? std::string_view() : names.substr(comma + 1);
    while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
    fmt::format_to(std::back_inserter(out), "{}{}=", first ? "" : ", ", name);
    AppendValue(out, value);
    first = false;
  };
  (append_one(args), ...);
  out.push_back(')');
  return fmt::to_string(out);
}

}  // namespace ncclguard
