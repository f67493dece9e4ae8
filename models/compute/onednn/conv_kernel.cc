// Convolution: forward, backward data and backward weights (with bias) as oneDNN convolution
// primitives on plain NCHW activations. The weights' layout is left to oneDNN (format_tag::any)
// and converted from and to torch's layout only when the chosen one differs.
#include <string>
#include <variant>
#include <vector>

#include "models/compute/onednn/kernel.h"
#include "models/compute/onednn/kernel_util.h"

namespace kolo::models::compute::onednn {
namespace {

using dnnl::memory;
using Dt = memory::data_type;
using Tag = memory::format_tag;

class ConvKernel final : public LayerKernel {
 public:
  ConvKernel(Net& net, int l);
  Status Forward() override;
  Status Backward(bool accumulate) override;

 private:
  Net& net_;
  const std::string context_;
  const bool bias_;
  bool data_grad_ = false;  // the input needs a gradient
  bool add_in_ = false;

  dnnl::convolution_forward fwd_;
  dnnl::convolution_backward_data bwd_data_;
  dnnl::convolution_backward_weights bwd_weights_;
  WeightsIn fwd_weights_;
  WeightsIn bwd_data_weights_;
  bool bwd_data_reuses_fwd_weights_ = false;
  GradOutput in_grad_;
  WeightGradients weight_grads_;
  Args fwd_args_;
  Args bwd_data_args_;
  std::vector<Transfer> plain_copies_;  // source and output gradient, for a plain-layout kernel
};

ConvKernel::ConvKernel(Net& net, int l)
    : net_(net),

      context_(LayerContext(net.layer(l))),
      bias_(std::get<ConvParams>(net.layer(l).params).bias) {
  const Layer& layer = net.layer(l);
  const auto& p = std::get<ConvParams>(layer.params);
  const int in = layer.inputs[0];
  const dnnl::engine& eng = net.engine();

  const memory::desc src_md = net.OutputDesc(in);
  const memory::desc dst_md = net.OutputDesc(l);
  const memory::dims wdims = p.groups == 1
                                 ? memory::dims{p.out_channels, layer.in.c, p.kernel_h, p.kernel_w}
                                 : memory::dims{p.groups, p.out_channels / p.groups,
                                                layer.in.c / p.groups, p.kernel_h, p.kernel_w};
  const memory::desc user_w_md(wdims, Dt::f32, p.groups == 1 ? Tag::oihw : Tag::goihw);
  const memory::desc any_w_md(wdims, Dt::f32, Tag::any);
  const memory::desc bias_md({p.out_channels}, Dt::f32, Tag::a);
  const memory::dims strides{p.stride_h, p.stride_w};
  // Output sizes are floor((in + 2 * pad - kernel) / stride) + 1 (graph.h); oneDNN's size check
  // uses the same rounding, so symmetric padding is consistent here.
  const memory::dims pad{p.pad_h, p.pad_w};
  const auto alg = dnnl::algorithm::convolution_direct;

  const auto fwd_desc =
      bias_ ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, src_md,
                                              any_w_md, bias_md, dst_md, strides, pad, pad)
            : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, src_md,
                                              any_w_md, dst_md, strides, pad, pad);
  const dnnl::convolution_forward::primitive_desc fwd_pd(fwd_desc, eng);
  fwd_ = dnnl::convolution_forward(fwd_pd);
  const int w_id = layer.param_ids[0];
  fwd_weights_ = WeightsIn(net, ParamValue(net, w_id, user_w_md), fwd_pd.weights_desc());
  fwd_args_ = {{DNNL_ARG_SRC, net.value(in)},
               {DNNL_ARG_WEIGHTS, fwd_weights_.mem()},
               {DNNL_ARG_DST, net.value(l)}};
  if (bias_) fwd_args_[DNNL_ARG_BIAS] = ParamValue(net, layer.param_ids[1], bias_md);

