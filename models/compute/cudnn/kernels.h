// The GPU backend's own CUDA kernels: the element-wise, copy, loss and optimizer steps that cuDNN
// and cuBLAS do not provide. Every launcher enqueues on `stream` and returns the launch's error
// (cudaGetLastError), so the caller can convert it with KOLO_CUDA_CHECK.
//
// Conventions: activations and their gradients are device buffers of the element type `e` (float32
// at fp32/tf32, float16 or bfloat16 under mixed precision); arithmetic is float32 whatever the
// storage, rounded once when stored. Other buffers are float32 (labels int32). Sizes are element
// counts. An `accumulate` flag adds into the destination instead of overwriting it (a producer
// whose output has several consumers receives the sum of their gradients). Buffers may not
// overlap unless a launcher says so.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kolo::models::compute::cudnn {

// Storage type of activations and of their gradients.
enum class Elem : uint8_t { kFloat32, kFloat16, kBfloat16 };
inline size_t ElemBytes(Elem e) { return e == Elem::kFloat32 ? 4 : 2; }

// y = max(x, 0). x and y may be the same buffer.
cudaError_t LaunchReluForward(Elem e, const void* x, void* y, int64_t n, cudaStream_t stream);
// dx (+)= dy where y > 0, else 0 (+ 0).
cudaError_t LaunchReluBackward(Elem e, const void* y, const void* dy, void* dx, int64_t n,
                               bool accumulate, cudaStream_t stream);

// y = a + b.
cudaError_t LaunchAdd(Elem e, const void* a, const void* b, void* y, int64_t n,
                      cudaStream_t stream);

// For each of `rows` rows: dst[r * dst_stride + dst_offset + j] (+)= src[r * src_stride +
// src_offset + j], j < len. Concat forward (rows = batch, each input's block into its channel
// range of the output) and backward (the output gradient's channel range back to one input);
// with rows = 1 a plain copy or accumulation.
cudaError_t LaunchRowCopy(Elem e, const void* src, int64_t src_stride, int64_t src_offset,
                          void* dst, int64_t dst_stride, int64_t dst_offset, int64_t rows,
                          int64_t len, bool accumulate, cudaStream_t stream);

// Dropout with a counter-based generator, the same mask as the onednn backend's: with
// key = Mix(seed ^ Mix(layer ^ Mix(pass))) (Mix: SplitMix64's increment and finaliser), element i
// is kept when Mix(key + i) >> 40 >= floor(rate * 2^24), and kept elements are multiplied by
// float(1 / (1 - rate)). `pass` counts the backward passes the layer has run, so a forward and
// its backward use one mask and no mask is stored. REQUIRES: 0 <= rate < 1.
cudaError_t LaunchDropoutForward(Elem e, const void* x, void* y, int64_t n, double rate,
                                 uint64_t seed, uint64_t layer, uint64_t pass, cudaStream_t stream);
cudaError_t LaunchDropoutBackward(Elem e, const void* dy, void* dx, int64_t n, double rate,
                                  uint64_t seed, uint64_t layer, uint64_t pass, bool accumulate,
                                  cudaStream_t stream);

// y[r * cols + c] += bias[c] for r < rows (the fully connected layer's bias; float32 bias).
cudaError_t LaunchAddBiasRows(Elem e, void* y, const float* bias, int64_t rows, int64_t cols,
                              cudaStream_t stream);

// Softmax cross-entropy over `batch` rows of `classes` logits, computed in float32. Writes
// *loss = weight / batch * sum_r (logsumexp(x_r) - x_r[label_r]) and
// dlogits = s * weight / batch * (softmax(x_r) - onehot(label_r)), where s is *loss_scale when
// loss_scale is not null (a device float: mixed precision seeds backward with the loss scale) and
// 1 otherwise; the loss itself is never scaled. `scratch` holds `batch` floats.
// REQUIRES: 0 <= labels[r] < classes (checked by the caller on the host).
cudaError_t LaunchSoftmaxCrossEntropy(Elem e, const void* logits, const int32_t* labels,
                                      int64_t batch, int64_t classes, float weight,
                                      const float* loss_scale, void* dlogits, float* scratch,
                                      float* loss, cudaStream_t stream);

// *loss = scale * sum of x[0..n) (one block; for test losses, not for large tensors on a hot path).
cudaError_t LaunchScaledSum(Elem e, const void* x, int64_t n, float scale, float* loss,
                            cudaStream_t stream);

// torch.optim.SGD: g' = g * grad_scale + weight_decay * w; v = momentum * v + g'; w -= lr * v.
cudaError_t LaunchSgdMomentum(float* w, const float* g, float* v, int64_t n, float lr,
                              float momentum, float weight_decay, float grad_scale,
                              cudaStream_t stream);

// p[i] = value (float32 buffer).
cudaError_t LaunchFill(float* p, int64_t n, float value, cudaStream_t stream);

// p[i] = value * (*scale), or value when scale is null, stored as `e`.
cudaError_t LaunchFillScaled(Elem e, void* p, int64_t n, float value, const float* scale,
                             cudaStream_t stream);

}  // namespace kolo::models::compute::cudnn
