// The cudnn backend's class, shared by its two source files: cudnn_backend.cc (set-up,
// parameters, input, loss, optimizer, timing) and layer_ops.cc (each layer kind's forward and
// backward). Internal to this folder; users go through cudnn_backend.h.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "models/compute/backend.h"
#include "models/compute/cudnn/conv_algos.h"
#include "models/compute/cudnn/descriptors.h"

namespace kolo::models::compute::cudnn {

using CublasHandle = Owned<cublasHandle_t, cublasDestroy>;

// Device state of one layer. Buffers point into allocations owned by the backend.
struct LayerState {
  float* y = nullptr;   // output activations, batch * out.size()
  float* dy = nullptr;  // gradient of the loss with respect to y (null for loss layers)
  // Whether some consumer's backward already wrote dy in this pass: the next one accumulates.
  bool dy_written = false;
  TensorDesc y_desc;  // NCHW of batch x out

  // conv
  FilterDesc w_desc;
  ConvDesc conv_fwd, conv_bwd_data, conv_bwd_filter;
  TensorDesc bias_desc;  // 1 x K x 1 x 1
  ConvAlgos algos;
  bool needs_dx =
      true;  // conv: false when the input is the image batch (nothing needs its gradient)

  // batch norm
  TensorDesc bn_desc;  // 1 x C x 1 x 1
  float* running_mean = nullptr;
  float* running_var = nullptr;
  float* save_mean = nullptr;
  float* save_inv_std = nullptr;

  // pooling
  PoolDesc pool;

  // dropout: backward passes run so far (picks the mask; see kernels.h)
  uint64_t dropout_draw = 0;

  // loss
  float* dlogits = nullptr;
  float* row_loss = nullptr;
  int loss_index = -1;

  // recorded after this layer's parameter gradients are written (layers with parameters)
  Event grads_ready;
};

struct ParamState {
  float* w = nullptr;
  float* g = nullptr;
  float* v = nullptr;  // momentum
  int64_t numel = 0;
};

class CudnnBackend final : public ComputeBackend {
 public:
  CudnnBackend() = default;
  ~CudnnBackend() override;

  const char* name() const override { return "cudnn"; }
  Status Prepare(const Graph& graph, const BackendConfig& config) override;
  Status SetParameter(int param, std::span<const float> values) override;
  Status GetParameter(int param, std::span<float> out) override;
  Status GetGradient(int param, std::span<float> out) override;
  Status SetInput(std::span<const float> images, std::span<const int32_t> labels) override;
  Status Forward(int layer) override;
  StatusOr<double> Loss() override;
  Status Backward(int layer, bool accumulate) override;
  GradientView Gradient(int param) override;
  Status Update(int param, const SgdConfig& sgd, double grad_scale) override;
  Status Synchronize() override;
  double TakeKernelSeconds() override;
  std::string DeviceName() const override;

 private:
  // cudnn_backend.cc
  Status CheckReady(const char* what) const;
  Status CheckLayer(int layer) const;
  Status CheckParam(int param, size_t size, const char* what) const;
  StatusOr<float*> Allocate(int64_t floats);
  Status PrepareLayer(int index);
  Status PrepareConv(int index);
  Status SetTensor4d(cudnnTensorDescriptor_t desc, int64_t n, const ImageShape& s);
  Status MarkForwardStart();
  Status MarkBackwardEnd();

  // layer_ops.cc
  Status ForwardConv(const Layer& l, LayerState& s);
  Status ForwardFullyConnected(const Layer& l, LayerState& s);
  Status BackwardConv(const Layer& l, LayerState& s, bool accumulate);
  Status BackwardBatchNorm(const Layer& l, LayerState& s, bool accumulate);
  Status BackwardFullyConnected(const Layer& l, LayerState& s, bool accumulate);
  Status BackwardConcat(const Layer& l, LayerState& s);
  // The gradient buffer of `input` for a consumer's backward to write, and whether that write
  // must accumulate (another consumer wrote first in this pass); marks it written.
  float* InputGrad(int input, bool* accumulate);
  const float* Param(const Layer& l, int k) const { return params_[l.param_ids[k]].w; }
  float* Grad(const Layer& l, int k) { return params_[l.param_ids[k]].g; }

  const Graph* graph_ = nullptr;
  BackendConfig config_;
  bool prepared_ = false;

  Stream stream_;
  CudnnHandle cudnn_;
  CublasHandle cublas_;
  cudnnMathType_t conv_math_ = CUDNN_FMA_MATH;
  ConvAlgoCache algo_cache_;

  std::vector<DevicePtr> allocations_;  // everything below points into these
  std::vector<LayerState> layers_;
  std::vector<ParamState> params_;
  float* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  float* ones_ = nullptr;  // batch ones: fully connected bias gradients as a matrix-vector product
  int32_t* labels_ = nullptr;
  float* loss_values_ = nullptr;  // one per loss layer
  int num_losses_ = 0;
  bool have_input_ = false;

  // Timing: one event pair per forward/backward pass since the last TakeKernelSeconds.
  struct PassEvents {
    Event start;
    Event end;
    bool ended = false;
  };
  std::vector<PassEvents> passes_;  // a pool: the first used_passes_ are this interval's
  size_t used_passes_ = 0;
  bool pass_backward_ = true;  // the open pass ran a backward: the next forward opens a new one
};

}  // namespace kolo::models::compute::cudnn
