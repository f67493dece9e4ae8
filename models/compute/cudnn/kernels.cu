#include <algorithm>
#include <cfloat>

#include "models/compute/cudnn/kernel_util.cuh"
#include "models/compute/cudnn/kernels.h"

namespace kolo::models::compute::cudnn {
namespace {

// The elementwise kernels below take `vec` (every pointer 16-byte aligned, from the launch): the
// first n / kVec<T> vectors go a vector at a time, the rest one element at a time.
template <typename T>
__global__ void ReluForwardKernel(const T* x, T* y, int64_t n, bool vec) {
  constexpr int V = kVec<T>;
  const int64_t nv = vec ? n / V : 0;
  for (int64_t i = GlobalIndex(); i < nv; i += GlobalStride()) {
    float a[V];
    LoadVec(x + i * V, a);
#pragma unroll
    for (int k = 0; k < V; ++k) a[k] = fmaxf(a[k], 0.0f);
    StoreVec(y + i * V, a);
  }
  for (int64_t i = nv * V + GlobalIndex(); i < n; i += GlobalStride())
    Store(y + i, fmaxf(Load(x + i), 0.0f));
}

template <typename T>
__global__ void ReluBackwardKernel(const T* y, const T* dy, T* dx, int64_t n, bool accumulate,
                                   bool vec) {
  constexpr int V = kVec<T>;
  const int64_t nv = vec ? n / V : 0;
  for (int64_t i = GlobalIndex(); i < nv; i += GlobalStride()) {
    float out[V];
    float g[V];
    LoadVec(y + i * V, out);
    LoadVec(dy + i * V, g);
    float acc[V] = {};
    if (accumulate) LoadVec(dx + i * V, acc);
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] += out[k] > 0.0f ? g[k] : 0.0f;
    StoreVec(dx + i * V, acc);
  }
  for (int64_t i = nv * V + GlobalIndex(); i < n; i += GlobalStride()) {
    const float g = Load(y + i) > 0.0f ? Load(dy + i) : 0.0f;
    Store(dx + i, accumulate ? Load(dx + i) + g : g);
  }
}

template <typename T>
__global__ void AddKernel(const T* a, const T* b, T* y, int64_t n, bool vec) {
  constexpr int V = kVec<T>;
  const int64_t nv = vec ? n / V : 0;
  for (int64_t i = GlobalIndex(); i < nv; i += GlobalStride()) {
    float u[V];
    float w[V];
    LoadVec(a + i * V, u);
    LoadVec(b + i * V, w);
#pragma unroll
    for (int k = 0; k < V; ++k) u[k] += w[k];
    StoreVec(y + i * V, u);
  }
  for (int64_t i = nv * V + GlobalIndex(); i < n; i += GlobalStride())
    Store(y + i, Load(a + i) + Load(b + i));
}

// Rows of `len` elements: grid y walks the rows, grid x the elements of a row (no division per
// element). With `vec`, the row starts and `len` are whole vectors.
template <typename T>
__global__ void RowCopyKernel(const T* src, int64_t src_stride, T* dst, int64_t dst_stride,
                              int64_t rows, int64_t len, bool accumulate, bool vec) {
  constexpr int V = kVec<T>;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const T* s = src + r * src_stride;
    T* d = dst + r * dst_stride;
    if (vec) {
      for (int64_t i = GlobalIndex(); i < len / V; i += GlobalStride()) {
        if (accumulate) {
          float a[V];
          float b[V];
          LoadVec(d + i * V, a);
          LoadVec(s + i * V, b);
#pragma unroll
          for (int k = 0; k < V; ++k) a[k] += b[k];
          StoreVec(d + i * V, a);
        } else {
          reinterpret_cast<uint4*>(d)[i] = reinterpret_cast<const uint4*>(s)[i];
        }
      }
      continue;
    }
    for (int64_t j = GlobalIndex(); j < len; j += GlobalStride()) {
      if (accumulate) {
        Store(d + j, Load(d + j) + Load(s + j));
      } else {
        d[j] = s[j];  // a copy is exact at any width
      }
    }
  }
}

// SplitMix64's finaliser (with its increment): the dropout mask's counter-based generator.
__host__ __device__ __forceinline__ uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Keep element i when its uniform draw, in 2^-24 steps, is at least the rate's threshold.
__device__ __forceinline__ bool Keep(uint64_t key, uint64_t threshold, int64_t i) {
  return (Mix(key + static_cast<uint64_t>(i)) >> 40) >= threshold;
}

