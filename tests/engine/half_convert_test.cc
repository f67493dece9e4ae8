// The float16/bfloat16 conversions of engine/common/dtype.h: exhaustive round trips, an
// independent arithmetic reference, the CPU's F16C instructions where present, and known values.
#include <cpuid.h>
#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "engine/common/dtype.h"

namespace kolo {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t ToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

bool IsHalfNan(uint16_t h) { return (h & 0x7fffu) > 0x7c00u; }
bool IsBf16Nan(uint16_t b) { return (b & 0x7fffu) > 0x7f80u; }

// Value of a finite half from its fields, in double arithmetic.
double DecodeHalf(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  const double mag = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return (h & 0x8000) ? -mag : mag;
}

// Round a finite float to half in double arithmetic: scale so the half's last place is 1 and let
// nearbyint (round half to even, the default mode) do the rounding.
uint16_t ReferenceFloatToHalf(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isinf(f)) return sign | 0x7c00;
  const double v = std::fabs(static_cast<double>(f));
  if (v < std::ldexp(1.0, -14)) {  // subnormal range: last place is 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(std::ldexp(v, 24)));  // 1024 = min normal
  }
  int e;
  std::frexp(v, &e);  // v = m * 2^e, m in [0.5, 1): the half's exponent field is e - 1 + 15
  double m = std::nearbyint(std::ldexp(v, 11 - e));  // 11 significant bits, in [1024, 2048]
  if (m == 2048) {
    m = 1024;
    ++e;
  }
  const int field = e - 1 + 15;
  if (field >= 31) return sign | 0x7c00;
  return sign | static_cast<uint16_t>((field << 10) | (static_cast<int>(m) - 1024));
}

// Round a finite float to bfloat16: pick the nearer of the two bfloat16 neighbours by distance,
// ties to the even pattern; beyond the largest finite value the upper neighbour is 2^128 (inf).
uint16_t ReferenceFloatToBf16(float f) {
  const uint32_t bits = ToBits(f);
  if (std::isinf(f)) return static_cast<uint16_t>(bits >> 16);
  const uint32_t sign = bits & 0x80000000u;
  const uint32_t lower = (bits & 0x7fff0000u);
  const uint32_t upper = lower + 0x10000u;
  const double v = std::fabs(static_cast<double>(f));
  const double lo = FromBits(lower);
  const double hi = upper == 0x7f800000u ? std::ldexp(1.0, 128) : FromBits(upper);
  uint32_t pick;
  if (v - lo < hi - v) {
    pick = lower;
  } else if (v - lo > hi - v) {
    pick = upper;
  } else {
    pick = (lower & 0x10000u) == 0 ? lower : upper;
  }
  return static_cast<uint16_t>((sign | pick) >> 16);
}

__attribute__((target("f16c"))) uint16_t HardwareFloatToHalf(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float HardwareHalfToFloat(uint16_t h) { return _cvtsh_ss(h); }

// CPUID leaf 1, ECX bit 29 (clang does not accept "f16c" in __builtin_cpu_supports).
bool HaveF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

TEST(HalfConvertTest, EveryHalfRoundTripsAndDecodesExactly) {
  const bool f16c = HaveF16c();
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float f = HalfToFloat(h);
    if (IsHalfNan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << i;
      const uint16_t back = FloatToHalf(f);
      ASSERT_TRUE(IsHalfNan(back)) << std::hex << i << " -> " << back;
      ASSERT_EQ(back & 0x8000, h & 0x8000) << "NaN sign lost for 0x" << std::hex << i;
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), h) << std::hex << "0x" << i;
    if ((h & 0x7c00) == 0x7c00) {
      ASSERT_TRUE(std::isinf(f)) << std::hex << i;
    } else {
      ASSERT_EQ(static_cast<double>(f), DecodeHalf(h)) << std::hex << "0x" << i;
    }
    if (f16c) {
      ASSERT_EQ(ToBits(f), ToBits(HardwareHalfToFloat(h))) << std::hex << "0x" << i;
    }
  }
}

// Floats from a strided sweep over all bit patterns, plus every exact midpoint between adjacent
// halves and its two float neighbours (the cases where round-to-nearest-even decides).
std::vector<float> HalfProbeFloats() {
  std::vector<float> out;
  for (uint64_t u = 0; u < (1ull << 32); u += 4099)
    out.push_back(FromBits(static_cast<uint32_t>(u)));
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    const float mid = static_cast<float>((DecodeHalf(h) + DecodeHalf(h + 1)) / 2);  // exact
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      out.push_back(f);
      out.push_back(-f);
    }
  }
  return out;
}

