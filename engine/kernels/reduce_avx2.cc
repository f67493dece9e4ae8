// AVX2 + F16C reduction kernels. The library is built for x86-64-v2, so every function that uses
// these instructions carries the target attribute and runs only after the CPU check in Avx2().
// (A file-wide `#pragma GCC target` is avoided: inline functions from headers instantiated under
// it could be picked by the linker for callers on CPUs without AVX2.)
//
// Each kernel processes one vector of kLanes elements; the loops run it over whole vectors and
// then over the tail copied into a zero-padded stack vector, so every element of a call, tail
// included, takes the same instruction path and rounds identically.
#include <cpuid.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "engine/kernels/reduce_kernels.h"

#define KOLO_AVX2 __attribute__((target("avx2,f16c")))

namespace kolo::kernels::cpu {
namespace {

KOLO_AVX2 inline __m256 LoadHalf(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

KOLO_AVX2 inline void StoreHalf(uint8_t* p, __m256 f) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT));
}

KOLO_AVX2 inline __m256 LoadBf16(const uint8_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// The integer round-to-nearest-even of FloatToBFloat16, one lane per float, not yet packed.
KOLO_AVX2 inline __m256i RoundToBf16(__m256i x) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb);
  return _mm256_srli_epi32(_mm256_add_epi32(x, bias), 16);
}

// Eight lanes, each in [0, 0xffff], as eight bfloat16 (unsigned-saturating packing is exact).
KOLO_AVX2 inline void PackBf16(uint8_t* p, __m256i r) {
  const __m128i packed =
      _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}

// Its NaN branch is not needed here: every float stored comes from adding or scaling bfloat16
// inputs, so a NaN is either an input's payload (low 16 bits zero) or the default NaN, and
// rounding cannot carry it into infinity. Arithmetic has already made it quiet, as
// FloatToBFloat16 would.
KOLO_AVX2 inline void StoreBf16(uint8_t* p, __m256 f) {
  PackBf16(p, RoundToBf16(_mm256_castps_si256(f)));
}

KOLO_AVX2 inline __m256i LoadI(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
KOLO_AVX2 inline void StoreI(uint8_t* p, __m256i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}

// ---- sums: Apply(d, a, b) writes kLanes elements of a + b ----

struct AddF32 {
  static constexpr size_t kBytes = 32;
  KOLO_AVX2 static void Apply(uint8_t* d, const uint8_t* a, const uint8_t* b) {
    _mm256_storeu_ps(reinterpret_cast<float*>(d),
                     _mm256_add_ps(_mm256_loadu_ps(reinterpret_cast<const float*>(a)),
                                   _mm256_loadu_ps(reinterpret_cast<const float*>(b))));
  }
};

struct AddF64 {
  static constexpr size_t kBytes = 32;
  KOLO_AVX2 static void Apply(uint8_t* d, const uint8_t* a, const uint8_t* b) {
    _mm256_storeu_pd(reinterpret_cast<double*>(d),
                     _mm256_add_pd(_mm256_loadu_pd(reinterpret_cast<const double*>(a)),
                                   _mm256_loadu_pd(reinterpret_cast<const double*>(b))));
  }
};

struct AddF16 {
  static constexpr size_t kBytes = 16;
  KOLO_AVX2 static void Apply(uint8_t* d, const uint8_t* a, const uint8_t* b) {
    StoreHalf(d, _mm256_add_ps(LoadHalf(a), LoadHalf(b)));
  }
};

struct AddBf16 {
  static constexpr size_t kBytes = 16;
  KOLO_AVX2 static void Apply(uint8_t* d, const uint8_t* a, const uint8_t* b) {
    StoreBf16(d, _mm256_add_ps(LoadBf16(a), LoadBf16(b)));
  }
};

struct AddI32 {
  static constexpr size_t kBytes = 32;
  KOLO_AVX2 static void Apply(uint8_t* d, const uint8_t* a, const uint8_t* b) {
    StoreI(d, _mm256_add_epi32(LoadI(a), LoadI(b)));
  }
};

struct AddI64 {
  static constexpr size_t kBytes = 32;
  KOLO_AVX2 static void Apply(uint8_t* d, const uint8_t* a, const uint8_t* b) {
    StoreI(d, _mm256_add_epi64(LoadI(a), LoadI(b)));
  }
};

struct AddU8 {
  static constexpr size_t kBytes = 32;
  KOLO_AVX2 static void Apply(uint8_t* d, const uint8_t* a, const uint8_t* b) {
    StoreI(d, _mm256_add_epi8(LoadI(a), LoadI(b)));
  }
};

template <typename K>
KOLO_AVX2 void Sum3Loop(void* dst, const void* a, const void* b, size_t bytes) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* pa = static_cast<const uint8_t*>(a);
  const auto* pb = static_cast<const uint8_t*>(b);
  size_t off = 0;
  for (; off + K::kBytes <= bytes; off += K::kBytes) K::Apply(d + off, pa + off, pb + off);
  if (off == bytes) return;
  alignas(32) uint8_t ta[K::kBytes] = {};
  alignas(32) uint8_t tb[K::kBytes] = {};
  alignas(32) uint8_t td[K::kBytes];
  std::memcpy(ta, pa + off, bytes - off);
  std::memcpy(tb, pb + off, bytes - off);
  K::Apply(td, ta, tb);
  std::memcpy(d + off, td, bytes - off);
}

