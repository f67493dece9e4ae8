#include <cfloat>

#include "models/compute/cudnn/kernels.h"

namespace kolo::models::compute::cudnn {
namespace {

constexpr int kThreads = 256;
// Grid-stride loops: enough blocks to fill any current GPU several times over, few enough that
// a launch over a small tensor does not pay for idle blocks.
constexpr int64_t kMaxBlocks = 4096;

unsigned Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

__device__ __forceinline__ int64_t GlobalIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t GlobalStride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

__global__ void ReluForwardKernel(const float* x, float* y, int64_t n) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) y[i] = fmaxf(x[i], 0.0f);
}

__global__ void ReluBackwardKernel(const float* y, const float* dy, float* dx, int64_t n,
                                   bool accumulate) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    const float g = y[i] > 0.0f ? dy[i] : 0.0f;
    dx[i] = accumulate ? dx[i] + g : g;
  }
}

__global__ void AddKernel(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) y[i] = a[i] + b[i];
}

__global__ void RowCopyKernel(const float* src, int64_t src_stride, int64_t src_offset, float* dst,
                              int64_t dst_stride, int64_t dst_offset, int64_t rows, int64_t len,
                              bool accumulate) {
  const int64_t total = rows * len;
  for (int64_t i = GlobalIndex(); i < total; i += GlobalStride()) {
    const int64_t r = i / len;
    const int64_t j = i - r * len;
    const float v = src[r * src_stride + src_offset + j];
    float* d = dst + r * dst_stride + dst_offset + j;
    *d = accumulate ? *d + v : v;
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

__global__ void DropoutForwardKernel(const float* x, float* y, int64_t n, float scale, uint64_t key,
                                     uint64_t threshold) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    y[i] = x[i] * (Keep(key, threshold, i) ? scale : 0.0f);
  }
}

__global__ void DropoutBackwardKernel(const float* dy, float* dx, int64_t n, float scale,
                                      uint64_t key, uint64_t threshold, bool accumulate) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) {
    const float g = dy[i] * (Keep(key, threshold, i) ? scale : 0.0f);
    dx[i] = accumulate ? dx[i] + g : g;
  }
}

uint64_t DropoutKey(uint64_t seed, uint64_t layer, uint64_t pass) {
  return Mix(seed ^ Mix(layer ^ Mix(pass)));
}
uint64_t DropoutThreshold(double rate) { return static_cast<uint64_t>(rate * 16777216.0); }
float DropoutScale(double rate) { return static_cast<float>(1.0 / (1.0 - rate)); }

__global__ void AddBiasRowsKernel(float* y, const float* bias, int64_t rows, int64_t cols) {
  const int64_t total = rows * cols;
  for (int64_t i = GlobalIndex(); i < total; i += GlobalStride()) y[i] += bias[i % cols];
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

// One block per row.
__global__ void SoftmaxCrossEntropyKernel(const float* logits, const int32_t* labels,
                                          int64_t classes, float scale, float* dlogits,
                                          float* row_loss) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const float* x = logits + r * classes;
  float* dx = dlogits + r * classes;
  float m = -FLT_MAX;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) m = fmaxf(m, x[c]);
  m = BlockReduce(m, -FLT_MAX, shared, MaxOp());
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) s += expf(x[c] - m);
  s = BlockReduce(s, 0.0f, shared, SumOp());
  const float log_sum = logf(s);
  const int32_t label = labels[r];
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
    const float p = expf(x[c] - m - log_sum);
    dx[c] = scale * (p - (c == label ? 1.0f : 0.0f));
  }
  if (threadIdx.x == 0) row_loss[r] = m + log_sum - x[label];
}

// One block: loss = scale * sum(row_loss).
__global__ void SumRowsKernel(const float* row_loss, int64_t rows, float scale, float* loss) {
  __shared__ float shared[32];
  float s = 0.0f;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) s += row_loss[r];
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

__global__ void FillKernel(float* p, int64_t n, float value) {
  for (int64_t i = GlobalIndex(); i < n; i += GlobalStride()) p[i] = value;
}

}  // namespace

cudaError_t LaunchReluForward(const float* x, float* y, int64_t n, cudaStream_t stream) {
  ReluForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchReluBackward(const float* y, const float* dy, float* dx, int64_t n,
                               bool accumulate, cudaStream_t stream) {
  ReluBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(y, dy, dx, n, accumulate);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(const float* a, const float* b, float* y, int64_t n, cudaStream_t stream) {
  AddKernel<<<Blocks(n), kThreads, 0, stream>>>(a, b, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchRowCopy(const float* src, int64_t src_stride, int64_t src_offset, float* dst,
                          int64_t dst_stride, int64_t dst_offset, int64_t rows, int64_t len,
                          bool accumulate, cudaStream_t stream) {
  RowCopyKernel<<<Blocks(rows * len), kThreads, 0, stream>>>(
      src, src_stride, src_offset, dst, dst_stride, dst_offset, rows, len, accumulate);
  return cudaGetLastError();
}

cudaError_t LaunchDropoutForward(const float* x, float* y, int64_t n, double rate, uint64_t seed,
                                 uint64_t layer, uint64_t pass, cudaStream_t stream) {
  DropoutForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(
      x, y, n, DropoutScale(rate), DropoutKey(seed, layer, pass), DropoutThreshold(rate));
  return cudaGetLastError();
}

cudaError_t LaunchDropoutBackward(const float* dy, float* dx, int64_t n, double rate, uint64_t seed,
                                  uint64_t layer, uint64_t pass, bool accumulate,
                                  cudaStream_t stream) {
  DropoutBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(dy, dx, n, DropoutScale(rate),
                                                            DropoutKey(seed, layer, pass),
                                                            DropoutThreshold(rate), accumulate);
  return cudaGetLastError();
}

cudaError_t LaunchAddBiasRows(float* y, const float* bias, int64_t rows, int64_t cols,
                              cudaStream_t stream) {
  AddBiasRowsKernel<<<Blocks(rows * cols), kThreads, 0, stream>>>(y, bias, rows, cols);
  return cudaGetLastError();
}

cudaError_t LaunchSoftmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t batch,
                                      int64_t classes, float weight, float* dlogits, float* scratch,
                                      float* loss, cudaStream_t stream) {
  const float scale = weight / static_cast<float>(batch);
  SoftmaxCrossEntropyKernel<<<static_cast<unsigned>(batch), kThreads, 0, stream>>>(
      logits, labels, classes, scale, dlogits, scratch);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  SumRowsKernel<<<1, kThreads, 0, stream>>>(scratch, batch, scale, loss);
  return cudaGetLastError();
}

cudaError_t LaunchScaledSum(const float* x, int64_t n, float scale, float* loss,
                            cudaStream_t stream) {
  SumRowsKernel<<<1, kThreads, 0, stream>>>(x, n, scale, loss);
  return cudaGetLastError();
}

cudaError_t LaunchSgdMomentum(float* w, const float* g, float* v, int64_t n, float lr,
                              float momentum, float weight_decay, float grad_scale,
                              cudaStream_t stream) {
  SgdMomentumKernel<<<Blocks(n), kThreads, 0, stream>>>(w, g, v, n, lr, momentum, weight_decay,
                                                        grad_scale);
  return cudaGetLastError();
}

cudaError_t LaunchFill(float* p, int64_t n, float value, cudaStream_t stream) {
  FillKernel<<<Blocks(n), kThreads, 0, stream>>>(p, n, value);
  return cudaGetLastError();
}

}  // namespace kolo::models::compute::cudnn
