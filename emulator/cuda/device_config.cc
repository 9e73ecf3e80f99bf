#include "device_config.h"

#include <array>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace ncclemu {
namespace {

constexpr int kDefaultDeviceCount = 8;
constexpr int kMaxDeviceCount = 64;
constexpr const char* kDefaultGpuName = "NVIDIA H100 80GB HBM3";
constexpr long long kDefaultGpuMemoryMb = 81559;
constexpr const char* kDefaultDriverVersion = "580.65.06";
constexpr int kDefaultCudaDriverVersion = 13000;
// As the real driver (580, on an H200: scripts/gpu-check.sh, check `parked`).
constexpr int kDefaultFreesWait = 1;

const char* envValue(const char* name) {
  const char* value = std::getenv(name);
  return (value != nullptr && *value != '\0') ? value : nullptr;
}

void reportBadValue(const char* name, const char* value, const char* expected, const std::string& fallback) {
  std::fprintf(stderr, "ncclemu: %s='%s' is invalid (expected %s); using %s\n", name, value, expected,
               fallback.c_str());
}

bool parseInteger(std::string_view text, long long& out) {
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), out);
  return error == std::errc() && end == text.data() + text.size();
}

long long readIntegerInRange(const char* name, long long fallback, long long min, long long max) {
  const char* value = envValue(name);
  if (value == nullptr) return fallback;
  long long parsed = 0;
  if (parseInteger(value, parsed) && parsed >= min && parsed <= max) return parsed;
  std::string expected = "an integer from " + std::to_string(min) + " to " + std::to_string(max);
  reportBadValue(name, value, expected.c_str(), std::to_string(fallback));
  return fallback;
}

// A kernel driver version as nvidia-smi prints it: two or three dot-separated numbers.
bool isDriverVersionString(std::string_view text) {
  int parts = 0;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t dot = text.find('.', start);
    std::string_view part =
        text.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    if (part.empty() || part.size() > 4) return false;
    for (char c : part) {
      if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    }
    ++parts;
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return parts == 2 || parts == 3;
}

constexpr std::array<unsigned, 8> kBusNumbers = {0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb};

}  // namespace

int readDeviceCount() {
  return static_cast<int>(readIntegerInRange("NCCLEMU_DEVICES", kDefaultDeviceCount, 0, kMaxDeviceCount));
}

std::string readGpuName() {
  const char* value = envValue("NCCLEMU_GPU_NAME");
  if (value == nullptr) return kDefaultGpuName;
  std::string name = value;
  // CUDA and NVML hand names out in fixed buffers (NVML's is 96 bytes).
  if (name.size() < 96) return name;
  reportBadValue("NCCLEMU_GPU_NAME", value, "a name shorter than 96 characters", kDefaultGpuName);
  return kDefaultGpuName;
}

std::size_t readGpuMemoryBytes() {
  long long mb = readIntegerInRange("NCCLEMU_GPU_MEMORY_MB", kDefaultGpuMemoryMb, 1, 1LL << 30);
  return static_cast<std::size_t>(mb) << 20;
}

std::string readDriverVersionString() {
  const char* value = envValue("NCCLEMU_DRIVER_VERSION");
  if (value == nullptr) return kDefaultDriverVersion;
  if (isDriverVersionString(value)) return value;
  reportBadValue("NCCLEMU_DRIVER_VERSION", value, "a version such as 545.23.08", kDefaultDriverVersion);
  return kDefaultDriverVersion;
}

int readCudaDriverVersion() {
  return static_cast<int>(
      readIntegerInRange("NCCLEMU_CUDA_DRIVER_VERSION", kDefaultCudaDriverVersion, 1000, 99999));
}

bool readFreesWait() { return readIntegerInRange("NCCLEMU_FREES_WAIT", kDefaultFreesWait, 0, 1) == 1; }

std::vector<std::vector<bool>> readP2pMatrix(int device_count) {
  auto uniform = [device_count](bool access) {
    std::vector<std::vector<bool>> matrix(device_count, std::vector<bool>(device_count, access));
    for (int i = 0; i < device_count; ++i) matrix[i][i] = false;
    return matrix;
  };
  const char* value = envValue("NCCLEMU_P2P_ACCESS");
  if (value == nullptr) return uniform(true);
  std::string_view text = value;
  if (text == "1") return uniform(true);
  if (text == "0") return uniform(false);

  std::vector<std::vector<bool>> matrix;
  bool valid = true;
  std::size_t start = 0;
  while (valid && start <= text.size()) {
    std::size_t comma = text.find(',', start);
    std::string_view row =
        text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    valid = row.size() == static_cast<std::size_t>(device_count);
    std::vector<bool> access;
    for (char c : row) {
      valid = valid && (c == '0' || c == '1');
      access.push_back(c == '1');
    }
    matrix.push_back(std::move(access));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (valid && matrix.size() == static_cast<std::size_t>(device_count)) {
    for (int i = 0; i < device_count; ++i) matrix[i][i] = false;
    return matrix;
  }
  std::string expected = "1, 0, or " + std::to_string(device_count) + " comma-separated rows of " +
                         std::to_string(device_count) + " digits 0/1";
  reportBadValue("NCCLEMU_P2P_ACCESS", value, expected.c_str(), "1");
  return uniform(true);
}

PciLocation pciLocation(int device_index) {
  // The first eight follow a DGX H100's layout; more devices continue in further PCI domains.
  const auto index = static_cast<unsigned>(device_index);
  const auto buses = static_cast<unsigned>(kBusNumbers.size());
  return PciLocation{index / buses, kBusNumbers[index % buses], 0};
}

std::string pciBusId(int device_index) {
  PciLocation location = pciLocation(device_index);
  char text[32];
  std::snprintf(text, sizeof text, "%04X:%02X:%02X.0", location.domain, location.bus, location.device);
  return text;
}

GpuModel gpuModelForName(const std::string& name) {
  struct Known {
    const char* name_part;
    GpuModel model;
  };
  static constexpr Known kKnown[] = {
      {"H100", {9, 0, 132, 0x2330}}, {"H200", {9, 0, 132, 0x2335}},     {"B200", {10, 0, 148, 0x2901}},
      {"A100", {8, 0, 108, 0x20b2}}, {"RTX 4090", {8, 9, 128, 0x2684}}, {"RTX 3090", {8, 6, 82, 0x2204}},
      {"A6000", {8, 6, 84, 0x2230}}, {"L40S", {8, 9, 142, 0x26b9}},     {"V100", {7, 0, 80, 0x1db5}},
  };
  for (const Known& known : kKnown) {
    if (name.find(known.name_part) != std::string::npos) return known.model;
  }
  return kKnown[0].model;
}

void deviceUuid(int device_index, unsigned char out[16]) {
  static constexpr unsigned char kPrefix[12] = {0x6e, 0x63, 0x63, 0x6c, 0x65, 0x6d,
                                                0x75, 0x2d, 0x67, 0x70, 0x75, 0x2d};
  for (int i = 0; i < 12; ++i) out[i] = kPrefix[i];
  for (int i = 0; i < 4; ++i)
    out[12 + i] = static_cast<unsigned char>(static_cast<unsigned>(device_index) >> (24 - 8 * i));
}

}  // namespace ncclemu
