// Reduction kernels of every instruction set against a scalar reference written here.
#include "engine/kernels/reduce.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "engine/kernels/reduce_kernels.h"

namespace kolo::kernels {
namespace {

using Bytes = std::vector<uint8_t>;

// ---- independent scalar reference ----

template <typename T>
T Get(const uint8_t* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}
template <typename T>
void Put(uint8_t* p, size_t i, T v) {
  std::memcpy(p + i * sizeof(T), &v, sizeof(T));
}

void RefSum(DataType dt, uint8_t* d, const uint8_t* a, const uint8_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    switch (dt) {
      case DataType::kFloat32:
        Put<float>(d, i, Get<float>(a, i) + Get<float>(b, i));
        break;
      case DataType::kFloat64:
        Put<double>(d, i, Get<double>(a, i) + Get<double>(b, i));
        break;
      case DataType::kFloat16:
        Put<uint16_t>(
            d, i, FloatToHalf(HalfToFloat(Get<uint16_t>(a, i)) + HalfToFloat(Get<uint16_t>(b, i))));
        break;
      case DataType::kBFloat16:
        Put<uint16_t>(d, i,
                      FloatToBFloat16(BFloat16ToFloat(Get<uint16_t>(a, i)) +
                                      BFloat16ToFloat(Get<uint16_t>(b, i))));
        break;
      case DataType::kInt32:  // C++20 narrowing conversions are modular
        Put<int32_t>(d, i, static_cast<int32_t>(int64_t{Get<int32_t>(a, i)} + Get<int32_t>(b, i)));
        break;
      case DataType::kInt64:
        Put<int64_t>(
            d, i,
            static_cast<int64_t>(static_cast<__int128>(Get<int64_t>(a, i)) + Get<int64_t>(b, i)));
        break;
      case DataType::kUInt8:
        Put<uint8_t>(d, i, static_cast<uint8_t>(int{Get<uint8_t>(a, i)} + Get<uint8_t>(b, i)));
        break;
    }
  }
}

template <typename T>
T RefTruncate(double v) {
  if (std::isnan(v)) return 0;
  const double t = std::trunc(v);
  if (t < static_cast<double>(std::numeric_limits<T>::min())) return std::numeric_limits<T>::min();
  if (t >= std::ldexp(1.0, std::numeric_limits<T>::digits)) return std::numeric_limits<T>::max();
  return static_cast<T>(t);
}

void RefScale(DataType dt, uint8_t* d, const uint8_t* s, size_t n, double f) {
  const float ff = static_cast<float>(f);
  for (size_t i = 0; i < n; ++i) {
    switch (dt) {
      case DataType::kFloat32:
        Put<float>(d, i, Get<float>(s, i) * ff);
        break;
      case DataType::kFloat64:
        Put<double>(d, i, Get<double>(s, i) * f);
        break;
      case DataType::kFloat16:
        Put<uint16_t>(d, i, FloatToHalf(HalfToFloat(Get<uint16_t>(s, i)) * ff));
        break;
      case DataType::kBFloat16:
        Put<uint16_t>(d, i, FloatToBFloat16(BFloat16ToFloat(Get<uint16_t>(s, i)) * ff));
        break;
      case DataType::kInt32:
        Put<int32_t>(d, i, RefTruncate<int32_t>(Get<int32_t>(s, i) * f));
        break;
      case DataType::kInt64:
        Put<int64_t>(d, i, RefTruncate<int64_t>(static_cast<double>(Get<int64_t>(s, i)) * f));
        break;
      case DataType::kUInt8:
        Put<uint8_t>(d, i, RefTruncate<uint8_t>(Get<uint8_t>(s, i) * f));
        break;
    }
  }
}

bool IsNanAt(DataType dt, const uint8_t* p, size_t i) {
  switch (dt) {
    case DataType::kFloat32:
      return std::isnan(Get<float>(p, i));
    case DataType::kFloat64:
      return std::isnan(Get<double>(p, i));
    case DataType::kFloat16:
      return (Get<uint16_t>(p, i) & 0x7fffu) > 0x7c00u;
    case DataType::kBFloat16:
      return (Get<uint16_t>(p, i) & 0x7fffu) > 0x7f80u;
    default:
      return false;
  }
}

// Bit-for-bit equality, except that any NaN equals any NaN (reduce.h leaves NaN bits unspecified).
::testing::AssertionResult SameElements(DataType dt, const uint8_t* got, const uint8_t* want,
                                        size_t n) {
  const size_t size = DataTypeSize(dt);
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(got + i * size, want + i * size, size) == 0) continue;
    if (IsNanAt(dt, got, i) && IsNanAt(dt, want, i)) continue;
    uint64_t g = 0, w = 0;
    std::memcpy(&g, got + i * size, size);
    std::memcpy(&w, want + i * size, size);
    return ::testing::AssertionFailure() << DataTypeName(dt) << " element " << i << " of " << n
                                         << ": got bits 0x" << std::hex << g << ", want 0x" << w;
  }
  return ::testing::AssertionSuccess();
}