  data_grad_ = net.needs_grad(in);
  if (data_grad_) {
    add_in_ = net.adds_to_input(l, 0);
    const dnnl::convolution_backward_data::primitive_desc pd(
        dnnl::convolution_backward_data::desc(alg, src_md, any_w_md, dst_md, strides, pad, pad),
        eng, fwd_pd);
    bwd_data_ = dnnl::convolution_backward_data(pd);
    bwd_data_reuses_fwd_weights_ = pd.weights_desc() == fwd_pd.weights_desc();
    if (!bwd_data_reuses_fwd_weights_) {
      bwd_data_weights_ = WeightsIn(net, ParamValue(net, w_id, user_w_md), pd.weights_desc());
    }
    in_grad_ = InputGradOutput(net, l, 0, pd.diff_src_desc(), src_md);
    bwd_data_args_ = {{DNNL_ARG_DIFF_DST, net.diff(l)},
                      {DNNL_ARG_WEIGHTS,
                       bwd_data_reuses_fwd_weights_ ? fwd_weights_.mem() : bwd_data_weights_.mem()},
                      {DNNL_ARG_DIFF_SRC, in_grad_.Dest(add_in_)}};
  }

  auto bwd_weights_pd = [&](const memory::desc& src, const memory::desc& dst,
                            const dnnl::convolution_forward::primitive_desc& hint) {
    const auto d = bias_ ? dnnl::convolution_backward_weights::desc(alg, src, any_w_md, bias_md,
                                                                    dst, strides, pad, pad)
                         : dnnl::convolution_backward_weights::desc(alg, src, any_w_md, dst,
                                                                    strides, pad, pad);
    return dnnl::convolution_backward_weights::primitive_desc(d, eng, hint);
  };
  auto bwd_pd = bwd_weights_pd(src_md, dst_md, fwd_pd);
  memory bwd_src = net.value(in);
  memory bwd_diff_dst = net.diff(l);
  const memory::desc plain_src(src_md.dims(), Dt::f32, Tag::nchw);
  const memory::desc plain_dst(dst_md.dims(), Dt::f32, Tag::nchw);
  if (std::string(bwd_pd.impl_info_str()).starts_with("ref") &&
      (src_md != plain_src || dst_md != plain_dst)) {
    // oneDNN 2.6 has no optimised blocked backward-weights kernel for some shapes (tall kernels
    // whose padding exceeds a small image, as in Inception V3 at small sizes); its reference
    // kernel is two orders of magnitude slower than the gemm-based one on plain copies.
    const auto plain_fwd =
        bias_ ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, plain_src,
                                                any_w_md, bias_md, plain_dst, strides, pad, pad)
              : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, plain_src,
                                                any_w_md, plain_dst, strides, pad, pad);
    bwd_pd = bwd_weights_pd(plain_src, plain_dst,
                            dnnl::convolution_forward::primitive_desc(plain_fwd, eng));
    bwd_src = memory(plain_src, eng);
    bwd_diff_dst = memory(plain_dst, eng);
    plain_copies_ = {Transfer(net, net.value(in), bwd_src),
                     Transfer(net, net.diff(l), bwd_diff_dst)};
  }
  bwd_weights_ = dnnl::convolution_backward_weights(bwd_pd);
  weight_grads_ = WeightGradients(net, layer, bias_, user_w_md, bwd_pd.diff_weights_desc(), bias_md,
                                  bwd_pd.diff_bias_desc(), bwd_src, bwd_diff_dst);
}

Status ConvKernel::Forward() {
  KOLO_RETURN_IF_ERROR(fwd_weights_.Refresh(net_, context_));
  return net_.Run(context_, "forward", fwd_, fwd_args_);
}

Status ConvKernel::Backward(bool accumulate) {
  if (data_grad_) {
    // The forward of this pass left the weights reordered; they have not changed since.
    if (!bwd_data_reuses_fwd_weights_) {
      KOLO_RETURN_IF_ERROR(bwd_data_weights_.Refresh(net_, context_));
    }
    KOLO_RETURN_IF_ERROR(net_.Run(context_, "backward data", bwd_data_, bwd_data_args_));
    KOLO_RETURN_IF_ERROR(in_grad_.Finish(net_, context_, add_in_));
  }
  if (accumulate) net_.UseParamScratch();
  for (const Transfer& copy : plain_copies_) {
    KOLO_RETURN_IF_ERROR(copy.Run(net_, context_, /*add=*/false));
  }
  KOLO_RETURN_IF_ERROR(weight_grads_.Run(net_, context_, bwd_weights_, accumulate));
  return Status::OK();
}

}  // namespace

std::unique_ptr<LayerKernel> MakeConvKernel(Net& net, int l) {
  return std::make_unique<ConvKernel>(net, l);
}

}  // namespace kolo::models::compute::onednn
