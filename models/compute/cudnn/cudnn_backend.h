// The cudnn compute backend (see models/compute/backend.h): cuDNN convolutions, batch norm and
// pooling, cuBLAS for fully connected layers, and kolo's own CUDA kernels for the rest, all on one
// compute stream of BackendConfig::device.
//
// Precision: fp32 (FMA math in cuDNN, no TF32 in cuBLAS) and tf32 (tensor-core math for
// convolutions and matrix products, float32 storage). fp16 and bf16 are rejected by Prepare.
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

namespace kolo::models::compute::cudnn {

std::unique_ptr<ComputeBackend> CreateCudnnBackend();

// The number of CUDA devices this process can use: 0 when there is no driver or no GPU (that is
// not an error). Tests skip on 0.
int CudaDeviceCount();

// The name of CUDA device `device` as the driver reports it ("NVIDIA H100 80GB HBM3"), for the
// JSON record's gpu_model. Errors: no such device, or no usable driver.
StatusOr<std::string> GpuName(int device);

}  // namespace kolo::models::compute::cudnn
