// Helpers shared by the backend's .cu files (device code only): grid-stride launch geometry,
// float32 loads and rounding stores of every activation element type, and the dispatch of a
// launch on an Elem.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "models/compute/cudnn/kernels.h"

namespace kolo::models::compute::cudnn {

inline constexpr int kThreads = 256;
// Grid-stride loops: enough blocks to fill any current GPU several times over, few enough that
// a launch over a small tensor does not pay for idle blocks.
inline constexpr int64_t kMaxBlocks = 4096;

inline unsigned Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

__device__ __forceinline__ int64_t GlobalIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t GlobalStride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

__device__ __forceinline__ float Load(const float* p) { return *p; }
__device__ __forceinline__ float Load(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float Load(const __nv_bfloat16* p) { return __bfloat162float(*p); }

// Round to nearest even; values beyond the type's range become infinities (which is how an
// overflowing fp16 gradient is later found).
__device__ __forceinline__ void Store(float* p, float v) { *p = v; }
__device__ __forceinline__ void Store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void Store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// 16-byte vectors of activations: kVec<T> elements move in one load or store (4 floats, 8 halves),
// as memory-bound kernels need on Hopper. A kernel takes its vector path only where every pointer
// it touches is 16-byte aligned (Aligned16), and finishes the elements past the last whole vector
// one at a time.
template <typename T>
inline constexpr int kVec = static_cast<int>(16 / sizeof(T));

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The blocks for n elements taken a vector at a time (`vec`) or one at a time.
template <typename T>
inline unsigned VecBlocks(int64_t n, bool vec) {
  return Blocks(vec ? (n + kVec<T> - 1) / kVec<T> : n);
}

template <typename T>
__device__ __forceinline__ void LoadVec(const T* p, float (&out)[kVec<T>]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int k = 0; k < kVec<T>; ++k) out[k] = Load(e + k);
}

template <typename T>
__device__ __forceinline__ void StoreVec(T* p, const float (&v)[kVec<T>]) {
  uint4 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int k = 0; k < kVec<T>; ++k) Store(e + k, v[k]);
  *reinterpret_cast<uint4*>(p) = raw;
}

// Block-wide reduction through shared memory; every thread gets the result. `identity` is op's
// neutral element (it fills the lanes past the last warp).
template <typename Op>
__device__ float BlockReduce(float v, float identity, float* shared, Op op) {
  for (int offset = 16; offset > 0; offset /= 2)
    v = op(v, __shfl_down_sync(0xffffffffu, v, offset));
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / 32;
    v = lane < warps ? shared[lane] : identity;
    for (int offset = 16; offset > 0; offset /= 2) {
      v = op(v, __shfl_down_sync(0xffffffffu, v, offset));
    }
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  const float result = shared[0];
  __syncthreads();
  return result;
}

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with T the C++ type of `e`, then returns the launch error.
template <typename F>
cudaError_t DispatchElem(Elem e, F&& f) {
  switch (e) {
    case Elem::kFloat32:
      f(TypeTag<float>{});
      break;
    case Elem::kFloat16:
      f(TypeTag<__half>{});
      break;
    case Elem::kBfloat16:
      f(TypeTag<__nv_bfloat16>{});
      break;
  }
  return cudaGetLastError();
}

}  // namespace kolo::models::compute::cudnn
