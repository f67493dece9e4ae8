// ReLU as a oneDNN eltwise primitive; backward passes the gradient where the output is positive,
// which lets the forward run in place over its input (Net decides).
#include "models/compute/onednn/kernel.h"
#include "models/compute/onednn/kernel_util.h"

namespace kolo::models::compute::onednn {
namespace {

using dnnl::memory;

class ReluKernel final : public LayerKernel {
 public:
  ReluKernel(Net& net, int l);
  Status Forward() override { return net_.Run(context_, "forward", fwd_, fwd_args_); }
  Status Backward(bool accumulate) override;

 private:
  Net& net_;
  const std::string context_;
  bool add_in_ = false;
  dnnl::eltwise_forward fwd_;
  dnnl::eltwise_backward bwd_;
  GradOutput in_grad_;
  Args fwd_args_;
  Args bwd_args_;
};

ReluKernel::ReluKernel(Net& net, int l) : net_(net), context_(LayerContext(net.layer(l))) {
  const int in = net.layer(l).inputs[0];
  const dnnl::engine& eng = net.engine();
  const memory::desc md = net.OutputDesc(l);
  const dnnl::eltwise_forward::primitive_desc fwd_pd(
      dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::eltwise_relu,
                                  md, 0.0f),
      eng);
  fwd_ = dnnl::eltwise_forward(fwd_pd);
  fwd_args_ = {{DNNL_ARG_SRC, net.value(in)}, {DNNL_ARG_DST, net.value(l)}};
  if (!net.needs_grad(in)) return;

  const dnnl::eltwise_backward::primitive_desc bwd_pd(
      dnnl::eltwise_backward::desc(dnnl::algorithm::eltwise_relu_use_dst_for_bwd, md, md, 0.0f),
      eng, fwd_pd);
  bwd_ = dnnl::eltwise_backward(bwd_pd);
  add_in_ = net.adds_to_input(l, 0);
  in_grad_ = InputGradOutput(net, l, 0, bwd_pd.diff_src_desc(), md);
  bwd_args_ = {{DNNL_ARG_DST, net.value(l)},
               {DNNL_ARG_DIFF_DST, net.diff(l)},
               {DNNL_ARG_DIFF_SRC, in_grad_.Dest(add_in_)}};
}

Status ReluKernel::Backward(bool /*accumulate: no parameters*/) {
  if (!bwd_) return Status::OK();
  KOLO_RETURN_IF_ERROR(net_.Run(context_, "backward", bwd_, bwd_args_));
  return in_grad_.Finish(net_, context_, add_in_);
}

}  // namespace

std::unique_ptr<LayerKernel> MakeReluKernel(Net& net, int l) {
  return std::make_unique<ReluKernel>(net, l);
}

}  // namespace kolo::models::compute::onednn
