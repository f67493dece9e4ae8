// Forward and backward of each layer kind on the compute stream.
#include <variant>

#include "models/compute/cudnn/backend_impl.h"
#include "models/compute/cudnn/check.h"
#include "models/compute/cudnn/kernels.h"

namespace kolo::models::compute::cudnn {
namespace {

const float kOne = 1.0f;
const float kZero = 0.0f;

const float* Beta(bool accumulate) { return accumulate ? &kOne : &kZero; }

}  // namespace

void* CudnnBackend::InputGrad(int input, bool* accumulate) {
  LayerState& s = layers_[static_cast<size_t>(input)];
  *accumulate = s.dy_written;
  s.dy_written = true;
  return s.dy;
}

Status CudnnBackend::Forward(int layer) {
  KOLO_RETURN_IF_ERROR(CheckLayer(layer));
  if (!have_input_) return FailedPrecondition("cudnn backend: Forward before SetInput");
  KOLO_RETURN_IF_ERROR(MarkForwardStart());
  const Layer& l = graph_->layer(layer);
  LayerState& s = layers_[static_cast<size_t>(layer)];
  s.dy_written = false;
  cudaStream_t st = stream_.get();
  const int64_t n = config_.batch;
  const void* x = l.inputs.empty() ? nullptr : layers_[l.inputs[0]].y;
  const cudnnTensorDescriptor_t x_desc =
      l.inputs.empty() ? nullptr : layers_[l.inputs[0]].y_desc.get();
  switch (l.kind) {
    case LayerKind::kInput:
      return Status::OK();
    case LayerKind::kConv:
      return ForwardConv(l, s);
    case LayerKind::kBatchNorm: {
      const auto& p = std::get<BatchNormParams>(l.params);
      KOLO_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
          cudnn_.get(), CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, x_desc, x, s.y_desc.get(), s.y,
          s.bn_desc.get(), Param(l, 0), Param(l, 1), p.momentum, s.running_mean, s.running_var,
          p.epsilon, s.save_mean, s.save_inv_std));
      return Status::OK();
    }
    case LayerKind::kRelu:
      KOLO_CUDA_CHECK(LaunchReluForward(act_, x, s.y, n * l.out.size(), st));
      return Status::OK();
    case LayerKind::kMaxPool:
    case LayerKind::kAvgPool:
      KOLO_CUDNN_CHECK(cudnnPoolingForward(cudnn_.get(), s.pool.get(), &kOne, x_desc, x, &kZero,
                                           s.y_desc.get(), s.y));
      return Status::OK();
    case LayerKind::kConcat: {
      int64_t offset = 0;
      const int64_t hw = l.out.h * l.out.w;
      for (int in : l.inputs) {
        const int64_t len = graph_->layer(in).out.c * hw;
        KOLO_CUDA_CHECK(LaunchRowCopy(act_, layers_[in].y, len, 0, s.y, l.out.size(), offset, n,
                                      len, false, st));
        offset += len;
      }
      return Status::OK();
    }
    case LayerKind::kAdd:
      KOLO_CUDA_CHECK(LaunchAdd(act_, x, layers_[l.inputs[1]].y, s.y, n * l.out.size(), st));
      return Status::OK();
    case LayerKind::kDropout: {
      const double rate = std::get<DropoutParams>(l.params).rate;
      KOLO_CUDA_CHECK(LaunchDropoutForward(act_, x, s.y, n * l.out.size(), rate, config_.seed,
                                           static_cast<uint64_t>(layer), s.dropout_draw, st));
      return Status::OK();
    }
    case LayerKind::kFullyConnected:
      return ForwardFullyConnected(l, s);
    case LayerKind::kSoftmaxCrossEntropy: {
      const auto& p = std::get<LossParams>(l.params);
      if (p.sum_of_inputs) {
        KOLO_CUDA_CHECK(LaunchScaledSum(act_, x, n * l.in.size(), static_cast<float>(p.weight),
                                        loss_values_ + s.loss_index, st));
        return Status::OK();
      }
      KOLO_CUDA_CHECK(LaunchSoftmaxCrossEntropy(act_, x, labels_, n, p.num_classes,
                                                static_cast<float>(p.weight), ScalePtr(), s.dlogits,
                                                s.row_loss, loss_values_ + s.loss_index, st));
      return Status::OK();
    }
  }
  return InvalidArgument("cudnn backend: layer '{}' has an unknown kind", l.name);
}

