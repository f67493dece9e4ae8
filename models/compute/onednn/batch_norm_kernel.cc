// Batch normalization in training mode: oneDNN's forward_training normalises with the batch's
// mean and (biased) variance and scales and shifts per channel; backward gives the input
// gradient and the scale and shift gradients. The running statistics follow torch:
// running = (1 - momentum) * running + momentum * batch, with the batch variance unbiased.
#include <chrono>
#include <variant>
#include <vector>

#include "models/compute/onednn/kernel.h"
#include "models/compute/onednn/kernel_util.h"

namespace kolo::models::compute::onednn {
namespace {

using dnnl::memory;
using Dt = memory::data_type;
using Tag = memory::format_tag;

class BatchNormKernel final : public LayerKernel {
 public:
  BatchNormKernel(Net& net, int l);
  Status Forward() override;
  Status Backward(bool accumulate) override;

 private:
  void UpdateRunningStatistics();

  Net& net_;
  const std::string context_;
  const BatchNormParams params_;
  const int64_t channels_;
  const int64_t per_channel_;  // values averaged per channel: batch * H * W
  bool add_in_ = false;

  dnnl::batch_normalization_forward fwd_;
  dnnl::batch_normalization_backward bwd_;
  memory mean_;
  memory variance_;
  std::vector<float> running_mean_;
  std::vector<float> running_var_;
  GradOutput in_grad_;
  GradOutput scale_grad_;
  GradOutput shift_grad_;
  Args fwd_args_;
  Args bwd_args_[2];  // [accumulate]
};

BatchNormKernel::BatchNormKernel(Net& net, int l)
    : net_(net),
      context_(LayerContext(net.layer(l))),
      params_(std::get<BatchNormParams>(net.layer(l).params)),
      channels_(net.layer(l).out.c),
      per_channel_(net.batch() * net.layer(l).out.h * net.layer(l).out.w),
      running_mean_(static_cast<size_t>(channels_), 0.0f),
      running_var_(static_cast<size_t>(channels_), 1.0f) {
  const Layer& layer = net.layer(l);
  const int in = layer.inputs[0];
  const dnnl::engine& eng = net.engine();
  const memory::desc data_md = net.OutputDesc(l);
  const memory::desc c_md({channels_}, Dt::f32, Tag::a);
  const auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
  const auto eps = static_cast<float>(params_.epsilon);

  const dnnl::batch_normalization_forward::primitive_desc fwd_pd(
      dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, data_md, eps,
                                              flags),
      eng);
  fwd_ = dnnl::batch_normalization_forward(fwd_pd);
  mean_ = memory(fwd_pd.mean_desc(), eng);
  variance_ = memory(fwd_pd.variance_desc(), eng);
  const int scale_id = layer.param_ids[0];
  const int shift_id = layer.param_ids[1];
  const memory scale = ParamValue(net, scale_id, c_md);
  const memory shift = ParamValue(net, shift_id, c_md);
  fwd_args_ = {{DNNL_ARG_SRC, net.value(in)}, {DNNL_ARG_DST, net.value(l)},
               {DNNL_ARG_SCALE, scale},       {DNNL_ARG_SHIFT, shift},
               {DNNL_ARG_MEAN, mean_},        {DNNL_ARG_VARIANCE, variance_}};

  const dnnl::batch_normalization_backward::primitive_desc bwd_pd(
      dnnl::batch_normalization_backward::desc(dnnl::prop_kind::backward, data_md, data_md, eps,
                                               flags),
      eng, fwd_pd);
  bwd_ = dnnl::batch_normalization_backward(bwd_pd);
  add_in_ = net.adds_to_input(l, 0);
  in_grad_ = InputGradOutput(net, l, 0, bwd_pd.diff_src_desc(), data_md);
  size_t offset = 0;
  scale_grad_ = ParamGradOutput(net, scale_id, c_md, c_md, &offset);
  shift_grad_ = ParamGradOutput(net, shift_id, c_md, c_md, &offset);
  for (int acc = 0; acc < 2; ++acc) {
    bwd_args_[acc] = {{DNNL_ARG_SRC, net.value(in)},
                      {DNNL_ARG_MEAN, mean_},
                      {DNNL_ARG_VARIANCE, variance_},
                      {DNNL_ARG_DIFF_DST, net.diff(l)},
                      {DNNL_ARG_SCALE, scale},
                      {DNNL_ARG_SHIFT, shift},  // unused by the math, but oneDNN requires it
                      {DNNL_ARG_DIFF_SRC, in_grad_.Dest(add_in_)},
                      {DNNL_ARG_DIFF_SCALE, scale_grad_.Dest(acc == 1)},
                      {DNNL_ARG_DIFF_SHIFT, shift_grad_.Dest(acc == 1)}};
  }
}

Status BatchNormKernel::Forward() {
  KOLO_RETURN_IF_ERROR(net_.Run(context_, "forward", fwd_, fwd_args_));
  UpdateRunningStatistics();
  return Status::OK();
}

void BatchNormKernel::UpdateRunningStatistics() {
  const auto start = std::chrono::steady_clock::now();
  const auto* mean = static_cast<const float*>(mean_.get_data_handle());
  const auto* var = static_cast<const float*>(variance_.get_data_handle());
  const auto m = static_cast<float>(params_.momentum);
  const float unbias = per_channel_ > 1
                           ? static_cast<float>(per_channel_) / static_cast<float>(per_channel_ - 1)
                           : 1.0f;
  for (size_t c = 0; c < running_mean_.size(); ++c) {
    running_mean_[c] = (1 - m) * running_mean_[c] + m * mean[c];
    running_var_[c] = (1 - m) * running_var_[c] + m * var[c] * unbias;
  }
  net_.AddKernelTime(start);
}

Status BatchNormKernel::Backward(bool accumulate) {
  if (accumulate) net_.UseParamScratch();
  KOLO_RETURN_IF_ERROR(net_.Run(context_, "backward", bwd_, bwd_args_[accumulate ? 1 : 0]));
  KOLO_RETURN_IF_ERROR(in_grad_.Finish(net_, context_, add_in_));
  KOLO_RETURN_IF_ERROR(scale_grad_.Finish(net_, context_, accumulate));
  return shift_grad_.Finish(net_, context_, accumulate);
}

}  // namespace

std::unique_ptr<LayerKernel> MakeBatchNormKernel(Net& net, int l) {
  return std::make_unique<BatchNormKernel>(net, l);
}

}  // namespace kolo::models::compute::onednn