// Random elements: any bit pattern except NaN (so expected NaNs come only from inf - inf), and
// for floats also plain values of similar magnitude so that sums round and cancel.
Bytes RandomElements(DataType dt, size_t n, std::mt19937_64& rng) {
  Bytes out(n * DataTypeSize(dt));
  std::uniform_real_distribution<double> plain(-1000.0, 1000.0);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t bits = rng();
    const bool use_plain = (bits & 1) != 0;
    switch (dt) {
      case DataType::kFloat32: {
        float f = use_plain ? static_cast<float>(plain(rng)) : 0.0f;
        if (!use_plain) std::memcpy(&f, &bits, 4);
        Put<float>(out.data(), i, std::isnan(f) ? 1.5f : f);
        break;
      }
      case DataType::kFloat64: {
        double f = use_plain ? plain(rng) : 0.0;
        if (!use_plain) std::memcpy(&f, &bits, 8);
        Put<double>(out.data(), i, std::isnan(f) ? 2.5 : f);
        break;
      }
      case DataType::kFloat16:
      case DataType::kBFloat16: {
        uint16_t h = static_cast<uint16_t>(bits >> 16);
        if (use_plain) {
          const float f = static_cast<float>(plain(rng) / 64);
          h = dt == DataType::kFloat16 ? FloatToHalf(f) : FloatToBFloat16(f);
        }
        Put<uint16_t>(out.data(), i, IsNanAt(dt, reinterpret_cast<uint8_t*>(&h), 0) ? 0x3c00 : h);
        break;
      }
      default:
        std::memcpy(out.data() + i * DataTypeSize(dt), &bits, DataTypeSize(dt));
    }
  }
  return out;
}

// The public API presented as a kernel table, so it runs through the same tests.
const cpu::ReduceKernels kPublic = {"public", &ReduceSum3, &ScaleCopy, &Convert, &BitAnd, &BitOr};

const cpu::ReduceKernels* KernelsByName(const std::string& name) {
  if (name == "baseline") return &cpu::Baseline();
  if (name == "avx2") return cpu::Avx2();
  return &kPublic;
}

constexpr size_t kCounts[] = {0, 1, 7, 15, 16, 17, 31, 33, 1000003};
// Byte offsets of (dst, a, b) from 64-byte-aligned storage; most break element alignment.
constexpr size_t kOffsets[][3] = {{0, 0, 0}, {1, 3, 2}, {5, 0, 7}};
constexpr size_t kGuard = 16;  // bytes around every output that must stay untouched
constexpr uint8_t kGuardByte = 0xa5;

class ReduceTest : public ::testing::TestWithParam<std::tuple<std::string, DataType>> {
 protected:
  void SetUp() override {
    k_ = KernelsByName(std::get<0>(GetParam()));
    if (k_ == nullptr) GTEST_SKIP() << "CPU lacks AVX2 or F16C";
    dt_ = std::get<1>(GetParam());
    size_ = DataTypeSize(dt_);
  }

  // Storage for n elements at byte offset `off`, surrounded by guard bytes.
  Bytes Place(const Bytes& elems, size_t off) const {
    Bytes buf(kGuard + off + elems.size() + kGuard, kGuardByte);
    std::copy(elems.begin(), elems.end(), buf.begin() + kGuard + off);
    return buf;
  }
  static ::testing::AssertionResult GuardsIntact(const Bytes& buf, size_t off, size_t len) {
    for (size_t i = 0; i < buf.size(); ++i) {
      const bool inside = i >= kGuard + off && i < kGuard + off + len;
      if (!inside && buf[i] != kGuardByte) {
        return ::testing::AssertionFailure() << "byte " << i << " outside the output was written";
      }
    }
    return ::testing::AssertionSuccess();
  }

