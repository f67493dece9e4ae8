// Max and average pooling as oneDNN pooling primitives. Max pooling keeps oneDNN's workspace (the
// arg-max of every window) from forward to backward. Average pooling divides by the window size
// (count_include_pad) or by the number of input elements in the window.
#include <variant>

#include "models/compute/onednn/kernel.h"
#include "models/compute/onednn/kernel_util.h"

namespace kolo::models::compute::onednn {
namespace {

using dnnl::memory;

class PoolKernel final : public LayerKernel {
 public:
  PoolKernel(Net& net, int l);
  Status Forward() override { return net_.Run(context_, "forward", fwd_, fwd_args_); }
  Status Backward(bool accumulate) override;

 private:
  Net& net_;
  const std::string context_;
  bool add_in_ = false;
  dnnl::pooling_forward fwd_;
  dnnl::pooling_backward bwd_;
  memory workspace_;
  GradOutput in_grad_;
  Args fwd_args_;
  Args bwd_args_;
};

PoolKernel::PoolKernel(Net& net, int l) : net_(net), context_(LayerContext(net.layer(l))) {
  const Layer& layer = net.layer(l);
  const auto& p = std::get<PoolParams>(layer.params);
  const int in = layer.inputs[0];
  const dnnl::engine& eng = net.engine();
  const dnnl::algorithm alg = layer.kind == LayerKind::kMaxPool ? dnnl::algorithm::pooling_max
                              : p.count_include_pad ? dnnl::algorithm::pooling_avg_include_padding
                                                    : dnnl::algorithm::pooling_avg_exclude_padding;
  const memory::desc src_md = net.OutputDesc(in);
  const memory::desc dst_md = net.OutputDesc(l);
  const memory::dims strides{p.stride_h, p.stride_w};
  const memory::dims kernel{p.kernel_h, p.kernel_w};
  // As for convolutions, floor-rounded output sizes make symmetric padding consistent; the
  // windows never reach the extra right padding, so include-pad divisors are the full window.
  const memory::dims pad{p.pad_h, p.pad_w};

  const dnnl::pooling_forward::primitive_desc fwd_pd(
      dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, alg, src_md, dst_md, strides,
                                  kernel, pad, pad),
      eng);
  fwd_ = dnnl::pooling_forward(fwd_pd);
  fwd_args_ = {{DNNL_ARG_SRC, net.value(in)}, {DNNL_ARG_DST, net.value(l)}};
  if (fwd_pd.workspace_desc().get_size() != 0) {
    workspace_ = memory(fwd_pd.workspace_desc(), eng);
    fwd_args_[DNNL_ARG_WORKSPACE] = workspace_;
  }
  if (!net.needs_grad(in)) return;

  const dnnl::pooling_backward::primitive_desc bwd_pd(
      dnnl::pooling_backward::desc(alg, src_md, dst_md, strides, kernel, pad, pad), eng, fwd_pd);
  bwd_ = dnnl::pooling_backward(bwd_pd);
  add_in_ = net.adds_to_input(l, 0);
  in_grad_ = InputGradOutput(net, l, 0, bwd_pd.diff_src_desc(), src_md);
  bwd_args_ = {{DNNL_ARG_DIFF_DST, net.diff(l)}, {DNNL_ARG_DIFF_SRC, in_grad_.Dest(add_in_)}};
  if (workspace_) bwd_args_[DNNL_ARG_WORKSPACE] = workspace_;
}

Status PoolKernel::Backward(bool /*accumulate: no parameters*/) {
  if (!bwd_) return Status::OK();
  KOLO_RETURN_IF_ERROR(net_.Run(context_, "backward", bwd_, bwd_args_));
  return in_grad_.Finish(net_, context_, add_in_);
}

}  // namespace

std::unique_ptr<LayerKernel> MakePoolKernel(Net& net, int l) {
  return std::make_unique<PoolKernel>(net, l);
}

}  // namespace kolo::models::compute::onednn