Status CudnnBackend::Convolve(const Layer& l, const LayerState& s, ConvDirection dir,
                              bool accumulate, const void* x, const void* w, const void* y) {
  if (conv_plans_on_) return RunConvPlan(l, dir, accumulate, x, w, y);
  const LayerState& in = layers_[l.inputs[0]];
  switch (dir) {
    case ConvDirection::kForward:
      KOLO_CUDNN_CHECK(cudnnConvolutionForward(
          cudnn_.get(), &kOne, in.y_desc.get(), x, s.w_desc.get(), w, s.conv_fwd.get(), s.algos.fwd,
          workspace_, workspace_bytes_, Beta(accumulate), s.y_desc.get(), const_cast<void*>(y)));
      break;
    case ConvDirection::kBackwardData:
      KOLO_CUDNN_CHECK(cudnnConvolutionBackwardData(
          cudnn_.get(), &kOne, s.w_desc.get(), w, s.y_desc.get(), y, s.conv_bwd_data.get(),
          s.algos.bwd_data, workspace_, workspace_bytes_, Beta(accumulate), in.y_desc.get(),
          const_cast<void*>(x)));
      break;
    case ConvDirection::kBackwardFilter:
      KOLO_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
          cudnn_.get(), &kOne, in.y_desc.get(), x, s.y_desc.get(), y, s.conv_bwd_filter.get(),
          s.algos.bwd_filter, workspace_, workspace_bytes_, Beta(accumulate), s.w_desc.get(),
          const_cast<void*>(w)));
      break;
  }
  return Status::OK();
}

Status CudnnBackend::ForwardConv(const Layer& l, LayerState& s) {
  const LayerState& in = layers_[l.inputs[0]];
  KOLO_RETURN_IF_ERROR(Convolve(l, s, ConvDirection::kForward, false, in.y, Weight(l, 0), s.y));
  if (std::get<ConvParams>(l.params).bias && mixed_) {
    KOLO_CUDA_CHECK(LaunchAddChannelBias(act_, s.y, Param(l, 1), config_.batch, l.out.c,
                                         l.out.h * l.out.w, stream_.get()));
  } else if (std::get<ConvParams>(l.params).bias) {
    KOLO_CUDNN_CHECK(cudnnAddTensor(cudnn_.get(), &kOne, s.bias_desc.get(), Param(l, 1), &kOne,
                                    s.y_desc.get(), s.y));
  }
  return Status::OK();
}

// Row-major y[n, units] = x[n, in] W[units, in]^T is, in cuBLAS's column-major terms,
// y'[units, n] = W'^T[units, in] x'[in, n] with W' = W^T stored as [in, units].
Status CudnnBackend::ForwardFullyConnected(const Layer& l, LayerState& s) {
  if (mixed_) return ForwardFullyConnectedMixed(l, s);
  const auto m = static_cast<int>(l.out.c);
  const auto k = static_cast<int>(l.in.size());
  const auto n = static_cast<int>(config_.batch);
  KOLO_CUBLAS_CHECK(cublasSgemm(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &kOne,
                                Param(l, 0), k, static_cast<const float*>(layers_[l.inputs[0]].y),
                                k, &kZero, static_cast<float*>(s.y), m));
  if (std::get<FullyConnectedParams>(l.params).bias) {
    KOLO_CUDA_CHECK(LaunchAddBiasRows(act_, s.y, Param(l, 1), n, m, stream_.get()));
  }
  return Status::OK();
}

