#include "datatypes.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace ncclemu {
namespace {

// A binary floating format narrower than float: exponent and mantissa widths, and whether the
// all-ones exponent means inf/NaN (IEEE style) or only its all-ones mantissa means NaN (e4m3).
struct MiniFloat {
  int exponent_bits;
  int mantissa_bits;
  bool ieee_specials;
  bool saturate;  // out-of-range values become the largest finite value (fp8, as in CUDA's SATFINITE)
};

constexpr MiniFloat kHalf{5, 10, true, false};
constexpr MiniFloat kE4M3{4, 3, false, true};
constexpr MiniFloat kE5M2{5, 2, true, true};

float decode(const MiniFloat& f, uint32_t bits) {
  const uint32_t mantissa_mask = (1u << f.mantissa_bits) - 1;
  const uint32_t exponent_max = (1u << f.exponent_bits) - 1;
  const int bias = (1 << (f.exponent_bits - 1)) - 1;
  const bool negative = bits >> (f.exponent_bits + f.mantissa_bits) & 1;
  const uint32_t exponent = (bits >> f.mantissa_bits) & exponent_max;
  const uint32_t mantissa = bits & mantissa_mask;
  float magnitude;
  if (f.ieee_specials && exponent == exponent_max) {
    magnitude = mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else if (!f.ieee_specials && exponent == exponent_max && mantissa == mantissa_mask) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), 1 - bias - f.mantissa_bits);
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | (1u << f.mantissa_bits)),
                           static_cast<int>(exponent) - bias - f.mantissa_bits);
  }
  return negative ? -magnitude : magnitude;
}

// Round to nearest even, like the hardware conversions.
uint32_t encode(const MiniFloat& f, float value) {
  const uint32_t sign = std::signbit(value) ? 1u << (f.exponent_bits + f.mantissa_bits) : 0;
  const uint32_t exponent_max = (1u << f.exponent_bits) - 1;
  const uint32_t mantissa_mask = (1u << f.mantissa_bits) - 1;
  const int bias = (1 << (f.exponent_bits - 1)) - 1;
  if (std::isnan(value)) return sign | (exponent_max << f.mantissa_bits) | mantissa_mask;
  const uint32_t max_finite = f.ieee_specials ? ((exponent_max - 1) << f.mantissa_bits) | mantissa_mask
                                              : (exponent_max << f.mantissa_bits) | (mantissa_mask - 1);
  const uint32_t overflow = f.saturate ? max_finite : exponent_max << f.mantissa_bits;
  double magnitude = std::fabs(static_cast<double>(value));
  if (std::isinf(magnitude)) return sign | overflow;
  if (magnitude == 0) return sign;
  int exponent = std::ilogb(magnitude);
  exponent = std::max(exponent, 1 - bias);  // below the normal range: scale as a subnormal
  double scaled = std::nearbyint(std::ldexp(magnitude, f.mantissa_bits - exponent));
  if (scaled >= std::ldexp(1.0, f.mantissa_bits + 1)) {
    scaled /= 2;
    ++exponent;
  }
  uint32_t integer = static_cast<uint32_t>(scaled);
  uint32_t bits;
  if (integer < (1u << f.mantissa_bits)) {
    bits = integer;  // subnormal (or zero after rounding)
  } else {
    const int64_t biased = exponent + bias;
    if (biased >= static_cast<int64_t>(exponent_max) + (f.ieee_specials ? 0 : 1)) return sign | overflow;
    bits = static_cast<uint32_t>(biased) << f.mantissa_bits | (integer & mantissa_mask);
  }
  if (bits > max_finite) return sign | overflow;
  return sign | bits;
}

template <class T>
struct NativeCodec {
  using Storage = T;
  using Compute = T;
  static Compute load(Storage v) { return v; }
  static Storage store(Compute v) { return v; }
};

template <class S, float (*Load)(S), S (*Store)(float)>
struct NarrowCodec {
  using Storage = S;
  using Compute = float;
  static Compute load(Storage v) { return Load(v); }
  static Storage store(Compute v) { return Store(v); }
};

// Integer sums and products wrap around, as on the GPU, instead of being undefined.
template <class T>
T add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

template <class T>
T multiply(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    // Promote to at least unsigned int so small types do not go through signed int.
    using Wide = std::common_type_t<U, unsigned int>;
    return static_cast<T>(static_cast<Wide>(static_cast<U>(a)) * static_cast<Wide>(static_cast<U>(b)));
  } else {
    return a * b;
  }
}

template <class Codec>
void reduceTyped(void* dst, const void* const* sources, int source_count, size_t count,
                 const Reduction& reduction) {
  using Storage = typename Codec::Storage;
  using Compute = typename Codec::Compute;
  Storage scalar_storage;
  memcpy(&scalar_storage, reduction.device_scalar ? reduction.device_scalar : reduction.scalar,
         sizeof(Storage));
  const Compute scalar = Codec::load(scalar_storage);
  auto* out = static_cast<Storage*>(dst);
  for (size_t i = 0; i < count; ++i) {
    Compute acc{};
    for (int s = 0; s < source_count; ++s) {
      Compute v = Codec::load(static_cast<const Storage*>(sources[s])[i]);
      if (reduction.kind == ReduceKind::PreMulSum) v = multiply(v, scalar);
      if (s == 0) {
        acc = v;
        continue;
      }
      switch (reduction.kind) {
        case ReduceKind::Sum:
        case ReduceKind::PreMulSum:
        case ReduceKind::SumPostDiv: acc = add(acc, v); break;
        case ReduceKind::Prod: acc = multiply(acc, v); break;
        // A NaN operand wins, so the result does not depend on where the NaN sits in rank order.
        case ReduceKind::Max: acc = (v > acc || v != v) ? v : acc; break;
        case ReduceKind::Min: acc = (v < acc || v != v) ? v : acc; break;
      }
    }
    if (reduction.kind == ReduceKind::SumPostDiv) acc = static_cast<Compute>(acc / static_cast<Compute>(reduction.divisor));
    out[i] = Codec::store(acc);
  }
}