KOLO_AVX2 void Sum3(DataType dtype, void* dst, const void* a, const void* b, size_t count) {
  const size_t bytes = count * DataTypeSize(dtype);
  switch (dtype) {
    case DataType::kFloat32:
      return Sum3Loop<AddF32>(dst, a, b, bytes);
    case DataType::kFloat64:
      return Sum3Loop<AddF64>(dst, a, b, bytes);
    case DataType::kFloat16:
      return Sum3Loop<AddF16>(dst, a, b, bytes);
    case DataType::kBFloat16:
      return Sum3Loop<AddBf16>(dst, a, b, bytes);
    case DataType::kInt32:
      return Sum3Loop<AddI32>(dst, a, b, bytes);
    case DataType::kInt64:
      return Sum3Loop<AddI64>(dst, a, b, bytes);
    case DataType::kUInt8:
      return Sum3Loop<AddU8>(dst, a, b, bytes);
  }
}

// ---- scaling: Apply(d, s, factor) writes kLanes elements of s * factor ----

struct MulF32 {
  static constexpr size_t kBytes = 32;
  KOLO_AVX2 static void Apply(uint8_t* d, const uint8_t* s, double factor) {
    const __m256 f = _mm256_set1_ps(static_cast<float>(factor));
    _mm256_storeu_ps(reinterpret_cast<float*>(d),
                     _mm256_mul_ps(_mm256_loadu_ps(reinterpret_cast<const float*>(s)), f));
  }
};

struct MulF64 {
  static constexpr size_t kBytes = 32;
  KOLO_AVX2 static void Apply(uint8_t* d, const uint8_t* s, double factor) {
    _mm256_storeu_pd(
        reinterpret_cast<double*>(d),
        _mm256_mul_pd(_mm256_loadu_pd(reinterpret_cast<const double*>(s)), _mm256_set1_pd(factor)));
  }
};

struct MulF16 {
  static constexpr size_t kBytes = 16;
  KOLO_AVX2 static void Apply(uint8_t* d, const uint8_t* s, double factor) {
    StoreHalf(d, _mm256_mul_ps(LoadHalf(s), _mm256_set1_ps(static_cast<float>(factor))));
  }
};

struct MulBf16 {
  static constexpr size_t kBytes = 16;
  KOLO_AVX2 static void Apply(uint8_t* d, const uint8_t* s, double factor) {
    StoreBf16(d, _mm256_mul_ps(LoadBf16(s), _mm256_set1_ps(static_cast<float>(factor))));
  }
};