template <typename T>
__global__ void DropoutForwardKernel(const T* x, T* y, int64_t n, float scale, uint64_t key,
                                     uint64_t threshold) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    Store(y + i, Load(x + i) * (Keep(key, threshold, i) ? scale : 0.0f));
  }
}

template <typename T>
__global__ void DropoutBackwardKernel(const T* dy, T* dx, int64_t n, float scale, uint64_t key,
                                      uint64_t threshold, bool accumulate) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    const float g = Load(dy + i) * (Keep(key, threshold, i) ? scale : 0.0f);
    Store(dx + i, accumulate ? Load(dx + i) + g : g);
  }
}

uint64_t DropoutKey(uint64_t seed, uint64_t layer, uint64_t pass) {
  return Mix(seed ^ Mix(layer ^ Mix(pass)));
}
uint64_t DropoutThreshold(double rate) { return static_cast<uint64_t>(rate * 16777216.0); }
float DropoutScale(double rate) { return static_cast<float>(1.0 / (1.0 - rate)); }

template <typename T>
__global__ void AddBiasRowsKernel(T* y, const float* bias, int64_t rows, int64_t cols) {
  const int64_t total = rows * cols;
  for (int64_t i = GlobalIndex(); i < total; i += GlobalStride()) {
    Store(y + i, Load(y + i) + bias[i % cols]);
  }
}

// One block per row.
template <typename T>
__global__ void SoftmaxCrossEntropyKernel(const T* logits, const int32_t* labels, int64_t classes,
                                          float scale, const float* loss_scale, T* dlogits,
                                          float* row_loss) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const T* x = logits + r * classes;
  T* dx = dlogits + r * classes;
  const float grad_scale = loss_scale != nullptr ? scale * *loss_scale : scale;
  float m = -FLT_MAX;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) m = fmaxf(m, Load(x + c));
  m = BlockReduce(m, -FLT_MAX, shared, MaxOp());
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) s += expf(Load(x + c) - m);
  s = BlockReduce(s, 0.0f, shared, SumOp());
  const float log_sum = logf(s);
  const int32_t label = labels[r];
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
    const float p = expf(Load(x + c) - m - log_sum);
    Store(dx + c, grad_scale * (p - (c == label ? 1.0f : 0.0f)));
  }
  if (threadIdx.x == 0) row_loss[r] = m + log_sum - Load(x + label);
}

// One block: loss = scale * sum(x).
template <typename T>
__global__ void SumRowsKernel(const T* x, int64_t rows, float scale, float* loss) {
  __shared__ float shared[32];
  float s = 0.0f;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) s += Load(x + r);
  s = BlockReduce(s, 0.0f, shared, SumOp());
  if (threadIdx.x == 0) *loss = scale * s;
}

__global__ void SgdMomentumKernel(float* w, const float* g, float* v, int64_t n, float lr,
                                  float momentum, float weight_decay, float grad_scale) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    const float d = g[i] * grad_scale + weight_decay * w[i];
    const float m = momentum * v[i] + d;
    v[i] = m;
    w[i] -= lr * m;
  }
}

template <typename T>
__global__ void FillScaledKernel(T* p, int64_t n, float value, const float* scale) {
  const float v = scale != nullptr ? value * *scale : value;
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) Store(p + i, v);
}

}  // namespace

cudaError_t LaunchReluForward(Elem e, const void* x, void* y, int64_t n, cudaStream_t stream) {
  const bool vec = Aligned16(x) && Aligned16(y);
  return DispatchElem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    ReluForwardKernel<<<VecBlocks<T>(n, vec), kThreads, 0, stream>>>(static_cast<const T*>(x),
                                                                     static_cast<T*>(y), n, vec);
  });
}

cudaError_t LaunchReluBackward(Elem e, const void* y, const void* dy, void* dx, int64_t n,
                               bool accumulate, cudaStream_t stream) {
  const bool vec = Aligned16(y) && Aligned16(dy) && Aligned16(dx);
  return DispatchElem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    ReluBackwardKernel<<<VecBlocks<T>(n, vec), kThreads, 0, stream>>>(
        static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), n, accumulate,
        vec);
  });
}

cudaError_t LaunchAdd(Elem e, const void* a, const void* b, void* y, int64_t n,
                      cudaStream_t stream) {
  const bool vec = Aligned16(a) && Aligned16(b) && Aligned16(y);
  return DispatchElem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    AddKernel<<<VecBlocks<T>(n, vec), kThreads, 0, stream>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y), n, vec);
  });
}

