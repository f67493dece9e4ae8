#include "models/compute/cudnn/conv_algos.h"

#include <algorithm>

#include "models/compute/cudnn/check.h"

namespace kolo::models::compute::cudnn {
namespace {

// cuDNN lists results fastest first; take the first that ran and fits the workspace limit.
template <typename Perf>
const Perf* Fastest(const Perf* perf, int count) {
  for (int i = 0; i < count; ++i) {
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= kMaxWorkspaceBytes) {
      return &perf[i];
    }
  }
  return nullptr;
}

}  // namespace

StatusOr<ConvAlgos> ConvAlgoCache::Choose(cudnnHandle_t handle, const ConvKey& key,
                                          const ConvDescriptors& d, bool need_bwd_data,
                                          const char* layer) {
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    ConvAlgos a;
    constexpr int kMax = 16;
    int n = 0;
    cudnnConvolutionFwdAlgoPerf_t fwd[kMax];
    KOLO_CUDNN_CHECK(
        cudnnFindConvolutionForwardAlgorithm(handle, d.x, d.w, d.fwd, d.y, kMax, &n, fwd));
    const auto* f = Fastest(fwd, n);
    if (f == nullptr) {
      return Internal("conv layer '{}': no cuDNN forward algorithm runs within a {} MiB workspace",
                      layer, kMaxWorkspaceBytes >> 20);
    }
    a.fwd = f->algo;
    a.fwd_math = f->mathType;
    a.workspace_bytes = f->memory;

    cudnnConvolutionBwdFilterAlgoPerf_t bf[kMax];
    KOLO_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(handle, d.x, d.y, d.bwd_filter,
                                                                 d.w, kMax, &n, bf));
    const auto* b = Fastest(bf, n);
    if (b == nullptr) {
      return Internal(
          "conv layer '{}': no cuDNN backward-filter algorithm runs within a {} MiB workspace",
          layer, kMaxWorkspaceBytes >> 20);
    }
    a.bwd_filter = b->algo;
    a.bwd_filter_math = b->mathType;
    a.workspace_bytes = std::max(a.workspace_bytes, b->memory);

    if (need_bwd_data) {
      cudnnConvolutionBwdDataAlgoPerf_t bd[kMax];
      KOLO_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(handle, d.w, d.y, d.bwd_data, d.x,
                                                                 kMax, &n, bd));
      const auto* g = Fastest(bd, n);
      if (g == nullptr) {
        return Internal(
            "conv layer '{}': no cuDNN backward-data algorithm runs within a {} MiB workspace",
            layer, kMaxWorkspaceBytes >> 20);
      }
      a.bwd_data = g->algo;
      a.bwd_data_math = g->mathType;
      a.workspace_bytes = std::max(a.workspace_bytes, g->memory);
    }
    it = cache_.emplace(key, a).first;
  }
  const ConvAlgos& a = it->second;
  KOLO_CUDNN_CHECK(cudnnSetConvolutionMathType(d.fwd, a.fwd_math));
  KOLO_CUDNN_CHECK(cudnnSetConvolutionMathType(d.bwd_filter, a.bwd_filter_math));
  if (need_bwd_data) KOLO_CUDNN_CHECK(cudnnSetConvolutionMathType(d.bwd_data, a.bwd_data_math));
  return a;
}

}  // namespace kolo::models::compute::cudnn
