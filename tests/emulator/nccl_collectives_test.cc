// Every collective, datatype and reduction of the emulated NCCL against a reference computed
// here, with ranks as devices of one process. Narrow floating types are rounded with CUDA's own
// host conversions, an implementation independent of the emulator's.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "nccl_test_support.h"

namespace {

using nccltest::LocalRanks;
using Bytes = std::vector<unsigned char>;

constexpr int kRanks = 3;
constexpr size_t kCount = 1001;

const std::vector<ncclDataType_t> kAllTypes = {ncclInt8,   ncclUint8,   ncclInt32,    ncclUint32,
                                               ncclInt64,  ncclUint64,  ncclFloat16,  ncclFloat32,
                                               ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};

size_t sizeOf(ncclDataType_t type) {
  switch (type) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

bool isFloating(ncclDataType_t type) { return type >= ncclFloat16; }
bool isUnsigned(ncclDataType_t type) { return type == ncclUint8 || type == ncclUint32 || type == ncclUint64; }

template <class T>
void put(Bytes& out, T value) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(&value);
  out.insert(out.end(), bytes, bytes + sizeof(T));
}

// Appends value in the type's encoding, rounding to nearest even like the GPU conversions.
void encode(Bytes& out, ncclDataType_t type, double value) {
  switch (type) {
    case ncclInt8: put(out, static_cast<int8_t>(value)); break;
    case ncclUint8: put(out, static_cast<uint8_t>(value)); break;
    case ncclInt32: put(out, static_cast<int32_t>(value)); break;
    case ncclUint32: put(out, static_cast<uint32_t>(value)); break;
    case ncclInt64: put(out, static_cast<int64_t>(value)); break;
    case ncclUint64: put(out, static_cast<uint64_t>(value)); break;
    case ncclFloat32: put(out, static_cast<float>(value)); break;
    case ncclFloat64: put(out, value); break;
    case ncclFloat16: put(out, static_cast<__half_raw>(__float2half_rn(static_cast<float>(value))).x); break;
    case ncclBfloat16: put(out, static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(static_cast<float>(value))).x); break;
    case ncclFloat8e4m3: put(out, __nv_cvt_float_to_fp8(static_cast<float>(value), __NV_SATFINITE, __NV_E4M3)); break;
    case ncclFloat8e5m2: put(out, __nv_cvt_float_to_fp8(static_cast<float>(value), __NV_SATFINITE, __NV_E5M2)); break;
    default: FAIL("unknown type");
  }
}

// The value a datatype really holds for `value` (e.g. 1/3 in fp8).
double representable(ncclDataType_t type, double value) {
  Bytes bytes;
  encode(bytes, type, value);
  switch (type) {
    case ncclFloat16: return __half2float(*reinterpret_cast<const __half*>(bytes.data()));
    case ncclBfloat16: return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(bytes.data()));
    case ncclFloat8e4m3: return __half2float(__half(__nv_cvt_fp8_to_halfraw(bytes[0], __NV_E4M3)));
    case ncclFloat8e5m2: return __half2float(__half(__nv_cvt_fp8_to_halfraw(bytes[0], __NV_E5M2)));
    case ncclFloat32: return static_cast<float>(value);
    default: return value;
  }
}

// Small values, exact in every type; floats get halves too.
double inputValue(ncclDataType_t type, int rank, size_t index) {
  const int spread = static_cast<int>((index * 7 + rank * 3) % 7);
  if (isUnsigned(type)) return spread % 6;
  return isFloating(type) ? (spread - 3) * 0.5 : spread - 3;
}

enum class Reduction { Sum, Prod, Max, Min, Avg, PreMulSumHost, PreMulSumDevice };
const std::map<Reduction, std::string> kReductionNames = {
    {Reduction::Sum, "sum"}, {Reduction::Prod, "prod"}, {Reduction::Max, "max"}, {Reduction::Min, "min"},
    {Reduction::Avg, "avg"}, {Reduction::PreMulSumHost, "premulsum-host"}, {Reduction::PreMulSumDevice, "premulsum-device"}};

double preMulScalar(ncclDataType_t type) { return isFloating(type) ? 0.5 : 2; }