  const cpu::ReduceKernels* k_ = nullptr;
  DataType dt_ = DataType::kFloat32;
  size_t size_ = 0;
};

TEST_P(ReduceTest, Sum3MatchesReferenceForAnyCountAndAlignment) {
  std::mt19937_64 rng(42 + static_cast<int>(dt_));
  for (size_t n : kCounts) {
    const Bytes a = RandomElements(dt_, n, rng);
    const Bytes b = RandomElements(dt_, n, rng);
    Bytes want(n * size_);
    RefSum(dt_, want.data(), a.data(), b.data(), n);
    for (const auto& off : kOffsets) {
      SCOPED_TRACE(::testing::Message()
                   << "count " << n << ", offsets " << off[0] << "/" << off[1] << "/" << off[2]);
      Bytes dst = Place(Bytes(n * size_, 0), off[0]);
      Bytes pa = Place(a, off[1]);
      Bytes pb = Place(b, off[2]);
      uint8_t* d = dst.data() + kGuard + off[0];
      k_->sum3(dt_, d, pa.data() + kGuard + off[1], pb.data() + kGuard + off[2], n);
      ASSERT_TRUE(SameElements(dt_, d, want.data(), n));
      ASSERT_TRUE(GuardsIntact(dst, off[0], n * size_));
      // In place, as ReduceSum uses it: dst == a.
      uint8_t* in_a = pa.data() + kGuard + off[1];
      k_->sum3(dt_, in_a, in_a, pb.data() + kGuard + off[2], n);
      ASSERT_TRUE(SameElements(dt_, in_a, want.data(), n));
      ASSERT_TRUE(GuardsIntact(pa, off[1], n * size_));
    }
    // dst == a == b doubles every element.
    Bytes twice(n * size_);
    RefSum(dt_, twice.data(), a.data(), a.data(), n);
    Bytes same = a;
    k_->sum3(dt_, same.data(), same.data(), same.data(), n);
    ASSERT_TRUE(SameElements(dt_, same.data(), twice.data(), n)) << "count " << n;
  }
}

TEST_P(ReduceTest, ScaleCopyMatchesReference) {
  std::mt19937_64 rng(7 + static_cast<int>(dt_));
  const double inf = std::numeric_limits<double>::infinity();
  const double factors[] = {0.5, 1.0 / 3, 0.125, -2.0, 3.0, 0.0, 1e300, inf, -inf, std::nan("")};
  for (size_t n : kCounts) {
    const Bytes src = RandomElements(dt_, n, rng);
    for (double f : factors) {
      SCOPED_TRACE(::testing::Message() << "count " << n << ", factor " << f);
      Bytes want(n * size_);
      RefScale(dt_, want.data(), src.data(), n, f);
      Bytes dst = Place(Bytes(n * size_, 0), 3);
      Bytes s = Place(src, 1);
      k_->scale_copy(dt_, dst.data() + kGuard + 3, s.data() + kGuard + 1, n, f);
      ASSERT_TRUE(SameElements(dt_, dst.data() + kGuard + 3, want.data(), n));
      ASSERT_TRUE(GuardsIntact(dst, 3, n * size_));
      k_->scale_copy(dt_, s.data() + kGuard + 1, s.data() + kGuard + 1, n, f);  // in place
      ASSERT_TRUE(SameElements(dt_, s.data() + kGuard + 1, want.data(), n));
    }
  }
}

TEST_P(ReduceTest, ScaleByOneIsExactIncludingNanPayloads) {
  std::mt19937_64 rng(3);
  Bytes src(1001 * size_);
  for (auto& byte : src) byte = static_cast<uint8_t>(rng());  // NaN patterns included
  Bytes dst(src.size(), 0);
  k_->scale_copy(dt_, dst.data(), src.data(), 1001, 1.0);
  EXPECT_EQ(dst, src);
  Bytes in_place = src;
  k_->scale_copy(dt_, in_place.data(), in_place.data(), 1001, 1.0);
  EXPECT_EQ(in_place, src);
}

// ---- edge values, each repeated so it lands in vector bodies and in tails ----

