// The cudnn compute backend (see models/compute/backend.h): cuDNN convolutions, batch norm and
// pooling, cuBLAS for fully connected layers, and kolo's own CUDA kernels for the rest, all on one
// compute stream of BackendConfig::device.
//
// Precision: fp32 (FMA math in cuDNN, no TF32 in cuBLAS), tf32 (tensor-core math for
// convolutions and matrix products, float32 storage), and mixed precision in the manner of
// torch.autocast: fp16 or bf16 activations and activation gradients (NCHW, the layout PyTorch
// uses by default), convolutions and matrix products on tensor cores with float32 accumulation,
// batch norm with half data and float32 statistics, the loss and its softmax in float32, and
// float32 master weights, momentum and gradient buffers. Half weight gradients are divided by the
// loss scale in float32 as they are written into the float32 buffers, so the engine reduces, and
// GetGradient returns, true (unscaled) gradients at every precision.
//
// Loss scaling: fp16 scales dynamically (LossScaleOptions, torch GradScaler's defaults); each
// Update checks its (reduced) gradient for inf/NaN on the device, and the Update that completes
// the step applies SGD to every parameter at once unless some gradient was not finite, in which
// case the whole step is skipped and the scale backs off. Nothing waits for the host. bf16 does
// not scale: it has float32's exponent range, so gradients neither underflow nor overflow where
// float32's would not (torch.autocast uses bf16 without a GradScaler for the same reason); its
// Update applies at once and nothing is skipped. bf16 needs compute capability 8.0 or newer.
//
// Gradients are float32 device buffers in torch layout; each layer's gradients carry one
// cudaEvent_t (GradientView::ready_event) recorded on the compute stream after that layer's
// backward, which the engine waits on before it reduces them.
//
// TakeKernelSeconds() reports GPU time from the first kernel of each forward pass to the last
// kernel of its backward pass, measured with CUDA events (gaps where the GPU waited for the host
// inside that span count; optimizer updates do not).
#pragma once

#include <memory>
#include <string>

#include "engine/common/status.h"
#include "models/compute/backend.h"
#include "models/compute/cudnn/loss_scale.h"

namespace kolo::models::compute::cudnn {

// `loss_scale` configures fp16's dynamic loss scaling (other precisions ignore it); Prepare
// rejects options that LossScaleOptionsValid refuses.
std::unique_ptr<ComputeBackend> CreateCudnnBackend(const LossScaleOptions& loss_scale = {});

// The loss-scaling state of a prepared cudnn backend, read from the device (waits for it):
// scale 1 with no step skipped at fp32, tf32 and bf16. Errors: not a prepared cudnn backend.
StatusOr<LossScaleState> ReadLossScale(ComputeBackend& backend);

// The number of CUDA devices this process can use: 0 when there is no driver or no GPU (that is
// not an error). Tests skip on 0.
int CudaDeviceCount();

// The name of CUDA device `device` as the driver reports it ("NVIDIA H100 80GB HBM3"), for the
// JSON record's gpu_model. Errors: no such device, or no usable driver.
StatusOr<std::string> GpuName(int device);

// The compute capability of CUDA device `device` as major * 10 + minor (90 for an H100).
// Errors: no such device, or no usable driver.
StatusOr<int> ComputeCapability(int device);

}  // namespace kolo::models::compute::cudnn