// The documented order: rank 0, 1, ..., n-1, accumulated in float (double for Float64, exact
// integers for integer types) and rounded to the datatype once.
double referenceReduce(ncclDataType_t type, Reduction reduction, const std::vector<double>& values) {
  const int n = static_cast<int>(values.size());
  if (!isFloating(type)) {
    int64_t acc = 0;
    for (int r = 0; r < n; ++r) {
      int64_t v = static_cast<int64_t>(values[r]);
      if (reduction == Reduction::PreMulSumHost || reduction == Reduction::PreMulSumDevice) v *= 2;
      if (r == 0) { acc = v; continue; }
      switch (reduction) {
        case Reduction::Prod: acc *= v; break;
        case Reduction::Max: acc = std::max(acc, v); break;
        case Reduction::Min: acc = std::min(acc, v); break;
        default: acc += v; break;
      }
    }
    return static_cast<double>(reduction == Reduction::Avg ? acc / n : acc);
  }
  auto fold = [&](auto acc) {
    using Compute = decltype(acc);
    Compute scalar = 1;
    if (reduction == Reduction::Avg) scalar = static_cast<Compute>(representable(type, 1.0 / n));
    if (reduction == Reduction::PreMulSumHost || reduction == Reduction::PreMulSumDevice) scalar = static_cast<Compute>(preMulScalar(type));
    const bool premultiply = reduction == Reduction::Avg || reduction == Reduction::PreMulSumHost || reduction == Reduction::PreMulSumDevice;
    for (int r = 0; r < n; ++r) {
      Compute v = static_cast<Compute>(values[r]);
      if (premultiply) v = v * scalar;
      if (r == 0) { acc = v; continue; }
      switch (reduction) {
        case Reduction::Prod: acc = acc * v; break;
        case Reduction::Max: acc = v > acc ? v : acc; break;
        case Reduction::Min: acc = v < acc ? v : acc; break;
        default: acc = acc + v; break;
      }
    }
    return static_cast<double>(acc);
  };
  return type == ncclFloat64 ? fold(0.0) : fold(0.0f);
}

// One collective over kRanks ranks: inputs made here, outputs compared byte for byte.
struct CollectiveRun {
  LocalRanks& ranks;
  ncclDataType_t type;
  size_t element_size = sizeOf(type);
  std::vector<char*> send, recv;

  CollectiveRun(LocalRanks& r, ncclDataType_t t, size_t send_elements, size_t recv_elements) : ranks(r), type(t) {
    for (int rank = 0; rank < kRanks; ++rank) {
      Bytes bytes;
      for (size_t i = 0; i < send_elements; ++i) encode(bytes, type, inputValue(type, rank, i));
      send.push_back(ranks.allocate(rank, bytes.size()));
      memcpy(send.back(), bytes.data(), bytes.size());
      recv.push_back(ranks.allocate(rank, recv_elements * element_size));
      memset(recv.back(), 0xee, recv_elements * element_size);
    }
  }

  double sent(int rank, size_t index) const { return inputValue(type, rank, index); }

  void expectElement(int rank, size_t index, double value, const std::string& what) {
    Bytes wanted;
    encode(wanted, type, value);
    INFO(what << ": rank " << rank << " element " << index << " expected " << value);
    REQUIRE(memcmp(recv[rank] + index * element_size, wanted.data(), element_size) == 0);
  }
};

template <class Launch>
void runGrouped(LocalRanks& ranks, Launch launch) {
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < ranks.size(); ++r) REQUIRE(launch(r) == ncclSuccess);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  REQUIRE(ranks.synchronize());
}

struct UserOps {
  std::vector<ncclRedOp_t> ops;
  LocalRanks& ranks;
  UserOps(LocalRanks& r, ncclDataType_t type, Reduction reduction) : ops(r.size()), ranks(r) {
    for (int rank = 0; rank < r.size(); ++rank) {
      Bytes scalar;
      encode(scalar, type, preMulScalar(type));
      const bool host = reduction == Reduction::PreMulSumHost;
      void* where = host ? static_cast<void*>(scalar.data()) : static_cast<void*>(r.allocate(rank, scalar.size()));
      if (!host) memcpy(where, scalar.data(), scalar.size());
      REQUIRE(ncclRedOpCreatePreMulSum(&ops[rank], where, type, host ? ncclScalarHostImmediate : ncclScalarDevice,
                                       r.comm(rank)) == ncclSuccess);
    }
  }
  ~UserOps() {
    for (int rank = 0; rank < ranks.size(); ++rank) ncclRedOpDestroy(ops[rank], ranks.comm(rank));
  }
};

