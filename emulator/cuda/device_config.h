// The emulated machine as NCCLEMU_* variables describe it. Shared by the emulated libcuda and
// libnvidia-ml, which each read the variables they expose, so both report the same devices.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ncclemu {

struct PciLocation {
  unsigned domain;
  unsigned bus;
  unsigned device;
};

// Each reader prints one line on stderr naming the variable when its value is bad, and returns
// the default.
int readDeviceCount();
std::string readGpuName();
std::size_t readGpuMemoryBytes();
std::string readDriverVersionString();
int readCudaDriverVersion();
// NCCLEMU_FREES_WAIT: whether cuMemFree and cuMemFreeHost first wait for the device to finish the
// work queued on its streams, as the real driver does (default on; 0 models a driver that does not).
bool readFreesWait();
// Row r, column c: whether device r can access device c. Sized device_count x device_count.
std::vector<std::vector<bool>> readP2pMatrix(int device_count);

PciLocation pciLocation(int device_index);
// "0000:18:00.0": the form cuDeviceGetPCIBusId returns.
std::string pciBusId(int device_index);

struct GpuModel {
  int compute_major;
  int compute_minor;
  int multiprocessors;
  int pci_device_id;  // the PCI device id NVIDIA assigned to that product
};
// Known products by name, so a "GeForce RTX 4090" looks like one; anything else looks like an H100.
GpuModel gpuModelForName(const std::string& name);

// 16 bytes derived from the device index only: stable across runs and processes.
void deviceUuid(int device_index, unsigned char out[16]);

}  // namespace ncclemu
