#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "engine/cuda/kernels.h"

namespace kolo::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocksPerEntry = 128;
constexpr int kMaxRows = 32768;

__device__ bool Aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

template <typename W>
__device__ void CopyWords(const void* src, void* dst, size_t words, size_t tid, size_t stride) {
  const W* s = static_cast<const W*>(src);
  W* d = static_cast<W*>(dst);
  for (size_t i = tid; i < words; i += stride) d[i] = s[i];
}

__global__ void BatchedCopyKernel(const CopyDesc* descs, int n) {
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (int e = blockIdx.y; e < n; e += gridDim.y) {
    const CopyDesc c = descs[e];
    // The widest move both pointers allow; the tail past the last whole word goes byte by byte.
    size_t head = 0;
    if (Aligned(c.src, 16) && Aligned(c.dst, 16)) {
      head = c.bytes / 16 * 16;
      CopyWords<uint4>(c.src, c.dst, c.bytes / 16, tid, stride);
    } else if (Aligned(c.src, 4) && Aligned(c.dst, 4)) {
      head = c.bytes / 4 * 4;
      CopyWords<uint32_t>(c.src, c.dst, c.bytes / 4, tid, stride);
    }
    CopyWords<uint8_t>(static_cast<const uint8_t*>(c.src) + head,
                       static_cast<uint8_t*>(c.dst) + head, c.bytes - head, tid, stride);
  }
}

template <typename T>
__device__ T ScaleInt(T x, double f) {
  const double v = static_cast<double>(x) * f;
  if (isnan(v)) return 0;
  if (v <= static_cast<double>(std::numeric_limits<T>::min())) {
    return std::numeric_limits<T>::min();
  }
  if (v >= static_cast<double>(std::numeric_limits<T>::max())) {
    return std::numeric_limits<T>::max();
  }
  return static_cast<T>(v);
}

struct ScaleF32 {
  using T = float;
  __device__ static T Apply(T x, double, float f) { return x * f; }
};
struct ScaleF64 {
  using T = double;
  __device__ static T Apply(T x, double f, float) { return x * f; }
};
struct ScaleF16 {
  using T = __half;
  __device__ static T Apply(T x, double, float f) { return __float2half_rn(__half2float(x) * f); }
};
struct ScaleBF16 {
  using T = __nv_bfloat16;
  __device__ static T Apply(T x, double, float f) {
    return __float2bfloat16_rn(__bfloat162float(x) * f);
  }
};
template <typename I>
struct ScaleInteger {
  using T = I;
  __device__ static T Apply(T x, double f, float) { return ScaleInt<T>(x, f); }
};

template <typename Op>
__global__ void BatchedScaleKernel(const CopyDesc* descs, int n, double f64, float f32) {
  using T = typename Op::T;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (int e = blockIdx.y; e < n; e += gridDim.y) {
    const CopyDesc c = descs[e];
    const T* s = static_cast<const T*>(c.src);
    T* d = static_cast<T*>(c.dst);
    const size_t count = c.bytes / sizeof(T);
    for (size_t i = tid; i < count; i += stride) d[i] = Op::Apply(s[i], f64, f32);
  }
}

dim3 Grid(int n, size_t max_bytes, size_t bytes_per_thread) {
  const size_t per_block = static_cast<size_t>(kThreads) * bytes_per_thread;
  const size_t blocks = std::clamp<size_t>((max_bytes + per_block - 1) / per_block, 1,
                                           static_cast<size_t>(kMaxBlocksPerEntry));
  return dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(std::min(n, kMaxRows)), 1);
}

template <typename Op>
cudaError_t LaunchScale(const CopyDesc* descs, int n, size_t max_bytes, double scale,
                        cudaStream_t stream) {
  BatchedScaleKernel<Op><<<Grid(n, max_bytes, 4 * sizeof(typename Op::T)), kThreads, 0, stream>>>(
      descs, n, scale, static_cast<float>(scale));
  return cudaGetLastError();
}

struct FromF32 {
  __device__ static float Load(const void* p, size_t i) { return static_cast<const float*>(p)[i]; }
};
struct ToF32 {
  __device__ static void Store(void* p, size_t i, float v) { static_cast<float*>(p)[i] = v; }
};
struct F16 {
  __device__ static float Load(const void* p, size_t i) {
    return __half2float(static_cast<const __half*>(p)[i]);
  }
  __device__ static void Store(void* p, size_t i, float v) {
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  }
};
struct BF16 {
  __device__ static float Load(const void* p, size_t i) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
  __device__ static void Store(void* p, size_t i, float v) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  }
};

template <typename From, typename To, size_t kFromSize>
__global__ void BatchedConvertKernel(const CopyDesc* descs, int n, float f, bool scaled) {
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (int e = blockIdx.y; e < n; e += gridDim.y) {
    const CopyDesc c = descs[e];
    const size_t count = c.bytes / kFromSize;
    for (size_t i = tid; i < count; i += stride) {
      const float v = From::Load(c.src, i);
      To::Store(c.dst, i, scaled ? v * f : v);
    }
  }
}

template <typename From, typename To, size_t kFromSize>
cudaError_t LaunchConvert(const CopyDesc* descs, int n, size_t max_count, double scale,
                          cudaStream_t stream) {
  BatchedConvertKernel<From, To, kFromSize><<<Grid(n, max_count * 4, 16), kThreads, 0, stream>>>(
      descs, n, static_cast<float>(scale), scale != 1.0);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchBatchedConvert(const CopyDesc* descs, int n, size_t max_count, ElementKind from,
                                 ElementKind to, double scale, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (from == ElementKind::kFloat32 && to == ElementKind::kFloat16) {
    return LaunchConvert<FromF32, F16, 4>(descs, n, max_count, scale, stream);
  }
  if (from == ElementKind::kFloat32 && to == ElementKind::kBFloat16) {
    return LaunchConvert<FromF32, BF16, 4>(descs, n, max_count, scale, stream);
  }
  if (from == ElementKind::kFloat16 && to == ElementKind::kFloat32) {
    return LaunchConvert<F16, ToF32, 2>(descs, n, max_count, scale, stream);
  }
  if (from == ElementKind::kBFloat16 && to == ElementKind::kFloat32) {
    return LaunchConvert<BF16, ToF32, 2>(descs, n, max_count, scale, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchBatchedCopy(const CopyDesc* descs, int n, size_t max_bytes, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  BatchedCopyKernel<<<Grid(n, max_bytes, 64), kThreads, 0, stream>>>(descs, n);
  return cudaGetLastError();
}

cudaError_t LaunchBatchedScaleCopy(const CopyDesc* descs, int n, size_t max_bytes, ElementKind kind,
                                   double scale, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  switch (kind) {
    case ElementKind::kFloat32:
      return LaunchScale<ScaleF32>(descs, n, max_bytes, scale, stream);
    case ElementKind::kFloat64:
      return LaunchScale<ScaleF64>(descs, n, max_bytes, scale, stream);
    case ElementKind::kFloat16:
      return LaunchScale<ScaleF16>(descs, n, max_bytes, scale, stream);
    case ElementKind::kBFloat16:
      return LaunchScale<ScaleBF16>(descs, n, max_bytes, scale, stream);
    case ElementKind::kInt32:
      return LaunchScale<ScaleInteger<int32_t>>(descs, n, max_bytes, scale, stream);
    case ElementKind::kInt64:
      return LaunchScale<ScaleInteger<int64_t>>(descs, n, max_bytes, scale, stream);
    case ElementKind::kUInt8:
      return LaunchScale<ScaleInteger<uint8_t>>(descs, n, max_bytes, scale, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kolo::cuda
