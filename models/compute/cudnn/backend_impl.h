// The cudnn backend's class, shared by its source files: cudnn_backend.cc (set-up, parameters,
// input, loss, optimizer, timing), layer_ops.cc (each layer kind's forward and backward),
// gradient_staging.cc (gradient copies to pinned host memory on a side stream) and
// mixed_precision.cc (fp16/bf16: working copies, gradient conversion, loss scaling, the gated
// optimizer step). Internal to this folder; users go through cudnn_backend.h.
//
// Mixed precision (fp16, bf16): activations and their gradients are stored as `act_` (NCHW, as at
// fp32; half convolutions run on tensor cores with float32 accumulation); parameters, momentum and
// the gradient buffers the engine reduces stay float32. Convolution and fully connected weights
// have a half working copy (ParamState::w_half) refreshed from the float32 master whenever it
// changes; biases and batch-norm scale/shift are read as float32 directly.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "models/compute/backend.h"
#include "models/compute/cudnn/conv_algos.h"
#include "models/compute/cudnn/conv_plans.h"
#include "models/compute/cudnn/descriptors.h"
#include "models/compute/cudnn/kernels.h"
#include "models/compute/cudnn/loss_scale.h"
#include "models/compute/cudnn/mixed_kernels.h"

namespace kolo::models::compute::cudnn {

using CublasHandle = Owned<cublasHandle_t, cublasDestroy>;

// Offsets into the gradient staging buffer keep each region 256-byte aligned.
inline size_t RoundUp256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Device state of one layer. Buffers point into allocations owned by the backend.
struct LayerState {
  void* y = nullptr;   // output activations, batch * out.size() elements of act_
  void* dy = nullptr;  // gradient of the loss with respect to y (null for loss layers)
  // Whether some consumer's backward already wrote dy in this pass: the next one accumulates.
  bool dy_written = false;
  TensorDesc y_desc;  // NCHW of batch x out, of act_

  // conv
  FilterDesc w_desc;
  ConvDesc conv_fwd, conv_bwd_data, conv_bwd_filter;
  TensorDesc bias_desc;  // 1 x K x 1 x 1 (fp32/tf32; mixed precision adds the bias itself)
  ConvAlgos algos;
  bool needs_dx =
      true;  // conv: false when the input is the image batch (nothing needs its gradient)

  // batch norm
  TensorDesc bn_desc;  // 1 x C x 1 x 1, float32 at every precision (cuDNN's rule)
  float* running_mean = nullptr;
  float* running_var = nullptr;
  float* save_mean = nullptr;
  float* save_inv_std = nullptr;

  // pooling
  PoolDesc pool;

  // dropout: backward passes run so far (picks the mask; see kernels.h)
  uint64_t dropout_draw = 0;

  // loss
  void* dlogits = nullptr;  // of act_
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
  // Mixed precision: the act_ working copy of w that cuDNN/cuBLAS read (conv and fully connected
  // weights), or null where kernels read w itself.
  void* w_half = nullptr;
};

class CudnnBackend final : public ComputeBackend {
 public:
  explicit CudnnBackend(const LossScaleOptions& loss_scale) : loss_options_(loss_scale) {}
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
  StatusOr<std::span<float>> HostStagingBuffer(int param) override;
  StatusOr<std::unique_ptr<GradientCopy>> StartGradientCopy(int param,
                                                            std::span<float> out) override;
  Status Update(int param, const SgdConfig& sgd, double grad_scale) override;
  Status Synchronize() override;
  double TakeKernelSeconds() override;
  Status TimeMark() override;
  StatusOr<std::vector<double>> TakeMarkTimesMs() override;
  std::string DeviceName() const override;

  // The loss-scaling state (scale 1 and nothing skipped unless fp16). Waits for the device.
  StatusOr<LossScaleState> ReadLossScale();

 private:
  // cudnn_backend.cc
  Status CheckReady(const char* what) const;
  Status CheckLayer(int layer) const;
  Status CheckParam(int param, size_t size, const char* what) const;
  StatusOr<float*> Allocate(int64_t floats);
  StatusOr<void*> AllocateBytes(size_t bytes);
  StatusOr<void*> AllocateActivations(int64_t count) {
    return AllocateBytes(static_cast<size_t>(count) * ElemBytes(act_));
  }
  Status PrepareLayer(int index);
  Status PrepareConv(int index);
  // Descriptor of n x s in act_ (float32 when `master` is set: batch norm's parameters).
  Status SetTensor4d(cudnnTensorDescriptor_t desc, int64_t n, const ImageShape& s,
                     bool master = false);
  Status MarkForwardStart();
  Status MarkBackwardEnd();

  // mixed_precision.cc
  Status ChoosePrecision(const BackendConfig& config);
  Status PrepareMixed();
  Status UpdateMixed(int param, const SgdConfig& sgd, double grad_scale);
  // The device loss scale the loss gradient is seeded with and weight gradients are divided by;
  // null when gradients are not scaled (fp32, tf32, bf16).
  const float* ScalePtr() const { return dynamic_scaling_ ? &loss_scale_->scale : nullptr; }
  // Unscales a weight gradient written to grad_staging_ (as `e`) into parameter k of `l`.
  Status TakeStagedGradient(const Layer& l, int k, Elem e, size_t staging_offset, bool accumulate);
  // Bytes of grad_staging_ that layer `l`'s backward needs.
  size_t StagingBytes(const Layer& l) const;