cudaError_t LaunchRowCopy(Elem e, const void* src, int64_t src_stride, int64_t src_offset,
                          void* dst, int64_t dst_stride, int64_t dst_offset, int64_t rows,
                          int64_t len, bool accumulate, cudaStream_t stream) {
  return DispatchElem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // One contiguous run when the rows follow each other in both buffers.
    if (rows > 1 && src_stride == len && dst_stride == len) {
      len *= rows;
      rows = 1;
    }
    const T* s = static_cast<const T*>(src) + src_offset;
    T* d = static_cast<T*>(dst) + dst_offset;
    constexpr int64_t V = kVec<T>;
    const bool vec = Aligned16(s) && Aligned16(d) && len % V == 0 &&
                     (rows == 1 || (src_stride % V == 0 && dst_stride % V == 0));
    const int64_t per_row = vec ? len / V : len;
    // Blocks for one row, then as many rows side by side as keep the grid within kMaxBlocks.
    const unsigned x = Blocks(per_row);
    const int64_t y = std::min<int64_t>({rows, std::max<int64_t>(1, kMaxBlocks / x), 65535});
    RowCopyKernel<<<dim3(x, static_cast<unsigned>(y)), kThreads, 0, stream>>>(
        s, src_stride, d, dst_stride, rows, len, accumulate, vec);
  });
}

cudaError_t LaunchDropoutForward(Elem e, const void* x, void* y, int64_t n, double rate,
                                 uint64_t seed, uint64_t layer, uint64_t pass,
                                 cudaStream_t stream) {
  return DispatchElem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    DropoutForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<T*>(y), n, DropoutScale(rate),
        DropoutKey(seed, layer, pass), DropoutThreshold(rate));
  });
}

cudaError_t LaunchDropoutBackward(Elem e, const void* dy, void* dx, int64_t n, double rate,
                                  uint64_t seed, uint64_t layer, uint64_t pass, bool accumulate,
                                  cudaStream_t stream) {
  return DispatchElem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    DropoutBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(
        static_cast<const T*>(dy), static_cast<T*>(dx), n, DropoutScale(rate),
        DropoutKey(seed, layer, pass), DropoutThreshold(rate), accumulate);
  });
}

cudaError_t LaunchAddBiasRows(Elem e, void* y, const float* bias, int64_t rows, int64_t cols,
                              cudaStream_t stream) {
  return DispatchElem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    AddBiasRowsKernel<<<Blocks(rows * cols), kThreads, 0, stream>>>(static_cast<T*>(y), bias, rows,
                                                                    cols);
  });
}

cudaError_t LaunchSoftmaxCrossEntropy(Elem e, const void* logits, const int32_t* labels,
                                      int64_t batch, int64_t classes, float weight,
                                      const float* loss_scale, void* dlogits, float* scratch,
                                      float* loss, cudaStream_t stream) {
  const float scale = weight / static_cast<float>(batch);
  cudaError_t err = DispatchElem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    SoftmaxCrossEntropyKernel<<<static_cast<unsigned>(batch), kThreads, 0, stream>>>(
        static_cast<const T*>(logits), labels, classes, scale, loss_scale, static_cast<T*>(dlogits),
        scratch);
  });
  if (err != cudaSuccess) return err;
  SumRowsKernel<float><<<1, kThreads, 0, stream>>>(scratch, batch, scale, loss);
  return cudaGetLastError();
}

cudaError_t LaunchScaledSum(Elem e, const void* x, int64_t n, float scale, float* loss,
                            cudaStream_t stream) {
  return DispatchElem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    SumRowsKernel<<<1, kThreads, 0, stream>>>(static_cast<const T*>(x), n, scale, loss);
  });
}

cudaError_t LaunchSgdMomentum(float* w, const float* g, float* v, int64_t n, float lr,
                              float momentum, float weight_decay, float grad_scale,
                              cudaStream_t stream) {
  SgdMomentumKernel<<<Blocks(n), kThreads, 0, stream>>>(w, g, v, n, lr, momentum, weight_decay,
                                                        grad_scale);
  return cudaGetLastError();
}

cudaError_t LaunchFill(float* p, int64_t n, float value, cudaStream_t stream) {
  return LaunchFillScaled(Elem::kFloat32, p, n, value, nullptr, stream);
}

cudaError_t LaunchFillScaled(Elem e, void* p, int64_t n, float value, const float* scale,
                             cudaStream_t stream) {
  return DispatchElem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    FillScaledKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<T*>(p), n, value, scale);
  });
}

}  // namespace kolo::models::compute::cudnn