Status CudnnBackend::Backward(int layer, bool accumulate) {
  KOLO_RETURN_IF_ERROR(CheckLayer(layer));
  const Layer& l = graph_->layer(layer);
  LayerState& s = layers_[static_cast<size_t>(layer)];
  if (l.kind != LayerKind::kSoftmaxCrossEntropy && l.kind != LayerKind::kInput && !s.dy_written) {
    return FailedPrecondition(
        "cudnn backend: Backward of layer '{}' before the backward of its consumers", l.name);
  }
  cudaStream_t st = stream_.get();
  const int64_t n = config_.batch;
  const int64_t count = n * l.out.size();
  bool acc = false;
  switch (l.kind) {
    case LayerKind::kInput:
      break;
    case LayerKind::kConv:
      KOLO_RETURN_IF_ERROR(BackwardConv(l, s, accumulate));
      break;
    case LayerKind::kBatchNorm:
      KOLO_RETURN_IF_ERROR(BackwardBatchNorm(l, s, accumulate));
      break;
    case LayerKind::kRelu: {
      void* dx = InputGrad(l.inputs[0], &acc);
      KOLO_CUDA_CHECK(LaunchReluBackward(act_, s.y, s.dy, dx, count, acc, st));
      break;
    }
    case LayerKind::kMaxPool:
    case LayerKind::kAvgPool: {
      const LayerState& in = layers_[l.inputs[0]];
      void* dx = InputGrad(l.inputs[0], &acc);
      KOLO_CUDNN_CHECK(cudnnPoolingBackward(cudnn_.get(), s.pool.get(), &kOne, s.y_desc.get(), s.y,
                                            s.y_desc.get(), s.dy, in.y_desc.get(), in.y, Beta(acc),
                                            in.y_desc.get(), dx));
      break;
    }
    case LayerKind::kConcat:
      KOLO_RETURN_IF_ERROR(BackwardConcat(l, s));
      break;
    case LayerKind::kAdd:
      for (int in : l.inputs) {
        void* dx = InputGrad(in, &acc);
        KOLO_CUDA_CHECK(LaunchRowCopy(act_, s.dy, 0, 0, dx, 0, 0, 1, count, acc, st));
      }
      break;
    case LayerKind::kDropout: {
      void* dx = InputGrad(l.inputs[0], &acc);
      const double rate = std::get<DropoutParams>(l.params).rate;
      KOLO_CUDA_CHECK(LaunchDropoutBackward(act_, s.dy, dx, count, rate, config_.seed,
                                            static_cast<uint64_t>(layer), s.dropout_draw, acc, st));
      ++s.dropout_draw;
      break;
    }
    case LayerKind::kFullyConnected:
      KOLO_RETURN_IF_ERROR(BackwardFullyConnected(l, s, accumulate));
      break;
    case LayerKind::kSoftmaxCrossEntropy: {
      const auto& p = std::get<LossParams>(l.params);
      if (p.sum_of_inputs && mixed_) {
        KOLO_CUDA_CHECK(LaunchFillScaled(act_, s.dlogits, n * l.in.size(),
                                         static_cast<float>(p.weight), ScalePtr(), st));
      }
      void* dx = InputGrad(l.inputs[0], &acc);
      KOLO_CUDA_CHECK(LaunchRowCopy(act_, s.dlogits, 0, 0, dx, 0, 0, 1, n * l.in.size(), acc, st));
      break;
    }
  }
  if (!l.param_ids.empty()) KOLO_CUDA_CHECK(cudaEventRecord(s.grads_ready.get(), st));
  return MarkBackwardEnd();
}

Status CudnnBackend::BackwardConv(const Layer& l, LayerState& s, bool accumulate) {
  if (mixed_) return BackwardConvMixed(l, s, accumulate);
  const LayerState& in = layers_[l.inputs[0]];
  KOLO_RETURN_IF_ERROR(
      Convolve(l, s, ConvDirection::kBackwardFilter, accumulate, in.y, Grad(l, 0), s.dy));
  if (std::get<ConvParams>(l.params).bias) {
    KOLO_CUDNN_CHECK(cudnnConvolutionBackwardBias(cudnn_.get(), &kOne, s.y_desc.get(), s.dy,
                                                  Beta(accumulate), s.bias_desc.get(), Grad(l, 1)));
  }
  if (s.needs_dx) {
    bool acc = false;
    void* dx = InputGrad(l.inputs[0], &acc);
    KOLO_RETURN_IF_ERROR(Convolve(l, s, ConvDirection::kBackwardData, acc, dx, Param(l, 0), s.dy));
  }
  return Status::OK();
}

