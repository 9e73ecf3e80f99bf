// Element types and reductions. Narrow floating types (half, bfloat16, fp8) are widened to float,
// combined in float and rounded back once per element.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>

namespace ncclemu {

bool isValidDatatype(int datatype);
size_t datatypeSize(ncclDataType_t datatype);
bool isFloatingDatatype(ncclDataType_t datatype);

enum class ReduceKind { Sum, Prod, Max, Min, PreMulSum, SumPostDiv };

// A reduction as the data path sees it: ncclAvg becomes PreMulSum by 1/n for floating types and
// SumPostDiv by n for integers, as in NCCL.
struct Reduction {
  ReduceKind kind = ReduceKind::Sum;
  // PreMulSum: the scalar, stored in the datatype's own encoding.
  unsigned char scalar[8] = {};
  // PreMulSum with a device-resident scalar: read when the collective runs.
  const void* device_scalar = nullptr;
  uint64_t divisor = 1;
};

// dst[i] = sources[0][i] (op) sources[1][i] (op) ... in source order. dst may alias a source.
void reduceElements(void* dst, const void* const* sources, int source_count, size_t count,
                    ncclDataType_t datatype, const Reduction& reduction);

// Writes 1/n in the encoding of a floating datatype (for ncclAvg).
void encodeReciprocal(ncclDataType_t datatype, int n, unsigned char* out);

float halfToFloat(uint16_t bits);
uint16_t floatToHalf(float value);
float bfloat16ToFloat(uint16_t bits);
uint16_t floatToBfloat16(float value);
float fp8e4m3ToFloat(uint8_t bits);
uint8_t floatToFp8e4m3(float value);
float fp8e5m2ToFloat(uint8_t bits);
uint8_t floatToFp8e5m2(float value);

}  // namespace ncclemu
