// What ncclguard records of NCCL's profiler events (state/profiles.h), in plain types that the
// shim, which receives the events (shim/profiler.cc), and the reports, which write them into dumps,
// can both see.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ncclguard {

inline constexpr int kProfiledOps = 8;
inline constexpr int kProfiledChannels = 32;
inline constexpr int kProfiledProxyOps = 64;
inline constexpr int kStepsInFlight = 8;  // NCCL's NCCL_STEPS: steps a proxy operation has in flight

// Where a proxy operation's step waits (NCCL's ncclProfilerProxyStep* states), by what it waits for.
enum class StepWait : std::uint8_t {
  kNone,
  kSendGpu,    // the GPU has not filled the buffer yet
  kSendPeer,   // filled; the peer has not given credit for it yet
  kSendNet,    // sent; the network has not completed it
  kRecvNet,    // posted; nothing received yet
  kRecvFlush,  // received; being flushed
  kRecvGpu,    // received; the GPU has not consumed it
};
inline const char* StepWaitName(StepWait wait) {
  switch (wait) {
    case StepWait::kNone:
      return "none";
    case StepWait::kSendGpu:
      return "send_gpu_wait";
    case StepWait::kSendPeer:
      return "send_peer_wait";
    case StepWait::kSendNet:
      return "send_net_wait";
    case StepWait::kRecvNet:
      return "recv_net_wait";
    case StepWait::kRecvFlush:
      return "recv_flush_wait";
    case StepWait::kRecvGpu:
      return "recv_gpu_wait";
  }
  return "none";
}
// The wait StepWaitName names `name`; nothing for a name that is none (a file's mistake).
inline std::optional<StepWait> StepWaitNamed(std::string_view name) {
  for (const StepWait wait : {StepWait::kNone, StepWait::kSendGpu, StepWait::kSendPeer, StepWait::kSendNet,
                              StepWait::kRecvNet, StepWait::kRecvFlush, StepWait::kRecvGpu}) {
    if (name == StepWaitName(wait)) return wait;
  }
  return std::nullopt;
}

class CommProfile;  // state/profiles.h
struct OpRecord;    // state/records.h

// A reference to an operation, or to one of its kernel channels, proxy operations or steps.
struct ProfileRef {
  CommProfile* comm = nullptr;
  std::uint32_t generation = 0;  // of the operation's slot
  std::int16_t slot = -1;
  std::int16_t proxy = -1;
  // The channel (kernel channel), the step (proxy step), or whether a send counts in its pace
  // block (proxy operation: state/profiles.cc).
  std::int32_t index = -1;
  // The ring record of ncclguard's operation it belongs to, while that holds operation
  // `record_seq`: NCCL's API event ties it, and the events below the API event inherit it.
  OpRecord* record = nullptr;
  std::uint64_t record_seq = 0;
  bool valid() const { return comm != nullptr && slot >= 0; }
};

struct ChannelSnapshot {
  int channel = 0;
  bool stopped = false;
  std::int64_t gpu_start_ns = 0;  // the GPU's global timer
  std::int64_t gpu_stop_ns = 0;
};

struct ProxyOpSnapshot {
  int channel = 0;
  int peer = -1;
  bool send = false;
  int steps = 0;  // to do
  int steps_done = 0;
  bool stopped = false;
  // Send steps on the network (NCCL's SendWait state): their time there, their bytes (NCCL's
  // transSize; 0 when it gave none) and how many.
  std::int64_t network_ns = 0;
  std::uint64_t network_bytes = 0;
  int network_steps = 0;
  // The oldest step in flight: its number, what it waits for and since when (epoch ns).
  int waiting_step = -1;
  StepWait waiting = StepWait::kNone;
  std::int64_t waiting_since_ns = 0;
};

struct OpProfileSnapshot {
  std::string func;            // NCCL's name: "AllReduce", "Send", ...
  std::uint64_t nccl_seq = 0;  // NCCL's count of this communicator's operations of `func`
  std::uint64_t seq = 0;       // ncclguard's operation, 0 when not known
  std::string algo;
  std::string proto;
  int channels = 0;
  int peer = -1;              // point-to-point
  std::int64_t start_ns = 0;  // epoch ns
  std::vector<ChannelSnapshot> kernel_channels;
  std::vector<ProxyOpSnapshot> proxy_ops;
};

// Whether a kernel channel or a proxy operation of `op` is still running.
inline bool StillRunning(const OpProfileSnapshot& op) {
  for (const ChannelSnapshot& channel : op.kernel_channels) {
    if (!channel.stopped) return true;
  }
  for (const ProxyOpSnapshot& proxy : op.proxy_ops) {
    if (!proxy.stopped) return true;
  }
  return false;
}

struct CommProfileSnapshot {
  std::string comm_id;
  int rank = -1;
  std::vector<OpProfileSnapshot> ops;  // oldest first
};

// What an operation is, at its start.
struct ProfiledOpStart {
  const char* func = "";
  std::uint64_t nccl_seq = 0;
  const char* algo = "";
  const char* proto = "";
  int channels = 0;
  int peer = -1;
};

}  // namespace ncclguard
