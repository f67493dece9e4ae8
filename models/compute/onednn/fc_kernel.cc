// Fully connected: oneDNN inner products over the 4-D input in whatever layout it has, with the
// weights seen as {units, C, H, W} (torch's [units, C*H*W] flattened in C, H, W order) and their
// layout left to oneDNN, which pairs it with the input's.
#include <variant>

#include "models/compute/onednn/kernel.h"
#include "models/compute/onednn/kernel_util.h"

namespace kolo::models::compute::onednn {
namespace {

using dnnl::memory;
using Dt = memory::data_type;
using Tag = memory::format_tag;

class FullyConnectedKernel final : public LayerKernel {
 public:
  FullyConnectedKernel(Net& net, int l);
  Status Forward() override;
  Status Backward(bool accumulate) override;

 private:
  Net& net_;
  const std::string context_;
  const bool bias_;
  bool data_grad_ = false;
  bool add_in_ = false;

  dnnl::inner_product_forward fwd_;
  dnnl::inner_product_backward_data bwd_data_;
  dnnl::inner_product_backward_weights bwd_weights_;
  WeightsIn fwd_weights_;
  WeightsIn bwd_data_weights_;
  bool bwd_data_reuses_fwd_weights_ = false;
  GradOutput in_grad_;
  WeightGradients weight_grads_;
  Args fwd_args_;
  Args bwd_data_args_;
};

FullyConnectedKernel::FullyConnectedKernel(Net& net, int l)
    : net_(net),
      context_(LayerContext(net.layer(l))),
      bias_(std::get<FullyConnectedParams>(net.layer(l).params).bias) {
  const Layer& layer = net.layer(l);
  const int64_t units = std::get<FullyConnectedParams>(layer.params).units;
  const int in = layer.inputs[0];
  const dnnl::engine& eng = net.engine();

  const memory::desc src_md = net.OutputDesc(in);
  const memory::desc dst_md({net.batch(), units}, Dt::f32, Tag::nc);
  const memory::dims wdims{units, layer.in.c, layer.in.h, layer.in.w};
  const memory::desc user_w_md(wdims, Dt::f32, Tag::oihw);
  const memory::desc any_w_md(wdims, Dt::f32, Tag::any);
  const memory::desc bias_md({units}, Dt::f32, Tag::a);
  const memory src = net.value(in);
  const memory dst = Reshaped(net, net.value(l), dst_md);

  const auto fwd_desc = bias_ ? dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_training,
                                                                  src_md, any_w_md, bias_md, dst_md)
                              : dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_training,
                                                                  src_md, any_w_md, dst_md);
  const dnnl::inner_product_forward::primitive_desc fwd_pd(fwd_desc, eng);
  fwd_ = dnnl::inner_product_forward(fwd_pd);
  const int w_id = layer.param_ids[0];
  fwd_weights_ = WeightsIn(net, ParamValue(net, w_id, user_w_md), fwd_pd.weights_desc());
  fwd_args_ = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, fwd_weights_.mem()}, {DNNL_ARG_DST, dst}};
  if (bias_) fwd_args_[DNNL_ARG_BIAS] = ParamValue(net, layer.param_ids[1], bias_md);

  const memory diff_dst = Reshaped(net, net.diff(l), dst_md);
  data_grad_ = net.needs_grad(in);
  if (data_grad_) {
    add_in_ = net.adds_to_input(l, 0);
    const dnnl::inner_product_backward_data::primitive_desc pd(
        dnnl::inner_product_backward_data::desc(src_md, any_w_md, dst_md), eng, fwd_pd);
    bwd_data_ = dnnl::inner_product_backward_data(pd);
    bwd_data_reuses_fwd_weights_ = pd.weights_desc() == fwd_pd.weights_desc();
    if (!bwd_data_reuses_fwd_weights_) {
      bwd_data_weights_ = WeightsIn(net, ParamValue(net, w_id, user_w_md), pd.weights_desc());
    }
    in_grad_ = InputGradOutput(net, l, 0, pd.diff_src_desc(), src_md);
    bwd_data_args_ = {{DNNL_ARG_DIFF_DST, diff_dst},
                      {DNNL_ARG_WEIGHTS,
                       bwd_data_reuses_fwd_weights_ ? fwd_weights_.mem() : bwd_data_weights_.mem()},
                      {DNNL_ARG_DIFF_SRC, in_grad_.Dest(add_in_)}};
  }

  const auto bwd_desc =
      bias_ ? dnnl::inner_product_backward_weights::desc(src_md, any_w_md, bias_md, dst_md)
            : dnnl::inner_product_backward_weights::desc(src_md, any_w_md, dst_md);
  const dnnl::inner_product_backward_weights::primitive_desc bwd_pd(bwd_desc, eng, fwd_pd);
  bwd_weights_ = dnnl::inner_product_backward_weights(bwd_pd);
  weight_grads_ = WeightGradients(net, layer, bias_, user_w_md, bwd_pd.diff_weights_desc(), bias_md,
                                  bwd_pd.diff_bias_desc(), src, diff_dst);
}

Status FullyConnectedKernel::Forward() {
  KOLO_RETURN_IF_ERROR(fwd_weights_.Refresh(net_, context_));
  return net_.Run(context_, "forward", fwd_, fwd_args_);
}

Status FullyConnectedKernel::Backward(bool accumulate) {
  if (data_grad_) {
    if (!bwd_data_reuses_fwd_weights_) {
      KOLO_RETURN_IF_ERROR(bwd_data_weights_.Refresh(net_, context_));
    }
    KOLO_RETURN_IF_ERROR(net_.Run(context_, "backward data", bwd_data_, bwd_data_args_));
    KOLO_RETURN_IF_ERROR(in_grad_.Finish(net_, context_, add_in_));
  }
  if (accumulate) net_.UseParamScratch();
  KOLO_RETURN_IF_ERROR(weight_grads_.Run(net_, context_, bwd_weights_, accumulate));
  return Status::OK();
}

}  // namespace

std::unique_ptr<LayerKernel> MakeFullyConnectedKernel(Net& net, int l) {
  return std::make_unique<FullyConnectedKernel>(net, l);
}

}  // namespace kolo::models::compute::onednn