ncclRedOp_t builtin(Reduction reduction) {
  switch (reduction) {
    case Reduction::Sum: return ncclSum;
    case Reduction::Prod: return ncclProd;
    case Reduction::Max: return ncclMax;
    case Reduction::Min: return ncclMin;
    default: return ncclAvg;
  }
}

}  // namespace

TEST_CASE("emulated NCCL reductions: every op, datatype and reduction matches the reference", "[nccl]") {
  LocalRanks ranks(kRanks);
  ranks.initAll();
  for (ncclDataType_t type : kAllTypes) {
    for (const auto& [reduction, reduction_name] : kReductionNames) {
      const bool user = reduction == Reduction::PreMulSumHost || reduction == Reduction::PreMulSumDevice;
      std::unique_ptr<UserOps> user_ops;
      if (user) user_ops = std::make_unique<UserOps>(ranks, type, reduction);
      auto op = [&](int rank) { return user ? user_ops->ops[rank] : builtin(reduction); };
      const std::string what = "type " + std::to_string(type) + " " + reduction_name;
      auto reduced = [&](const CollectiveRun& run, size_t index) {
        std::vector<double> values;
        for (int r = 0; r < kRanks; ++r) values.push_back(run.sent(r, index));
        return referenceReduce(type, reduction, values);
      };

      CollectiveRun all_reduce(ranks, type, kCount, kCount);
      runGrouped(ranks, [&](int r) {
        return ncclAllReduce(all_reduce.send[r], all_reduce.recv[r], kCount, type, op(r), ranks.comm(r), ranks.stream(r));
      });
      for (int r = 0; r < kRanks; ++r) {
        for (size_t i = 0; i < kCount; ++i) all_reduce.expectElement(r, i, reduced(all_reduce, i), "AllReduce " + what);
      }

      const int root = 1;
      CollectiveRun reduce(ranks, type, kCount, kCount);
      runGrouped(ranks, [&](int r) {
        return ncclReduce(reduce.send[r], reduce.recv[r], kCount, type, op(r), root, ranks.comm(r), ranks.stream(r));
      });
      for (size_t i = 0; i < kCount; ++i) reduce.expectElement(root, i, reduced(reduce, i), "Reduce " + what);

      CollectiveRun reduce_scatter(ranks, type, kCount * kRanks, kCount);
      runGrouped(ranks, [&](int r) {
        return ncclReduceScatter(reduce_scatter.send[r], reduce_scatter.recv[r], kCount, type, op(r), ranks.comm(r),
                                 ranks.stream(r));
      });
      for (int r = 0; r < kRanks; ++r) {
        for (size_t i = 0; i < kCount; ++i) {
          reduce_scatter.expectElement(r, i, reduced(reduce_scatter, r * kCount + i), "ReduceScatter " + what);
        }
      }
    }
  }
  ranks.destroyAll();
}

