// CUDA kernels of mixed precision (fp16/bf16): casts between the float32 master copies and the
// half working copies, the conversion of half weight gradients into the float32 buffers the
// engine reduces, the inf/NaN check, the optimizer step gated by it, the loss-scale update, and
// the convolution bias (whose cuDNN calls want matching bias and tensor types). Conventions as in
// kernels.h: every launcher enqueues on `stream` and returns the launch's error.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "models/compute/cudnn/kernels.h"
#include "models/compute/cudnn/loss_scale.h"

namespace kolo::models::compute::cudnn {

// dst[i] = src[i] rounded to `e`.
cudaError_t LaunchCast(Elem e, const float* src, void* dst, int64_t n, cudaStream_t stream);

// g[i] (+)= src[i] / *scale in float32: a weight gradient computed at the loss scale, as `e`,
// unscaled into the parameter's float32 gradient buffer. scale null: no division.
cudaError_t LaunchUnscaleGradient(Elem e, const void* src, const float* scale, float* g, int64_t n,
                                  bool accumulate, cudaStream_t stream);

// Sets *found_inf to 1 when some g[i] is an inf or NaN (leaves it alone otherwise).
cudaError_t LaunchCheckFinite(const float* g, int64_t n, int32_t* found_inf, cudaStream_t stream);

// One parameter of the multi-tensor optimizer step. Device-resident array, set up once.
struct SgdTensor {
  float* w = nullptr;  // float32 master weights
  const float* g = nullptr;
  float* v = nullptr;      // momentum
  void* w_half = nullptr;  // the half working copy refreshed from w after the update, or null
  int64_t numel = 0;
};
// A slice [begin, end) of tensor `tensor`: one thread block's work.
struct SgdChunk {
  int32_t tensor = 0;
  int64_t begin = 0;
  int64_t end = 0;
};
inline constexpr int64_t kSgdChunkElems = 65536;

// torch.optim.SGD (see LaunchSgdMomentum) over every chunk in one launch, then
// w_half = round(w) as `e`; does nothing at all when *skip is nonzero (a skipped step: weights,
// momentum and working copies unchanged). skip may be null.
cudaError_t LaunchMultiTensorSgd(Elem e, const SgdTensor* tensors, const SgdChunk* chunks,
                                 int64_t num_chunks, float lr, float momentum, float weight_decay,
                                 float grad_scale, const int32_t* skip, cudaStream_t stream);

// The same update for one tensor (bf16, where no step is skipped).
cudaError_t LaunchSgdMomentumRefresh(Elem e, float* w, const float* g, float* v, void* w_half,
                                     int64_t n, float lr, float momentum, float weight_decay,
                                     float grad_scale, cudaStream_t stream);

// AdvanceLossScale(options, state) on the device (one thread).
cudaError_t LaunchAdvanceLossScale(const LossScaleOptions& options, LossScaleState* state,
                                   cudaStream_t stream);

// y[b, c, :] += bias[c] over an NCHW tensor of `batch` x `channels` x `spatial`.
cudaError_t LaunchAddChannelBias(Elem e, void* y, const float* bias, int64_t batch,
                                 int64_t channels, int64_t spatial, cudaStream_t stream);
// db[c] = sum over b and the spatial positions of dy[b, c, :], in float32 (overwrites db).
cudaError_t LaunchChannelSum(Elem e, const void* dy, float* db, int64_t batch, int64_t channels,
                             int64_t spatial, cudaStream_t stream);

}  // namespace kolo::models::compute::cudnn