float loadE4M3(uint8_t v) { return fp8e4m3ToFloat(v); }
uint8_t storeE4M3(float v) { return floatToFp8e4m3(v); }
float loadE5M2(uint8_t v) { return fp8e5m2ToFloat(v); }
uint8_t storeE5M2(float v) { return floatToFp8e5m2(v); }
float loadHalf(uint16_t v) { return halfToFloat(v); }
uint16_t storeHalf(float v) { return floatToHalf(v); }
float loadBf16(uint16_t v) { return bfloat16ToFloat(v); }
uint16_t storeBf16(float v) { return floatToBfloat16(v); }

}  // namespace

float halfToFloat(uint16_t bits) { return decode(kHalf, bits); }
uint16_t floatToHalf(float value) { return static_cast<uint16_t>(encode(kHalf, value)); }
float fp8e4m3ToFloat(uint8_t bits) { return decode(kE4M3, bits); }
uint8_t floatToFp8e4m3(float value) { return static_cast<uint8_t>(encode(kE4M3, value)); }
float fp8e5m2ToFloat(uint8_t bits) { return decode(kE5M2, bits); }
uint8_t floatToFp8e5m2(float value) { return static_cast<uint8_t>(encode(kE5M2, value)); }

float bfloat16ToFloat(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

uint16_t floatToBfloat16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t rounding = 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

bool isValidDatatype(int datatype) { return datatype >= 0 && datatype < ncclNumTypes; }

size_t datatypeSize(ncclDataType_t datatype) {
  switch (datatype) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

bool isFloatingDatatype(ncclDataType_t datatype) {
  return datatype >= ncclFloat16 && datatype < ncclNumTypes;
}

void reduceElements(void* dst, const void* const* sources, int source_count, size_t count,
                    ncclDataType_t datatype, const Reduction& reduction) {
  switch (datatype) {
    case ncclInt8: reduceTyped<NativeCodec<int8_t>>(dst, sources, source_count, count, reduction); break;
    case ncclUint8: reduceTyped<NativeCodec<uint8_t>>(dst, sources, source_count, count, reduction); break;
    case ncclInt32: reduceTyped<NativeCodec<int32_t>>(dst, sources, source_count, count, reduction); break;
    case ncclUint32: reduceTyped<NativeCodec<uint32_t>>(dst, sources, source_count, count, reduction); break;
    case ncclInt64: reduceTyped<NativeCodec<int64_t>>(dst, sources, source_count, count, reduction); break;
    case ncclUint64: reduceTyped<NativeCodec<uint64_t>>(dst, sources, source_count, count, reduction); break;
    case ncclFloat32: reduceTyped<NativeCodec<float>>(dst, sources, source_count, count, reduction); break;
    case ncclFloat64: reduceTyped<NativeCodec<double>>(dst, sources, source_count, count, reduction); break;
    case ncclFloat16:
      reduceTyped<NarrowCodec<uint16_t, loadHalf, storeHalf>>(dst, sources, source_count, count, reduction);
      break;
    case ncclBfloat16:
      reduceTyped<NarrowCodec<uint16_t, loadBf16, storeBf16>>(dst, sources, source_count, count, reduction);
      break;
    case ncclFloat8e4m3:
      reduceTyped<NarrowCodec<uint8_t, loadE4M3, storeE4M3>>(dst, sources, source_count, count, reduction);
      break;
    case ncclFloat8e5m2:
      reduceTyped<NarrowCodec<uint8_t, loadE5M2, storeE5M2>>(dst, sources, source_count, count, reduction);
      break;
    default: break;
  }
}

void encodeReciprocal(ncclDataType_t datatype, int n, unsigned char* out) {
  const double reciprocal = 1.0 / n;
  switch (datatype) {
    case ncclFloat64: memcpy(out, &reciprocal, sizeof(double)); break;
    case ncclFloat32: {
      const float value = static_cast<float>(reciprocal);
      memcpy(out, &value, sizeof(float));
      break;
    }
    case ncclFloat16: {
      const uint16_t value = floatToHalf(static_cast<float>(reciprocal));
      memcpy(out, &value, sizeof(value));
      break;
    }
    case ncclBfloat16: {
      const uint16_t value = floatToBfloat16(static_cast<float>(reciprocal));
      memcpy(out, &value, sizeof(value));
      break;
    }
    case ncclFloat8e4m3: out[0] = floatToFp8e4m3(static_cast<float>(reciprocal)); break;
    case ncclFloat8e5m2: out[0] = floatToFp8e5m2(static_cast<float>(reciprocal)); break;
    default: break;
  }
}

}  // namespace ncclemu