TEST_CASE("emulated NCCL data movement: every collective and datatype", "[nccl]") {
  LocalRanks ranks(kRanks);
  ranks.initAll();
  for (ncclDataType_t type : kAllTypes) {
    const std::string what = " type " + std::to_string(type);
    const int root = 2;
    CollectiveRun broadcast(ranks, type, kCount, kCount);
    runGrouped(ranks, [&](int r) {
      return ncclBroadcast(broadcast.send[r], broadcast.recv[r], kCount, type, root, ranks.comm(r), ranks.stream(r));
    });
    for (int r = 0; r < kRanks; ++r) {
      for (size_t i = 0; i < kCount; ++i) broadcast.expectElement(r, i, broadcast.sent(root, i), "Broadcast" + what);
    }

    CollectiveRun all_gather(ranks, type, kCount, kCount * kRanks);
    runGrouped(ranks, [&](int r) {
      return ncclAllGather(all_gather.send[r], all_gather.recv[r], kCount, type, ranks.comm(r), ranks.stream(r));
    });
    CollectiveRun all_to_all(ranks, type, kCount * kRanks, kCount * kRanks);
    runGrouped(ranks, [&](int r) {
      return ncclAlltoAll(all_to_all.send[r], all_to_all.recv[r], kCount, type, ranks.comm(r), ranks.stream(r));
    });
    CollectiveRun gather(ranks, type, kCount, kCount * kRanks);
    runGrouped(ranks, [&](int r) {
      return ncclGather(gather.send[r], gather.recv[r], kCount, type, root, ranks.comm(r), ranks.stream(r));
    });
    CollectiveRun scatter(ranks, type, kCount * kRanks, kCount);
    runGrouped(ranks, [&](int r) {
      return ncclScatter(scatter.send[r], scatter.recv[r], kCount, type, root, ranks.comm(r), ranks.stream(r));
    });
    for (int r = 0; r < kRanks; ++r) {
      for (int from = 0; from < kRanks; ++from) {
        for (size_t i = 0; i < kCount; ++i) {
          all_gather.expectElement(r, from * kCount + i, all_gather.sent(from, i), "AllGather" + what);
          all_to_all.expectElement(r, from * kCount + i, all_to_all.sent(from, r * kCount + i), "AlltoAll" + what);
          if (r == root) gather.expectElement(r, from * kCount + i, gather.sent(from, i), "Gather" + what);
        }
      }
      for (size_t i = 0; i < kCount; ++i) scatter.expectElement(r, i, scatter.sent(root, r * kCount + i), "Scatter" + what);
    }
  }
  ranks.destroyAll();
}

TEST_CASE("emulated NCCL in-place collectives and buffers larger than the staging slots", "[nccl]") {
  LocalRanks ranks(kRanks);
  ranks.initAll();
  // 5M int32 per rank: several rounds through the 2 MiB staging slots, and an uneven last one.
  const size_t count = 5'000'011;
  std::vector<int32_t*> data;
  for (int r = 0; r < kRanks; ++r) {
    data.push_back(ranks.allocate<int32_t>(r, count * kRanks * sizeof(int32_t)));
    for (size_t i = 0; i < count * kRanks; ++i) data[r][i] = static_cast<int32_t>(i % 1000 + r);
  }
  runGrouped(ranks, [&](int r) { return ncclAllReduce(data[r], data[r], count, ncclInt32, ncclSum, ranks.comm(r), ranks.stream(r)); });
  for (int r = 0; r < kRanks; ++r) {
    for (size_t i = 0; i < count; i += 997) REQUIRE(data[r][i] == static_cast<int32_t>(3 * (i % 1000) + 3));
  }

  // In-place AllGather: each rank's input already sits at its own block of the output.
  for (int r = 0; r < kRanks; ++r) {
    for (size_t i = 0; i < count; ++i) data[r][r * count + i] = static_cast<int32_t>(r * 10 + i % 10);
  }
  runGrouped(ranks, [&](int r) {
    return ncclAllGather(data[r] + r * count, data[r], count, ncclInt32, ranks.comm(r), ranks.stream(r));
  });
  for (int r = 0; r < kRanks; ++r) {
    for (int from = 0; from < kRanks; ++from) {
      for (size_t i = 0; i < count; i += 1009) REQUIRE(data[r][from * count + i] == static_cast<int32_t>(from * 10 + i % 10));
    }
  }

  // In-place ReduceScatter: the result lands on the rank's own block of the input.
  for (int r = 0; r < kRanks; ++r) {
    for (size_t i = 0; i < count * kRanks; ++i) data[r][i] = static_cast<int32_t>(i % 100 + r);
  }
  runGrouped(ranks, [&](int r) {
    return ncclReduceScatter(data[r], data[r] + r * count, count, ncclInt32, ncclMax, ranks.comm(r), ranks.stream(r));
  });
  for (int r = 0; r < kRanks; ++r) {
    for (size_t i = 0; i < count; i += 1013) REQUIRE(data[r][r * count + i] == static_cast<int32_t>((r * count + i) % 100 + 2));
  }

  // ncclBcast is the in-place broadcast.
  for (size_t i = 0; i < count; ++i) data[1][i] = static_cast<int32_t>(i * 3);
  runGrouped(ranks, [&](int r) { return ncclBcast(data[r], count, ncclInt32, 1, ranks.comm(r), ranks.stream(r)); });
  for (int r = 0; r < kRanks; ++r) {
    for (size_t i = 0; i < count; i += 991) REQUIRE(data[r][i] == static_cast<int32_t>(i * 3));
  }
  ranks.destroyAll();
}