// Four int32 lanes times factor in double, clamped to [lo, hi] (exact in double) and truncated.
// Only called with a finite factor: the product is then never NaN, and +-inf clamps.
KOLO_AVX2 inline __m128i MulTruncate(__m128i x, double factor, double lo, double hi) {
  __m256d v = _mm256_mul_pd(_mm256_cvtepi32_pd(x), _mm256_set1_pd(factor));
  v = _mm256_min_pd(_mm256_max_pd(v, _mm256_set1_pd(lo)), _mm256_set1_pd(hi));
  return _mm256_cvttpd_epi32(v);
}

struct MulI32 {
  static constexpr size_t kBytes = 32;
  KOLO_AVX2 static void Apply(uint8_t* d, const uint8_t* s, double factor) {
    constexpr double kLo = -2147483648.0;
    constexpr double kHi = 2147483647.0;
    const __m256i x = LoadI(s);
    const __m128i lo = MulTruncate(_mm256_castsi256_si128(x), factor, kLo, kHi);
    const __m128i hi = MulTruncate(_mm256_extracti128_si256(x, 1), factor, kLo, kHi);
    StoreI(d, _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
  }
};

struct MulU8 {
  static constexpr size_t kBytes = 8;
  KOLO_AVX2 static void Apply(uint8_t* d, const uint8_t* s, double factor) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s));
    const __m128i lo = MulTruncate(_mm_cvtepu8_epi32(bytes), factor, 0.0, 255.0);
    const __m128i hi = MulTruncate(_mm_cvtepu8_epi32(_mm_srli_si128(bytes, 4)), factor, 0.0, 255.0);
    const __m128i words = _mm_packus_epi32(lo, hi);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(d), _mm_packus_epi16(words, words));
  }
};

template <typename K>
KOLO_AVX2 void ScaleLoop(void* dst, const void* src, size_t bytes, double factor) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  size_t off = 0;
  for (; off + K::kBytes <= bytes; off += K::kBytes) K::Apply(d + off, s + off, factor);
  if (off == bytes) return;
  alignas(32) uint8_t ts[K::kBytes] = {};
  alignas(32) uint8_t td[K::kBytes];
  std::memcpy(ts, s + off, bytes - off);
  K::Apply(td, ts, factor);
  std::memcpy(d + off, td, bytes - off);
}

KOLO_AVX2 void ScaleCopy(DataType dtype, void* dst, const void* src, size_t count, double factor) {
  const size_t bytes = count * DataTypeSize(dtype);
  if (factor == 1.0) {
    if (dst != src) std::memcpy(dst, src, bytes);
    return;
  }
  const bool finite = std::isfinite(factor);
  switch (dtype) {
    case DataType::kFloat32:
      return ScaleLoop<MulF32>(dst, src, bytes, factor);
    case DataType::kFloat64:
      return ScaleLoop<MulF64>(dst, src, bytes, factor);
    case DataType::kFloat16:
      return ScaleLoop<MulF16>(dst, src, bytes, factor);
    case DataType::kBFloat16:
      return ScaleLoop<MulBf16>(dst, src, bytes, factor);
    case DataType::kInt32:
      if (finite) return ScaleLoop<MulI32>(dst, src, bytes, factor);
      break;
    case DataType::kUInt8:
      if (finite) return ScaleLoop<MulU8>(dst, src, bytes, factor);
      break;
    case DataType::kInt64:  // AVX2 has no int64 <-> double conversion
      break;
  }
  Baseline().scale_copy(dtype, dst, src, count, factor);
}

// ---- compression's casts ----

// StoreBf16 for any float32, NaN included: a NaN keeps its sign and top payload bits, made quiet
// (FloatToBFloat16's semantics), where the rounding add could carry it into an infinity or zero.
KOLO_AVX2 inline void StoreBf16AnyFloat(uint8_t* p, __m256 f) {
  const __m256i x = _mm256_castps_si256(f);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
  PackBf16(p, _mm256_blendv_epi8(RoundToBf16(x), quiet, nan));
}

