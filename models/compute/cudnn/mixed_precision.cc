// Mixed precision (fp16, bf16) in the cudnn backend: the choice of storage types, the half
// working copies of the weights, the unscaling of weight gradients into the float32 buffers the
// engine reduces, and fp16's optimizer step gated by the device's inf/NaN flag.
#include <algorithm>
#include <vector>

#include "models/compute/cudnn/backend_impl.h"
#include "models/compute/cudnn/check.h"
#include "models/compute/cudnn/cudnn_backend.h"

namespace kolo::models::compute::cudnn {

Status CudnnBackend::ChoosePrecision(const BackendConfig& config) {
  switch (config.precision) {
    case Precision::kFp32:
    case Precision::kTf32:
      return Status::OK();
    case Precision::kFp16: {
      const char* why = nullptr;
      if (!LossScaleOptionsValid(loss_options_, &why)) {
        return InvalidArgument("cudnn backend: fp16 loss scaling: {}", why);
      }
      act_ = Elem::kFloat16;
      act_type_ = CUDNN_DATA_HALF;
      blas_type_ = CUDA_R_16F;
      mixed_ = true;
      dynamic_scaling_ = true;
      return Status::OK();
    }
    case Precision::kBf16: {
      KOLO_ASSIGN_OR_RETURN(const int cc, ComputeCapability(config.device));
      if (cc < 80) {
        KOLO_ASSIGN_OR_RETURN(const std::string name, GpuName(config.device));
        return InvalidArgument(
            "cudnn backend: precision bf16 needs a GPU of compute capability 8.0 or newer "
            "(Ampere, Hopper); CUDA device {} '{}' has {}.{}; use fp16, tf32 or fp32",
            config.device, name, cc / 10, cc % 10);
      }
      act_ = Elem::kBfloat16;
      act_type_ = CUDNN_DATA_BFLOAT16;
      blas_type_ = CUDA_R_16BF;
      mixed_ = true;
      return Status::OK();
    }
  }
  return InvalidArgument("cudnn backend: unknown precision {}", static_cast<int>(config.precision));
}

size_t CudnnBackend::StagingBytes(const Layer& l) const {
  const auto numel = [&](int k) {
    return static_cast<size_t>(params_[l.param_ids[static_cast<size_t>(k)]].numel);
  };
  const size_t channels = static_cast<size_t>(l.out.c) * sizeof(float);
  switch (l.kind) {
    case LayerKind::kConv:  // the filter gradient as act_, then the bias gradient as float32
      return std::max(numel(0) * ElemBytes(act_), l.param_ids.size() > 1 ? channels : 0);
    case LayerKind::kFullyConnected:  // both as float32, one after the other
      return std::max(numel(0), l.param_ids.size() > 1 ? numel(1) : 0) * sizeof(float);
    case LayerKind::kBatchNorm:  // scale and shift gradients side by side
      return 2 * RoundUp256(channels);
    default:
      return 0;
  }
}

Status CudnnBackend::PrepareMixed() {
  cudaStream_t st = stream_.get();
  const auto& params = graph_->params();
  for (size_t i = 0; i < params_.size(); ++i) {
    const Layer& l = graph_->layer(params[i].layer);
    const bool weight = l.param_ids[0] == static_cast<int>(i);
    if (weight && (l.kind == LayerKind::kConv || l.kind == LayerKind::kFullyConnected)) {
      ParamState& p = params_[i];
      KOLO_ASSIGN_OR_RETURN(p.w_half, AllocateActivations(p.numel));
      KOLO_CUDA_CHECK(LaunchCast(act_, p.w, p.w_half, p.numel, st));
    }
  }
  for (const Layer& l : graph_->layers()) {
    grad_staging_bytes_ = std::max(grad_staging_bytes_, StagingBytes(l));
  }
  KOLO_ASSIGN_OR_RETURN(grad_staging_, AllocateBytes(grad_staging_bytes_));
  KOLO_ASSIGN_OR_RETURN(input_staging_, Allocate(config_.batch * graph_->input_shape().size()));
  KOLO_ASSIGN_OR_RETURN(ones_act_, AllocateActivations(config_.batch));
  KOLO_CUDA_CHECK(LaunchFillScaled(act_, ones_act_, config_.batch, 1.0f, nullptr, st));

  const LossScaleState initial =
      dynamic_scaling_ ? InitialLossScale(loss_options_) : LossScaleState{};
  KOLO_ASSIGN_OR_RETURN(void* state, AllocateBytes(sizeof(LossScaleState)));
  loss_scale_ = static_cast<LossScaleState*>(state);
  KOLO_CUDA_CHECK(
      cudaMemcpyAsync(loss_scale_, &initial, sizeof(initial), cudaMemcpyHostToDevice, st));
  KOLO_CUDA_CHECK(cudaStreamSynchronize(st));  // `initial` goes out of scope
  if (!dynamic_scaling_) return Status::OK();

  // fp16's one-launch optimizer step: every parameter cut into chunks of one thread block each.
  std::vector<SgdTensor> tensors(params_.size());
  std::vector<SgdChunk> chunks;
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamState& p = params_[i];
    tensors[i] = SgdTensor{p.w, p.g, p.v, p.w_half, p.numel};
    for (int64_t begin = 0; begin < p.numel; begin += kSgdChunkElems) {
      chunks.push_back(
          SgdChunk{static_cast<int32_t>(i), begin, std::min(p.numel, begin + kSgdChunkElems)});
    }
  }
  KOLO_ASSIGN_OR_RETURN(void* t, AllocateBytes(tensors.size() * sizeof(SgdTensor)));
  KOLO_ASSIGN_OR_RETURN(void* c, AllocateBytes(chunks.size() * sizeof(SgdChunk)));
  sgd_tensors_ = static_cast<SgdTensor*>(t);
  sgd_chunks_ = static_cast<SgdChunk*>(c);
  num_sgd_chunks_ = static_cast<int64_t>(chunks.size());
  KOLO_CUDA_CHECK(cudaMemcpyAsync(sgd_tensors_, tensors.data(), tensors.size() * sizeof(SgdTensor),
                                  cudaMemcpyHostToDevice, st));
  KOLO_CUDA_CHECK(cudaMemcpyAsync(sgd_chunks_, chunks.data(), chunks.size() * sizeof(SgdChunk),
                                  cudaMemcpyHostToDevice, st));
  KOLO_CUDA_CHECK(cudaStreamSynchronize(st));
  checked_.assign(params_.size(), 0);
  num_checked_ = 0;
  return Status::OK();
}