TEST_CASE("emulated NCCL Send/Recv: a ring exchange in one group, matched in issue order", "[nccl]") {
  const int n = 4;
  LocalRanks ranks(n);
  ranks.initAll();
  // Larger than a ring buffer, so sender and receiver have to take turns.
  const size_t count = 300'007;
  std::vector<int64_t*> first_out, second_out, first_in, second_in;
  for (int r = 0; r < n; ++r) {
    first_out.push_back(ranks.allocate<int64_t>(r, count * 8));
    second_out.push_back(ranks.allocate<int64_t>(r, count * 8));
    first_in.push_back(ranks.allocate<int64_t>(r, count * 8));
    second_in.push_back(ranks.allocate<int64_t>(r, count * 8));
    for (size_t i = 0; i < count; ++i) {
      first_out[r][i] = r * 1'000'000 + static_cast<int64_t>(i);
      second_out[r][i] = -(r * 1'000'000 + static_cast<int64_t>(i));
    }
  }
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < n; ++r) {
    const int next = (r + 1) % n;
    const int previous = (r + n - 1) % n;
    // Everyone sends first: only a grouped launch keeps this from deadlocking.
    REQUIRE(ncclSend(first_out[r], count, ncclInt64, next, ranks.comm(r), ranks.stream(r)) == ncclSuccess);
    REQUIRE(ncclSend(second_out[r], count, ncclInt64, next, ranks.comm(r), ranks.stream(r)) == ncclSuccess);
    REQUIRE(ncclRecv(first_in[r], count, ncclInt64, previous, ranks.comm(r), ranks.stream(r)) == ncclSuccess);
    REQUIRE(ncclRecv(second_in[r], count, ncclInt64, previous, ranks.comm(r), ranks.stream(r)) == ncclSuccess);
  }
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  REQUIRE(ranks.synchronize());
  for (int r = 0; r < n; ++r) {
    const int previous = (r + n - 1) % n;
    for (size_t i = 0; i < count; i += 101) {
      REQUIRE(first_in[r][i] == previous * 1'000'000 + static_cast<int64_t>(i));
      REQUIRE(second_in[r][i] == -(previous * 1'000'000 + static_cast<int64_t>(i)));
    }
  }

  // A rank may send to itself inside a group.
  int32_t* self_out = ranks.allocate<int32_t>(0, 64);
  int32_t* self_in = ranks.allocate<int32_t>(0, 64);
  for (int i = 0; i < 16; ++i) self_out[i] = i * i;
  REQUIRE(ncclGroupStart() == ncclSuccess);
  REQUIRE(ncclSend(self_out, 16, ncclInt32, 0, ranks.comm(0), ranks.stream(0)) == ncclSuccess);
  REQUIRE(ncclRecv(self_in, 16, ncclInt32, 0, ranks.comm(0), ranks.stream(0)) == ncclSuccess);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  REQUIRE(ranks.synchronize());
  for (int i = 0; i < 16; ++i) REQUIRE(self_in[i] == i * i);
  ranks.destroyAll();
}

