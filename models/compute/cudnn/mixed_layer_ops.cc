// The layers whose mixed-precision arithmetic differs from float32's beyond the element type:
// fully connected layers (cublasGemmEx with half operands and float32 accumulation) and
// convolutions' weight and bias gradients (computed at the loss scale, then unscaled into the
// float32 gradient buffers). Everything else shares layer_ops.cc's code at every precision.
#include <variant>

#include "models/compute/cudnn/backend_impl.h"
#include "models/compute/cudnn/check.h"

namespace kolo::models::compute::cudnn {
namespace {

const float kOne = 1.0f;
const float kZero = 0.0f;

}  // namespace

// Row-major y[n, units] = x[n, in] W[units, in]^T; see ForwardFullyConnected for the column-major
// reading. Products accumulate in float32 and round once into the half output.
Status CudnnBackend::ForwardFullyConnectedMixed(const Layer& l, LayerState& s) {
  const auto m = static_cast<int>(l.out.c);
  const auto k = static_cast<int>(l.in.size());
  const auto n = static_cast<int>(config_.batch);
  KOLO_CUBLAS_CHECK(cublasGemmEx(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &kOne,
                                 Weight(l, 0), blas_type_, k, layers_[l.inputs[0]].y, blas_type_, k,
                                 &kZero, s.y, blas_type_, m, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
  if (std::get<FullyConnectedParams>(l.params).bias) {
    KOLO_CUDA_CHECK(LaunchAddBiasRows(act_, s.y, Param(l, 1), n, m, stream_.get()));
  }
  return Status::OK();
}

// dW' = x' dy'^T and db = dy' 1 are written as float32 (cuBLAS accumulates in float32 anyway, so
// they are not rounded to half on the way), then unscaled; dx' = W' dy' in half.
Status CudnnBackend::BackwardFullyConnectedMixed(const Layer& l, LayerState& s, bool accumulate) {
  const LayerState& in = layers_[l.inputs[0]];
  const auto m = static_cast<int>(l.out.c);
  const auto k = static_cast<int>(l.in.size());
  const auto n = static_cast<int>(config_.batch);
  KOLO_CUBLAS_CHECK(cublasGemmEx(cublas_.get(), CUBLAS_OP_N, CUBLAS_OP_T, k, m, n, &kOne, in.y,
                                 blas_type_, k, s.dy, blas_type_, m, &kZero, grad_staging_,
                                 CUDA_R_32F, k, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  KOLO_RETURN_IF_ERROR(TakeStagedGradient(l, 0, Elem::kFloat32, 0, accumulate));
  if (std::get<FullyConnectedParams>(l.params).bias) {
    KOLO_CUBLAS_CHECK(cublasGemmEx(cublas_.get(), CUBLAS_OP_N, CUBLAS_OP_N, m, 1, n, &kOne, s.dy,
                                   blas_type_, m, ones_act_, blas_type_, n, &kZero, grad_staging_,
                                   CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    KOLO_RETURN_IF_ERROR(TakeStagedGradient(l, 1, Elem::kFloat32, 0, accumulate));
  }
  if (graph_->layer(l.inputs[0]).kind != LayerKind::kInput) {
    bool acc = false;
    void* dx = InputGrad(l.inputs[0], &acc);
    KOLO_CUBLAS_CHECK(cublasGemmEx(cublas_.get(), CUBLAS_OP_N, CUBLAS_OP_N, k, n, m, &kOne,
                                   Weight(l, 0), blas_type_, k, s.dy, blas_type_, m,
                                   acc ? &kOne : &kZero, dx, blas_type_, k, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
  }
  return Status::OK();
}

// cuDNN writes the filter gradient in the filter's own type (half); the bias gradient is summed
// in float32 by kolo's kernel (cuDNN's bias calls want bias and tensor of one type).
Status CudnnBackend::BackwardConvMixed(const Layer& l, LayerState& s, bool accumulate) {
  const LayerState& in = layers_[l.inputs[0]];
  KOLO_RETURN_IF_ERROR(
      Convolve(l, s, ConvDirection::kBackwardFilter, false, in.y, grad_staging_, s.dy));
  KOLO_RETURN_IF_ERROR(TakeStagedGradient(l, 0, act_, 0, accumulate));
  if (std::get<ConvParams>(l.params).bias) {
    KOLO_CUDA_CHECK(LaunchChannelSum(act_, s.dy, static_cast<float*>(grad_staging_), config_.batch,
                                     l.out.c, l.out.h * l.out.w, stream_.get()));
    KOLO_RETURN_IF_ERROR(TakeStagedGradient(l, 1, Elem::kFloat32, 0, accumulate));
  }
  if (s.needs_dx) {
    bool acc = false;
    void* dx = InputGrad(l.inputs[0], &acc);
    KOLO_RETURN_IF_ERROR(Convolve(l, s, ConvDirection::kBackwardData, acc, dx, Weight(l, 0), s.dy));
  }
  return Status::OK();
}

}  // namespace kolo::models::compute::cudnn