struct Case {
  uint64_t a, b, want;  // element bit patterns
};

void ExpectSums(const cpu::ReduceKernels& k, DataType dt, const std::vector<Case>& cases) {
  const size_t size = DataTypeSize(dt);
  const size_t n = cases.size() * 7 + 3;
  Bytes a(n * size), b(n * size), want(n * size), got(n * size);
  for (size_t i = 0; i < n; ++i) {
    const Case& c = cases[i % cases.size()];
    std::memcpy(a.data() + i * size, &c.a, size);
    std::memcpy(b.data() + i * size, &c.b, size);
    std::memcpy(want.data() + i * size, &c.want, size);
  }
  k.sum3(dt, got.data(), a.data(), b.data(), n);
  EXPECT_TRUE(SameElements(dt, got.data(), want.data(), n)) << k.name;
}

uint64_t F32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

class ReduceEdgeTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    k_ = KernelsByName(GetParam());
    if (k_ == nullptr) GTEST_SKIP() << "CPU lacks AVX2 or F16C";
  }
  const cpu::ReduceKernels* k_ = nullptr;
};

TEST_P(ReduceEdgeTest, KnownSums) {
  const float max = std::numeric_limits<float>::max();
  const float inf = std::numeric_limits<float>::infinity();
  for (DataType dt : AllDataTypes()) {
    SCOPED_TRACE(DataTypeName(dt));
    switch (dt) {
      case DataType::kFloat16:
        ExpectSums(*k_, dt,
                   {{0x7bff, 0x7bff, 0x7c00},    // 65504 + 65504 overflows to inf
                    {0x7bff, 0x4c00, 0x7c00},    // 65504 + 16 = 65520: a tie, rounds to even = inf
                    {0x7bff, 0x4b80, 0x7bff},    // 65504 + 15 stays 65504
                    {0x0001, 0x0001, 0x0002},    // subnormals add exactly
                    {0x3c00, 0x1000, 0x3c00},    // 1 + 2^-11: tie, stays on even 1.0
                    {0x3c01, 0x1000, 0x3c02},    // (1 + 2^-10) + 2^-11: tie, rounds up to even
                    {0x7c00, 0x3c00, 0x7c00},    // inf + 1
                    {0x7c00, 0xfc00, 0x7e00},    // inf - inf = NaN
                    {0x7e00, 0x3c00, 0x7e00},    // NaN + 1 = NaN
                    {0x3c00, 0xbc00, 0x0000}});  // 1 - 1 = +0
        break;
      case DataType::kBFloat16:
        ExpectSums(*k_, dt,
                   {{0x7f7f, 0x7f7f, 0x7f80},    // max + max = inf
                    {0x3f80, 0x3b80, 0x3f80},    // 1 + 2^-8: tie, stays on even 1.0
                    {0x3f81, 0x3b80, 0x3f82},    // tie, rounds up to even
                    {0x7f80, 0xff80, 0x7fc0},    // inf - inf = NaN
                    {0x0001, 0x0001, 0x0002}});  // subnormals
        break;
      case DataType::kFloat32:
        ExpectSums(*k_, dt,
                   {{F32(max), F32(max), F32(inf)},
                    {F32(inf), F32(-inf), F32(std::nanf(""))},
                    {F32(1.0f), F32(std::ldexp(1.0f, -24)), F32(1.0f)},
                    {F32(0.1f), F32(0.2f), F32(0.1f + 0.2f)}});
        break;
      case DataType::kInt32:
        ExpectSums(*k_, dt, {{0x7fffffff, 1, 0x80000000}, {0xffffffff, 1, 0}, {5, 0xfffffffd, 2}});
        break;
      case DataType::kInt64:
        ExpectSums(*k_, dt,
                   {{0x7fffffffffffffff, 1, 0x8000000000000000}, {~0ull, 2, 1}, {40, 2, 42}});
        break;
      case DataType::kUInt8:
        ExpectSums(*k_, dt, {{255, 1, 0}, {200, 100, 44}, {1, 2, 3}});
        break;
      case DataType::kFloat64:
        ExpectSums(*k_, dt, {{0x7fefffffffffffff, 0x7fefffffffffffff, 0x7ff0000000000000}});
        break;
    }
  }
}