TEST(HalfConvertTest, FloatToHalfMatchesReferenceAndHardware) {
  const bool f16c = HaveF16c();
  for (float f : HalfProbeFloats()) {
    const uint16_t got = FloatToHalf(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(IsHalfNan(got)) << std::hex << ToBits(f);
      continue;
    }
    ASSERT_EQ(got, ReferenceFloatToHalf(f)) << std::hex << "float bits 0x" << ToBits(f);
    if (f16c) {
      ASSERT_EQ(got, HardwareFloatToHalf(f)) << std::hex << "float bits 0x" << ToBits(f);
    }
  }
}

TEST(HalfConvertTest, KnownRoundings) {
  const float inf = std::numeric_limits<float>::infinity();
  const struct {
    float f;
    uint16_t want;
  } cases[] = {
      {65504.0f, 0x7bff},                        // largest finite half
      {std::nextafter(65520.0f, 0.0f), 0x7bff},  // just below the overflow tie
      {65520.0f, 0x7c00},                        // tie between 65504 and 2^16: even is inf
      {-65520.0f, 0xfc00},
      {1e10f, 0x7c00},
      {std::ldexp(1.0f, -24), 0x0001},  // smallest subnormal
      {std::ldexp(1.0f, -25), 0x0000},  // half of it: tie, even is zero
      {std::nextafter(std::ldexp(1.0f, -25), 1.0f), 0x0001},
      {std::ldexp(3.0f, -25), 0x0002},                          // 1.5 ulp: tie, rounds to even 2
      {std::ldexp(5.0f, -25), 0x0002},                          // 2.5 ulp: tie, rounds to even 2
      {std::ldexp(1.0f, -14), 0x0400},                          // smallest normal
      {std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25), 0x0400},  // tie between 0x3ff and 0x400
      {1.0f + std::ldexp(1.0f, -11), 0x3c00},                   // tie, stays on even
      {1.0f + std::ldexp(3.0f, -11), 0x3c02},                   // tie, rounds up to even
      {0.1f, 0x2e66},
      {1.0f / 3, 0x3555},
      {-2.0f, 0xc000},
      {-0.0f, 0x8000},
      {inf, 0x7c00},
      {-inf, 0xfc00},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(FloatToHalf(c.f), c.want)
        << "float " << c.f << " (bits 0x" << std::hex << ToBits(c.f) << ")";
  }
  EXPECT_TRUE(IsHalfNan(FloatToHalf(std::nanf(""))));
  EXPECT_TRUE(IsHalfNan(FloatToHalf(FromBits(0x7f800001u))));  // signalling NaN stays NaN
}

TEST(BFloat16ConvertTest, EveryBf16RoundTrips) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto b = static_cast<uint16_t>(i);
    const float f = BFloat16ToFloat(b);
    ASSERT_EQ(ToBits(f), i << 16);
    if (IsBf16Nan(b)) {
      const uint16_t back = FloatToBFloat16(f);
      ASSERT_TRUE(IsBf16Nan(back)) << std::hex << i << " -> " << back;
      ASSERT_EQ(back & 0x8000, b & 0x8000);
      continue;
    }
    ASSERT_EQ(FloatToBFloat16(f), b) << std::hex << "0x" << i;
  }
}

TEST(BFloat16ConvertTest, FloatToBf16MatchesReference) {
  std::vector<uint32_t> probes;
  for (uint64_t u = 0; u < (1ull << 32); u += 4099) probes.push_back(static_cast<uint32_t>(u));
  for (uint32_t b = 0; b < 0x10000; ++b) {  // midpoints and their neighbours
    probes.insert(probes.end(), {(b << 16) | 0x8000u, (b << 16) | 0x7fffu, (b << 16) | 0x8001u});
  }
  for (uint32_t bits : probes) {
    const float f = FromBits(bits);
    const uint16_t got = FloatToBFloat16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(IsBf16Nan(got)) << std::hex << bits;
      continue;
    }
    ASSERT_EQ(got, ReferenceFloatToBf16(f)) << std::hex << "float bits 0x" << bits;
  }
}

