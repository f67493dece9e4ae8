// The GPU backend's own CUDA kernels: the element-wise, copy, loss and optimizer steps that cuDNN
// and cuBLAS do not provide. Every launcher enqueues on `stream` and returns the launch's error
// (cudaGetLastError), so the caller can convert it with KOLO_CUDA_CHECK.
//
// Conventions: all buffers are device float32 (labels int32); sizes are element counts. An
// `accumulate` flag adds into the destination instead of overwriting it (a producer whose output
// has several consumers receives the sum of their gradients). Buffers may not overlap unless a
// launcher says so.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kolo::models::compute::cudnn {

// y = max(x, 0). x and y may be the same buffer.
cudaError_t LaunchReluForward(const float* x, float* y, int64_t n, cudaStream_t stream);
// dx (+)= dy where y > 0, else 0 (+ 0).
cudaError_t LaunchReluBackward(const float* y, const float* dy, float* dx, int64_t n,
                               bool accumulate, cudaStream_t stream);

// y = a + b.
cudaError_t LaunchAdd(const float* a, const float* b, float* y, int64_t n, cudaStream_t stream);

// For each of `rows` rows: dst[r * dst_stride + dst_offset + j] (+)= src[r * src_stride +
// src_offset + j], j < len. Concat forward (rows = batch, each input's block into its channel
// range of the output) and backward (the output gradient's channel range back to one input);
// with rows = 1 a plain copy or accumulation.
cudaError_t LaunchRowCopy(const float* src, int64_t src_stride, int64_t src_offset, float* dst,
                          int64_t dst_stride, int64_t dst_offset, int64_t rows, int64_t len,
                          bool accumulate, cudaStream_t stream);

// Dropout with a counter-based generator, the same mask as the onednn backend's: with
// key = Mix(seed ^ Mix(layer ^ Mix(pass))) (Mix: SplitMix64's increment and finaliser), element i
// is kept when Mix(key + i) >> 40 >= floor(rate * 2^24), and kept elements are multiplied by
// float(1 / (1 - rate)). `pass` counts the backward passes the layer has run, so a forward and
// its backward use one mask and no mask is stored. REQUIRES: 0 <= rate < 1.
cudaError_t LaunchDropoutForward(const float* x, float* y, int64_t n, double rate, uint64_t seed,
                                 uint64_t layer, uint64_t pass, cudaStream_t stream);
cudaError_t LaunchDropoutBackward(const float* dy, float* dx, int64_t n, double rate, uint64_t seed,
                                  uint64_t layer, uint64_t pass, bool accumulate,
                                  cudaStream_t stream);

// y[r * cols + c] += bias[c] for r < rows (the fully connected layer's bias).
cudaError_t LaunchAddBiasRows(float* y, const float* bias, int64_t rows, int64_t cols,
                              cudaStream_t stream);

// Softmax cross-entropy over `batch` rows of `classes` logits. Writes
// *loss = weight / batch * sum_r (logsumexp(x_r) - x_r[label_r]) and
// dlogits = weight / batch * (softmax(x_r) - onehot(label_r)). `scratch` holds `batch` floats.
// REQUIRES: 0 <= labels[r] < classes (checked by the caller on the host).
cudaError_t LaunchSoftmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t batch,
                                      int64_t classes, float weight, float* dlogits, float* scratch,
                                      float* loss, cudaStream_t stream);

// *loss = scale * sum of x[0..n) (one block; for test losses, not for large tensors on a hot path).
cudaError_t LaunchScaledSum(const float* x, int64_t n, float scale, float* loss,
                            cudaStream_t stream);

// torch.optim.SGD: g' = g * grad_scale + weight_decay * w; v = momentum * v + g'; w -= lr * v.
cudaError_t LaunchSgdMomentum(float* w, const float* g, float* v, int64_t n, float lr,
                              float momentum, float weight_decay, float grad_scale,
                              cudaStream_t stream);

// p[i] = value.
cudaError_t LaunchFill(float* p, int64_t n, float value, cudaStream_t stream);

}  // namespace kolo::models::compute::cudnn