template <typename T>
std::vector<T> ScaleValues(const cpu::ReduceKernels& k, DataType dt, std::vector<T> v, double f) {
  k.scale_copy(dt, v.data(), v.data(), v.size(), f);
  return v;
}

TEST_P(ReduceEdgeTest, AverageTruncatesIntegersAndSaturates) {
  const int32_t max = std::numeric_limits<int32_t>::max();
  const int32_t min = std::numeric_limits<int32_t>::min();
  using V32 = std::vector<int32_t>;
  EXPECT_EQ(ScaleValues<int32_t>(*k_, DataType::kInt32, {7, -7, 5, -5, max, min, 1, -1, 0}, 0.5),
            (V32{3, -3, 2, -2, 1073741823, -1073741824, 0, 0, 0}));
  EXPECT_EQ(ScaleValues<int32_t>(*k_, DataType::kInt32, {10, -10, 11, 12, -13}, 0.25),
            (V32{2, -2, 2, 3, -3}));
  EXPECT_EQ(ScaleValues<int32_t>(*k_, DataType::kInt32, {max, min, 3, -3, 0}, 2.0),
            (V32{max, min, 6, -6, 0}));
  EXPECT_EQ(ScaleValues<int32_t>(*k_, DataType::kInt32, {5, -5, 0},
                                 std::numeric_limits<double>::infinity()),
            (V32{max, min, 0}));  // 0 * inf is NaN, which gives 0
  EXPECT_EQ(ScaleValues<uint8_t>(*k_, DataType::kUInt8, {200, 7, 0}, 2.0),
            (std::vector<uint8_t>{255, 14, 0}));
  EXPECT_EQ(ScaleValues<uint8_t>(*k_, DataType::kUInt8, {200, 7}, -1.0),
            (std::vector<uint8_t>{0, 0}));
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(ScaleValues<int64_t>(*k_, DataType::kInt64, {big, 9, -9}, 1.0),
            (std::vector<int64_t>{big, 9, -9}));  // 1.0 is exact even beyond 2^53
  EXPECT_EQ(ScaleValues<int64_t>(*k_, DataType::kInt64, {big, 9, -9}, 0.5),
            (std::vector<int64_t>{int64_t{1} << 62, 4, -4}));  // big rounds to 2^63 in double
  // Floats: average of 4 ranks, and fp16 overflow / 1/3 rounding through float32.
  EXPECT_EQ(ScaleValues<float>(*k_, DataType::kFloat32, {3.0f, -1.0f}, 0.25),
            (std::vector<float>{0.75f, -0.25f}));
  EXPECT_EQ(ScaleValues<uint16_t>(*k_, DataType::kFloat16, {0x7bff, 0x4200, 0x3c00}, 2.0),
            (std::vector<uint16_t>{0x7c00, 0x4600, 0x4000}));
  EXPECT_EQ(ScaleValues<uint16_t>(*k_, DataType::kFloat16, {0x4200}, 1.0 / 3),
            (std::vector<uint16_t>{0x3c00}));  // 3 * (1/3 in float) rounds to 1.0
}

TEST_P(ReduceEdgeTest, BitAndBitOrMatchReference) {
  std::mt19937_64 rng(11);
  for (size_t words : {0, 1, 3, 4, 5, 8, 33, 1001}) {
    std::vector<uint64_t> a(words + 1), b(words + 1);
    for (auto& w : a) w = rng();
    for (auto& w : b) w = rng();
    std::vector<uint64_t> x = a, y = a;
    k_->bit_and(x.data(), b.data(), words);
    k_->bit_or(y.data(), b.data(), words);
    for (size_t i = 0; i < words; ++i) {
      ASSERT_EQ(x[i], a[i] & b[i]) << "word " << i << " of " << words;
      ASSERT_EQ(y[i], a[i] | b[i]) << "word " << i << " of " << words;
    }
    EXPECT_EQ(x[words], a[words]) << "BitAnd wrote past the end";
    EXPECT_EQ(y[words], a[words]) << "BitOr wrote past the end";
  }
}