  // layer_ops.cc
  Status ForwardConv(const Layer& l, LayerState& s);
  Status ForwardFullyConnected(const Layer& l, LayerState& s);
  Status BackwardConv(const Layer& l, LayerState& s, bool accumulate);
  Status BackwardBatchNorm(const Layer& l, LayerState& s, bool accumulate);
  Status BackwardFullyConnected(const Layer& l, LayerState& s, bool accumulate);
  Status BackwardConcat(const Layer& l, LayerState& s);
  Status ForwardFullyConnectedMixed(const Layer& l, LayerState& s);
  Status BackwardFullyConnectedMixed(const Layer& l, LayerState& s, bool accumulate);
  Status BackwardConvMixed(const Layer& l, LayerState& s, bool accumulate);
  // Convolution `dir` of `l` (state `s`), the output added to with `accumulate`: through its
  // kept execution plan (conv_plans.h) with KOLO_CUDNN_CONV_API=plans, else the legacy call with
  // the algorithm cudnnFind chose. The pointers are in the forward convolution's roles (x, w, y):
  // backward data writes x, backward filter w, forward y.
  Status Convolve(const Layer& l, const LayerState& s, ConvDirection dir, bool accumulate,
                  const void* x, const void* w, const void* y);
  Status RunConvPlan(const Layer& l, ConvDirection dir, bool accumulate, const void* x,
                     const void* w, const void* y);
  // The gradient buffer of `input` for a consumer's backward to write, and whether that write
  // must accumulate (another consumer wrote first in this pass); marks it written.
  void* InputGrad(int input, bool* accumulate);
  // Parameter k of `l` as float32 (biases, batch norm, and everything at fp32/tf32).
  const float* Param(const Layer& l, int k) const { return params_[l.param_ids[k]].w; }
  // What convolutions and matrix products read: the half working copy under mixed precision.
  const void* Weight(const Layer& l, int k) const {
    const ParamState& p = params_[l.param_ids[k]];
    return p.w_half != nullptr ? p.w_half : p.w;
  }
  float* Grad(const Layer& l, int k) { return params_[l.param_ids[k]].g; }

  const Graph* graph_ = nullptr;
  BackendConfig config_;
  bool prepared_ = false;

  Stream stream_;
  CudnnHandle cudnn_;
  CublasHandle cublas_;
  cudnnMathType_t conv_math_ = CUDNN_FMA_MATH;
  // Activation storage: float32 at fp32/tf32, half under mixed precision.
  Elem act_ = Elem::kFloat32;
  cudnnDataType_t act_type_ = CUDNN_DATA_FLOAT;
  cudaDataType_t blas_type_ = CUDA_R_32F;
  bool mixed_ = false;
  ConvAlgoCache algo_cache_;
  bool conv_plans_on_ = false;  // KOLO_CUDNN_CONV_API=plans
  ConvPlanCache conv_plans_;

  std::vector<DevicePtr> allocations_;  // everything below points into these
  std::vector<LayerState> layers_;
  std::vector<ParamState> params_;
  float* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  float* ones_ = nullptr;  // batch ones: fully connected bias gradients as a matrix-vector product
  void* ones_act_ = nullptr;  // the same as act_ (mixed precision)
  int32_t* labels_ = nullptr;
  float* loss_values_ = nullptr;  // one per loss layer
  int num_losses_ = 0;
  bool have_input_ = false;

  // Mixed precision.
  float* input_staging_ = nullptr;  // SetInput's float32 images, cast to act_ into the input layer
  void* grad_staging_ = nullptr;    // a weight gradient between its computation and unscaling
  size_t grad_staging_bytes_ = 0;
  LossScaleOptions loss_options_;
  bool dynamic_scaling_ = false;          // fp16: loss scaling with inf/NaN skipping
  LossScaleState* loss_scale_ = nullptr;  // device
  SgdTensor* sgd_tensors_ = nullptr;      // device, one per parameter
  SgdChunk* sgd_chunks_ = nullptr;        // device
  int64_t num_sgd_chunks_ = 0;
  // fp16's step: parameters whose Update ran (their gradients checked); the optimizer runs for all
  // of them at once when the last one arrives, with the SGD settings the first one brought.
  std::vector<char> checked_;
  size_t num_checked_ = 0;
  SgdConfig step_sgd_;
  double step_grad_scale_ = 1.0;

  // Gradient staging (gradient_staging.cc), set up on first use: copies wait on the copy stream
  // for their layer's grads_ready, so the compute stream never waits for them.
  Stream copy_stream_;
  struct ParamStaging {
    PinnedPtr host;  // numel floats: HostStagingBuffer
    Event copied;    // recorded on copy_stream_ after the parameter's latest copy
  };
  std::vector<ParamStaging> staging_;  // per parameter

  // Timing: one event pair per forward/backward pass since the last TakeKernelSeconds.
  struct PassEvents {
    Event start;
    Event end;
    bool ended = false;
  };
  std::vector<PassEvents> passes_;  // a pool: the first used_passes_ are this interval's
  size_t used_passes_ = 0;
  bool pass_backward_ = true;  // the open pass ran a backward: the next forward opens a new one
  // TimeMark's events on stream_ (a pool: the first used_marks_ are marks not yet taken).
  std::vector<Event> marks_;
  size_t used_marks_ = 0;
};

}  // namespace kolo::models::compute::cudnn
