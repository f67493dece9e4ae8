// Element types the engine moves and reduces, and the half-precision conversions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "engine/common/status.h"

namespace kolo {

enum class DataType : uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kUInt8 = 6,
};
inline constexpr int kNumDataTypes = 7;

// Bytes per element.
size_t DataTypeSize(DataType dtype);
// "float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8".
const char* DataTypeName(DataType dtype);
// Parses the names above (also "fp32", "fp16", "bf16", "f32", "f64"); error lists the allowed ones.
StatusOr<DataType> ParseDataType(std::string_view name);
// Every dtype, in enum order.
const std::vector<DataType>& AllDataTypes();

// A tensor's shape; an empty shape is a scalar (one element).
using Shape = std::vector<int64_t>;
int64_t NumElements(const Shape& shape);
std::string ShapeToString(const Shape& shape);  // "[64,3,7,7]"

// Element i of a buffer of `dtype`, read as a double. float16/bfloat16 go through the converters
// below. REQUIRES: data holds at least i + 1 elements of dtype.
double LoadElement(DataType dtype, const void* data, size_t i);
// Writes `value` into element i of a buffer of `dtype`. Floating types round (float16/bfloat16
// through the converters below); integer types truncate toward zero to int64, then wrap modulo
// 2^bits. REQUIRES: data holds at least i + 1 elements; for integer types value lies within the
// int64 range.
void StoreElement(DataType dtype, void* data, size_t i, double value);

// IEEE binary16 <-> float, round to nearest even; NaN and infinities preserved.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u);
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: overflow to inf
  if (abs < 0x38800000u) {                        // below the smallest normal half
    if (abs < 0x33000000u) return sign;           // rounds to zero
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t h = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return sign | static_cast<uint16_t>(h);
  }
  uint32_t h = ((abs >> 13) - ((127 - 15) << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return sign | static_cast<uint16_t>(h);
}

inline float BFloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t FloatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

}  // namespace kolo
