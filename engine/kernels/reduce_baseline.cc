// Portable reduction kernels: plain loops the compiler may vectorise for the baseline ISA.
// Elements move through memcpy so that pointers need no alignment (no misaligned T* derefs).
#include <cmath>
#include <cstring>
#include <limits>

#include "engine/kernels/reduce_kernels.h"

namespace kolo::kernels::cpu {
namespace {

template <typename T>
T Load(const uint8_t* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
void Store(uint8_t* p, size_t i, T v) {
  std::memcpy(p + i * sizeof(T), &v, sizeof(T));
}

// 16-byte vectors of T (GCC/Clang vector extension; SSE2 on x86-64). Plain loops are not
// vectorised at -O2 here: dst may equal a or b, and the cheap cost model refuses the run-time
// overlap checks that would need.
template <typename T>
struct Vec16 {
  typedef T type __attribute__((vector_size(16)));
};

// d[i] = op(a[i], b[i]); op takes and returns either two Vec16<T> or two T.
template <typename T, typename Op>
void Elementwise(uint8_t* d, const uint8_t* a, const uint8_t* b, size_t n, Op op) {
  using V = typename Vec16<T>::type;
  constexpr size_t kLanes = sizeof(V) / sizeof(T);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    V va, vb;
    std::memcpy(&va, a + i * sizeof(T), sizeof(V));
    std::memcpy(&vb, b + i * sizeof(T), sizeof(V));
    const V r = op(va, vb);
    std::memcpy(d + i * sizeof(T), &r, sizeof(V));
  }
  for (; i < n; ++i) Store<T>(d, i, op(Load<T>(a, i), Load<T>(b, i)));
}

// Integers are added as their unsigned counterparts: same bits, but wraparound is defined.
template <typename U>
void SumWrapping(uint8_t* d, const uint8_t* a, const uint8_t* b, size_t n) {
  Elementwise<U>(d, a, b, n, [](auto x, auto y) { return decltype(x)(x + y); });
}

template <typename T>
void SumFloat(uint8_t* d, const uint8_t* a, const uint8_t* b, size_t n) {
  Elementwise<T>(d, a, b, n, [](auto x, auto y) { return x + y; });
}

template <float (*kToFloat)(uint16_t), uint16_t (*kFromFloat)(float)>
void SumHalf(uint8_t* d, const uint8_t* a, const uint8_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    Store<uint16_t>(d, i,
                    kFromFloat(kToFloat(Load<uint16_t>(a, i)) + kToFloat(Load<uint16_t>(b, i))));
  }
}

void Sum3(DataType dtype, void* dst, const void* a, const void* b, size_t count) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* pa = static_cast<const uint8_t*>(a);
  const auto* pb = static_cast<const uint8_t*>(b);
  switch (dtype) {
    case DataType::kFloat32:
      return SumFloat<float>(d, pa, pb, count);
    case DataType::kFloat64:
      return SumFloat<double>(d, pa, pb, count);
    case DataType::kFloat16:
      return SumHalf<HalfToFloat, FloatToHalf>(d, pa, pb, count);
    case DataType::kBFloat16:
      return SumHalf<BFloat16ToFloat, FloatToBFloat16>(d, pa, pb, count);
    case DataType::kInt32:
      return SumWrapping<uint32_t>(d, pa, pb, count);
    case DataType::kInt64:
      return SumWrapping<uint64_t>(d, pa, pb, count);
    case DataType::kUInt8:
      return SumWrapping<uint8_t>(d, pa, pb, count);
  }
}

// Truncates toward zero, saturating at the type's limits; NaN gives 0. Converting an
// out-of-range double is undefined behaviour, hence the explicit bounds. Every bound below is
// exact in double (int64's max rounds up to 2^63, so `>=` catches everything beyond it).
template <typename T>
T SaturatingTruncate(double v) {
  constexpr double kLo = static_cast<double>(std::numeric_limits<T>::min());
  constexpr double kHi = static_cast<double>(std::numeric_limits<T>::max());
  if (std::isnan(v)) return 0;
  if (v <= kLo) return std::numeric_limits<T>::min();
  if (v >= kHi) return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}

