#include "models/compute/cudnn/kernel_util.cuh"
#include "models/compute/cudnn/mixed_kernels.h"

namespace kolo::models::compute::cudnn {
namespace {

template <typename T>
__global__ void CastKernel(const float* src, T* dst, int64_t n) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) Store(dst + i, src[i]);
}

template <typename T>
__global__ void UnscaleGradientKernel(const T* src, const float* scale, float* g, int64_t n,
                                      bool accumulate) {
  // Loss scales are powers of two, so multiplying by the reciprocal is exact.
  const float inv = scale != nullptr ? 1.0f / *scale : 1.0f;
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    const float v = Load(src + i) * inv;
    g[i] = accumulate ? g[i] + v : v;
  }
}

__global__ void CheckFiniteKernel(const float* g, int64_t n, int32_t* found_inf) {
  bool bad = false;
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) bad |= !isfinite(g[i]);
  // Every writer stores the same value, so the race is benign; no atomics needed.
  if (bad) *found_inf = 1;
}

template <typename T>
__device__ __forceinline__ void SgdElement(float* w, const float* g, float* v, T* w_half, int64_t i,
                                           float lr, float momentum, float weight_decay,
                                           float grad_scale) {
  const float d = g[i] * grad_scale + weight_decay * w[i];
  const float m = momentum * v[i] + d;
  v[i] = m;
  const float updated = w[i] - lr * m;
  w[i] = updated;
  if (w_half != nullptr) Store(w_half + i, updated);
}

template <typename T>
__global__ void MultiTensorSgdKernel(const SgdTensor* tensors, const SgdChunk* chunks, float lr,
                                     float momentum, float weight_decay, float grad_scale,
                                     const int32_t* skip) {
  if (skip != nullptr && *skip != 0) return;
  const SgdChunk c = chunks[blockIdx.x];
  const SgdTensor t = tensors[c.tensor];
  T* w_half = static_cast<T*>(t.w_half);
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
    SgdElement(t.w, t.g, t.v, w_half, i, lr, momentum, weight_decay, grad_scale);
  }
}

template <typename T>
__global__ void SgdRefreshKernel(float* w, const float* g, float* v, T* w_half, int64_t n, float lr,
                                 float momentum, float weight_decay, float grad_scale) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    SgdElement(w, g, v, w_half, i, lr, momentum, weight_decay, grad_scale);
  }
}

__global__ void AdvanceLossScaleKernel(LossScaleOptions options, LossScaleState* state) {
  AdvanceLossScale(options, state);
}

template <typename T>
__global__ void AddChannelBiasKernel(T* y, const float* bias, int64_t total, int64_t channels,
                                     int64_t spatial) {
  for (int64_t i = GlobalIndex(); i < total; i += GlobalStride()) {
    Store(y + i, Load(y + i) + bias[(i / spatial) % channels]);
  }
}

// Grid (channels, splits): block (c, s) sums every splits-th image's plane of channel c starting
// at image s and adds its share into db[c] (zeroed by the launcher).
template <typename T>
__global__ void ChannelSumKernel(const T* dy, float* db, int64_t batch, int64_t channels,
                                 int64_t spatial) {
  __shared__ float shared[32];
  const int64_t c = blockIdx.x;
  float s = 0.0f;
  for (int64_t b = blockIdx.y; b < batch; b += gridDim.y) {
    const T* plane = dy + (b * channels + c) * spatial;
    for (int64_t j = threadIdx.x; j < spatial; j += blockDim.x) s += Load(plane + j);
  }
  s = BlockReduce(s, 0.0f, shared, SumOp());
  if (threadIdx.x == 0) atomicAdd(db + c, s);
}

}  // namespace

cudaError_t LaunchCast(Elem e, const float* src, void* dst, int64_t n, cudaStream_t stream) {
  return DispatchElem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    CastKernel<<<Blocks(n), kThreads, 0, stream>>>(src, static_cast<T*>(dst), n);
  });
}

cudaError_t LaunchUnscaleGradient(Elem e, const void* src, const float* scale, float* g, int64_t n,
                                  bool accumulate, cudaStream_t stream) {
  return DispatchElem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    UnscaleGradientKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<const T*>(src), scale, g,
                                                              n, accumulate);
  });
}

cudaError_t LaunchCheckFinite(const float* g, int64_t n, int32_t* found_inf, cudaStream_t stream) {
  CheckFiniteKernel<<<Blocks(n), kThreads, 0, stream>>>(g, n, found_inf);
  return cudaGetLastError();
}

cudaError_t LaunchMultiTensorSgd(Elem e, const SgdTensor* tensors, const SgdChunk* chunks,
                                 int64_t num_chunks, float lr, float momentum, float weight_decay,
                                 float grad_scale, const int32_t* skip, cudaStream_t stream) {
  if (num_chunks <= 0) return cudaSuccess;
  return DispatchElem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    MultiTensorSgdKernel<T><<<static_cast<unsigned>(num_chunks), kThreads, 0, stream>>>(
        tensors, chunks, lr, momentum, weight_decay, grad_scale, skip);
  });
}

cudaError_t LaunchSgdMomentumRefresh(Elem e, float* w, const float* g, float* v, void* w_half,
                                     int64_t n, float lr, float momentum, float weight_decay,
                                     float grad_scale, cudaStream_t stream) {
  return DispatchElem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    SgdRefreshKernel<<<Blocks(n), kThreads, 0, stream>>>(w, g, v, static_cast<T*>(w_half), n, lr,
                                                         momentum, weight_decay, grad_scale);
  });
}

cudaError_t LaunchAdvanceLossScale(const LossScaleOptions& options, LossScaleState* state,
                                   cudaStream_t stream) {
  AdvanceLossScaleKernel<<<1, 1, 0, stream>>>(options, state);
  return cudaGetLastError();
}

cudaError_t LaunchAddChannelBias(Elem e, void* y, const float* bias, int64_t batch,
                                 int64_t channels, int64_t spatial, cudaStream_t stream) {
  const int64_t total = batch * channels * spatial;
  return DispatchElem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    AddChannelBiasKernel<<<Blocks(total), kThreads, 0, stream>>>(static_cast<T*>(y), bias, total,
                                                                 channels, spatial);
  });
}

cudaError_t LaunchChannelSum(Elem e, const void* dy, float* db, int64_t batch, int64_t channels,
                             int64_t spatial, cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(db, 0, static_cast<size_t>(channels) * sizeof(float), stream);
  if (err != cudaSuccess) return err;
  // About 512 blocks in all (a few per SM), each over at least one whole image plane.
  int64_t splits = (512 + channels - 1) / channels;
  if (splits > batch) splits = batch;
  if (splits < 1) splits = 1;
  const dim3 grid(static_cast<unsigned>(channels), static_cast<unsigned>(splits));
  return DispatchElem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    ChannelSumKernel<<<grid, kThreads, 0, stream>>>(static_cast<const T*>(dy), db, batch, channels,
                                                    spatial);
  });
}

}  // namespace kolo::models::compute::cudnn