TEST(BFloat16ConvertTest, KnownRoundings) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(3.14159265f), 0x4049);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);        // tie, even
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(3.0f, -8)), 0x3f82);        // tie, up to even
  EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x7fc00000u)), 0x7fc0);
  EXPECT_TRUE(IsBf16Nan(FloatToBFloat16(FromBits(0x7f800001u))));  // must not become inf
  EXPECT_TRUE(IsBf16Nan(FloatToBFloat16(FromBits(0xff80ffffu))));
}

// LoadElement/StoreElement against raw bytes written and read independently with memcpy.
template <typename T>
T ReadRaw(const std::vector<uint8_t>& buf, size_t i) {
  T v;
  std::memcpy(&v, buf.data() + i * sizeof(T), sizeof(T));
  return v;
}

TEST(ElementAccess, StoreWritesTheDtypesBytes) {
  std::vector<uint8_t> buf(3 * 8, 0);
  StoreElement(DataType::kFloat32, buf.data(), 2, 1.5);
  EXPECT_EQ(ReadRaw<float>(buf, 2), 1.5f);
  StoreElement(DataType::kFloat64, buf.data(), 1, -0.125);
  EXPECT_EQ(ReadRaw<double>(buf, 1), -0.125);
  StoreElement(DataType::kFloat16, buf.data(), 1, 1.0);
  EXPECT_EQ(ReadRaw<uint16_t>(buf, 1), 0x3c00);
  StoreElement(DataType::kBFloat16, buf.data(), 2, -2.0);
  EXPECT_EQ(ReadRaw<uint16_t>(buf, 2), 0xc000);
  StoreElement(DataType::kInt32, buf.data(), 1, -7.9);  // truncates toward zero
  EXPECT_EQ(ReadRaw<int32_t>(buf, 1), -7);
  StoreElement(DataType::kInt64, buf.data(), 2, 4294967296.0 * 3);
  EXPECT_EQ(ReadRaw<int64_t>(buf, 2), int64_t{3} << 32);
  StoreElement(DataType::kUInt8, buf.data(), 5, 300.0);  // wraps modulo 256
  EXPECT_EQ(buf[5], 44);
  StoreElement(DataType::kUInt8, buf.data(), 6, -1.0);
  EXPECT_EQ(buf[6], 255);
}

TEST(ElementAccess, LoadReadsTheDtypesBytes) {
  std::vector<uint8_t> buf(3 * 8, 0);
  const float f = -3.25f;
  std::memcpy(buf.data() + 4, &f, 4);
  EXPECT_EQ(LoadElement(DataType::kFloat32, buf.data(), 1), -3.25);
  const double d = 1e300;
  std::memcpy(buf.data() + 16, &d, 8);
  EXPECT_EQ(LoadElement(DataType::kFloat64, buf.data(), 2), 1e300);
  const uint16_t h = 0xc500;  // -5 in binary16
  std::memcpy(buf.data() + 2, &h, 2);
  EXPECT_EQ(LoadElement(DataType::kFloat16, buf.data(), 1), -5.0);
  const uint16_t b = 0x4040;  // 3 in bfloat16
  std::memcpy(buf.data() + 4, &b, 2);
  EXPECT_EQ(LoadElement(DataType::kBFloat16, buf.data(), 2), 3.0);
  const int32_t i32 = -123456;
  std::memcpy(buf.data() + 8, &i32, 4);
  EXPECT_EQ(LoadElement(DataType::kInt32, buf.data(), 2), -123456.0);
  const int64_t i64 = int64_t{1} << 40;
  std::memcpy(buf.data() + 8, &i64, 8);
  EXPECT_EQ(LoadElement(DataType::kInt64, buf.data(), 1), 1099511627776.0);
  buf[3] = 200;
  EXPECT_EQ(LoadElement(DataType::kUInt8, buf.data(), 3), 200.0);
}

TEST(ElementAccess, RoundTripsSmallIntegersInEveryDtype) {
  for (DataType dtype : AllDataTypes()) {
    std::vector<uint8_t> buf(64 * DataTypeSize(dtype));
    for (size_t i = 0; i < 64; ++i) StoreElement(dtype, buf.data(), i, static_cast<double>(i * 3));
    for (size_t i = 0; i < 64; ++i) {
      EXPECT_EQ(LoadElement(dtype, buf.data(), i), static_cast<double>(i * 3))
          << DataTypeName(dtype);
    }
  }
}

}  // namespace
}  // namespace kolo