Status CudnnBackend::TakeStagedGradient(const Layer& l, int k, Elem e, size_t staging_offset,
                                        bool accumulate) {
  ParamState& p = params_[l.param_ids[static_cast<size_t>(k)]];
  KOLO_CUDA_CHECK(LaunchUnscaleGradient(e, static_cast<char*>(grad_staging_) + staging_offset,
                                        ScalePtr(), p.g, p.numel, accumulate, stream_.get()));
  return Status::OK();
}

Status CudnnBackend::UpdateMixed(int param, const SgdConfig& sgd, double grad_scale) {
  cudaStream_t st = stream_.get();
  ParamState& p = params_[static_cast<size_t>(param)];
  if (!dynamic_scaling_) {
    KOLO_CUDA_CHECK(LaunchSgdMomentumRefresh(
        act_, p.w, p.g, p.v, p.w_half, p.numel, static_cast<float>(sgd.learning_rate),
        static_cast<float>(sgd.momentum), static_cast<float>(sgd.weight_decay),
        static_cast<float>(grad_scale), st));
    return Status::OK();
  }
  const std::string& name = graph_->params()[static_cast<size_t>(param)].name;
  if (checked_[static_cast<size_t>(param)] != 0) {
    return FailedPrecondition(
        "cudnn backend: Update of '{}' twice in one step; with fp16 every parameter is updated "
        "once per step, and the step applies when the last one is",
        name);
  }
  if (num_checked_ == 0) {
    step_sgd_ = sgd;
    step_grad_scale_ = grad_scale;
  } else if (sgd.learning_rate != step_sgd_.learning_rate || sgd.momentum != step_sgd_.momentum ||
             sgd.weight_decay != step_sgd_.weight_decay || grad_scale != step_grad_scale_) {
    return InvalidArgument(
        "cudnn backend: Update of '{}' with learning rate {}, momentum {}, weight decay {}, "
        "gradient scale {}; fp16 steps every parameter at once, and this step's first Update "
        "had {}, {}, {}, {}",
        name, sgd.learning_rate, sgd.momentum, sgd.weight_decay, grad_scale,
        step_sgd_.learning_rate, step_sgd_.momentum, step_sgd_.weight_decay, step_grad_scale_);
  }
  // The gradient is the engine's reduced one: every rank checks the same values, so every rank
  // finds the same inf/NaN and all of them skip (or apply) the same steps.
  KOLO_CUDA_CHECK(LaunchCheckFinite(p.g, p.numel, &loss_scale_->found_inf, st));
  checked_[static_cast<size_t>(param)] = 1;
  if (++num_checked_ < params_.size()) return Status::OK();

  KOLO_CUDA_CHECK(LaunchMultiTensorSgd(
      act_, sgd_tensors_, sgd_chunks_, num_sgd_chunks_, static_cast<float>(step_sgd_.learning_rate),
      static_cast<float>(step_sgd_.momentum), static_cast<float>(step_sgd_.weight_decay),
      static_cast<float>(step_grad_scale_), &loss_scale_->found_inf, st));
  KOLO_CUDA_CHECK(LaunchAdvanceLossScale(loss_options_, loss_scale_, st));
  std::fill(checked_.begin(), checked_.end(), 0);
  num_checked_ = 0;
  return Status::OK();
}

StatusOr<LossScaleState> CudnnBackend::ReadLossScale() {
  KOLO_RETURN_IF_ERROR(CheckReady("ReadLossScale"));
  LossScaleState s;
  if (loss_scale_ == nullptr) return s;
  KOLO_CUDA_CHECK(
      cudaMemcpyAsync(&s, loss_scale_, sizeof(s), cudaMemcpyDeviceToHost, stream_.get()));
  KOLO_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  return s;
}

}  // namespace kolo::models::compute::cudnn
