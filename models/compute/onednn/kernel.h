// One layer's kernels on the oneDNN backend: its primitives, their arguments and any buffers of
// its own, built once for the Net's batch size and reused by every pass.
#pragma once

#include <memory>

#include "engine/common/status.h"
#include "models/compute/onednn/net.h"

namespace kolo::models::compute::onednn {

class LayerKernel {
 public:
  virtual ~LayerKernel() = default;

  // Computes the layer's output from its inputs' outputs.
  [[nodiscard]] virtual Status Forward() = 0;
  // From the gradient of the layer's output: the gradients of its inputs (those that need one,
  // written or added as Net::adds_to_input says) and of its parameters (written, or added to the
  // gradient buffers when `accumulate`). REQUIRES: Forward ran in this pass.
  [[nodiscard]] virtual Status Backward(bool accumulate) = 0;
};

// Builders, one per layer kind; each reads layer `l` of net.graph(). They throw dnnl::error when
// oneDNN cannot build a primitive (the caller converts it).
std::unique_ptr<LayerKernel> MakeConvKernel(Net& net, int l);
std::unique_ptr<LayerKernel> MakeFullyConnectedKernel(Net& net, int l);
std::unique_ptr<LayerKernel> MakeBatchNormKernel(Net& net, int l);
std::unique_ptr<LayerKernel> MakeReluKernel(Net& net, int l);
std::unique_ptr<LayerKernel> MakePoolKernel(Net& net, int l);  // max and average
std::unique_ptr<LayerKernel> MakeConcatKernel(Net& net, int l);
std::unique_ptr<LayerKernel> MakeAddKernel(Net& net, int l);
std::unique_ptr<LayerKernel> MakeDropoutKernel(Net& net, int l);
std::unique_ptr<LayerKernel> MakeLossKernel(Net& net, int l);

}  // namespace kolo::models::compute::onednn
