// Convolution algorithm selection: for each distinct convolution (shapes, strides, padding,
// groups, math mode) cuDNN's search (cudnnFind*Algorithm, which runs every applicable algorithm
// once) picks the fastest forward, backward-data and backward-filter algorithms whose workspace
// fits kMaxWorkspaceBytes. Results are cached, so the many identical convolutions of ResNet or
// Inception are searched once.
//
// Thread-safety: none; owned by one backend.
#pragma once

#include <cudnn.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>

#include "engine/common/status.h"

namespace kolo::models::compute::cudnn {

// The largest workspace one algorithm may ask for.
inline constexpr size_t kMaxWorkspaceBytes = size_t{4} << 30;

struct ConvAlgos {
  cudnnConvolutionFwdAlgo_t fwd = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  cudnnConvolutionBwdDataAlgo_t bwd_data = CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0;
  // The math type each chosen algorithm was timed with; set on that direction's descriptor.
  cudnnMathType_t fwd_math = CUDNN_DEFAULT_MATH;
  cudnnMathType_t bwd_data_math = CUDNN_DEFAULT_MATH;
  cudnnMathType_t bwd_filter_math = CUDNN_DEFAULT_MATH;
  size_t workspace_bytes = 0;  // the largest of the three
};

// What identifies a convolution for the cache: N, C, H, W, K, kh, kw, stride h/w, pad h/w, groups,
// math type, whether the backward-data algorithm is wanted, and the tensors' cuDNN data type.
using ConvKey = std::array<int64_t, 15>;

// The three descriptors of one convolution: `fwd`, `bwd_data` and `bwd_filter` are separate
// convolution descriptors with the same geometry (each direction keeps its own math type).
struct ConvDescriptors {
  cudnnTensorDescriptor_t x;
  cudnnFilterDescriptor_t w;
  cudnnTensorDescriptor_t y;
  cudnnConvolutionDescriptor_t fwd;
  cudnnConvolutionDescriptor_t bwd_data;
  cudnnConvolutionDescriptor_t bwd_filter;
};

class ConvAlgoCache {
 public:
  // Returns the cached choice for `key`, or searches with `d` (whose convolution descriptors carry
  // the allowed math type) and caches it. Sets each descriptor's math type to the chosen one.
  // `layer` names the layer in errors. Needs a GPU: the search runs the kernels.
  [[nodiscard]] StatusOr<ConvAlgos> Choose(cudnnHandle_t handle, const ConvKey& key,
                                           const ConvDescriptors& d, bool need_bwd_data,
                                           const char* layer);

  size_t size() const { return cache_.size(); }

 private:
  std::map<ConvKey, ConvAlgos> cache_;
};

}  // namespace kolo::models::compute::cudnn