Status CudnnBackend::BackwardBatchNorm(const Layer& l, LayerState& s, bool accumulate) {
  const LayerState& in = layers_[l.inputs[0]];
  const auto& p = std::get<BatchNormParams>(l.params);
  bool acc = false;
  void* dx = InputGrad(l.inputs[0], &acc);
  // Mixed precision: the parameter gradients (float32, at the loss scale) go to the staging buffer
  // and are unscaled from there.
  const size_t shift_offset = RoundUp256(static_cast<size_t>(l.out.c) * sizeof(float));
  float* dscale = mixed_ ? static_cast<float*>(grad_staging_) : Grad(l, 0);
  float* dshift = mixed_
                      ? reinterpret_cast<float*>(static_cast<char*>(grad_staging_) + shift_offset)
                      : Grad(l, 1);
  const float* param_beta = mixed_ ? &kZero : Beta(accumulate);
  KOLO_CUDNN_CHECK(cudnnBatchNormalizationBackward(
      cudnn_.get(), CUDNN_BATCHNORM_SPATIAL, &kOne, Beta(acc), &kOne, param_beta, in.y_desc.get(),
      in.y, s.y_desc.get(), s.dy, in.y_desc.get(), dx, s.bn_desc.get(), Param(l, 0), dscale, dshift,
      p.epsilon, s.save_mean, s.save_inv_std));
  if (mixed_) {
    KOLO_RETURN_IF_ERROR(TakeStagedGradient(l, 0, Elem::kFloat32, 0, accumulate));
    KOLO_RETURN_IF_ERROR(TakeStagedGradient(l, 1, Elem::kFloat32, shift_offset, accumulate));
  }
  return Status::OK();
}

// With dy'[units, n] and x'[in, n] column-major (row-major dy[n, units], x[n, in]):
// dx' = W' dy' (W' = W^T as [in, units]), dW' = x' dy'^T, db = dy' 1.
Status CudnnBackend::BackwardFullyConnected(const Layer& l, LayerState& s, bool accumulate) {
  if (mixed_) return BackwardFullyConnectedMixed(l, s, accumulate);
  const LayerState& in = layers_[l.inputs[0]];
  const auto* x = static_cast<const float*>(in.y);
  const auto* dy = static_cast<const float*>(s.dy);
  const auto m = static_cast<int>(l.out.c);
  const auto k = static_cast<int>(l.in.size());
  const auto n = static_cast<int>(config_.batch);
  KOLO_CUBLAS_CHECK(cublasSgemm(cublas_.get(), CUBLAS_OP_N, CUBLAS_OP_T, k, m, n, &kOne, x, k, dy,
                                m, Beta(accumulate), Grad(l, 0), k));
  if (std::get<FullyConnectedParams>(l.params).bias) {
    KOLO_CUBLAS_CHECK(cublasSgemv(cublas_.get(), CUBLAS_OP_N, m, n, &kOne, dy, m, ones_, 1,
                                  Beta(accumulate), Grad(l, 1), 1));
  }
  if (graph_->layer(l.inputs[0]).kind != LayerKind::kInput) {
    bool acc = false;
    auto* dx = static_cast<float*>(InputGrad(l.inputs[0], &acc));
    KOLO_CUBLAS_CHECK(cublasSgemm(cublas_.get(), CUBLAS_OP_N, CUBLAS_OP_N, k, n, m, &kOne,
                                  Param(l, 0), k, dy, m, Beta(acc), dx, k));
  }
  return Status::OK();
}

Status CudnnBackend::BackwardConcat(const Layer& l, LayerState& s) {
  const int64_t hw = l.out.h * l.out.w;
  int64_t offset = 0;
  for (int in : l.inputs) {
    const int64_t len = graph_->layer(in).out.c * hw;
    bool acc = false;
    void* dx = InputGrad(in, &acc);
    KOLO_CUDA_CHECK(LaunchRowCopy(act_, s.dy, l.out.size(), offset, dx, len, 0, config_.batch, len,
                                  acc, stream_.get()));
    offset += len;
  }
  return Status::OK();
}

}  // namespace kolo::models::compute::cudnn