TEST_CASE("emulated NCCL graph replay: captured collectives run at every launch, with the data of that launch", "[nccl]") {
  const int n = 3;
  const size_t count = 1000;
  LocalRanks ranks(n);
  ranks.initAll();
  std::vector<float*> input, summed, broadcast;
  for (int r = 0; r < n; ++r) {
    input.push_back(ranks.allocate<float>(r, count * sizeof(float)));
    summed.push_back(ranks.allocate<float>(r, count * sizeof(float)));
    broadcast.push_back(ranks.allocate<float>(r, count * sizeof(float)));
  }
  for (int r = 0; r < n; ++r) {
    REQUIRE(cuStreamBeginCapture(ranks.stream(r), CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  }
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < n; ++r) {
    REQUIRE(ncclAllReduce(input[r], summed[r], count, ncclFloat, ncclSum, ranks.comm(r), ranks.stream(r)) == ncclSuccess);
    REQUIRE(ncclBroadcast(input[r], broadcast[r], count, ncclFloat, 1, ranks.comm(r), ranks.stream(r)) == ncclSuccess);
  }
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  std::vector<CUgraph> graphs(n);
  std::vector<CUgraphExec> executables(n);
  for (int r = 0; r < n; ++r) {
    REQUIRE(cuStreamEndCapture(ranks.stream(r), &graphs[r]) == CUDA_SUCCESS);
    REQUIRE(cuGraphInstantiate(&executables[r], graphs[r], 0) == CUDA_SUCCESS);
    REQUIRE(cuGraphDestroy(graphs[r]) == CUDA_SUCCESS);
  }

  // Work launched outside the graph still runs, before the graph has ever been launched.
  for (int r = 0; r < n; ++r) std::fill(input[r], input[r] + count, 1.0f);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < n; ++r) {
    REQUIRE(ncclAllReduce(input[r], summed[r], count, ncclFloat, ncclSum, ranks.comm(r), ranks.stream(r)) == ncclSuccess);
  }
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  REQUIRE(ranks.synchronize());
  for (int r = 0; r < n; ++r) REQUIRE(summed[r][count - 1] == static_cast<float>(n));

  for (int launch = 1; launch <= 5; ++launch) {
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) input[r][i] = static_cast<float>(launch * 100 + r * 10) + static_cast<float>(i % 7);
    }
    for (int r = 0; r < n; ++r) REQUIRE(cuGraphLaunch(executables[r], ranks.stream(r)) == CUDA_SUCCESS);
    REQUIRE(ranks.synchronize());
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; i += 37) {
        const float base = static_cast<float>(i % 7);
        REQUIRE(summed[r][i] == static_cast<float>(n * (launch * 100 + base) + 10 * (0 + 1 + 2)));
        REQUIRE(broadcast[r][i] == static_cast<float>(launch * 100 + 10) + base);
      }
    }
  }
  for (int r = 0; r < n; ++r) REQUIRE(cuGraphExecDestroy(executables[r]) == CUDA_SUCCESS);
  ranks.destroyAll();
}

TEST_CASE("emulated NCCL graph capture: a group captured on some of its streams only is refused", "[nccl]") {
  LocalRanks ranks(1);
  ranks.initAll();
  float* buffer = ranks.allocate<float>(0, 64 * sizeof(float));
  CUstream uncaptured = nullptr;
  REQUIRE(cuStreamCreate(&uncaptured, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  REQUIRE(cuStreamBeginCapture(ranks.stream(0), CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  REQUIRE(ncclAllReduce(buffer, buffer, 32, ncclFloat, ncclSum, ranks.comm(0), ranks.stream(0)) == ncclSuccess);
  REQUIRE(ncclAllReduce(buffer + 32, buffer + 32, 32, ncclFloat, ncclSum, ranks.comm(0), uncaptured) == ncclSuccess);
  CHECK(ncclGroupEnd() == ncclInvalidUsage);
  CHECK(std::string(ncclGetLastError(ranks.comm(0))).find("captured on all their streams or on none") !=
        std::string::npos);
  CUgraph graph = nullptr;
  REQUIRE(cuStreamEndCapture(ranks.stream(0), &graph) == CUDA_SUCCESS);
  REQUIRE(cuGraphDestroy(graph) == CUDA_SUCCESS);
  // The communicator still works afterwards.
  REQUIRE(ncclAllReduce(buffer, buffer, 64, ncclFloat, ncclSum, ranks.comm(0), ranks.stream(0)) == ncclSuccess);
  REQUIRE(ranks.synchronize());
  REQUIRE(cuStreamDestroy(uncaptured) == CUDA_SUCCESS);
  ranks.destroyAll();
}