template <typename T>
void ScaleInt(uint8_t* d, const uint8_t* s, size_t n, double factor) {
  for (size_t i = 0; i < n; ++i) {
    Store<T>(d, i, SaturatingTruncate<T>(static_cast<double>(Load<T>(s, i)) * factor));
  }
}

template <typename T>
void ScaleFloat(uint8_t* d, const uint8_t* s, size_t n, T factor) {
  Elementwise<T>(d, s, s, n, [factor](auto x, auto) { return x * factor; });
}

template <float (*kToFloat)(uint16_t), uint16_t (*kFromFloat)(float)>
void ScaleHalf(uint8_t* d, const uint8_t* s, size_t n, float factor) {
  for (size_t i = 0; i < n; ++i)
    Store<uint16_t>(d, i, kFromFloat(kToFloat(Load<uint16_t>(s, i)) * factor));
}

void ScaleCopy(DataType dtype, void* dst, const void* src, size_t count, double factor) {
  if (factor == 1.0) {  // exact for every dtype, including int64 values beyond 2^53
    if (dst != src) std::memcpy(dst, src, count * DataTypeSize(dtype));
    return;
  }
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  const float f32 = static_cast<float>(factor);
  switch (dtype) {
    case DataType::kFloat32:
      return ScaleFloat<float>(d, s, count, f32);
    case DataType::kFloat64:
      return ScaleFloat<double>(d, s, count, factor);
    case DataType::kFloat16:
      return ScaleHalf<HalfToFloat, FloatToHalf>(d, s, count, f32);
    case DataType::kBFloat16:
      return ScaleHalf<BFloat16ToFloat, FloatToBFloat16>(d, s, count, f32);
    case DataType::kInt32:
      return ScaleInt<int32_t>(d, s, count, factor);
    case DataType::kInt64:
      return ScaleInt<int64_t>(d, s, count, factor);
    case DataType::kUInt8:
      return ScaleInt<uint8_t>(d, s, count, factor);
  }
}

template <uint16_t (*kFromFloat)(float)>
void ToHalf(uint8_t* d, const uint8_t* s, size_t n, float factor, bool scaled) {
  for (size_t i = 0; i < n; ++i) {
    const float v = Load<float>(s, i);
    Store<uint16_t>(d, i, kFromFloat(scaled ? v * factor : v));
  }
}

template <float (*kToFloat)(uint16_t)>
void FromHalf(uint8_t* d, const uint8_t* s, size_t n, float factor, bool scaled) {
  for (size_t i = 0; i < n; ++i) {
    const float v = kToFloat(Load<uint16_t>(s, i));
    Store<float>(d, i, scaled ? v * factor : v);
  }
}

void Convert(DataType from, DataType to, void* dst, const void* src, size_t count, double factor) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  const float f = static_cast<float>(factor);
  const bool scaled = factor != 1.0;
  if (from == DataType::kFloat32 && to == DataType::kFloat16) {
    return ToHalf<FloatToHalf>(d, s, count, f, scaled);
  }
  if (from == DataType::kFloat32 && to == DataType::kBFloat16) {
    return ToHalf<FloatToBFloat16>(d, s, count, f, scaled);
  }
  if (from == DataType::kFloat16 && to == DataType::kFloat32) {
    return FromHalf<HalfToFloat>(d, s, count, f, scaled);
  }
  if (from == DataType::kBFloat16 && to == DataType::kFloat32) {
    return FromHalf<BFloat16ToFloat>(d, s, count, f, scaled);
  }
}

void BitAndWords(uint64_t* dst, const uint64_t* src, size_t words) {
  for (size_t i = 0; i < words; ++i) dst[i] &= src[i];
}

void BitOrWords(uint64_t* dst, const uint64_t* src, size_t words) {
  for (size_t i = 0; i < words; ++i) dst[i] |= src[i];
}

constexpr ReduceKernels kBaseline = {"baseline", &Sum3,        &ScaleCopy,
                                     &Convert,   &BitAndWords, &BitOrWords};

}  // namespace

const ReduceKernels& Baseline() { return kBaseline; }

}  // namespace kolo::kernels::cpu