template <bool kToHalf, bool kBf16>
KOLO_AVX2 inline void ConvertStep(uint8_t* out, const uint8_t* in, __m256 f, bool scaled) {
  if constexpr (kToHalf) {
    __m256 v = _mm256_loadu_ps(reinterpret_cast<const float*>(in));
    if (scaled) v = _mm256_mul_ps(v, f);
    if constexpr (kBf16) {
      StoreBf16AnyFloat(out, v);
    } else {
      StoreHalf(out, v);
    }
  } else {
    __m256 v = kBf16 ? LoadBf16(in) : LoadHalf(in);
    if (scaled) v = _mm256_mul_ps(v, f);
    _mm256_storeu_ps(reinterpret_cast<float*>(out), v);
  }
}

// 8 float32 (32 bytes) <-> 8 halves (16 bytes) per step; the tail goes through a zero-padded
// stack vector so that it rounds as the rest does.
template <bool kToHalf, bool kBf16>
KOLO_AVX2 void ConvertLoop(uint8_t* d, const uint8_t* s, size_t count, float factor, bool scaled) {
  constexpr size_t kSrc = kToHalf ? 32 : 16;
  constexpr size_t kDst = kToHalf ? 16 : 32;
  const __m256 f = _mm256_set1_ps(factor);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    ConvertStep<kToHalf, kBf16>(d + i / 8 * kDst, s + i / 8 * kSrc, f, scaled);
  }
  if (i == count) return;
  const size_t rest = count - i;
  alignas(32) uint8_t ts[kSrc] = {};
  alignas(32) uint8_t td[kDst];
  std::memcpy(ts, s + i / 8 * kSrc, rest * (kSrc / 8));
  ConvertStep<kToHalf, kBf16>(td, ts, f, scaled);
  std::memcpy(d + i / 8 * kDst, td, rest * (kDst / 8));
}

KOLO_AVX2 void Convert(DataType from, DataType to, void* dst, const void* src, size_t count,
                       double factor) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  const float f = static_cast<float>(factor);
  const bool scaled = factor != 1.0;
  if (from == DataType::kFloat32 && to == DataType::kFloat16) {
    return ConvertLoop<true, false>(d, s, count, f, scaled);
  }
  if (from == DataType::kFloat32 && to == DataType::kBFloat16) {
    return ConvertLoop<true, true>(d, s, count, f, scaled);
  }
  if (from == DataType::kFloat16 && to == DataType::kFloat32) {
    return ConvertLoop<false, false>(d, s, count, f, scaled);
  }
  if (from == DataType::kBFloat16 && to == DataType::kFloat32) {
    return ConvertLoop<false, true>(d, s, count, f, scaled);
  }
}

KOLO_AVX2 void BitAndWords(uint64_t* dst, const uint64_t* src, size_t words) {
  size_t i = 0;
  for (; i + 4 <= words; i += 4) {
    auto* d = reinterpret_cast<uint8_t*>(dst + i);
    StoreI(d, _mm256_and_si256(LoadI(d), LoadI(reinterpret_cast<const uint8_t*>(src + i))));
  }
  for (; i < words; ++i) dst[i] &= src[i];
}

KOLO_AVX2 void BitOrWords(uint64_t* dst, const uint64_t* src, size_t words) {
  size_t i = 0;
  for (; i + 4 <= words; i += 4) {
    auto* d = reinterpret_cast<uint8_t*>(dst + i);
    StoreI(d, _mm256_or_si256(LoadI(d), LoadI(reinterpret_cast<const uint8_t*>(src + i))));
  }
  for (; i < words; ++i) dst[i] |= src[i];
}

constexpr ReduceKernels kAvx2 = {"avx2", &Sum3, &ScaleCopy, &Convert, &BitAndWords, &BitOrWords};

// CPUID leaf 1, ECX bit 29 (clang 14 does not accept "f16c" in __builtin_cpu_supports). Its
// instructions use the AVX registers, whose support by the OS the "avx2" check includes.
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

}  // namespace

const ReduceKernels* Avx2() {
  static const bool supported = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && HasF16c();
  }();
  return supported ? &kAvx2 : nullptr;
}

}  // namespace kolo::kernels::cpu