// Compression's casts against the scalar converters, element by element, for every count (the
// vector loop's tail included), with the specials the converters define: NaN (quiet, its sign
// kept), infinities, float16's overflow to infinity and its subnormals.
TEST_P(ReduceEdgeTest, ConvertMatchesScalarConvertersBothWays) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            std::bit_cast<float>(0x7fffffffu),  // NaN whose rounding would carry
                            std::bit_cast<float>(0x7f800001u),  // signalling NaN
                            65504.0f,
                            65520.0f,  // rounds past float16's largest: infinity
                            1e-7f,     // a float16 subnormal
                            3.0e38f,
                            1.0f + 1.0f / 2048};  // a tie in float16
  for (DataType half : {DataType::kFloat16, DataType::kBFloat16}) {
    auto to_half = half == DataType::kFloat16 ? FloatToHalf : FloatToBFloat16;
    auto to_float = half == DataType::kFloat16 ? HalfToFloat : BFloat16ToFloat;
    for (size_t n :
         {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{13}, size_t{100003}}) {
      for (double factor : {1.0, 0.25}) {
        SCOPED_TRACE(::testing::Message()
                     << DataTypeName(half) << " count " << n << " factor " << factor);
        std::vector<float> src(n);
        for (size_t i = 0; i < n; ++i) {
          src[i] = i < std::size(specials) ? specials[i] : std::ldexp(u(rng), (int(i) % 40) - 20);
        }
        std::vector<uint16_t> h(n + 1, 0xabcd);
        k_->convert(DataType::kFloat32, half, h.data(), src.data(), n, factor);
        for (size_t i = 0; i < n; ++i) {
          const float scaled = factor == 1.0 ? src[i] : src[i] * static_cast<float>(factor);
          if (std::isnan(scaled)) {  // NaN's payload may differ between instruction sets
            ASSERT_TRUE(std::isnan(to_float(h[i]))) << "element " << i;
          } else {
            ASSERT_EQ(h[i], to_half(scaled)) << "element " << i << " = " << src[i];
          }
        }
        EXPECT_EQ(h[n], 0xabcd) << "wrote past the end";
        std::vector<float> back(n + 1, 7.0f);
        k_->convert(half, DataType::kFloat32, back.data(), h.data(), n, factor);
        for (size_t i = 0; i < n; ++i) {
          const float want =
              factor == 1.0 ? to_float(h[i]) : to_float(h[i]) * static_cast<float>(factor);
          if (std::isnan(want)) {
            ASSERT_TRUE(std::isnan(back[i])) << "element " << i;
          } else {
            ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(want))
                << "element " << i;
          }
        }
        EXPECT_EQ(back[n], 7.0f) << "wrote past the end";
      }
    }
  }
  EXPECT_TRUE(CanConvert(DataType::kFloat32, DataType::kBFloat16));
  EXPECT_TRUE(CanConvert(DataType::kFloat16, DataType::kFloat32));
  EXPECT_FALSE(CanConvert(DataType::kFloat64, DataType::kFloat16));
  EXPECT_FALSE(CanConvert(DataType::kFloat16, DataType::kBFloat16));
}

TEST(ReduceSumTest, AccumulatesIntoDestinationAndDoublesWhenAliased) {
  std::vector<float> dst = {1.0f, 2.0f, 3.0f};
  const std::vector<float> src = {0.5f, -2.0f, 10.0f};
  ReduceSum(DataType::kFloat32, dst.data(), src.data(), dst.size());
  EXPECT_EQ(dst, (std::vector<float>{1.5f, 0.0f, 13.0f}));
  ReduceSum(DataType::kFloat32, dst.data(), dst.data(), dst.size());
  EXPECT_EQ(dst, (std::vector<float>{3.0f, 0.0f, 26.0f}));
  std::vector<int64_t> i64 = {1, 2};
  ReduceSum(DataType::kInt64, i64.data(), i64.data(), 0);  // count 0 touches nothing
  EXPECT_EQ(i64, (std::vector<int64_t>{1, 2}));
}

std::string ParamName(const ::testing::TestParamInfo<ReduceTest::ParamType>& info) {
  return std::get<0>(info.param) + "_" + DataTypeName(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllKernels, ReduceTest,
                         ::testing::Combine(::testing::Values("baseline", "avx2", "public"),
                                            ::testing::ValuesIn(AllDataTypes())),
                         ParamName);
INSTANTIATE_TEST_SUITE_P(AllKernels, ReduceEdgeTest,
                         ::testing::Values("baseline", "avx2", "public"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kolo::kernels
